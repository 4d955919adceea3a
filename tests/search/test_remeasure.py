"""Re-measurement: its rounds, which configs stay in them and when the figures are settled, how
many trial processes are alive at once, and how a group that the memory cannot hold is split,
the baseline beside the configs in every part."""

from __future__ import annotations

import dataclasses
import io
import math
import re
import statistics
from pathlib import Path
from typing import cast

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from rich.console import Console

from autotuner.measurement.telemetry import available_memory_mb
from autotuner.output.console import SearchReporter
from autotuner.results.evidence import Remeasurement
from autotuner.results.records import TrialRecord, records, remeasurements
from autotuner.results.store import record
from autotuner.search.remeasure import (
    MEMORY_SHARE,
    SETTLED,
    Remeasurer,
    contenders,
    earlier_estimates,
    median_error,
    processes_that_fit,
    remeasure_groups,
    rounds_left,
    settled,
)
from autotuner.spec.job import Job, load_spec
from autotuner.study.claims import Claims
from autotuner.study.names import BASELINE, REFERENCE, SEARCH
from autotuner.study.optuna_adapter import study_id
from autotuner.study.storage import open_storage, open_study
from autotuner.trials.launcher import TrialLauncher, TrialResult
from autotuner.trials.lockstep import measure_together
from autotuner.trials.outcomes import Outcome
from autotuner.trials.probe import Environment
from autotuner.trials.request import TrialRequest
from autotuner.trials.trial_output import Losses, TrialOutput
from autotuner.workers.coordination import OncePerStudy
from autotuner.workers.ownership import SearchProcess
from tests.support.helpers import RUNNER, SMALL_MLP, measured, reference, request
from tests.support.studies import write_spec

CPU = Environment("pytorch", "cpu", "test CPU", "test", {"python": "3.11"}, {"accelerator": False})


def _trial(number: int, peak_rss_mb: float | None = None) -> TrialRecord:
    metrics = {} if peak_rss_mb is None else {"peak_rss_mb": peak_rss_mb}
    return TrialRecord(number, "COMPLETE", {}, {}, "search", "ok", "", True, metrics)


def _numbers(groups: list[list[TrialRecord]]) -> list[list[int]]:
    return [[t.number for t in group] for group in groups]


def test_one_group_a_round_when_it_fits_else_parts_with_the_baseline_in_each() -> None:
    a, b, c, base = _trial(3), _trial(5), _trial(7), _trial(0)
    assert _numbers(remeasure_groups([a, b, c], base, None)) == [[3, 5, 7, 0]]
    assert _numbers(remeasure_groups([a, b, c], base, 4)) == [[3, 5, 7, 0]]
    assert _numbers(remeasure_groups([a, b, c], base, 3)) == [[3, 5, 0], [7, 0]]
    # one process at a time still pairs each config with the baseline (measured one after another)
    assert _numbers(remeasure_groups([a, b], base, 1)) == [[3, 0], [5, 0]]
    assert _numbers(remeasure_groups([a, b], None, 1)) == [[3], [5]]
    assert _numbers(remeasure_groups([], base, 2)) == [[0]]


def test_the_median_error_is_the_relative_standard_error_of_the_median() -> None:
    assert median_error([100.0]) == math.inf
    windows = [90.0, 100.0, 110.0, 100.0]
    assert median_error(windows) == pytest.approx(1.2533 * statistics.stdev(windows) / 2 / 100)
    assert median_error([5.0] * 10) == 0.0


