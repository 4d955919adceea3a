"""Progress everywhere: a trial process tells its phase to the search's status line, and the
search says how long its trials have left."""

from __future__ import annotations

import io
import time
from pathlib import Path

from rich.console import Console

from autotuner.measurement.measured_phase import measure_throughput
from autotuner.measurement.timing import Measuring, WindowTimer
from autotuner.output.console import PHASE_POLL_S, SearchReporter
from autotuner.results.records import TrialRecord
from autotuner.trials.progress import PhaseFile, duration, phase_path, read_phase, time_left


def test_a_phase_file_holds_the_last_phase_whole(tmp_path: Path) -> None:
    path = tmp_path / "phase.txt"
    assert read_phase(path) is None
    phase = PhaseFile(str(path))
    phase("warm-up, 3 steps")
    phase("window 2 of 5")
    assert read_phase(path) == "window 2 of 5"
    assert [p.name for p in tmp_path.iterdir()] == ["phase.txt"]  # no temporary left behind
    PhaseFile(None)("nothing")  # no path: nothing written, nothing raised
    PhaseFile(str(tmp_path / "gone" / "phase.txt"))("a folder removed meanwhile: never fails the trial")


def test_the_measured_phase_tells_each_phase_outside_the_timed_windows() -> None:
    told: list[str] = []
    measure_throughput(
        WindowTimer(lambda: time.sleep(0.001), lambda: None),
        Measuring(warmup_steps=2, steps=2, windows=3, samples_per_step=1, min_window_s=0.001),
        phase=told.append,
    )
    assert told == ["warm-up, 2 steps", "calibration", "window 1 of 3", "window 2 of 3", "window 3 of 3"]


def test_time_left_extrapolates_the_trials_still_in_the_budget() -> None:
    assert time_left(30.0, 3, 14) == 110.0
    assert time_left(30.0, 0, 14) is None
    assert time_left(30.0, 14, 14) == 0.0
    assert [duration(s) for s in (4.4, 65, 3725)] == ["4s", "1m05s", "1h02m"]


def test_the_status_line_shows_the_trials_phase_and_the_time_left(tmp_path: Path) -> None:
    out = io.StringIO()
    reporter = SearchReporter(Console(file=out, force_terminal=True, width=200, highlight=False, color_system=None))
    reporter.phase_file = phase_path(tmp_path)  # runs/<name>/progress/<pid>.txt
    # The first trial began 10 s into the search (start-up, the reference) and took 5 s.
    first = TrialRecord(0, "COMPLETE", {"precision": "fp32"}, {}, "baseline", "ok", "", True, {"wall_s": 5.0})
    reporter.trial(first, ran=1, budget=14, elapsed_s=15.0, best=None, baseline=None)
    assert "(1m05s left)" in out.getvalue()  # 13 more trials at 5 s each
    done = TrialRecord(3, "COMPLETE", {"precision": "fp32"}, {}, "search", "ok", "", True, {"wall_s": 4.0})
    reporter.trial(done, ran=4, budget=14, elapsed_s=30.0, best=None, baseline=None)
    assert "(50s left)" in out.getvalue()  # 20 s for 4 trials: 10 more at 5 s
    with reporter.running("trial 5/14: precision=bf16"):
        PhaseFile(str(reporter.phase_file))("window 2 of 5")
        time.sleep(PHASE_POLL_S * 6)
    shown = out.getvalue()
    assert "trial 5/14: precision=bf16 (trials: about 50s left): window 2 of 5" in shown
    reporter.close()
    assert not (tmp_path / "progress").exists()  # the search leaves no phase file behind
