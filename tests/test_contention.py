"""A busy machine, noticed: a trial measured while other work took the CPU is run again once the
machine is quiet, or kept with the flag `contended`, and the search says so in one line."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from autotuner.measurement.contention import CONTENDED_SHARE, contention, machine_load, wait_until_quiet
from autotuner.measurement.telemetry import MIN_OTHERS_WALL_S, CpuSampler, usable_cpus
from tests.conftest import SMALL_SPEC, run_cli, write_spec


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


def test_the_share_other_work_took_so_far_is_told_once_the_span_is_long_enough() -> None:
    """As a trial's windows go on (the pruning rule reads it after each): over a tenth of a second
    a tick or two of anything would read as 10% of a core, so nothing is told, not even processes of
    their own session spinning on every core; over `MIN_OTHERS_WALL_S` they are."""
    spin = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass"
    others = [subprocess.Popen([sys.executable, "-c", spin], start_new_session=True) for _ in range(len(usable_cpus()))]
    try:
        time.sleep(0.5)  # started, spinning
        with CpuSampler() as sampler:
            time.sleep(MIN_OTHERS_WALL_S / 5)  # too short for a trial's contention to be told
            early = sampler.others_share()
            time.sleep(MIN_OTHERS_WALL_S)
            later = sampler.others_share()
    finally:
        for other in others:
            other.kill()
            other.wait()
    assert early == 0.0 and later > CONTENDED_SHARE, (early, later)


def _stop_other_work(folder: Path) -> None:
    pid_file = folder / "other-work"
    if pid_file.exists():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


@pytest.mark.parametrize(
    ("seconds", "quiet_wait", "flagged"), [(20.0, 60, False), (120.0, 0, True)], ids=["quiet-again", "busy-throughout"]
)
def test_a_trial_measured_beside_other_work_is_run_again_or_flagged(
    tmp_path: Path, seconds: float, quiet_wait: float, flagged: bool
) -> None:
    # The third process to train (after the fp32 reference's two: the baseline trial) starts a
    # CPU-bound process of its own session in its warm-up, for `seconds`: through its calibration and
    # windows, which other work slows many times over on 2 cores. Long enough to outlast them with
    # margin: with 8 s, two full runs of the suite saw no contention at all, which is what happens
    # when the windows (slowed, and measured again at their pace when a slowed calibration sized
    # them too short) end after the other work has.
    spec = write_spec(
        tmp_path,
        workload="tests.study_workloads:busy_machine",
        workload_args={"folder": str(tmp_path), "at": 3, "seconds": seconds, **SMALL_SPEC["workload_args"]},
        budget={"trials": 1},
        trial={**SMALL_SPEC["trial"], "windows": 3, "min_window_s": 0.5, "quiet_wait": quiet_wait},
    )
    try:
        done = run_cli("search", "--spec", str(spec), cwd=tmp_path, timeout=240)
    finally:
        _stop_other_work(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "other-work").exists()
    warnings = [line for line in done.stderr.splitlines() if "other work took" in line]
    assert len(warnings) == 1, done.stderr
    assert warnings[0].startswith("autotuner: warning: trial 0: other work took ")
    assert ("flagged contended" in warnings[0]) is flagged, warnings[0]
    print(warnings[0])  # pytest -rP shows it
    study = optuna.load_study(study_name="small", storage=f"sqlite:///{tmp_path}/runs/small/study.db")
    baseline = study.trials[0].user_attrs
    assert baseline["contention_first_run"] > CONTENDED_SHARE  # about one core of two
    assert baseline["contended"] is flagged and (baseline["contention"] > CONTENDED_SHARE) is flagged
    assert baseline["measured_s"] >= MIN_OTHERS_WALL_S  # its windows were long enough to tell
