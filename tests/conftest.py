"""What every test may use: one JAX compilation cache for the session, a trial launcher, the
storages a study can live in, and the markers (`e2e` for the end-to-end tests under `tests/e2e/`,
`gpu` for those that need an NVIDIA GPU, `slow` for the others that take 3 s or more on a 2-core
VM: `pytest -m "not e2e and not slow"` is the quick subset). Helpers the tests import are in
`tests/support/`."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import optuna
import pytest
import sqlalchemy

if TYPE_CHECKING:
    from autotuner.trials.launcher import TrialLauncher

# One JAX persistent compilation cache for the whole session, in a fresh folder: a JAX trial op by
# op (jit=off: the reference, most baselines) compiles each of its ~100 primitives in every process,
# and a jitted step its whole graph; with the cache, each is compiled once a session and loaded by
# every later process (this one, the trial processes, the CLI's) that compiles the same (XLA's
# cache key holds the computation, the compile options and XLA_FLAGS: a flag bundle compiles anew).
# The same executables run, so what the tests check of them is unchanged; only the repeated
# compile time goes (benchmarks/gpu.py's --tiny JAX study does the same). Set in the environment
# before anything imports JAX, so the processes the tests start inherit it; a cache the caller
# chose is left as it is. pytest-xdist's workers share it: they inherit the environment of the
# process that starts them, which imported this file first.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _jax_cache = tempfile.mkdtemp(prefix="autotuner-tests-jax-cache-")

    def _remove_jax_cache(owner: int = os.getpid()) -> None:
        if os.getpid() == owner:  # not in a process forked from this one that exits normally
            shutil.rmtree(_jax_cache, ignore_errors=True)

    atexit.register(_remove_jax_cache)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _jax_cache
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # the primitives compile in milliseconds
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"

# One thread a trial process: the suite runs on as many pytest-xdist workers as there are cores
# (pyproject.toml), each starting trial processes, and a trial's framework would otherwise start a
# thread per core, so that two workers' trials on two cores ran four threads that wait for each
# other at every barrier (OpenMP's threads spin while they wait). What the tests check of a trial
# does not depend on its thread count; the figures autotuner measures for a user keep the user's
# settings (`autotuner.measurement.hardware.thread_settings`). A count the caller set is kept.
for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

E2E = Path(__file__).resolve().parent / "e2e"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture(scope="session")
def launcher() -> TrialLauncher:
    """The trial launcher of the session, every backend's runner preloaded in its fork server
    (multiprocessing keeps one fork server a process, and its preload is the first launcher's)."""
    from autotuner.backends import BACKENDS
    from autotuner.trials.launcher import TrialLauncher

    return TrialLauncher([backend.runner for backend in BACKENDS.values()])


def postgres_url() -> str:
    """The PostgreSQL server the storage tests use (`AUTOTUNER_TEST_POSTGRES_URL`); skipped
    without one, failed in CI, where one must be there."""
    url = os.environ.get("AUTOTUNER_TEST_POSTGRES_URL")
    in_ci = bool(os.environ.get("CI"))
    if not url:
        if in_ci:
            pytest.fail("CI is set but AUTOTUNER_TEST_POSTGRES_URL is not: the PostgreSQL tests must run in CI")
        pytest.skip("AUTOTUNER_TEST_POSTGRES_URL is not set")
    try:
        engine = sqlalchemy.create_engine(url)
        with engine.connect():
            pass
        engine.dispose()
    except Exception as exc:
        message = f"PostgreSQL at {url} is unreachable: {' '.join(str(exc).split())[:200]}"
        if in_ci:
            pytest.fail(message)
        pytest.skip(message)
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def storage_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(storage URL, a study name unique to this test run); the study is deleted afterwards."""
    name = f"workers_{uuid.uuid4().hex[:12]}"
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/shared.db", name
        return
    url = postgres_url()
    try:
        yield url, name
    finally:
        try:
            optuna.delete_study(study_name=name, storage=url)
        except KeyError:
            pass


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
    """The tests under `tests/e2e/` are marked `e2e`; those marked `gpu` (pyproject.toml declares
    both markers) are skipped without a usable GPU."""
    for item in items:
        if E2E in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.e2e)
    gpu_tests = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu_tests and not _cuda_usable():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
        for item in gpu_tests:
            item.add_marker(skip)


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[None]:
    """This process as the only rank of a gloo group, as a trial's rank is one of its group."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
