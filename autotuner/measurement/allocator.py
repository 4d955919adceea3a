"""The host memory allocator's settings every trial process runs with.

glibc's malloc serves an allocation above its mmap threshold with a fresh mapping and returns it
to the kernel when freed, and it raises the threshold as it sees large blocks freed (up to 32 MiB
on 64-bit). A training step allocates and frees the same large tensors every step, so a process
pays page faults and the zeroing of fresh pages at every step for as long as its threshold stays
below them, and where the threshold lands depends on the order its first blocks were freed in:
two processes of one config fault in different amounts, and what a fault costs depends on what
the kernel is doing with memory at the time. On a 2-core AMD VM (EPYC with AVX-512), the
quickstart's baseline and winner measured in lockstep rounds, alternating blocks of rounds with
and without these settings (`benchmarks/allocator.py`): the baseline's processes had a log sd of
0.093 with them and 0.117 without, one round's speedup 0.059 and 0.070.

So the fork server every trial process comes from (`autotuner.trials._forkserver`) fixes the
thresholds before it forks anything (`steady_allocator`, `mallopt`): blocks up to 256 MiB come
from the heap and stay there when freed, up to 1 GiB of free heap is kept rather than returned.
A trial's processes, its ranks and its loader workers are forked from it and inherit them. What
a study measures is then the job run with these settings, and the export says how to run it so
(`ENVIRONMENT`: the same settings as glibc's tunables, read at a process's start). A caller who
set glibc's malloc tunables themselves keeps theirs.

This module imports no framework.
"""

from __future__ import annotations

import ctypes
import os

MMAP_THRESHOLD = 256 << 20
"""Blocks up to this many bytes come from the heap, not from a mapping of their own."""
TRIM_THRESHOLD = 1 << 30
"""Free heap up to this many bytes is kept for the next allocation rather than returned."""
ENVIRONMENT = {
    "GLIBC_TUNABLES": f"glibc.malloc.mmap_threshold={MMAP_THRESHOLD}:glibc.malloc.trim_threshold={TRIM_THRESHOLD}"
}
"""The same settings for a process started from a shell: what an export's launch line sets."""
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def user_set() -> bool:
    """Whether this process's environment sets glibc's malloc tunables itself."""
    return "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "")


def steady_allocator() -> bool:
    """Fix this process's malloc thresholds (`MMAP_THRESHOLD`, `TRIM_THRESHOLD`), for it and for
    every process it forks; whether they were set: not where the C library is not glibc (it has
    no `mallopt`), nor where the caller's environment sets glibc's malloc tunables (`user_set`)."""
    if user_set():
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def assignments() -> str:
    """`GLIBC_TUNABLES=...`: what a shell line that starts a job as the study measured it sets."""
    return " ".join(f"{name}={value}" for name, value in ENVIRONMENT.items())
