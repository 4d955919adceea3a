"""Re-measurement: its rounds, which configs stay in them and when the leader's interval stops them, how
many trial processes are alive at once, and how a group that the memory cannot hold is split,
the baseline beside the configs in every part."""

from __future__ import annotations

import dataclasses
import io
import math
import re
from pathlib import Path
from typing import cast

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from rich.console import Console

from autotuner.measurement.interval import ratio_interval, stated_interval
from autotuner.measurement.telemetry import available_memory_mb
from autotuner.output.console import SearchReporter
from autotuner.results.evidence import Remeasurement
from autotuner.results.records import TrialRecord, records, remeasurements, speedup_interval
from autotuner.results.standings import Standing, baseline_standing, contenders
from autotuner.results.store import Yardstick, record
from autotuner.search.batch_rounds import remeasure_groups
from autotuner.search.remeasure import (
    MEMORY_SHARE,
    Remeasurer,
    earlier_standings,
    processes_that_fit,
    rounds_left,
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


def _one_round(speedup: float) -> Standing:
    return Standing(speedup, None)


def test_after_one_round_no_config_is_out() -> None:
    # one round gives no interval: however far behind a config's first round came out, it stays
    assert contenders({0: _one_round(1.0), 4: _one_round(2.0), 5: _one_round(1.2)}) == [4, 5, 0]
    assert contenders({4: _one_round(2.0), 5: _one_round(2.0)}) == [4, 5]  # a tie goes to the lower number
    assert contenders({}) == []


def _rounds(*ratios: float) -> Standing:
    interval = ratio_interval(list(ratios))
    assert interval is not None
    return Standing(interval.estimate, interval)


def test_with_intervals_a_config_is_out_once_the_leaders_interval_clears_its_own() -> None:
    leader, close, far = _rounds(5.0, 5.1, 4.9), _rounds(4.9, 5.0, 4.8), _rounds(4.0, 4.1, 3.9)
    assert leader.interval is not None and far.interval is not None and close.interval is not None
    assert leader.interval.clears(far.interval) and not leader.interval.clears(close.interval)
    assert contenders({4: leader, 5: close, 6: far}) == [4, 5]
    # the baseline's speedup is 1 exactly: a config whose interval lies above 1 puts it out
    assert contenders({0: baseline_standing(3), 4: leader}) == [4]
    # a config without an interval yet stays, whatever its one round said
    assert contenders({4: leader, 7: _one_round(4.0)}) == [4, 7]


def test_a_newcomer_is_judged_against_the_leader_re_measured_before_it() -> None:
    # #4 re-measured first in two rounds, at 4.8x and 4.9x the baseline beside it; #5 and #1 came in after it
    leader = dataclasses.replace(
        _trial(4),
        remeasured=Remeasurement(
            [13_000.0, 13_100.0],
            [[12_900.0, 13_000.0, 13_100.0], [13_000.0, 13_100.0, 13_200.0]],
            speedups=[4.8, 4.9],
            baseline_windows=[2_700.0, 2_710.0, 2_720.0, 2_660.0, 2_670.0, 2_680.0],
        ),
    )
    failed = dataclasses.replace(_trial(7), remeasured=Remeasurement(error="re-run 1: crash: signal 9"))
    base = dataclasses.replace(_trial(0), remeasured=Remeasurement([2_710.0], [[2_700.0, 2_710.0, 2_720.0]]))
    earlier = earlier_standings([leader, failed, base, _trial(5), _trial(1)], [5, 1], baseline_number=0)
    assert list(earlier) == [4]  # neither the baseline, nor a failed one, nor the batch's own
    assert earlier[4].speedup == pytest.approx(math.sqrt(4.8 * 4.9))  # the rounds' geometric mean
    assert earlier[4].interval == ratio_interval([4.8, 4.9])
    # the newcomers' two rounds: about 4.0x and 3.96x, within the noise of each other, but not of #4
    these = {0: baseline_standing(2), 5: _rounds(4.0, 4.02), 1: _rounds(3.95, 3.97)}
    assert contenders(these) == [5, 1]  # alone, they would go on for every round
    assert contenders({**earlier, **these}) == [4]  # beside the leader, both are out


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


def test_configs_that_come_in_later_get_the_rounds_the_first_ones_left() -> None:
    def remeasured(number: int, processes: int) -> TrialRecord:
        return dataclasses.replace(_trial(number), remeasured=Remeasurement([100.0] * processes, [[100.0]] * processes))

    assert rounds_left([_trial(4), _trial(0)], [4, 0], 5) == 5  # the first re-measurement: all of them
    assert rounds_left([remeasured(4, 2), remeasured(0, 2), _trial(5)], [5], 5) == 3
    # the first ones ran to the cap: a newcomer is still judged, in the two rounds an interval needs
    assert rounds_left([remeasured(4, 5), remeasured(0, 5), _trial(5)], [5], 5) == 2
    assert rounds_left([remeasured(4, 1), _trial(5)], [5], 1) == 1  # never more than the cap
    # the batch's own processes (a re-measurement taken over from another worker) do not count
    assert rounds_left([remeasured(5, 2), _trial(0)], [5, 0], 3) == 3


# ---------------------------------------------------------------- rounds, on scripted processes


class _Paced:
    """A launcher whose re-measurement processes measure the rates given for their config's
    micro-batch, in order: each process's windows all at its rate. What a real process would
    measure on a busy machine is a script here, so each case is decided the same on any machine."""

    def __init__(self, rates: dict[int, list[float]], process_s: float = 0.0):
        self.rates = {batch: iter(values) for batch, values in rates.items()}
        self.ran: list[int] = []
        self.windows: list[int] = []
        self.now, self.process_s = 0.0, process_s

    def clock(self) -> float:
        return self.now

    def call(self, runner: str, function: str, request: TrialRequest, timeout_s: float) -> TrialResult[TrialOutput]:
        batch = request.config["batch_size"]
        self.ran.append(batch)
        self.windows.append(request.windows)
        self.now += self.process_s
        rate = next(self.rates[batch])
        throughput = dataclasses.replace(
            measured(rate, 2.0, [2.0]).throughput, window_samples_per_s=[rate] * request.windows
        )
        return TrialResult(Outcome.OK, output=TrialOutput(Losses(math.nan, []), throughput=throughput))


def _url(job: Job) -> str:
    """The study's storage: a database in the folder of its spec."""
    return f"sqlite:///{Path(job.source).parent}/study.db"


def _searched(
    tmp_path: Path, trials: dict[int, float], trial_s: float = 0.0, **budget: float
) -> tuple[Job, optuna.Study]:
    """A study whose baseline (micro-batch 8) and configs (fp32 at other micro-batches) ran their
    trials at these rates, micro-batch -> samples/s, the baseline first, each in `trial_s`."""
    job = load_spec(
        write_spec(
            tmp_path,
            global_batch=64,
            baseline={"precision": "fp32", "batch_size": 8, "workers": 0, "compile": "none"},
            space={"precision": ["fp32"], "batch_size": sorted(trials), "workers": [0], "compile": ["none"]},
            # the rounds' time is the script's: no time bound unless a test sets one
            budget={"trials": len(trials), "remeasure_windows": 3, "remeasure_share": 0, **budget},
        )
    )
    study = open_study(open_storage(_url(job)), job, CPU)
    study.set_user_attr(REFERENCE, reference(2.0, [2.0]).as_dict())
    space = {k: CategoricalDistribution(v) for k, v in job.space.items()}
    for number, (batch, rate) in enumerate(trials.items()):
        study.enqueue_trial({**job.baseline, "batch_size": batch})
        trial = study.ask(space)
        result = TrialResult(Outcome.OK, output=measured(rate, 2.0, [2.0]), wall_s=trial_s)
        config = job.complete(trial.params)
        role = BASELINE if number == 0 else SEARCH
        record(study, trial, config, result, role=role, against=Yardstick(job, reference(2.0, [2.0]), CPU))
    return job, study


def _remeasure(job: Job, study: optuna.Study, launcher: _Paced) -> str:
    """Re-measure `_searched`'s study, its processes one after another as on a GPU; what it printed
    (as in a log: no status line). Each process takes the launcher's `process_s` on its clock."""
    printed = io.StringIO()
    claims = Claims(open_storage(_url(job)), study_id(study))
    once = OncePerStudy(study, claims, SearchProcess.this())
    reporter = SearchReporter(Console(file=printed, width=400, force_terminal=False))
    remeasurer = Remeasurer(job, study, once, cast(TrialLauncher, launcher), "cuda:0", reporter)
    remeasurer.clock = launcher.clock
    remeasurer.run()
    return printed.getvalue()


def test_rounds_go_on_while_the_leaders_interval_is_wide(tmp_path: Path) -> None:
    # The baseline's processes alternate between two rates 20% apart, the leader's (micro-batch 64)
    # hold theirs: its rounds' speedups are 5x, 4x, 5x, and its interval stays wider than +-5%
    # though it is clearly ahead of the other config.
    job, study = _searched(tmp_path, {8: 1000.0, 32: 2000.0, 64: 4000.0}, remeasure_top=1, remeasure_runs=3)
    printed = _remeasure(job, study, _Paced({8: [800.0, 1000.0, 800.0], 64: [4000.0] * 3}))
    stored = remeasurements(study)
    leader = next(t.number for t in records(study) if t.config["batch_size"] == 64)
    assert sorted(stored) == [0, leader]  # the other config is far behind: never re-measured
    assert len(stored[0].throughputs) == len(stored[leader].throughputs) == 3  # every round of the cap
    assert stored[leader].speedups == [5.0, 4.0, 5.0] and stored[0].speedups == []
    assert stored[leader].group == [0, leader] and stored[leader].lockstep is False
    interval = stated_interval([5.0, 4.0, 5.0])
    assert interval is not None and interval.half_width > 0.05
    cap = (
        rf"undecided after 3 rounds \(budget\.remeasure_runs\): #{leader}'s speedup is 4\.64x, 90% interval "
        rf"{interval.low:.2f}-{interval.high:.2f}x: less certain than budget\.remeasure_width \(\+-5%\) asks"
    )
    assert re.search(cap, " ".join(printed.split())), printed
    # what the machine did, said where it happens: the baseline's processes 25% apart, the
    # speedups over them (each over the baseline's process beside it) 20%
    moved = (
        "the machine's speed moved during the re-measurement: the baseline's processes came out 800/s-1,000/s "
        f"(25% apart); measured beside them, #{leader}'s speedups 4.00x-5.00x (20% apart)"
    )
    assert moved in " ".join(printed.split()), printed


def test_rounds_go_on_past_a_narrow_interval_to_the_cap(tmp_path: Path) -> None:
    """Stopping at the first narrow interval would keep the rounds whose spread happened to be
    small: the interval would hold less often than it says. The rounds run to the cap."""
    job, study = _searched(tmp_path, {8: 1000.0, 32: 2000.0, 64: 4000.0}, remeasure_top=1, remeasure_runs=4)
    launcher = _Paced({8: [1000.0, 1010.0, 1000.0, 1000.0], 64: [4000.0] * 4})
    printed = _remeasure(job, study, launcher)
    stored = remeasurements(study)
    # two rounds, 4.0x and 3.96x, were within +-5% already
    assert [len(r.throughputs) for r in stored.values()] == [4, 4]
    assert sorted(launcher.ran) == [8] * 4 + [64] * 4
    assert "undecided" not in printed and "the machine's speed moved" not in printed  # 1% apart


def test_the_stated_interval_allows_for_the_drift_the_spec_sets(tmp_path: Path) -> None:
    """`budget.remeasure_drift` is stored with each re-measurement and is what the records' stated
    interval (the export's, the console's) allows for; 0 leaves the rounds' own interval."""
    for drift in (0.05, 0.0):
        folder = tmp_path / str(drift)
        folder.mkdir()
        job, study = _searched(
            folder, {8: 1000.0, 32: 2000.0, 64: 4000.0}, remeasure_top=1, remeasure_runs=3, remeasure_drift=drift
        )
        _remeasure(job, study, _Paced({8: [1000.0, 1010.0, 990.0], 64: [4000.0] * 3}))
        leader = next(t for t in records(study) if t.config["batch_size"] == 64)
        assert leader.remeasured is not None and leader.remeasured.drift == drift
        stated = speedup_interval(leader)
        assert stated is not None and stated.drift == drift
        assert stated == stated_interval(leader.remeasured.speedups, drift=drift)
        own = ratio_interval(leader.remeasured.speedups)
        assert own is not None and (stated.half_width > own.half_width) is (drift > 0)


def test_configs_within_the_noise_of_each_other_are_stated_jointly(tmp_path: Path) -> None:
    """Two configs neither of which the other's interval clears: the winner is the better of two
    estimates, so both intervals are stated jointly (`among` 2: Sidak's level for each), as the
    console printed them and as the records read them back."""
    job, study = _searched(tmp_path, {8: 1000.0, 32: 3900.0, 64: 4000.0}, remeasure_top=2, remeasure_runs=3)
    launcher = _Paced({8: [1000.0] * 3, 32: [3900.0, 4100.0, 4000.0], 64: [4000.0, 3900.0, 4100.0]})
    printed = " ".join(_remeasure(job, study, launcher).split())
    stored = remeasurements(study)
    number = {t.config["batch_size"]: t.number for t in records(study)}
    assert stored[number[32]].among == stored[number[64]].among == 2 and stored[0].among == 1
    joint = stated_interval(stored[number[64]].speedups, among=2)
    alone = stated_interval(stored[number[64]].speedups)
    assert joint is not None and alone is not None and joint.half_width > alone.half_width
    assert f"90% interval {joint.low:.2f}-{joint.high:.2f}x (3 rounds)" in printed, printed
    assert "are within the noise of each other" in printed


def test_a_newcomer_after_rounds_that_ran_to_the_cap_is_judged_in_two_rounds(tmp_path: Path) -> None:
    # The baseline's processes (micro-batch 8) alternate between two rates ten times apart, the top
    # config's (64) between two three times apart: the first re-measurement runs every round of the
    # cap (3), its interval wide, and their processes spread far. The other config's trial (32) is a
    # quarter as fast as the top's: not the top, yet within that spread, so it comes in after. The
    # budget has no rounds left: it is judged in the two an interval needs, not in three more.
    job, study = _searched(tmp_path, {8: 2000.0, 64: 5000.0, 32: 1250.0}, remeasure_top=1, remeasure_runs=3)
    launcher = _Paced({8: [200.0, 2000.0, 200.0, 2000.0, 200.0], 64: [1666.0, 5000.0, 1666.0], 32: [5000.0] * 2})
    _remeasure(job, study, launcher)
    stored = remeasurements(study)
    number = {t.config["batch_size"]: t.number for t in records(study)}
    top, newcomer = number[64], number[32]
    assert sorted(stored) == [0, top, newcomer], stored  # the baseline, the top config, then the other
    assert stored[top].group == [0, top] and stored[newcomer].group == [0, newcomer], stored
    assert len(stored[0].throughputs) == 3 and len(stored[top].throughputs) == 3, stored
    assert len(stored[newcomer].throughputs) == 2, stored  # not 3 more rounds
    assert stored[newcomer].speedups == [2.5, 25.0]
    assert launcher.ran.count(32) == 2 and launcher.ran.count(8) == 5


def test_re_measurement_stops_within_its_share_of_the_trials_time_and_says_so(tmp_path: Path) -> None:
    # Three trials of 10 s: half of it is 15 s. Each re-measurement process takes 3 s on the script's
    # clock, a round of the leader and the baseline 6 s: two rounds (12 s) fit, a third would not.
    job, study = _searched(
        tmp_path, {8: 1000.0, 32: 2000.0, 64: 4000.0}, trial_s=10.0, remeasure_top=1, remeasure_share=0.5
    )
    launcher = _Paced({8: [800.0, 1000.0, 800.0, 1000.0], 64: [4000.0] * 4}, process_s=3.0)
    printed = " ".join(_remeasure(job, study, launcher).split())
    stored = remeasurements(study)
    leader = next(t.number for t in records(study) if t.config["batch_size"] == 64)
    assert len(stored[leader].throughputs) == 2 and launcher.now == 12.0  # not the third round
    assert re.search(
        rf"undecided after 2 rounds, in the time budget\.remeasure_share leaves: #{leader}'s speedup is 4\.47x",
        printed,
    ), printed
    assert printed.count("re-measuring #") == 2  # a line a round, in a log
    assert "round 1 of at most 5, 3 windows a process, 15 s left" in printed
    assert "round 2 of at most 5, 3 windows a process, 9 s left" in printed


def test_the_windows_a_process_are_as_many_as_let_three_rounds_fit() -> None:
    from autotuner.measurement.rounds import FEWEST_WINDOWS, ProcessCost, round_seconds, windows_that_fit
    from autotuner.search.remeasure import process_cost

    slow = dataclasses.replace(_trial(1), metrics={"measured_s": 1.0, "throughput_windows": [1.0] * 2, "setup_s": 0.2})
    assert process_cost(slow) == ProcessCost(fixed_s=0.2, window_s=0.5)
    costs = [ProcessCost(0.2, 0.5), ProcessCost(0.0, 1.0)]
    assert costs[0].seconds(4) == pytest.approx(0.2 + (1 + 4.4) * 0.5)
    assert windows_that_fit(costs, None, 10) == 10
    assert windows_that_fit(costs, 1e6, 10) == 10
    assert windows_that_fit(costs, 3 * round_seconds(costs, 6), 10) == 6
    assert windows_that_fit(costs, 1.0, 10) == FEWEST_WINDOWS  # no time: the fewest, not none
    assert windows_that_fit(costs, 1.0, 2) == 2  # never more than the most
