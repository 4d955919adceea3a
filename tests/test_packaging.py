"""autotuner installs one import package: `backends/` and `search_spaces/` keep their top-level
folders but import as `autotuner.backends` and `autotuner.search_spaces`."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tests.helpers import ROOT


def test_outside_the_checkout_only_autotuner_imports(tmp_path: Path) -> None:
    script = """
import importlib, importlib.util
for name in ("backends", "search_spaces"):
    assert importlib.util.find_spec(name) is None, name
import autotuner.backends.pytorch.runner, autotuner.backends.jax
import autotuner.search_spaces as presets
assert "pytorch" in presets.available() and presets.load_preset("pytorch")["precision"]
print("one package")
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "one package" in done.stdout, done.stderr[-2000:]


def test_the_wheel_holds_one_top_level_package(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("autotuner-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {
        "autotuner",
        next(n.split("/")[0] for n in names if ".dist-info/" in n),
    }
    assert "autotuner/backends/pytorch/runner.py" in names and "autotuner/search_spaces/pytorch.yaml" in names


def test_a_training_loop_that_applies_a_config_does_not_load_the_study_loop(tmp_path: Path) -> None:
    """A user's loop imports `load_config` and a backend's `TunedTraining`; a trial process imports
    the backend's runner. Neither needs Optuna, SQLAlchemy or the study loop, and the package's
    own `__init__` imports none of them."""
    script = (
        "import sys\n"
        "import autotuner.apply, autotuner.backends.pytorch.apply, autotuner.backends.pytorch.runner\n"
        "heavy = [m for m in ('optuna', 'sqlalchemy', 'autotuner.search', 'autotuner.cli') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
