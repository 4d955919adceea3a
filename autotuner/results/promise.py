"""The export's promise and its verdict: the speedups an export's interval allows (`Promised`), and
what `autotuner apply`'s promise check says of the rounds it measured (`judge`: kept, not kept or
undecided, `EXIT_CODES`). The check looks after every round from the second and stops at the first
look that decides (`verdict_at`, `first_decision`); each look judges at its share of the check's
error (`look_level`), with the session's drift allowed for as the export's interval allowed for it
(`checked_interval`, `session_drift`).

Plain arithmetic on intervals (`autotuner.measurement.interval`): no framework, no Optuna.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from autotuner.measurement.interval import DRIFT, LEVEL, Interval, log_interval, stated_interval

TOLERANCE = 0.10
"""`autotuner apply --tolerance`'s default: the promise is kept when the speedup here lies within
the export's interval widened by 10% either way, at the check's level (`Promised`, `judge`): what
an interval measured in one session cannot hold, a machine whose speed moved since (on a 2-core
VM, two sessions half an hour apart saw one speedup 8.5% apart)."""


class Verdict(str, Enum):
    """What `autotuner apply` says of the export's promise, and its exit code (`EXIT_CODES`)."""

    KEPT = "kept"
    NOT_KEPT = "not kept"
    UNDECIDED = "undecided"


EXIT_CODES = {Verdict.KEPT: 0, Verdict.NOT_KEPT: 1, Verdict.UNDECIDED: 3}
"""`autotuner apply`'s exit code for each verdict (2 is a bad input's); 0 where nothing was checked."""
EARLY_SHARE = 0.2
"""The share of the promise check's error (1 - LEVEL) spent on its looks before the last
(`look_level`)."""


def look_level(rounds: int, most: int, level: float = LEVEL) -> float:
    """The level the promise check judges at after `rounds` rounds of at most `most`. It looks
    after every round from the second and stops at the first that decides; each look can decide
    wrongly, and a wrong verdict needs that look's interval to miss, so the error 1 - `level` is
    spread over the looks (Bonferroni), whichever one the check stops at: `EARLY_SHARE` of it in
    equal parts over the looks before the last (rounds 2 to most - 1), the rest on the last. A
    check of two rounds at most looks once, at `level`. With five rounds: 99.3% at rounds 2 to 4,
    92% at the fifth: an early look decides only what is plain (a config twice as slow as
    promised), the last one is nearly as narrow as a single look's."""
    error = 1 - level
    early = most - 2
    if early <= 0:
        return level
    return 1 - (EARLY_SHARE * error / early if rounds < most else (1 - EARLY_SHARE) * error)


@dataclass(frozen=True)
class Promised:
    """The speedups the export's promise allows: its interval (its speedup alone where its
    re-measurement ran one round) widened by `tolerance` either way, for what an interval cannot
    hold (a machine that moved since)."""

    low: float
    high: float
    tolerance: float

    @classmethod
    def of(cls, export: Interval | None, export_speedup: float | None, tolerance: float) -> Promised | None:
        """None where the export states no speedup."""
        if export is not None:
            low, high = export.low, export.high
        elif export_speedup:
            low = high = export_speedup
        else:
            return None
        return cls(low / (1 + tolerance), high * (1 + tolerance), tolerance)

    def text(self) -> str:
        return f"{self.low:.2f}-{self.high:.2f}x"


def judge(here: Interval, promised: Promised) -> Verdict:
    """The promise's verdict from `here`, the interval of the speedup the check measured: kept when
    it lies within what was `promised`, not kept when it lies wholly outside, undecided otherwise
    (the rounds cannot yet tell). Where the speedup here is within the export's interval, a "not
    kept" needs `here` to miss it, and where it is beyond the tolerance, a "kept" does: either is
    as rare as the check's level says."""
    if promised.low <= here.low and here.high <= promised.high:
        return Verdict.KEPT
    if here.high < promised.low or here.low > promised.high:
        return Verdict.NOT_KEPT
    return Verdict.UNDECIDED


def session_drift(export: Interval | None) -> float:
    """The session's drift the promise check's own interval allows for: the export's interval's
    (the study's `budget.remeasure_drift`), or `DRIFT` where the export has no interval."""
    return export.drift if export is not None else DRIFT


def checked_interval(rounds: Sequence[float], export: Interval | None, level: float = LEVEL) -> Interval | None:
    """The speedup of the promise check's `rounds` with its `level` interval, allowing for the
    session's drift as the export's did (`stated_interval`, `session_drift`); None with fewer than
    two rounds."""
    return stated_interval(rounds, level, drift=session_drift(export))


def verdict_at(rounds: Sequence[float], export: Interval | None, promised: Promised, most: int) -> Verdict:
    """The promise check's verdict at its look after `rounds` (of at most `most`): `judge` of their
    interval at that look's level (`look_level`); undecided before two rounds."""
    here = checked_interval(rounds, export, look_level(len(rounds), most))
    return Verdict.UNDECIDED if here is None else judge(here, promised)


def first_decision(rounds: Sequence[float], export: Interval | None, promised: Promised, most: int) -> Verdict:
    """What the promise check says of `rounds` measured one after another: the verdict of the first
    look that decides (`verdict_at`, from the second round on), else undecided."""
    for n in range(2, len(rounds) + 1):
        if (verdict := verdict_at(rounds[:n], export, promised, most)) is not Verdict.UNDECIDED:
            return verdict
    return Verdict.UNDECIDED


def rounds_to_decide(
    rounds: Sequence[float], export: Interval | None, promised: Promised, most: int = 100
) -> int | None:
    """About how many rounds would decide the promise, were they to go on as `rounds` went (their
    geometric mean and log spread): the fewest, up to `most`, whose interval `judge` would call
    kept or not kept at the check's last look; None if none would (the speedup here at the edge of
    what was promised, within the session's drift)."""
    if len(rounds) < 2:
        return None
    logs = [math.log(r) for r in rounds]
    mean, spread = statistics.fmean(logs), statistics.stdev(logs)
    drift = session_drift(export)
    for n in range(len(rounds) + 1, most + 1):  # a check of n rounds at most, judged at its last look
        if judge(log_interval(mean, spread, n, look_level(n, n), drift=drift), promised) is not Verdict.UNDECIDED:
            return n
    return None
