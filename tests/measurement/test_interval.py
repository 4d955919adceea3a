"""The speedup's interval: the t quantile, the interval of a few rounds' ratios, and whether two
speedups agree. Pinned to figures worked by hand and to the t table."""

from __future__ import annotations

import math
import statistics

import pytest

from autotuner.measurement.interval import (
    DRIFT,
    Interval,
    geometric_mean,
    joint_level,
    ratio_interval,
    stated_interval,
    t_quantile,
)

T_TABLE_95 = {1: 6.3138, 2: 2.9200, 3: 2.3534, 4: 2.1318, 5: 2.0150, 9: 1.8331, 29: 1.6991}
"""Student's t, 0.95 quantile (the two-sided 90% critical value), from the published table."""
T_TABLE_995 = {3: 5.8409, 4: 4.6041, 5: 4.0321, 9: 3.2498, 29: 2.7564}
"""Student's t, 0.995 quantile (the two-sided 99% critical value): the far tail a joint interval
or an early look of `autotuner apply` reaches, where an expansion alone is off by a percent."""


@pytest.mark.parametrize("df", sorted(T_TABLE_95))
def test_the_t_quantile_matches_the_table(df: int) -> None:
    assert t_quantile(0.95, df) == pytest.approx(T_TABLE_95[df], abs=1e-4)


@pytest.mark.parametrize("df", sorted(T_TABLE_995))
def test_the_t_quantile_matches_the_table_in_the_far_tail(df: int) -> None:
    assert t_quantile(0.995, df) == pytest.approx(T_TABLE_995[df], abs=1e-4)


def test_the_t_quantile_tends_to_the_normal_and_rounds_a_small_df_down() -> None:
    assert t_quantile(0.95, 10_000) == pytest.approx(1.645006, abs=1e-5)  # the normal's 1.644854, nearly
    assert t_quantile(0.95, 1e9) == pytest.approx(statistics.NormalDist().inv_cdf(0.95), abs=1e-8)
    assert t_quantile(0.975, 4) == pytest.approx(2.7764, abs=1e-4)
    assert t_quantile(0.95, 1.7) == t_quantile(0.95, 1)  # a wider interval, never a narrower one
    assert t_quantile(0.95, 4.6) == t_quantile(0.95, 4)
    assert t_quantile(0.5, 3) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError):
        t_quantile(0.95, 0.5)


def test_the_interval_is_the_t_interval_of_the_log_ratios() -> None:
    ratios = [5.0, 4.8, 5.3]
    logs = [math.log(r) for r in ratios]
    half = 2.9200 * statistics.stdev(logs) / math.sqrt(3)  # t(0.95, 2) x s / sqrt(n)
    interval = ratio_interval(ratios)
    assert interval is not None and interval.rounds == 3 and interval.level == 0.9
    assert interval.estimate == pytest.approx(geometric_mean(ratios)) == pytest.approx((5.0 * 4.8 * 5.3) ** (1 / 3))
    assert interval.low == pytest.approx(math.exp(statistics.fmean(logs) - half), rel=1e-4)
    assert interval.high == pytest.approx(math.exp(statistics.fmean(logs) + half), rel=1e-4)
    # worked by hand: 5.029x, 90% interval 4.62-5.47x
    assert (round(interval.estimate, 3), round(interval.low, 2), round(interval.high, 2)) == (5.029, 4.62, 5.47)
    assert interval.half_width == pytest.approx((interval.high - interval.low) / 2 / interval.estimate)
    assert interval.text() == "90% interval 4.62-5.47x"


def test_no_interval_from_one_round_or_a_ratio_that_is_not_positive() -> None:
    assert ratio_interval([5.0]) is None and ratio_interval([]) is None
    assert ratio_interval([5.0, 0.0]) is None and ratio_interval([5.0, math.nan]) is None
    same = ratio_interval([2.0, 2.0, 2.0])
    assert same == Interval(2.0, 2.0, 2.0, 3)