def test_a_config_is_out_once_the_leader_is_ahead_by_more_than_the_noise_of_both() -> None:
    # the leader first, then the others by speedup
    assert contenders({0: (1.0, 0.01), 4: (2.0, 0.01), 5: (1.99, 0.01)}) == [4, 5]
    # 10% behind: out with errors of 1% (margin 3%, the floor) ...
    assert contenders({0: (1.0, 0.01), 4: (2.0, 0.01), 5: (1.8, 0.01)}) == [4]
    # ... in with errors of 5% (margin 2 x sqrt(2) x 5% = 14%)
    assert contenders({0: (1.0, 0.05), 4: (2.0, 0.05), 5: (1.8, 0.05)}) == [4, 5]
    # never less than the floor, whatever the windows say; a tie goes to the lower number
    assert contenders({4: (2.0, 0.0), 5: (1.95, 0.0)}) == [4, 5]
    assert contenders({4: (2.0, 0.0), 5: (2.0, 0.0)}) == [4, 5]
    assert contenders({4: (2.0, 0.0), 5: (1.9, 0.0)}) == [4]
    # with one window a speedup settles nothing
    assert contenders({4: (2.0, math.inf), 5: (1.0, 0.0)}) == [4, 5]
    assert contenders({}) == []


def test_a_newcomer_is_judged_against_the_leader_re_measured_before_it() -> None:
    # #4 re-measured first, at 4.8x the baseline beside it; #5 and #1 came in after it
    leader = dataclasses.replace(
        _trial(4),
        remeasured=Remeasurement(
            [13_000.0], [[12_900.0, 13_000.0, 13_100.0]], baseline_windows=[2_700.0, 2_710.0, 2_720.0]
        ),
    )
    failed = dataclasses.replace(_trial(7), remeasured=Remeasurement(error="re-run 1: crash: signal 9"))
    base = dataclasses.replace(_trial(0), remeasured=Remeasurement([2_710.0], [[2_700.0, 2_710.0, 2_720.0]]))
    earlier = earlier_estimates([leader, failed, base, _trial(5), _trial(1)], [5, 1], baseline_number=0)
    assert list(earlier) == [4]  # neither the baseline, nor a failed one, nor the batch's own
    assert earlier[4][0] == pytest.approx(13_000 / 2_710)
    # the newcomers' first round: 4.2x and 4.1x, within the noise of each other, but not of #4
    this_round = {0: (1.0, 0.01), 5: (4.2, 0.01), 1: (4.1, 0.01)}
    assert contenders(this_round) == [5, 1]  # alone, they would go on for every round
    assert contenders({**earlier, **this_round}) == [4]  # beside the leader, both are out


def test_the_memory_available_decides_how_many_processes_fit() -> None:
    available = available_memory_mb()
    assert available is not None and available > 0  # Linux: /proc/meminfo
    assert processes_that_fit([_trial(1), _trial(0)]) is None  # no peak RSS known (a GPU trial)
    assert processes_that_fit([_trial(1, 50 * available), _trial(0, 1.0)]) == 1  # the largest decides
    small = processes_that_fit([_trial(1, 1.0)])
    assert small is not None and small >= int(MEMORY_SHARE * available) // 2


def test_not_in_lockstep_the_processes_run_one_after_another(launcher: TrialLauncher, tmp_path: Path) -> None:
    job = load_spec(write_spec(tmp_path))
    measured = request("autotuner.backends.pytorch.builtin:mlp", SMALL_MLP)
    results = measure_together(
        launcher, job.backend.runner, [measured, measured], "cpu", job.trial_timeout(), lockstep=False
    )
    first, second = (r.output.throughput.window_spans for r in results)
    assert first[-1][1] <= second[0][0]  # every window of the first before any of the second


def test_a_remeasurement_process_measures_throughput_and_skips_the_drift_phase(launcher: TrialLauncher) -> None:
    trial = request("autotuner.backends.pytorch.builtin:mlp", SMALL_MLP)
    rerun = dataclasses.replace(trial, drift=False)
    full, measured_only = (launcher.call(RUNNER, "run", r, 120).output for r in (trial, rerun))
    assert full.losses.trajectory and math.isfinite(full.losses.heldout)
    assert measured_only.throughput.samples_per_s > 0
    assert measured_only.losses.trajectory == [] and math.isnan(measured_only.losses.heldout)


