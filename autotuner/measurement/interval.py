"""The interval a speedup is stated with: a Student t interval over paired rounds.

A speedup is measured in rounds. In each, a fresh process of the config and one of the baseline
run beside each other (in lockstep on a CPU, one after the other elsewhere), and the round's
ratio is the config's median window over the baseline's. What a machine does to both in a round
(a neighbour's load, the clock) cancels in the ratio; what is left varies from round to round:
which process came out lucky, how the loader's workers fell, what the machine did to one and not
the other. The rounds' ratios are taken as independent draws of log-normal noise around the
speedup:

    l_i = ln(ratio_i),  m = mean(l),  s = stdev(l),  se = s / sqrt(n)
    speedup = exp(m),  interval = exp(m -+ t_{(1+level)/2, n-1} * se)

that is the geometric mean of the rounds' ratios and the t interval of its log, which is exact
for normal log-ratios and, unlike a bootstrap, does not understate the width with the few rounds
a study can afford (at 3 rounds a percentile bootstrap's 90% interval covers about 65% of normal
noise, in a simulation of 4,000 draws). Two
rounds at least: one gives no interval.

The winner of a re-measurement is the best of the configs within the noise of each other, and the
best of several estimates is biased upwards: its interval is stated jointly with theirs
(`among`), each at Sidak's level LEVEL^(1/among), so that all of them hold at once, and so the
winner's whichever it is, with probability LEVEL at least (Sidak's inequality holds for
two-sided intervals of correlated normal estimates, as configs measured beside one baseline are).

The rounds of one session are not independent of the session, though: a VM's speed moves in
phases of minutes, and a speedup's rounds in one phase stand apart from another phase's by more
than their spread says (on a 2-core AMD VM, 200 rounds over an hour: means of 5 to 20 consecutive
rounds stood apart by a log sd of 0.015 beyond what their rounds' spread gave;
`benchmarks/interval_coverage.py` measures it for a machine). What a study promises is a speedup
another session will see (`autotuner apply`'s), so the interval it states (`stated_interval`)
adds that drift d, a known log sd (`DRIFT` unless the spec sets `budget.remeasure_drift`), with
the normal quantile, to the rounds' own t term in quadrature:

    half = sqrt((t_{q, n-1} * se)^2 + (z_q * d)^2),  q = (1 + level^(1/among)) / 2

so it is never narrower than the rounds' own interval, and on a machine whose sessions drift by
no more than d it holds as often as its level says (`benchmarks/interval_procedure.py --replay`,
the rounds in the order measured); a machine that drifts more needs its own d. Comparisons
inside one session (which configs are still in contention) share its phase and leave it out.

How often the interval holds the speedup on a given machine is measured by
`benchmarks/interval_coverage.py` (many rounds of one pair, cut into studies of n rounds), and
under the whole re-measurement (its stopping, its choice of the winner) by
`benchmarks/interval_procedure.py`.

This module imports no framework and no Optuna.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

LEVEL = 0.90
"""The confidence level every interval is stated at."""
DRIFT = 0.015
"""The log sd by which a speedup measured in one session stands apart from another session's on
the same machine, beyond what its rounds' spread says (the module's account): what a stated
interval allows for by default (`stated_interval`; a spec sets its own, `budget.remeasure_drift`)."""


def t_quantile(p: float, df: float) -> float:
    """The `p` quantile (p in [0.5, 1)) of Student's t with `df` degrees of freedom: exact for
    1 and 2; else the Cornish-Fisher expansion (Abramowitz and Stegun 26.7.5) to 1/df^4, refined
    by Newton's method on the exact distribution (`_t_central`), to 1e-9 of it. A fractional
    df is rounded down (a wider interval, never a narrower one); from df 30 on the expansion
    alone is within 1e-6."""
    if not 0.5 <= p < 1.0 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 <= p < 1 and df >= 1, got p={p}, df={df}")
    whole = math.floor(df)
    if whole < 2:
        return math.tan(math.pi * (p - 0.5))
    if whole < 3:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = statistics.NormalDist().inv_cdf(p)
    terms = (
        (z**3 + z) / 4,
        (5 * z**5 + 16 * z**3 + 3 * z) / 96,
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
        (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160,
    )
    t = z + sum(term / whole ** (k + 1) for k, term in enumerate(terms))
    if whole >= 30:
        return t
    scale = math.exp(math.lgamma((whole + 1) / 2) - math.lgamma(whole / 2)) / math.sqrt(whole * math.pi)
    for _ in range(20):  # Newton on P(|T| <= t) = 2p - 1; its derivative is twice the density
        density = scale * (1 + t * t / whole) ** (-(whole + 1) / 2)
        step = (_t_central(t, whole) - (2 * p - 1)) / (2 * density)
        t -= step
        if abs(step) < 1e-9:
            break
    return t


def _t_central(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with a whole `df` (1 or more): the finite series of Abramowitz
    and Stegun 26.7.3 and 26.7.4, in theta = atan(t / sqrt(df))."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    term, total = 1.0, 0.0
    if df % 2:  # odd: 2/pi (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...)), df - 3 terms after 1
        if df == 1:
            return 2 * theta / math.pi
        for k in range(1, (df - 1) // 2 + 1):
            total += term
            term *= (2 * k) / (2 * k + 1) * c2
        return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
    for k in range(1, df // 2 + 1):  # even: sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
        total += term
        term *= (2 * k - 1) / (2 * k) * c2
    return math.sin(theta) * total


@dataclass(frozen=True)
class Interval:
    """A speedup (or any ratio) and its `level` interval from `rounds` paired rounds."""

    estimate: float
    low: float
    high: float
    rounds: int
    level: float = LEVEL
    among: int = 1
    """How many intervals it is stated jointly with, its own included (`joint_level`): the
    configs a winner was chosen among. 1: on its own."""
    drift: float = 0.0
    """The session's drift (a log sd) it allows for beside its rounds' spread (`stated_interval`);
    0: the rounds' own interval."""

    @property
    def half_width(self) -> float:
        """Half the interval's width relative to the estimate: 0.05 is "within about 5%"."""
        return (self.high - self.low) / (2 * self.estimate)

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def clears(self, other: Interval) -> bool:
        """This interval lies wholly above `other`'s."""
        return self.low > other.high

    def text(self, unit: str = "x") -> str:
        """`90% interval 4.80-5.40x`."""
        return f"{self.level:.0%} interval {self.low:.2f}-{self.high:.2f}{unit}"

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Interval:
        return cls(
            estimate=float(data["estimate"]),
            low=float(data["low"]),
            high=float(data["high"]),
            rounds=int(data["rounds"]),
            level=float(data.get("level", LEVEL)),
            among=int(data.get("among", 1)),
            drift=float(data.get("drift", 0.0)),
        )


