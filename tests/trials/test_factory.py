"""Finding a workload factory's module, and the libraries a trial fork server imports once for it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from autotuner.backends import BACKENDS
from autotuner.trials.factory import PRELOADABLE, preloadable_imports


def test_the_libraries_a_factory_imports_are_read_from_its_source_not_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "userjob"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('a job package is imported in its trials only')\n")
    (package / "train.py").write_text(
        "import os\n"
        "import transformers.models.gpt2 as gpt2\n"
        "from userjob import helpers\n"
        "def make_workload():\n"
        "    from peft import LoraConfig\n"
        "    import torch\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert preloadable_imports("userjob.train:make_workload") == ["transformers", "peft"]
    assert "userjob" not in sys.modules
    assert preloadable_imports("userjob:make_workload") == []  # a package's own __init__, importing nothing listed
    assert preloadable_imports("nowhere.to.be:found") == []
    assert preloadable_imports("not a path") == []
    (package / "broken.py").write_text("def (:\n")
    assert preloadable_imports("userjob.broken:make") == []


def test_the_fork_server_preloads_them_with_the_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from multiprocessing import forkserver

    (tmp_path / "hfjob.py").write_text("from transformers import GPT2Config\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # the process's one fork server takes the list when it starts: put back what it had
    monkeypatch.setattr(forkserver._forkserver, "_preload_modules", forkserver._forkserver._preload_modules)
    backend = BACKENDS["pytorch"]
    backend.launcher(workload="hfjob:make_workload")
    assert forkserver._forkserver._preload_modules == ["autotuner.trials._forkserver", backend.runner, "transformers"]
    assert {"transformers", "datasets", "flax"} <= PRELOADABLE
