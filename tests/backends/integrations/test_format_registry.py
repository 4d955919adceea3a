"""`autotuner export --format` offers what the registered backends name (`Backend.formats`): a
backend's format is a module in its package, and the command line names none of them."""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import pytest

from autotuner.backends import BACKENDS, Backend, ExportFormat, export_formats, formats_help
from autotuner.backends.pytorch import PYTORCH
from autotuner.backends.pytorch.inference import PYTORCH_INFERENCE
from autotuner.backends.pytorch.integrations import FORMATS, TRAINERS
from autotuner.cli import build_parser
from autotuner.errors import SpecError

TEXT = ExportFormat("numpy-text", "numpy_formats", "numpy", None, "numpy's")
FILES = ExportFormat("numpy-files", "numpy_formats", "numpy", None, "the weights as .npy files", files=True)


class FormatsBackend(Backend):
    name = "numpy-formats"
    formats = "numpy_formats"
    knobs: dict[str, object] = {}  # noqa: RUF012 (read by what lists every backend's knobs)


@pytest.fixture
def numpy_formats(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A backend registered with a formats module of its own, which writes a line or a file."""
    module = types.ModuleType("numpy_formats")
    module.FORMATS = {fmt.name: fmt for fmt in (TEXT, FILES)}  # type: ignore[attr-defined]
    module.snippet = lambda config: f"# {config.backend}: {dict(config.params)}\n"  # type: ignore[attr-defined]

    def write(config: object, job: object, path: Path) -> list[Path]:
        path.write_text(f"{job}\n")
        return [path]

    module.write = write  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "numpy_formats", module)
    monkeypatch.setitem(BACKENDS, FormatsBackend.name, FormatsBackend())
    return module


def test_pytorchs_formats_are_its_packages_table_named_by_both_its_halves() -> None:
    assert PYTORCH.formats == PYTORCH_INFERENCE.formats == "autotuner.backends.pytorch.integrations"
    assert importlib.import_module(PYTORCH.formats).FORMATS is FORMATS
    assert list(export_formats()) == list(FORMATS) == [*TRAINERS, "onnx"]
    assert all(fmt.module.startswith("autotuner.backends.pytorch.integrations.") for fmt in FORMATS.values())


def test_the_export_command_offers_every_backends_formats(numpy_formats: types.ModuleType) -> None:
    assert list(export_formats()) == [*FORMATS, "numpy-text", "numpy-files"]
    export = build_parser().parse_args(["export", "--format", "numpy-files"])
    assert export.format == "numpy-files"
    text = formats_help(export_formats())
    assert text.startswith(f"a trainer's arguments as Python: {', '.join([*TRAINERS, 'numpy-text'])};")
    assert text.endswith("; numpy-files: the weights as .npy files")


def test_a_format_writes_through_its_module(numpy_formats: types.ModuleType, tmp_path: Path) -> None:
    config = types.SimpleNamespace(backend="numpy", params={"batch_size": 8})
    assert TEXT.snippet(config) == "# numpy: {'batch_size': 8}\n"
    assert FILES.write(config, "the job", tmp_path / "w.npy") == [tmp_path / "w.npy"]
    assert (tmp_path / "w.npy").read_text() == "the job\n"
    with pytest.raises(ValueError, match="--format numpy-files writes files"):
        FILES.snippet(config)


def test_a_format_whose_library_is_missing_says_what_to_install() -> None:
    missing = ExportFormat("x", "numpy_formats", "no_such_library", "extra", "x's")
    with pytest.raises(SpecError, match=r"no_such_library is not installed: pip install 'autotuner\[extra\]'"):
        missing.require()


def test_two_backends_may_not_name_one_format_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("numpy_formats")
    module.FORMATS = {"onnx": ExportFormat("onnx", "numpy_formats", "numpy", None, "numpy's onnx")}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "numpy_formats", module)
    monkeypatch.setitem(BACKENDS, FormatsBackend.name, FormatsBackend())
    with pytest.raises(ValueError, match="two export formats are named 'onnx'"):
        export_formats()
