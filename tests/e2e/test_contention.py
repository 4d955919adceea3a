"""A busy machine, noticed end to end: a trial measured while other work took the CPU is run
again, and kept with the flag `contended` while that work goes on; the search says so in one line."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from autotuner.measurement.contention import CONTENDED_SHARE
from autotuner.measurement.telemetry import MIN_OTHERS_WALL_S
from tests.support.studies import SMALL_SPEC, load_study, run_cli, write_spec


def _stop_other_work(folder: Path) -> None:
    pid_file = folder / "other-work"
    if pid_file.exists():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_trial_measured_beside_other_work_is_run_again_and_flagged_while_the_work_goes_on(tmp_path: Path) -> None:
    # The third process to train (after the fp32 reference's two: the baseline trial) starts a
    # CPU-bound process of its own session in its warm-up, for two minutes: through its calibration
    # and windows, which other work slows many times over on 2 cores, and through the run again,
    # which the search starts at once (`trial.quiet_wait` 0). Whatever else the machine runs, the
    # first run is contended and so is the second: it is recorded, flagged. The decisions for a
    # machine that became quiet, or a second run that failed, are tests/search/test_dispatch.py's.
    spec = write_spec(
        tmp_path,
        workload="tests.support.study_workloads:busy_machine",
        workload_args={"folder": str(tmp_path), "at": 3, "seconds": 120.0, **SMALL_SPEC["workload_args"]},
        budget={"trials": 1},
        trial={**SMALL_SPEC["trial"], "windows": 3, "min_window_s": 0.5, "quiet_wait": 0},
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
    assert "flagged contended" in warnings[0], warnings[0]
    print(warnings[0])  # pytest -rP shows it
    baseline = load_study(tmp_path).trials[0].user_attrs
    assert baseline["contention_first_run"] > CONTENDED_SHARE  # about one core of two
    assert baseline["contended"] is True and baseline["contention"] > CONTENDED_SHARE
    assert baseline["measured_s"] >= MIN_OTHERS_WALL_S  # its windows were long enough to tell