def test_more_rounds_of_the_same_noise_narrow_the_interval() -> None:
    three, six = ratio_interval([5.0, 4.8, 5.2]), ratio_interval([5.0, 4.8, 5.2] * 2)
    assert three is not None and six is not None and six.half_width < three.half_width / 2


def test_an_interval_is_stored_and_read_back() -> None:
    interval = ratio_interval([5.0, 4.8, 5.3])
    assert interval is not None and Interval.from_dict(interval.as_dict()) == interval
    joint = ratio_interval([5.0, 4.8, 5.3], among=3)
    assert joint is not None and Interval.from_dict(joint.as_dict()) == joint
    older = {k: v for k, v in interval.as_dict().items() if k not in ("among", "drift")}  # stored before them
    assert Interval.from_dict(older) == interval
    stated = stated_interval([5.0, 4.8, 5.3], among=2)
    assert stated is not None and stated.drift == DRIFT and Interval.from_dict(stated.as_dict()) == stated


def test_an_interval_stated_jointly_among_k_is_each_at_sidaks_level() -> None:
    """The winner is the best of the configs within the noise of each other; stated jointly with
    theirs at 0.9^(1/k) each, all k hold at once with probability 0.9 at least, the winner's too."""
    ratios = [5.0, 4.8, 5.3, 5.1, 4.9]
    logs = [math.log(r) for r in ratios]
    se = statistics.stdev(logs) / math.sqrt(5)
    assert joint_level(0.9, 1) == 0.9 and joint_level(0.9, 2) == pytest.approx(0.948683, abs=1e-6)
    assert joint_level(0.9, 3) ** 3 == pytest.approx(0.9)
    for among, t in ((1, 2.1318), (2, 2.7511), (3, 3.1501)):  # t(4) at (1 + 0.9^(1/k)) / 2 (scipy.stats.t)
        interval = ratio_interval(ratios, among=among)
        assert interval is not None and interval.among == among and interval.level == 0.9
        assert interval.estimate == pytest.approx(geometric_mean(ratios))
        assert interval.high == pytest.approx(math.exp(statistics.fmean(logs) + t * se), rel=1e-4)
        assert interval.low == pytest.approx(math.exp(statistics.fmean(logs) - t * se), rel=1e-4)


def test_a_stated_interval_adds_the_sessions_drift_in_quadrature() -> None:
    """The interval a study states (and `autotuner apply` measures): the rounds' t term and the
    drift's normal term, each at the (joint) level, combined as sqrt(a^2 + b^2)."""
    ratios = [5.0, 4.8, 5.3, 5.1, 4.9]
    logs = [math.log(r) for r in ratios]
    se = statistics.stdev(logs) / math.sqrt(5)
    assert DRIFT == 0.015
    for among, t, z in ((1, 2.1318, 1.6449), (2, 2.7511, 1.9545)):  # t(4) and the normal at (1 + 0.9^(1/k)) / 2
        stated = stated_interval(ratios, among=among)
        assert stated is not None and stated.among == among and stated.rounds == 5
        half = math.sqrt((t * se) ** 2 + (z * DRIFT) ** 2)
        assert stated.high == pytest.approx(math.exp(statistics.fmean(logs) + half), rel=1e-4)
        assert stated.low == pytest.approx(math.exp(statistics.fmean(logs) - half), rel=1e-4)
        assert ratio_interval(ratios, among=among, drift=DRIFT) == stated
    # never narrower than the rounds' own, and as wide as the drift's alone where the rounds agree
    assert stated_interval(ratios).half_width > ratio_interval(ratios).half_width  # type: ignore[union-attr]
    same = stated_interval([2.0, 2.0, 2.0])
    assert same is not None and math.log(same.high / 2.0) == pytest.approx(1.6449 * DRIFT, rel=1e-4)
    assert stated_interval([2.0]) is None
