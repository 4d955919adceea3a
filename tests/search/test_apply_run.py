"""`autotuner apply`'s promise check measures its rounds as re-measurement does
(`autotuner.search.apply_run.promise_rounds`): on scripted processes, how many rounds it runs, in
which windows, and when it stops."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest

from autotuner.measurement.timing import Throughput
from autotuner.search.apply_run import CheckPlan, promise_rounds
from autotuner.spec.job import load_spec
from autotuner.trials.launcher import TrialLauncher, TrialResult
from autotuner.trials.outcomes import Outcome
from autotuner.trials.request import TrialRequest
from autotuner.trials.trial_output import Losses, TrialOutput
from tests.support.studies import write_spec


class _Rounds:
    """A launcher whose processes measure the rates given for their config's micro-batch, in
    order (the config's, then the baseline's); a rate of 0 fails the process."""

    def __init__(self, rates: dict[int, list[float]], windows: int = 4):
        self.rates = {batch: iter(values) for batch, values in rates.items()}
        self.windows = windows
        self.steps: dict[int, int] = {}
        self.tick: Callable[[], None] = lambda: None

    def call(self, runner: str, function: str, request: TrialRequest, timeout_s: float) -> TrialResult[TrialOutput]:
        rate = next(self.rates[request.config["batch_size"]])
        self.tick()
        self.steps[request.config["batch_size"]] = request.steps
        if not rate:
            return TrialResult(Outcome.CRASH, "signal 9")
        assert request.windows == self.windows and not request.drift and request.compile_cache == "cache"
        throughput = Throughput(rate, 0.01, [rate] * 4, 0.1, 1.0, 10, 4, 16)
        return TrialResult(Outcome.OK, output=TrialOutput(Losses(math.nan, []), throughput=throughput))


@pytest.mark.parametrize(
    ("config", "baseline", "expected", "error"),
    [
        ([2000.0] * 5, [1000.0, 1010.0, 990.0, 1000.0, 1000.0], 4, None),  # narrow after two rounds: on to the cap
        ([2000.0] * 5, [800.0, 1000.0, 800.0, 1000.0, 800.0], 4, None),  # wide: every round of the cap
        ([2000.0, 2000.0, 0.0], [800.0, 1000.0, 800.0], 2, "round 3: crash: signal 9"),  # kept what it had
    ],
)
def test_the_promise_check_runs_every_round_of_its_cap_without_a_decision_to_stop_at(
    tmp_path: Path, config: list[float], baseline: list[float], expected: int, error: str | None
) -> None:
    job = load_spec(write_spec(tmp_path, budget={"trials": 2, "remeasure_runs": 4, "remeasure_windows": 4}))
    configs = [job.complete({**job.baseline, "batch_size": 8}), job.complete(job.baseline)]
    launcher = _Rounds({8: config, job.baseline["batch_size"]: baseline})
    notes: list[str] = []
    speedups, failed = promise_rounds(job, cast(TrialLauncher, launcher), configs, "cuda:0", "cache", notes.append)
    assert len(speedups) == expected and failed == error
    assert speedups == [c / b for c, b in zip(config, baseline, strict=False)][:expected]
    assert notes[0] == "checking the promise: round 1 of at most 4, the config beside the baseline, 4 windows a process"


def test_the_promise_check_stops_within_the_time_of_the_run_before_it(tmp_path: Path) -> None:
    """Given the run's seconds, the rounds measure as many windows as let three fit (three at
    least), in the windows the run calibrated, and from the third on stop before one that would
    not fit: here each round takes 4 s on the script's clock, and the run took 10 s."""
    job = load_spec(write_spec(tmp_path, budget={"trials": 2, "remeasure_runs": 5, "remeasure_windows": 10}))
    configs = [job.complete({**job.baseline, "batch_size": 8}), job.complete(job.baseline)]
    launcher = _Rounds({8: [2000.0] * 5, job.baseline["batch_size"]: [800.0, 1000.0] * 3}, windows=3)
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0  # each read a second later: a round, read twice, is 1 s plus its processes' 3 s
        return now[0]

    launcher.tick = lambda: now.__setitem__(0, now[0] + 1.5)
    measured = [
        Throughput(2000.0, 0.01, [2000.0] * 4, 0.1, 2.0, 12, 4, 16),
        Throughput(900.0, 0.01, [900.0] * 4, 0.1, 2.0, 5, 4, 16),
    ]
    notes: list[str] = []
    speedups, failed = promise_rounds(
        job,
        cast(TrialLauncher, launcher),
        configs,
        "cuda:0",
        "cache",
        notes.append,
        CheckPlan(measured=tuple(measured), seconds=10.0, clock=clock),
    )
    assert failed is None and len(speedups) == 2, notes  # a third round (4 s) would not fit in the 2 s left
    assert launcher.steps == {8: 12, job.baseline["batch_size"]: 5}  # the run's calibrated windows
    assert "3 windows a process, 10 s left" in notes[0] and "6 s left" in notes[1]


def test_an_undecided_promise_check_runs_more_rounds_up_to_its_cap(tmp_path: Path) -> None:
    """Given what decides the promise, the rounds go on past a narrow interval and past the run's
    time while it cannot decide, to the cap, and stop at the first round that decides."""
    job = load_spec(write_spec(tmp_path, budget={"trials": 2, "remeasure_runs": 3, "remeasure_windows": 4}))
    configs = [job.complete({**job.baseline, "batch_size": 8}), job.complete(job.baseline)]
    rates = {8: [2000.0] * 8, job.baseline["batch_size"]: [1000.0] * 8}
    for decide_at, cap, expected in ((None, 6, 6), (4, 6, 4), (None, None, 3)):
        launcher = _Rounds({batch: list(values) for batch, values in rates.items()})
        speedups, failed = promise_rounds(
            job,
            cast(TrialLauncher, launcher),
            configs,
            "cuda:0",
            "cache",
            lambda text: None,
            CheckPlan(
                most=cap,
                decided=lambda done, at=decide_at: at is not None and len(done) >= at,
                seconds=0.001,  # a run too short for a third round: it does not stop an undecided check
            ),
        )
        assert failed is None and len(speedups) == expected
