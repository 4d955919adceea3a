"""The export's promise and the promise check's verdict (`autotuner.results.promise`): what was
promised, kept or not kept or undecided, the looks' levels, the rounds a decision needs."""

from __future__ import annotations

import math
import statistics

import pytest

from autotuner.measurement.interval import LEVEL, Interval, stated_interval
from autotuner.results.promise import (
    Promised,
    Verdict,
    checked_interval,
    first_decision,
    judge,
    look_level,
    rounds_to_decide,
    verdict_at,
)

EXPORT = [2.5, 2.4, 2.45]
"""An export's rounds: 2.45x, 90% interval 2.35-2.56x as stated; widened by 10%, 2.13-2.81x."""


def test_kept_means_within_the_exports_interval_widened_by_the_tolerance() -> None:
    export = Interval(2.0, 1.9, 2.1, 5)
    promised = Promised.of(export, 2.0, 0.10)
    assert promised is not None and (promised.low, promised.high) == pytest.approx((1.9 / 1.1, 2.1 * 1.1))
    here = Interval(1.8, 1.74, 1.86, 5)  # 10% below the export's speedup: within its promise widened by 10%
    assert judge(here, promised) is Verdict.KEPT
    tighter = Promised.of(export, 2.0, 0.05)
    assert tighter is not None and judge(here, tighter) is Verdict.UNDECIDED  # 1.74 is below 1.9 / 1.05
    assert judge(Interval(2.6, 2.5, 2.7, 5), tighter) is Verdict.NOT_KEPT  # faster than promised is not the promise
    alone = Promised.of(None, 2.0, 0.05)  # an export of one round: its speedup widened
    assert alone is not None and (alone.low, alone.high) == pytest.approx((2.0 / 1.05, 2.1))
    assert Promised.of(None, None, 0.05) is None


def test_the_rounds_a_decision_needs_are_none_when_the_speedup_here_sits_on_the_promises_edge() -> None:
    export = stated_interval(EXPORT)
    promised = Promised.of(export, None, 0.10)
    assert export is not None and promised is not None
    # 2.10x against a promise that starts at 2.13x: within the session's drift of its edge, however many rounds
    assert rounds_to_decide([2.1, 2.15, 2.05], export, promised) is None
    assert rounds_to_decide([2.2, 2.6], export, promised) == 6
    # rounds that go on as those went (the same log mean and standard deviation), in a check of
    # n rounds at most judged at its last look (`look_level`), decide it at 6, not at 5
    mean, spread = (math.log(2.2) + math.log(2.6)) / 2, abs(math.log(2.6 / 2.2)) / math.sqrt(2)
    as_they_went = {
        5: [mean - spread, mean + spread] * 2 + [mean],  # log sd exactly `spread`
        6: [mean - spread * math.sqrt(5 / 6), mean + spread * math.sqrt(5 / 6)] * 3,
    }
    for n, logs in as_they_went.items():
        assert statistics.stdev(logs) == pytest.approx(spread) and statistics.fmean(logs) == pytest.approx(mean)
        checked = checked_interval([math.exp(x) for x in logs], export, look_level(n, n))
        assert checked is not None and (judge(checked, promised) is Verdict.UNDECIDED) is (n == 5)


def test_the_promise_checks_looks_share_its_error_so_a_verdict_is_wrong_at_most_one_time_in_ten() -> None:
    """The check looks after rounds 2 to `most` and stops at the first that decides: the looks'
    errors (1 - level) add up to 1 - LEVEL at most, a fifth of it on the looks before the last."""
    assert look_level(2, 2) == pytest.approx(LEVEL)  # one look
    assert look_level(2, 3) == pytest.approx(1 - 0.2 * (1 - LEVEL)) and look_level(3, 3) == pytest.approx(0.92)
    for most in range(3, 12):
        errors = [1 - look_level(rounds, most) for rounds in range(2, most + 1)]
        assert sum(errors) == pytest.approx(1 - LEVEL)
        assert errors[-1] == pytest.approx(0.8 * (1 - LEVEL))
        assert all(e == pytest.approx(errors[0]) for e in errors[:-1])  # the early looks in equal parts
    assert look_level(2, 5) == pytest.approx(1 - 0.02 / 3)


def test_the_check_stops_at_the_first_look_that_decides() -> None:
    """Rounds run one after another: a plain verdict at an early look (its level near 99%) stands,
    whatever later rounds would have made of it; undecided only when no look decides."""
    export = stated_interval(EXPORT)
    promised = Promised.of(export, None, 0.10)
    assert export is not None and promised is not None
    plain = [1.9, 1.91, 1.9, 2.5, 2.6]  # wholly below 2.13x by the third round
    assert verdict_at(plain[:2], export, promised, 5) is Verdict.UNDECIDED  # two rounds at 99.3%: not yet
    assert verdict_at(plain[:3], export, promised, 5) is Verdict.NOT_KEPT
    assert verdict_at(plain, export, promised, 5) is not Verdict.NOT_KEPT  # the last look alone would not say so
    assert first_decision(plain, export, promised, 5) is Verdict.NOT_KEPT
    assert first_decision([2.3, 2.6], export, promised, 5) is Verdict.UNDECIDED
    assert first_decision([2.45], export, promised, 5) is Verdict.UNDECIDED  # one round: no interval
