"""The allocator settings trial processes run with: a block freed and allocated again comes back
from the heap, with no page fault, where glibc's defaults map it afresh every time; the fork
server sets them before it forks; a caller's own tunables are kept; the export's launch line
says them. Each case in a fresh interpreter (the settings are the process's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from autotuner.backends.pytorch.integrations import ALLOCATOR_LINE
from autotuner.measurement.allocator import ENVIRONMENT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc, on Linux")

FAULTS = """
import ctypes, json, resource
{setup}
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
size = 64 << 20
def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(block)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults()
print(json.dumps({{"set": {result}, "faults": [faults() for _ in range(3)]}}))
"""
"""Allocates, writes and frees a 64 MiB block four times: the page faults of the last three."""


def _run(setup: str, result: str = "None", env: dict[str, str] | None = None) -> dict[str, object]:
    code = FAULTS.format(setup=setup, result=result)
    environment = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"} | (env or {})
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_glibcs_defaults_fault_a_large_block_in_again_at_every_allocation() -> None:
    found = _run("")
    assert all(f > 10_000 for f in found["faults"]), found  # 64 MiB is 16,384 pages of 4 KiB


def test_the_steady_settings_keep_it_in_the_heap() -> None:
    found = _run("from autotuner.measurement.allocator import steady_allocator; done = steady_allocator()", "done")
    assert found["set"] is True and all(f < 100 for f in found["faults"]), found


def test_the_fork_server_sets_them_before_it_forks() -> None:
    found = _run("import autotuner.trials._forkserver")
    assert all(f < 100 for f in found["faults"]), found


def test_a_callers_own_tunables_are_kept() -> None:
    setup = "from autotuner.measurement.allocator import steady_allocator; done = steady_allocator()"
    found = _run(setup, "done", env=dict(ENVIRONMENT))
    assert found["set"] is False and all(f < 100 for f in found["faults"]), found  # glibc read the caller's


def test_the_exports_launch_line_gives_a_process_the_same_allocator() -> None:
    """The export header's `NAME=value` set where a job is launched, nothing of autotuner imported:
    glibc reads it at the process's start and keeps the block in the heap as the trials did."""
    words = ALLOCATOR_LINE.split()
    (assignment,) = [w for w in words if w.startswith("GLIBC_TUNABLES=")]
    name, value = assignment.split("=", 1)
    found = _run("", env={name: value})
    assert all(f < 100 for f in found["faults"]), found


def test_a_caller_who_names_any_malloc_tunable_keeps_glibcs_own_thresholds() -> None:
    """How `benchmarks/allocator.py` measures glibc's defaults: the fork server leaves them be."""
    found = _run("import autotuner.trials._forkserver", env={"GLIBC_TUNABLES": "glibc.malloc.perturb=0"})
    assert all(f > 10_000 for f in found["faults"]), found
