"""Rounds of paired processes within a time: how many windows each process of a round measures,
and when the rounds stop for time. Re-measurement (`autotuner.search.remeasure`) and `autotuner
apply`'s promise check (`autotuner.search.apply_run`) measure a speedup the same way: rounds of a
fresh process of each config beside one of the baseline, from two rounds on an interval
(`autotuner.measurement.interval`). Both are given a time, and spend it on rounds rather than on
windows: two rounds give an interval whose t quantile is 6.31, three one of 2.92, while more
windows a process only average out the noise inside a round.

This module imports no framework and no Optuna.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

FIT_ROUNDS = 3
"""The rounds the windows a process are sized for (`windows_that_fit`)."""
FEWEST_WINDOWS = 3
"""The fewest windows a process of a round measures (a median of three), whatever the time."""
TURN_SHARE = 0.1
"""What a window costs in a round beside its own time: the untimed step that opens its turn in
lockstep, about a tenth of a window."""


@dataclass(frozen=True)
class ProcessCost:
    """What one process of a round costs: its fixed part (its start, the workload built, the
    warm-up) and its window's length, as its config's trial (or run) measured them."""

    fixed_s: float
    window_s: float

    def seconds(self, windows: int) -> float:
        """About how long the process takes with `windows` windows: its fixed part, the windows
        (each opened by an untimed step in its turn), and a window more for the turns' settling
        and its end."""
        return self.fixed_s + (1 + (1 + TURN_SHARE) * windows) * self.window_s


def round_seconds(processes: Sequence[ProcessCost], windows: int) -> float:
    """About how long one round of `processes` takes with `windows` windows each."""
    return sum(p.seconds(windows) for p in processes)


def windows_that_fit(processes: Sequence[ProcessCost], seconds: float | None, most: int) -> int:
    """The windows each process of a round measures: `most`, or as many as let `FIT_ROUNDS`
    rounds of `processes` fit in `seconds` (None: no bound), `FEWEST_WINDOWS` at least (or `most`,
    when that is fewer)."""
    if seconds is None:
        return most
    fitting = next((w for w in range(most, 0, -1) if FIT_ROUNDS * round_seconds(processes, w) <= seconds), 0)
    return max(min(most, FEWEST_WINDOWS), fitting)


@dataclass
class TimeBudget:
    """A time to spend on rounds, and what they have spent."""

    seconds: float
    spent: float = 0.0

    @property
    def left(self) -> float:
        return max(0.0, self.seconds - self.spent)

    def holds(self, expected_s: float) -> bool:
        """Whether a round expected to take `expected_s` fits in what is left."""
        return expected_s <= self.left
