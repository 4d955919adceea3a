"""The benchmark scripts as their tests use them: one imported as a module (`import_benchmark`), and
the GPU benchmark (`benchmarks/gpu.py`) with its command and what every part's result file holds."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from tests.support.helpers import ROOT

GPU_PY = ROOT / "benchmarks" / "gpu.py"
RESULTS = ROOT / "benchmarks" / "results"
"""The committed results (a dry run never writes here)."""

COMMON = {
    "part",
    "benchmark",
    "invocation",
    "tiny",
    "device",
    "device_name",
    "machine",
    "commands",
    "wall_s",
    "status",
    "error",
    "changes",
    "conditions",
}
STUDY_KEYS = {"environment", "best", "baseline", "speedup", "mfu", "tokens_per_s", "energy", "export", "trials"}


def import_benchmark(script: str) -> ModuleType:
    """`benchmarks/<script>.py` as a module named `benchmarks_<script>` (registered in
    `sys.modules`, where its dataclasses look their module up), its folder on the path while it
    imports its harness."""
    path = list(sys.path)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(f"benchmarks_{script}", ROOT / "benchmarks" / f"{script}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path[:] = path


def digests(folder: Path = RESULTS) -> dict[str, str]:
    """Every file under `folder` (relative path -> sha256 of its bytes): what a dry run must leave as it was."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def benchmark_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def gpu_py(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GPU_PY), *args],
        cwd=ROOT,
        env=benchmark_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def render_tables(results: Path, folder: Path) -> str:
    """benchmarks/tables.py run on the result files in `results`, into a copy of
    benchmarks/README.md in `folder`: the copy's text, once it ran ok."""
    readme = folder / "README.md"
    shutil.copy(ROOT / "benchmarks" / "README.md", readme)
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "tables.py"),
        "--results",
        str(results),
        "--readme",
        str(readme),
    ]
    done = subprocess.run(command, cwd=ROOT, env=benchmark_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return readme.read_text()
