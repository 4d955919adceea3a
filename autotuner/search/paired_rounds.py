"""Paired rounds: how the study's re-measurement (`autotuner.search.remeasure`) and `autotuner
apply`'s promise check (`autotuner.search.apply_run`) measure a speedup.

In each round a fresh trial process of every config and one of the baseline are measured together
(`autotuner.trials.lockstep.measure_together`: in lockstep on a CPU, one after another in a seeded
order elsewhere), and a config's speedup in the round is its median window over the baseline's
beside it (`round_speedups`); from two rounds on, its rounds give an interval
(`autotuner.measurement.interval`). `measure_rounds` runs the rounds, one function for both: to a
cap, stopping before a round that the time left would not hold at the last round's pace (from the
third round on: two give the first interval), or once the caller's round says they are done. What
a round measures and when it is done is the caller's (`PairedRound`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from autotuner.measurement.rounds import TimeBudget
from autotuner.trials.launcher import TrialResult
from autotuner.trials.outcomes import Outcome
from autotuner.trials.trial_output import TrialOutput


@dataclass(frozen=True)
class RoundAt:
    """A round as it starts: its number, the most rounds, the time left (None: no bound)."""

    number: int
    most: int
    left_s: float | None

    def progress(self, windows: int, what: str = "") -> str:
        """The round as the lines that announce it say it, `what` it measures after its number:
        `round 2 of at most 5, 4 windows a process, 30 s left`."""
        left = f", {self.left_s:.0f} s left" if self.left_s is not None else ""
        return f"round {self.number} of at most {self.most}{what}, {windows} windows a process{left}"


class PairedRound(Protocol):
    """One caller's rounds: what a round runs, and when the rounds are done."""

    def processes(self) -> int:
        """The processes the next round runs (called before each round): its time is foreseen at
        the last round's pace a process."""
        ...

    def measure(self, at: RoundAt) -> bool:
        """Announce and measure the round `at`; whether the rounds go on."""
        ...


@dataclass(frozen=True)
class Pace:
    """How many rounds `measure_rounds` runs, and in what time."""

    most: int
    allowance: TimeBudget | None = None
    """The time the rounds may spend, spent as they run; None: no bound."""
    stop_for_time: bool = True
    """False: the rounds go on past the time (still spent, and said)."""
    clock: Callable[[], float] = time.monotonic
    """What a round's seconds are read on."""


@dataclass(frozen=True)
class RoundsRan:
    """How many rounds `measure_rounds` measured, and why it stopped: it ran `most` (`cap`), the
    next would not fit in the time (`time`), or the caller's round said they were done (`done`)."""

    rounds: int
    stopped: Literal["cap", "time", "done"]


def measure_rounds(paired: PairedRound, pace: Pace) -> RoundsRan:
    """Measure `paired`'s rounds, at most `pace.most`; from the third on, only while the time left
    holds the next at the last round's pace (its seconds a process, times the next one's
    processes). Each round's seconds are spent from `pace.allowance`."""
    allowance = pace.allowance
    last: tuple[float, int] | None = None  # the last round's seconds and processes
    for number in range(1, pace.most + 1):
        processes = paired.processes()
        if pace.stop_for_time and allowance is not None and last is not None and number > 2:
            if not allowance.holds(last[0] * processes / last[1]):
                return RoundsRan(number - 1, "time")
        began = pace.clock()
        go_on = paired.measure(RoundAt(number, pace.most, allowance.left if allowance is not None else None))
        last = (pace.clock() - began, processes)
        if allowance is not None:
            allowance.spent += last[0]
        if not go_on:
            return RoundsRan(number, "done")
    return RoundsRan(pace.most, "cap")


def round_speedups(results: Sequence[TrialResult[TrialOutput]]) -> list[float | None]:
    """Each process's speedup in a round (or a group of one) whose last process is the baseline's:
    its throughput (the median of its windows) over the baseline's; None where it or the baseline
    did not end ok."""

    def rate(result: TrialResult[TrialOutput]) -> float | None:
        output = result.output
        if result.outcome is not Outcome.OK or output is None or output.throughput is None:
            return None
        return output.throughput.samples_per_s

    base = rate(results[-1])
    return [None if base is None or (ours := rate(r)) is None else ours / base for r in results]