def test_a_figure_is_settled_when_the_last_two_processes_agree() -> None:
    assert settled([3385.0, 3400.0]) and settled([3385.0, 2624.0, 3300.0, 3400.0])
    assert not settled([3385.0, 2624.0])  # the trial, then a process 22% slower
    assert not settled([3400.0]) and not settled([])  # one process settles nothing
    assert settled([100.0, 100 * (1 - SETTLED)]) and not settled([100.0, 100 * (1 - SETTLED) - 0.01])


def test_configs_that_come_in_later_get_the_rounds_the_first_ones_left() -> None:
    def remeasured(number: int, processes: int) -> TrialRecord:
        return dataclasses.replace(_trial(number), remeasured=Remeasurement([100.0] * processes, [[100.0]] * processes))

    assert rounds_left([_trial(4), _trial(0)], [4, 0], 3) == 3  # the first re-measurement: all of them
    assert rounds_left([remeasured(4, 1), remeasured(0, 1), _trial(5)], [5], 3) == 2
    # the first ones ran to the cap: a newcomer is still judged, in one round
    assert rounds_left([remeasured(4, 3), remeasured(0, 3), _trial(5)], [5], 3) == 1
    # the batch's own processes (a re-measurement taken over from another worker) do not count
    assert rounds_left([remeasured(5, 2), _trial(0)], [5, 0], 3) == 3


# ---------------------------------------------------------------- rounds, on scripted processes


class _Paced:
    """A launcher whose re-measurement processes measure the rates given for their config's
    micro-batch, in order: each process's windows all at its rate. What a real process would
    measure on a busy machine is a script here, so each case is decided the same on any machine."""

    def __init__(self, rates: dict[int, list[float]]):
        self.rates = {batch: iter(values) for batch, values in rates.items()}
        self.ran: list[int] = []

    def call(self, runner: str, function: str, request: TrialRequest, timeout_s: float) -> TrialResult[TrialOutput]:
        batch = request.config["batch_size"]
        self.ran.append(batch)
        rate = next(self.rates[batch])
        throughput = dataclasses.replace(
            measured(rate, 2.0, [2.0]).throughput, window_samples_per_s=[rate] * request.windows
        )
        return TrialResult(Outcome.OK, output=TrialOutput(Losses(math.nan, []), throughput=throughput))


def _url(job: Job) -> str:
    """The study's storage: a database in the folder of its spec."""
    return f"sqlite:///{Path(job.source).parent}/study.db"


def _searched(tmp_path: Path, trials: dict[int, float], **budget: int) -> tuple[Job, optuna.Study]:
    """A study whose baseline (micro-batch 8) and configs (fp32 at other micro-batches) ran their
    trials at these rates, micro-batch -> samples/s, the baseline first."""
    job = load_spec(
        write_spec(
            tmp_path,
            global_batch=64,
            baseline={"precision": "fp32", "batch_size": 8, "workers": 0, "compile": "none"},
            space={"precision": ["fp32"], "batch_size": sorted(trials), "workers": [0], "compile": ["none"]},
            budget={"trials": len(trials), "remeasure_windows": 3, **budget},
        )
    )
    study = open_study(open_storage(_url(job)), job, CPU)
    study.set_user_attr(REFERENCE, reference(2.0, [2.0]).as_dict())
    space = {k: CategoricalDistribution(v) for k, v in job.space.items()}
    for number, (batch, rate) in enumerate(trials.items()):
        study.enqueue_trial({**job.baseline, "batch_size": batch})
        trial = study.ask(space)
        result = TrialResult(Outcome.OK, output=measured(rate, 2.0, [2.0]))
        config = job.complete(trial.params)
        role = BASELINE if number == 0 else SEARCH
        record(study, trial, job, config, result, role=role, reference=reference(2.0, [2.0]), environment=CPU)
    return job, study


