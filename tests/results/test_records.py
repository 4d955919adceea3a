"""Stored trials read back and ranked: a config measured again comes before one that was not."""

from __future__ import annotations

from autotuner.results.evidence import Remeasurement
from autotuner.results.records import TrialRecord, best, ranked


def _trial(number: int, rate: float, role: str = "search", rerun: list[float] | None = None) -> TrialRecord:
    remeasured = None
    if rerun is not None:
        remeasured = Remeasurement([rate], [rerun], speedups=[rate / 1000.0], baseline_windows=[1000.0] * len(rerun))
    return TrialRecord(number, "COMPLETE", {}, {}, role, "ok", "", True, {"throughput": rate}, remeasured)


def test_a_config_re_measured_is_declared_best_over_one_left_at_its_single_trial() -> None:
    """#2 came out within the noise of #1 in its one trial and was left out of a re-measurement
    that ran out of time: #1, measured again, is the best, though #2's trial figure is higher."""
    base = _trial(0, 1000.0, role="baseline", rerun=[1000.0, 1000.0])
    measured = _trial(1, 3000.0, rerun=[3000.0, 3000.0])
    left_out = _trial(2, 3100.0)
    assert [t.number for t in ranked([base, measured, left_out])] == [1, 2, 0]
    assert best([base, measured, left_out]) is measured


def test_a_re_measured_config_slower_than_the_baseline_is_not_the_best() -> None:
    base = _trial(0, 1000.0, role="baseline", rerun=[1000.0, 1000.0])
    slower = _trial(1, 900.0, rerun=[900.0, 900.0])
    assert best([base, slower]) is base


def test_without_a_re_measurement_the_trials_figures_rank() -> None:
    base, faster, fastest = _trial(0, 1000.0, role="baseline"), _trial(1, 2000.0), _trial(2, 3000.0)
    assert [t.number for t in ranked([base, faster, fastest])] == [2, 1, 0]
