"""The rule that stops a losing trial early: when a trial is behind the best so far, and windows
that stop when asked count what was measured. A pruned trial in a search is
tests/e2e/test_pruning.py's."""

from __future__ import annotations

from autotuner.measurement.pruning import TRIAL_NOISE, behind
from autotuner.measurement.timing import Measuring, WindowTimer, measure_throughput


def test_a_trial_is_behind_when_even_its_fastest_window_is_further_than_the_trial_noise() -> None:
    best = 1000.0
    slow = best * (1 - TRIAL_NOISE) * 0.9
    assert behind([slow, slow * 0.95], best, after=2) is not None
    assert behind([slow], best, after=2) is None  # not enough windows yet
    assert behind([slow, best * (1 - TRIAL_NOISE) * 1.01], best, after=2) is None  # one window within reach
    assert behind([slow, slow], best, after=0) is None  # pruning off
    reason = behind([500.0, 450.0], best, after=2)
    assert reason == (
        "its fastest of 2 windows, 500/s, is 50% behind the best so far, 1,000/s: "
        "more than the 15% two trials of one config differ by"
    )


def test_windows_stop_when_asked_and_count_what_was_measured() -> None:
    asked: list[list[float]] = []

    def stop(rates: list[float]) -> str | None:
        asked.append(list(rates))
        return "enough" if len(rates) == 2 else None

    result = measure_throughput(
        WindowTimer(lambda: None, lambda: None),
        Measuring(warmup_steps=0, steps=2, windows=5, samples_per_step=1),
        stop=stop,
    )
    assert [len(r) for r in asked] == [1, 2]
    assert (result.windows, len(result.window_samples_per_s), len(result.window_spans)) == (2, 2, 2)
    assert result.stopped == "enough"