def _remeasure(job: Job, study: optuna.Study, launcher: _Paced) -> str:
    """Re-measure `_searched`'s study, its processes one after another as on a GPU; what it printed."""
    printed = io.StringIO()
    claims = Claims(open_storage(_url(job)), study_id(study))
    once = OncePerStudy(study, claims, SearchProcess.this())
    reporter = SearchReporter(Console(file=printed, width=400))
    Remeasurer(job, study, once, cast(TrialLauncher, launcher), "cuda:0", reporter).run()
    return printed.getvalue()


def test_rounds_go_on_while_the_baselines_processes_disagree(tmp_path: Path) -> None:
    # The baseline's processes alternate between two rates 20% apart: no two in a row agree, and its
    # figure never settles, though the leader (micro-batch 64) is clearly ahead.
    job, study = _searched(tmp_path, {8: 1000.0, 32: 2000.0, 64: 4000.0}, remeasure_top=1, remeasure_runs=3)
    printed = _remeasure(job, study, _Paced({8: [800.0, 1000.0, 800.0], 64: [4000.0] * 3}))
    stored = remeasurements(study)
    leader = next(t.number for t in records(study) if t.config["batch_size"] == 64)
    assert sorted(stored) == [0, leader]  # the other config is far behind: never re-measured
    assert len(stored[0].throughputs) == len(stored[leader].throughputs) == 3  # every round of the cap
    assert stored[leader].group == [0, leader] and stored[leader].lockstep is False
    cap = r"after 3 rounds \(budget\.remeasure_runs\) the last two processes of the baseline are more than 6% apart"
    assert re.search(cap, " ".join(printed.split())), printed
    runs = [1000.0, *stored[0].throughputs]
    assert not any(settled(runs[k : k + 2]) for k in range(len(runs) - 1)), runs


def test_rounds_stop_once_the_leader_and_the_baseline_are_settled(tmp_path: Path) -> None:
    job, study = _searched(tmp_path, {8: 1000.0, 32: 2000.0, 64: 4000.0}, remeasure_top=1, remeasure_runs=3)
    launcher = _Paced({8: [1000.0, 1000.0, 1000.0], 64: [4000.0] * 3})
    _remeasure(job, study, launcher)
    stored = remeasurements(study)
    assert [len(r.throughputs) for r in stored.values()] == [1, 1]  # one round: both agree with their trials
    assert sorted(launcher.ran) == [8, 64]


def test_a_newcomer_after_rounds_that_ran_to_the_cap_is_judged_in_one_round(tmp_path: Path) -> None:
    # The baseline's processes (micro-batch 8) alternate between two rates ten times apart, the top
    # config's (64) between two three times apart: the first re-measurement runs every round of the
    # cap (2) unsettled, and their processes spread far. The other config's trial (32) is a quarter
    # as fast as the top's: not the top, yet within that spread, so it comes in after. Its process
    # is as fast as the top's best, beside the baseline's next, a slow one: it leads. Unsettled (its
    # trial and its process four times apart), it would run a second round, as the first configs
    # did; the budget has none left: it is judged in one.
    job, study = _searched(tmp_path, {8: 2000.0, 64: 5000.0, 32: 1250.0}, remeasure_top=1, remeasure_runs=2)
    launcher = _Paced({8: [200.0, 2000.0, 200.0], 64: [1666.0, 5000.0], 32: [5000.0]})
    _remeasure(job, study, launcher)
    stored = remeasurements(study)
    number = {t.config["batch_size"]: t.number for t in records(study)}
    top, newcomer = number[64], number[32]
    assert sorted(stored) == [0, top, newcomer], stored  # the baseline, the top config, then the other
    assert stored[top].group == [0, top] and stored[newcomer].group == [0, newcomer], stored
    assert len(stored[0].throughputs) == 2 and len(stored[top].throughputs) == 2, stored
    assert len(stored[newcomer].throughputs) == 1, stored  # not 2 more rounds
    assert launcher.ran.count(32) == 1 and launcher.ran.count(8) == 3
