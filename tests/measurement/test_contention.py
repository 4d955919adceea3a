"""A busy machine, measured: the share of a trial's cores other work took (told once the span is
long enough to tell), the load of the machine, and waiting for it to be quiet. What the search
decides with them is tests/search/test_dispatch.py's."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from autotuner.measurement import contention as contention_module
from autotuner.measurement.contention import CONTENDED_SHARE, contention, machine_load, wait_until_quiet
from autotuner.measurement.telemetry import MIN_OTHERS_WALL_S, CpuSampler


def test_contention_is_the_share_of_the_trials_cores_other_work_took() -> None:
    assert contention({"cpu_others_cores": 0.5, "cpu_cores": 2.0}) == 0.25
    assert contention({"cpu_cores": 2.0}) is None  # not measured (no /proc/stat)
    assert contention({}) is None


def test_the_cpu_sampler_counts_the_work_outside_its_process_group() -> None:
    """This process's own work is the group's; over too short a span the others' is not told."""
    with CpuSampler() as sampler:
        end = sum(range(300_000))
    assert end > 0 and "cpu_others_cores" not in sampler.summary()  # a few ms: ticks would decide it
    with CpuSampler() as sampler:
        deadline = time.monotonic() + MIN_OTHERS_WALL_S
        while time.monotonic() < deadline:  # work of our own, as long as it takes to be told
            pass
    assert sampler.summary()["cpu_others_cores"] >= 0.0
    load = machine_load(0.2)
    assert load is not None and 0.0 <= load <= 1.0
    assert wait_until_quiet(0.0, interval_s=0.05) is not None


def test_a_process_of_the_group_that_ended_meanwhile_is_the_groups_work_not_other_work() -> None:
    """A compile worker its pool quiesced, a loader worker that was not persistent: the CPU a child
    of the group used before it ended and was reaped counts as the group's (its parent's cutime)."""
    # Measured in a process that leads its own group, as a trial process does: the test runner's
    # group holds other tests' processes, which may end and be reaped outside it meanwhile.
    trial = (
        "import subprocess, sys\n"
        "from autotuner.measurement.telemetry import CpuSampler\n"
        "burn = 'import time\\nwhile time.process_time() < 0.5: pass'\n"
        "with CpuSampler() as sampler:\n"
        "    subprocess.run([sys.executable, '-c', burn], check=True)\n"  # in this group, reaped here
        "print(sampler.group_cpu_s)\n"
    )
    done = subprocess.run([sys.executable, "-c", trial], check=True, capture_output=True, text=True, process_group=0)
    assert float(done.stdout) >= 0.45


def test_the_share_other_work_took_so_far_is_told_once_the_span_is_long_enough() -> None:
    """As a trial's windows go on (the pruning rule reads it after each): over a tenth of a second
    a tick or two of anything would read as 10% of a core, so nothing is told, not even processes of
    their own session spinning on every core; over `MIN_OTHERS_WALL_S` they are. Measured in a
    process that leads its own group, as a trial process does (the test runner's group holds other
    tests' processes, whose reaped CPU would count as the group's)."""
    trial = f"""
import json, subprocess, sys, time
from autotuner.measurement.telemetry import CpuSampler, usable_cpus
spin = "import time\\nend = time.monotonic() + 30\\nwhile time.monotonic() < end: pass"
others = [subprocess.Popen([sys.executable, "-c", spin], start_new_session=True) for _ in range(len(usable_cpus()))]
try:
    time.sleep(0.5)  # started, spinning
    entered = time.perf_counter()
    with CpuSampler() as sampler:
        time.sleep({MIN_OTHERS_WALL_S / 5})  # too short for a trial's contention to be told
        early = sampler.others_share()
        span = time.perf_counter() - entered  # the sampler's span at that read, at most
        time.sleep({MIN_OTHERS_WALL_S})
        later = sampler.others_share()
finally:
    for other in others:
        other.kill()
        other.wait()
print(json.dumps([early, span, later]))
"""
    done = subprocess.run([sys.executable, "-c", trial], check=True, capture_output=True, text=True, process_group=0)
    early, span, later = json.loads(done.stdout)
    # a loaded machine may wake the process late, past the shortest span that is told
    assert early == 0.0 or span >= MIN_OTHERS_WALL_S, (early, span)
    assert later > CONTENDED_SHARE, later


def test_waiting_for_a_quiet_machine_ends_at_the_first_quiet_reading_or_at_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    readings = iter([0.6, 0.4, 0.05, 0.9])
    asked: list[float] = []

    def machine_load(interval_s: float) -> float | None:
        asked.append(interval_s)
        return next(readings)

    monkeypatch.setattr(contention_module, "machine_load", machine_load)
    assert wait_until_quiet(3600.0, interval_s=0.25) == 0.05  # the third reading is quiet: no fourth
    assert asked == [0.25, 0.25, 0.25]
    monkeypatch.setattr(contention_module, "machine_load", lambda interval_s: 0.9)
    assert wait_until_quiet(0.0) == 0.9  # busy, and no time to wait: the one reading it took
    monkeypatch.setattr(contention_module, "machine_load", lambda interval_s: None)
    assert wait_until_quiet(3600.0) is None  # without /proc/stat nothing can be waited for
