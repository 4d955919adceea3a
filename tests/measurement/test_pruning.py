"""The rule that stops a losing trial early, on the time its steps take, decided on a scripted
clock: stretches judged behind, the evidence length, compiled steps, a fast window's exemption,
the contention hold-off, and what a pruned measurement returns. A pruned trial in a search is
tests/e2e/test_pruning.py's."""

from __future__ import annotations

import pytest

from autotuner.measurement.measured_phase import measure_throughput
from autotuner.measurement.pruning import CALIBRATION, TRIAL_NOISE, WARM_UP, WINDOW, PruneBound, Pruner, Stopped
from autotuner.measurement.timing import Measuring, WindowTimer

SAMPLES = 100
"""Samples a step in these tests."""


class Clock:
    """A clock that moves only when told (each scripted step takes its time)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _pruner(clock: Clock, best: float = 1000.0, after: int = 2, steps: int = 10, **kw: object) -> Pruner:
    return Pruner(PruneBound(best, after, steps, min_window_s=0.0), SAMPLES, clock=clock, **kw)  # type: ignore[arg-type]


def _steps(pruner: Pruner, clock: Clock, seconds: list[float]) -> None:
    for s in seconds:
        clock.now += s
        pruner.stepped()


def test_the_evidence_length_is_the_bests_window_and_the_floor_the_margin_below_it() -> None:
    bound = PruneBound(best=1000.0, after=2, steps=10, min_window_s=0.5)
    assert bound.floor == pytest.approx(1000.0 * (1 - TRIAL_NOISE))
    assert bound.evidence_s(100) == pytest.approx(1.0)  # 10 steps of 100 samples at 1,000/s
    assert PruneBound(best=1e6, after=2, steps=10, min_window_s=0.5).evidence_s(100) == 0.5  # the shortest window


def test_a_config_ten_times_slower_is_stopped_two_of_the_bests_windows_after_its_warm_ups_first_step() -> None:
    clock = Clock()
    pruner = _pruner(clock)  # the best's window: 10 steps of 0.1 s = 1 s
    pruner.begin(WARM_UP, 2)
    _steps(pruner, clock, [1.0])  # one step at a tenth of the best's pace: as long as the best's window
    assert pruner.behind == [pytest.approx(100.0)]
    with pytest.raises(Stopped) as stopped:
        _steps(pruner, clock, [1.0])
    assert clock.now == pytest.approx(2.0)
    assert "its fastest of 2 stretches judged, 100/s, is 90% behind the best so far, 1,000/s" in stopped.value.reason
    assert pruner.bound_rate == pytest.approx(100.0)
    assert pruner.bound_rate < pruner.floor


def test_a_stretch_shorter_than_the_bests_window_is_no_evidence_outside_a_window() -> None:
    clock = Clock()
    pruner = _pruner(clock)
    pruner.begin(CALIBRATION, 1)
    _steps(pruner, clock, [0.5])  # half the pace, but over half the evidence length
    pruner.ended(0.5)
    assert pruner.behind == [] and not pruner.fast
    pruner.begin(WARM_UP, 3)
    _steps(pruner, clock, [0.5, 0.5])  # over 1 s now: shown
    assert pruner.behind == [pytest.approx(200.0)]


def test_a_window_is_behind_as_soon_as_its_steps_cannot_finish_at_the_floor() -> None:
    clock = Clock()
    pruner = _pruner(clock, best=1000.0)  # E = 1 s
    pruner.begin(WINDOW, 4)  # 400 samples need 400 / 850 = 0.47 s at the floor
    _steps(pruner, clock, [0.1, 0.1, 0.1, 0.1])
    pruner.ended(0.4)  # 1,000/s: fast, whatever its length
    assert pruner.fast and pruner.behind == []
    pruner = _pruner(clock, best=1000.0)
    pruner.begin(WINDOW, 4)
    _steps(pruner, clock, [0.3, 0.3])  # 0.6 s for 2 of 4 steps: the window cannot end at the floor
    assert len(pruner.behind) == 1


def test_a_measured_window_counts_at_its_end_whatever_its_length() -> None:
    clock = Clock()
    pruner = _pruner(clock, best=1000.0, after=2)  # E = 1 s: these windows are a quarter of it
    pruner.begin(WINDOW, 2)
    _steps(pruner, clock, [0.116])  # one step at 862/s: the window can still end at the floor
    assert pruner.behind == []
    _steps(pruner, clock, [0.13])
    pruner.ended(0.246)  # 813/s, under the floor of 850/s
    assert pruner.behind == [pytest.approx(200 / 0.246)]
    pruner.begin(WINDOW, 2)
    _steps(pruner, clock, [0.12])
    with pytest.raises(Stopped):
        _steps(pruner, clock, [0.12])  # 0.24 s for 200 samples: it cannot end at the floor


def test_a_fast_stretch_exempts_the_trial_for_good() -> None:
    clock = Clock()
    pruner = _pruner(clock)
    pruner.begin(WINDOW, 10)
    _steps(pruner, clock, [0.1] * 10)
    pruner.ended(1.0)
    assert pruner.fast
    for _ in range(4):  # every later stretch behind: it still runs on
        pruner.begin(WINDOW, 10)
        _steps(pruner, clock, [1.0] * 10)
        pruner.ended(10.0)
    assert len(pruner.behind) >= 4


def test_a_step_that_compiled_is_no_evidence() -> None:
    clock, compiled = Clock(), [0]

    def compiling_step(seconds: float) -> None:
        compiled[0] += 1
        _steps(pruner, clock, [seconds])

    pruner = _pruner(clock, compilations=lambda: compiled[0])
    pruner.begin(WARM_UP, 4)
    compiling_step(30.0)  # a recompile, 30 times the best's window
    compiling_step(30.0)
    assert pruner.behind == []
    _steps(pruner, clock, [0.1] * 10)  # then at the best's pace
    pruner.ended()
    assert pruner.fast and pruner.behind == []


def test_other_work_on_the_cpu_holds_the_rule_off() -> None:
    clock = Clock()
    pruner = _pruner(clock, held_off=lambda: 0.4)
    pruner.begin(WINDOW, 10)
    _steps(pruner, clock, [1.0] * 10)
    pruner.ended(10.0)
    assert len(pruner.behind) >= 2 and pruner.held_off_shares and pruner.held_off_shares[0] == 0.4


def test_pruning_off_never_stops() -> None:
    clock = Clock()
    pruner = _pruner(clock, after=0)
    pruner.begin(WINDOW, 10)
    _steps(pruner, clock, [1.0] * 10)
    pruner.ended(10.0)
    assert pruner.behind


def test_a_pruned_measurement_keeps_what_was_judged_and_the_bound() -> None:
    clock = Clock()

    def step() -> None:
        clock.now += 1.0  # a tenth of the best's pace: 100 samples a second

    pruner = _pruner(clock, best=1000.0, steps=10)
    result = measure_throughput(
        WindowTimer(step, lambda: None, watch=pruner),
        Measuring(warmup_steps=3, steps=10, windows=5, samples_per_step=SAMPLES),
    )
    assert result.stopped is not None and result.windows == 0  # stopped in the warm-up's last steps
    assert result.window_samples_per_s == [pytest.approx(100.0)] * 2
    assert result.bound == pytest.approx(100.0) and result.floor == pytest.approx(850.0)
    assert result.steps_taken == 3


def test_a_window_stopped_inside_leaves_the_windows_before_it() -> None:
    clock, pace = Clock(), [0.1]

    def step() -> None:
        clock.now += pace[0]

    pruner = _pruner(clock, best=1000.0, steps=10)
    timer = WindowTimer(step, lambda: None, watch=pruner, after_window=lambda: pace.__setitem__(0, 1.0))
    result = measure_throughput(timer, Measuring(warmup_steps=0, steps=10, windows=5, samples_per_step=SAMPLES))
    # the first window at the best's pace is fast: the slow windows after it never prune
    assert result.stopped is None and result.windows == 5
