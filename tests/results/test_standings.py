"""Which re-measured configs are still in contention at the end, and how many intervals the
winner's is stated jointly with."""

from __future__ import annotations

from autotuner.results.evidence import Remeasurement
from autotuner.results.standings import contenders, joint_among, standing


def _rounds(*speedups: float, error: str | None = None) -> Remeasurement:
    return Remeasurement(throughputs=[1000.0 * s for s in speedups], speedups=list(speedups), error=error)


def test_a_winner_that_clears_every_other_config_is_stated_on_its_own() -> None:
    found = {4: _rounds(3.0, 3.05, 2.95), 7: _rounds(2.0, 2.05, 1.95), 0: Remeasurement(throughputs=[1000.0] * 3)}
    assert joint_among(found) == {4: 1, 7: 1}  # the baseline (no speedups) takes no part


def test_configs_within_the_noise_of_the_winner_are_stated_jointly_with_it() -> None:
    found = {
        4: _rounds(3.0, 3.2, 2.9),
        7: _rounds(3.1, 2.9, 3.0),  # within the noise of #4
        9: _rounds(1.5, 1.55, 1.45),  # cleared by the winner's interval
        11: _rounds(3.5, 3.6, error="re-run 3: crash"),  # failed: not a candidate
    }
    assert contenders({n: standing(found[n]) for n in (4, 7, 9)}) == [4, 7]
    assert joint_among(found) == {4: 2, 7: 2, 9: 1}


def test_a_config_of_one_round_cannot_be_cleared_and_so_counts() -> None:
    found = {4: _rounds(3.0, 3.05, 2.95), 7: _rounds(1.2)}
    assert joint_among(found) == {4: 2, 7: 2}
    assert joint_among({}) == {}
