"""A busy machine, noticed: a trial measured while other work took the CPU is run again once the
machine is quiet, or kept with the flag `contended`, and the search says so in one line."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest

from autotuner.measurement.contention import CONTENDED_SHARE
from autotuner.measurement.telemetry import MIN_OTHERS_WALL_S
from tests.support.studies import SMALL_SPEC, load_study, run_cli, write_spec


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
        workload="tests.support.study_workloads:busy_machine",
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
    study = load_study(tmp_path)
    baseline = study.trials[0].user_attrs
    assert baseline["contention_first_run"] > CONTENDED_SHARE  # about one core of two
    assert baseline["contended"] is flagged and (baseline["contention"] > CONTENDED_SHARE) is flagged
    assert baseline["measured_s"] >= MIN_OTHERS_WALL_S  # its windows were long enough to tell
