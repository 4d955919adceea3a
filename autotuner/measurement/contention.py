"""A busy machine, noticed: a trial measured while other work took a share of its CPU (or its
GPU) is not ranked by that figure silently.

During a trial's timed windows its `autotuner.measurement.telemetry.CpuSampler` measures the cores that
everything outside the trial's process group kept busy (`cpu_others_cores`: other processes,
interrupts, a hypervisor's steal), and on a GPU its `GpuSampler` the SM utilisation NVML gives
other processes on the device (`gpu_others_sm_util_mean`). Beyond `CONTENDED_SHARE` of the
trial's cores (or of the device) the trial is contended: the search says so in one line, waits
until the machine is quiet (`wait_until_quiet`, at most `trial.quiet_wait` seconds) and runs it
once more. The second run is recorded, flagged `contended` if the machine never got quiet or got
busy again.

Why a threshold on other work rather than on the figure: a step that another process slows down
looks like a slow config, and only the machine can tell the two apart. On 2 cores, one
`while True: pass` beside a small step slows it many times over.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from autotuner.measurement.telemetry import cpus_busy_seconds, usable_cpus

CONTENDED_SHARE = 0.10
"""The share of a trial's cores that other work may take during its windows before the trial is
contended. An idle machine's background (the search process, the kernel) stays well below it."""
QUIET_INTERVAL_S = 1.0
"""How long each look at the machine lasts while waiting for it to be quiet."""


def contention(metrics: Mapping[str, Any]) -> float | None:
    """The share of the trial's resources that other work took during its windows, from the
    trial's metrics: of its cores, and on a GPU of the device's SMs (NVML's per-process
    utilisation of other processes), the larger; None where neither was measured."""
    shares = []
    others, cores = metrics.get("cpu_others_cores"), metrics.get("cpu_cores")
    if others is not None and cores:
        shares.append(float(others) / float(cores))
    if (sm := metrics.get("gpu_others_sm_util_mean")) is not None:
        shares.append(float(sm) / 100.0)
    return max(shares, default=None)


def machine_load(interval_s: float = QUIET_INTERVAL_S) -> float | None:
    """The share of this process's usable cores that were busy over the next `interval_s` seconds
    (anything on them: nothing of the search's runs meanwhile but this process, which sleeps);
    None without /proc/stat."""
    cpus = usable_cpus()
    before, began = cpus_busy_seconds(cpus), time.monotonic()
    time.sleep(interval_s)
    after, elapsed = cpus_busy_seconds(cpus), time.monotonic() - began
    if before is None or after is None:
        return None
    # over the time that really passed (a loaded machine oversleeps), and at most every core: the
    # kernel's counters move in ticks, which over a fifth of a second can add up to a little more
    return min(1.0, (after - before) / (max(elapsed, interval_s) * len(cpus)))


def wait_until_quiet(max_wait_s: float, interval_s: float = QUIET_INTERVAL_S) -> float | None:
    """Wait, up to `max_wait_s` seconds, until the machine's load over one interval is at most
    `CONTENDED_SHARE`; the last load seen (None without /proc/stat)."""
    deadline = time.monotonic() + max_wait_s
    while True:
        load = machine_load(min(interval_s, max(0.05, deadline - time.monotonic())))
        if load is None or load <= CONTENDED_SHARE or time.monotonic() >= deadline:
            return load