def geometric_mean(ratios: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(r) for r in ratios))


def joint_level(level: float, among: int) -> float:
    """The level each of `among` intervals is made at so that all hold at once with probability
    `level` at least (Sidak): level^(1/among)."""
    return level ** (1 / among)


def ratio_interval(
    ratios: Sequence[float], level: float = LEVEL, among: int = 1, drift: float = 0.0
) -> Interval | None:
    """The speedup the rounds' `ratios` give (their geometric mean) and its `level` t interval,
    stated jointly with `among` intervals in all and allowing a session's `drift` (a log sd), as
    the module says; None with fewer than two rounds or a ratio that is not positive."""
    if len(ratios) < 2 or any(not r > 0 for r in ratios):
        return None
    logs = [math.log(r) for r in ratios]
    return log_interval(statistics.fmean(logs), statistics.stdev(logs), len(logs), level, among, drift)


def stated_interval(
    ratios: Sequence[float], level: float = LEVEL, among: int = 1, drift: float = DRIFT
) -> Interval | None:
    """The interval a study states for a speedup, and `autotuner apply` for what it measured: the
    rounds' own with a session's `drift` added (`ratio_interval`)."""
    return ratio_interval(ratios, level, among, drift)


def log_interval(
    mean: float, spread: float, rounds: int, level: float = LEVEL, among: int = 1, drift: float = 0.0
) -> Interval:
    """The interval `ratio_interval` gives `rounds` (two or more) rounds whose log-ratios have this
    `mean` and standard deviation `spread`, with `drift` added as the module says."""
    q = (1 + joint_level(level, among)) / 2
    half = math.hypot(
        t_quantile(q, rounds - 1) * spread / math.sqrt(rounds), statistics.NormalDist().inv_cdf(q) * drift
    )
    return Interval(math.exp(mean), math.exp(mean - half), math.exp(mean + half), rounds, level, among, drift)
