"""The rounds function re-measurement and `autotuner apply` share
(`autotuner.search.paired_rounds`), on scripted rounds and a scripted clock."""

from __future__ import annotations

import math

from autotuner.measurement.rounds import TimeBudget
from autotuner.measurement.timing import Throughput
from autotuner.search.paired_rounds import Pace, RoundAt, RoundsRan, measure_rounds, round_speedups
from autotuner.trials.launcher import TrialResult
from autotuner.trials.outcomes import Outcome
from autotuner.trials.trial_output import Losses, TrialOutput


class _Scripted:
    """Rounds of `processes[i]` processes, each process taking `process_s` on the clock; done after
    round `done_at` (None: never)."""

    def __init__(self, processes: list[int], process_s: float = 1.0, done_at: int | None = None):
        self.counts, self.process_s, self.done_at = iter(processes), process_s, done_at
        self.now, self.current = 0.0, 0
        self.seen: list[RoundAt] = []

    def clock(self) -> float:
        return self.now

    def processes(self) -> int:
        self.current = next(self.counts)
        return self.current

    def measure(self, at: RoundAt) -> bool:
        self.seen.append(at)
        self.now += self.current * self.process_s
        return at.number != self.done_at


def test_the_rounds_run_to_the_cap_or_until_the_caller_is_done() -> None:
    rounds = _Scripted([2] * 5)
    assert measure_rounds(rounds, Pace(4, clock=rounds.clock)) == RoundsRan(4, "cap")
    assert [at.number for at in rounds.seen] == [1, 2, 3, 4] and rounds.seen[0].left_s is None
    done = _Scripted([2] * 5, done_at=2)
    assert measure_rounds(done, Pace(4, clock=done.clock)) == RoundsRan(2, "done")


def test_from_the_third_round_on_the_next_must_fit_at_the_last_rounds_pace_a_process() -> None:
    # 3 processes a round at 1 s each, then 1: the third round is foreseen at 1 s (3 s / 3 processes)
    rounds = _Scripted([3, 3, 1, 3], process_s=1.0)
    allowance = TimeBudget(8.0)
    assert measure_rounds(rounds, Pace(5, allowance, clock=rounds.clock)) == RoundsRan(3, "time")
    assert allowance.spent == 7.0 and [at.left_s for at in rounds.seen] == [8.0, 5.0, 2.0]
    assert rounds.seen[2].progress(4, ", the config beside the baseline") == (
        "round 3 of at most 5, the config beside the baseline, 4 windows a process, 2 s left"
    )
    # two rounds run whatever the time (an interval needs them), and without the stop, all of them
    short = _Scripted([3] * 5)
    assert measure_rounds(short, Pace(5, TimeBudget(1.0), clock=short.clock)) == RoundsRan(2, "time")
    on = _Scripted([3] * 5)
    spent = TimeBudget(1.0)
    assert measure_rounds(on, Pace(5, spent, stop_for_time=False, clock=on.clock)) == RoundsRan(5, "cap")
    assert spent.spent == 15.0


def _result(rate: float) -> TrialResult[TrialOutput]:
    if not rate:
        return TrialResult(Outcome.CRASH, "signal 9")
    throughput = Throughput(rate, 0.01, [rate] * 3, 0.1, 1.0, 10, 3, 16)
    return TrialResult(Outcome.OK, output=TrialOutput(Losses(math.nan, []), throughput=throughput))


def test_a_rounds_speedups_are_over_the_baseline_beside_them() -> None:
    assert round_speedups([_result(3000.0), _result(0.0), _result(1000.0)]) == [3.0, None, 1.0]
    assert round_speedups([_result(3000.0), _result(0.0)]) == [None, None]  # the baseline failed
