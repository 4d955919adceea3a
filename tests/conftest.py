from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

# One JAX persistent compilation cache for the whole session, in a fresh folder: a JAX trial op by
# op (jit=off: the reference, most baselines) compiles each of its ~100 primitives in every process,
# and a jitted step its whole graph; with the cache, each is compiled once a session and loaded by
# every later process (this one, the trial processes, the CLI's) that compiles the same (XLA's
# cache key holds the computation, the compile options and XLA_FLAGS: a flag bundle compiles anew).
# The same executables run, so what the tests check of them is unchanged; only the repeated
# compile time goes (benchmarks/gpu.py's --tiny JAX study does the same). Set in the environment
# before anything imports JAX, so the processes the tests start inherit it; a cache the caller
# chose is left as it is.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _jax_cache = tempfile.mkdtemp(prefix="autotuner-tests-jax-cache-")

    def _remove_jax_cache(owner: int = os.getpid()) -> None:
        if os.getpid() == owner:  # not in a process forked from this one that exits normally
            shutil.rmtree(_jax_cache, ignore_errors=True)

    atexit.register(_remove_jax_cache)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _jax_cache
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # the primitives compile in milliseconds
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"

# A study small enough to run end to end in seconds on two CPU cores.
SMALL_SPEC: dict[str, Any] = {
    "name": "small",
    "backend": "pytorch",
    "workload": "builtin:mlp",
    "workload_args": {"features": 32, "hidden": 64, "depth": 2, "samples": 1024},
    "device": "cpu",
    "global_batch": 64,
    "baseline": {"precision": "fp32", "batch_size": 16, "workers": 0, "compile": "none"},
    "space": {"precision": ["fp32", "bf16", "tf32"], "batch_size": [16, 64], "workers": [0], "compile": ["none"]},
    "budget": {"trials": 3},
    "trial": {"warmup_steps": 1, "steps": 3, "windows": 2, "min_window_s": 0.05, "drift_steps": 3, "timeout": 120},
    "sampler": {"name": "tpe", "seed": 0},
}


def write_spec(folder: Path, **changes: Any) -> Path:
    """SMALL_SPEC with `changes`; its best is not re-measured unless `budget` asks for it (the
    tests of re-measurement do), so that trial counts stay those of the search loop, and no trial
    is pruned unless `trial` asks for it (the tests of pruning do), so that every trial that ran
    is COMPLETE, whatever the machine's timings, and no profile runs after the search unless
    `profile` asks for it (the tests of profiling do), so that the processes that trained are the
    search's. A space of knobs without a `preset` holds every knob it does not name at the
    baseline's value, so that a test's space is the knobs it names (a preset would search the rest)."""
    spec = {**SMALL_SPEC, **changes}
    space = spec.get("space")
    if isinstance(space, dict) and "preset" not in space:
        from autotuner.backends import BACKENDS
        from autotuner.config.knobs import DERIVED

        knobs = BACKENDS[spec["backend"]].knobs if spec.get("backend") in BACKENDS else {}
        baseline = spec.get("baseline") or {}
        held = {
            name: [baseline.get(name, knob.reference)]
            for name, knob in knobs.items()
            if name not in space and name not in DERIVED and knob.reference is not None
        }
        spec["space"] = {**space, **held}
    spec["budget"] = {"remeasure_top": 0, **spec["budget"]}
    spec["trial"] = {"prune_after": 0, **spec["trial"]}
    spec.setdefault("profile", {"steps": 0})
    path = folder / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def write_hang_spec(folder: Path, name: str, *, hang_at: int, workers: int, trials: int) -> Path:
    """A spec of `tests.study_workloads:hang_once`: its `hang_at`-th training process (1-2: the
    reference, 3: the baseline, then the trials) hangs, with `workers` loader workers running."""
    return write_spec(
        folder,
        name=name,
        workload="tests.study_workloads:hang_once",
        workload_args={"folder": str(folder), "hang_at": hang_at},
        global_batch=32,
        baseline={"precision": "fp32", "batch_size": 8, "workers": workers, "compile": "none"},
        space={"precision": ["fp32", "bf16"], "batch_size": [8, 16, 32], "workers": [workers], "compile": ["none"]},
        budget={"trials": trials},
        trial={"warmup_steps": 1, "steps": 2, "windows": 2, "drift_steps": 2, "min_window_s": 0, "timeout": 600},
    )


def run_cli(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """The installed command as a user runs it, from `cwd` (where runs/ lands)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "COLUMNS": "200",
    }
    return subprocess.run(
        [sys.executable, "-m", "autotuner", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


def _cuda_usable() -> bool:
    """Whether torch sees a CUDA GPU. Asked in this process only when a `gpu` test is collected
    (importing torch costs seconds); trial processes are separate, so this initialises nothing
    they use."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` (pyproject.toml declares the marker) are skipped without a usable GPU."""
    gpu_tests = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu_tests and not _cuda_usable():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
        for item in gpu_tests:
            item.add_marker(skip)


@contextlib.contextmanager
def dashboard_server(*args: str, cwd: Path) -> Iterator[tuple[str, int]]:
    """`autotuner dashboard ARGS --port <a free port>` run from `cwd`: (its URL, its port) once it
    answers; stopped afterwards."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = subprocess.Popen(
        [sys.executable, "-m", "autotuner", "dashboard", *args, "--port", str(port)],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/studies", timeout=2) as response:
                    assert response.status == 200
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the dashboard did not start: {server.communicate()[0]}") from None
                time.sleep(0.3)
        yield url, port
    finally:
        server.terminate()
        server.wait(timeout=10)
