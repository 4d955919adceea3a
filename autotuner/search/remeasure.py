"""Re-measurement: the fastest feasible configs and the baseline measured again, together, before
the best is declared, so that one lucky window or process cannot win, and the winner's speedup is
stated with its interval.

`autotuner.results.records.to_remeasure` picks the configs. They are measured in rounds
(`autotuner.search.paired_rounds.measure_rounds`, which `autotuner apply`'s promise check runs too;
a batch's rounds are `autotuner.search.batch_rounds.BatchRounds`): in each, every config still in
contention and the baseline run one fresh trial process each, measured together
(`autotuner.trials.lockstep.measure_together`; split into groups the memory holds, `remeasure_groups`
and `processes_that_fit`, the baseline in each). A round gives each config a speedup: its median
window over the baseline's beside it; its rounds give its speedup and, from two rounds on, its 90%
interval (`autotuner.measurement.interval`). From the second round on, a config whose interval the
leader's clears is out (`autotuner.results.standings.contenders`); the rounds run to
`budget.remeasure_runs`, or as many as `budget.remeasure_share`'s time holds, or until no config
is left, never stopping on the leader's interval (`autotuner.search.batch_rounds.settled`); the
configs still in contention at the end are stated jointly (`autotuner.results.standings.joint_among`).
Configs that come in later (a re-measurement reordered the top) are judged against those
re-measured before them too (`earlier_standings`), and get the rounds the first ones left of
`budget.remeasure_runs` (`rounds_left`), two at least. Each config's
`autotuner.results.evidence.Remeasurement` is stored in its claim
(`autotuner.workers.coordination.OncePerStudy.remeasure`), where `autotuner.results.records.records` reads it back.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import optuna

from autotuner.measurement.interval import Interval, stated_interval
from autotuner.measurement.rounds import (
    FEWEST_WINDOWS,
    FIT_ROUNDS,
    ProcessCost,
    TimeBudget,
    round_seconds,
    windows_that_fit,
)
from autotuner.measurement.telemetry import available_memory_mb
from autotuner.measurement.timing import relative_spread as spread
from autotuner.output.console import SearchReporter
from autotuner.output.formatting import rate, times
from autotuner.results.evidence import Remeasurement
from autotuner.results.records import TrialRecord, baseline, records, spent_seconds, to_remeasure
from autotuner.results.run_time import RunPlan
from autotuner.results.standings import Standing, joint_among, standing
from autotuner.search.batch_rounds import BatchRounds, Grouping, remeasure_groups
from autotuner.search.paired_rounds import Pace, RoundsRan, measure_rounds
from autotuner.spec.job import Job
from autotuner.trials.launcher import TrialLauncher
from autotuner.trials.lockstep import in_lockstep
from autotuner.trials.outcomes import Outcome
from autotuner.trials.probe import PROBE_TIMEOUT_S
from autotuner.workers.coordination import OncePerStudy

MEMORY_SHARE = 0.8
"""The share of the memory available that a re-measurement group's processes may take."""
MACHINE_MOVED = 0.10
"""The baseline's processes this far apart ((max - min) / median) in a re-measurement: the
machine's speed moved between them, and the search says so, beside how far the speedups moved."""


def process_cost(t: TrialRecord) -> ProcessCost:
    """What a re-measurement process of `t`'s config costs, judged from its trial: its start, build
    and warm-up, and its window's length."""
    metrics = t.metrics
    count = len(metrics.get("throughput_windows") or []) or 1
    window_s = float(metrics.get("measured_s") or 0.0) / count
    fixed_s = sum(float(metrics.get(k) or 0.0) for k in ("startup_s", "setup_s", "warmup_s"))
    return ProcessCost(fixed_s, window_s)


def machine_moved(base: Remeasurement, leader: int, lead: Remeasurement) -> str | None:
    """One line saying how far the machine's speed moved during a re-measurement, where it moved
    more than `MACHINE_MOVED`: the spread of the baseline's processes (its rounds run at different
    times, so whatever changes the machine's speed between them is in it), beside the spread of
    the leader's speedups (each over the baseline's process measured with it: what lockstep
    leaves of it). None where it moved less, or there is nothing to compare."""
    if len(base.throughputs) < 2 or len(lead.speedups) < 2 or base.error:
        return None
    moved = spread(base.throughputs)
    if moved <= MACHINE_MOVED:
        return None
    return (
        f"the machine's speed moved during the re-measurement: the baseline's processes came out "
        f"{rate(min(base.throughputs))}-{rate(max(base.throughputs))} ({moved:.0%} apart); measured beside them, "
        f"#{leader}'s speedups {times(min(lead.speedups))}-{times(max(lead.speedups))} "
        f"({spread(lead.speedups):.0%} apart)"
    )


def earlier_standings(trials: list[TrialRecord], batch: list[int], baseline_number: int | None) -> dict[int, Standing]:
    """The `standing` of every config re-measured before this batch (trial numbers `batch`), the
    baseline and failed re-measurements aside: a newcomer is judged against them too, so one that
    cannot beat a leader settled earlier is out."""
    return {
        t.number: standing(t.remeasured)
        for t in trials
        if t.remeasured is not None
        and not t.remeasured.error
        and t.remeasured.rerun_windows
        and t.number not in batch
        and t.number != baseline_number
    }


def rounds_left(trials: list[TrialRecord], batch: list[int], runs: int) -> int:
    """How many rounds the re-measurement of trial numbers `batch` may run: `runs`
    (`budget.remeasure_runs`) less the rounds of the longest re-measurement before it (the most
    processes a config re-measured before has), two at least, so that each config gets an
    interval. Configs that come in once the first ones ran to the cap (a machine too noisy to
    settle them) are judged in two rounds, not in as many again."""
    ran = max(
        (len(t.remeasured.throughputs) for t in trials if t.remeasured is not None and t.number not in batch),
        default=0,
    )
    return max(min(2, runs), runs - ran)


def processes_that_fit(trials: list[TrialRecord]) -> int | None:
    """How many trial processes of these configs the memory available now holds at once, judged
    from the largest peak RSS of their trials (`autotuner.measurement.telemetry.CpuSampler`); None when
    either is not known (no /proc)."""
    available = available_memory_mb()
    peak = max((float(t.metrics.get("peak_rss_mb") or 0.0) for t in trials), default=0.0)
    if available is None or peak <= 0:
        return None
    return max(1, int(MEMORY_SHARE * available / peak))


def _why_split(remeasure_group: int | None) -> str:
    return "budget.remeasure_group" if remeasure_group else "what the memory available holds"


@dataclass
class Remeasurer:
    """The re-measurement of a study's top configs by one search process, once its budget is
    spent: on `device`, through `launcher`. Its processes measure throughput only: each config's
    trial measured its drift (the same config, seed and data)."""

    job: Job
    study: optuna.Study
    once: OncePerStudy
    launcher: TrialLauncher
    device: str
    reporter: SearchReporter
    plan: RunPlan | None = None
    """The real run, when the spec says it: the configs that can win it are re-measured."""
    allowance: TimeBudget | None = None
    """What the re-measurement may still spend (`budget.remeasure_share`); None: no bound."""
    clock: Callable[[], float] = time.monotonic
    """What a round's seconds are read on."""

    def run(self) -> None:
        """Measure the fastest feasible configs and the baseline again, in rounds of one more trial
        process each, measured together (`measure_together`), for `budget.remeasure_runs` rounds
        in all (or as many as the time holds), the configs the leader's interval clears dropped on
        the way (`contenders`). A config's
        throughput is then the median over every window of its processes, and its speedup the
        geometric mean of its rounds' speedups over the baseline measured beside it, with its
        interval; when that reorders the top, the newcomers are re-measured too,
        and so are the configs within the machine's noise of the best
        (`autotuner.results.records.to_remeasure`): at most twice `budget.remeasure_top` configs and the
        baseline in all."""
        settings = self.job.spec.budget
        if not settings.remeasure_top:
            return
        share = settings.remeasure_share
        self.allowance = TimeBudget(share * spent_seconds(records(self.study))) if share > 0 else None
        attempted: set[int] = set()
        while True:
            trials = records(self.study)
            candidates = to_remeasure(trials, settings.remeasure_top, self.plan)
            fresh = [t for t in candidates if t.remeasured is None and t.number not in attempted]
            if not fresh:
                return
            first = not attempted
            if not first and self.allowance is not None and not self._time_for(fresh, baseline(trials)):
                return
            attempted.update(t.number for t in fresh)  # those left out for time too: not again
            if first and self.allowance is not None:
                fresh = self._fitting(fresh, baseline(trials))
            allowed = self.once.remeasure_slots([t.number for t in fresh], 2 * settings.remeasure_top + 1)
            todo = {t.number: t for t in fresh if t.number in allowed}
            if not todo:
                continue
            todo_configs = [t.config for t in todo.values()]
            base = baseline(trials)
            measured_baseline = base if base is not None and base.outcome == Outcome.OK.value else None
            # each config's runs and the baseline's: a group of processes; its lease, generously
            lease_s = 2 * settings.remeasure_runs * self.job.trial_timeout(*todo_configs) + PROBE_TIMEOUT_S
            self.once.remeasure(list(todo), functools.partial(self._measure, todo, measured_baseline), lease_s)

    def _fitting(self, candidates: list[TrialRecord], base: TrialRecord | None) -> list[TrialRecord]:
        """Of the first `candidates` (fastest first, the baseline among them), those whose
        `FIT_ROUNDS` rounds of `FEWEST_WINDOWS` windows fit in the time: the fastest config at
        least. More configs in fewer rounds would leave each one's interval wide (t is 6.31 at two
        rounds, 2.92 at three); what is left out is said in one line."""
        assert self.allowance is not None
        configs = [t for t in candidates if base is None or t.number != base.number]
        fixed = [t for t in candidates if base is not None and t.number == base.number]
        kept = configs[:1]
        for t in configs[1:]:
            processes = [process_cost(p) for p in (*kept, t, *fixed)]
            if not self.allowance.holds(FIT_ROUNDS * round_seconds(processes, FEWEST_WINDOWS)):
                break
            kept.append(t)
        if len(kept) < len(configs):
            left = configs[len(kept) :]
            self.reporter.note(
                f"re-measuring {', '.join(f'#{t.number}' for t in kept)}, not {', '.join(f'#{t.number}' for t in left)}"
                f" (within the noise of the best in {'their trials' if len(left) > 1 else 'its trial'}): three rounds "
                f"of more would not fit in the time budget.remeasure_share leaves ({self.allowance.left:.0f} s)"
            )
        return [*kept, *fixed]

    def _time_for(self, newcomers: list[TrialRecord], base: TrialRecord | None) -> bool:
        """Whether the time left holds two rounds of `newcomers` (configs that came within the
        noise of the leader once it was re-measured) beside the baseline; if not, say which were
        left at their trials' figures."""
        assert self.allowance is not None
        processes = [*newcomers, *([base] if base is not None and base not in newcomers else [])]
        if self.allowance.holds(2 * round_seconds([process_cost(t) for t in processes], FEWEST_WINDOWS)):
            return True
        self.reporter.note(
            f"not re-measured: {', '.join(f'#{t.number}' for t in newcomers)}, within the noise of the best in "
            f"{'their trials' if len(newcomers) > 1 else 'its trial'}: the re-measurement spent its time "
            f"({self.allowance.spent:.0f} s, budget.remeasure_share of the trials')"
        )
        return False

    def _measure(
        self, candidates: dict[int, TrialRecord], baseline: TrialRecord | None, numbers: list[int]
    ) -> dict[int, Remeasurement]:
        """Re-measure the configs of trials `numbers` in rounds (`measure_rounds`): in each, a
        process of every config still in `contenders` and one of the baseline, measured together
        (in groups the memory holds, `remeasure_groups`), for the rounds left (`rounds_left`) or as
        many as the time holds, or until no config is left; the intervals are then stated jointly
        among the contenders (`joint_among`), and what is left undecided said in one line."""
        budget = self.job.spec.budget
        trials = [candidates[n] for n in numbers]
        configs = [t for t in trials if baseline is None or t.number != baseline.number]
        everyone = [*configs, *([baseline] if baseline is not None else [])]
        # in lockstep every process of a group is alive at once (on a GPU, one at a time)
        on_cpu = in_lockstep(self.device)
        most = budget.remeasure_group or (processes_that_fit(everyone) if on_cpu else None)
        if len(remeasure_groups(configs, baseline, most)) > 1:
            self.reporter.note(
                f"re-measuring {', '.join(f'#{t.number}' for t in everyone)} in groups of at most {most} processes "
                f"({_why_split(budget.remeasure_group)}), the baseline beside the configs in each"
            )
        # configs re-measured in an earlier batch: the newcomers must beat them too, in the rounds left
        known = records(self.study)
        earlier = earlier_standings(known, numbers, baseline.number if baseline is not None else None)
        most_rounds = rounds_left(known, numbers, budget.remeasure_runs)
        costs = [process_cost(t) for t in everyone]
        windows = windows_that_fit(costs, self.allowance.left if self.allowance else None, budget.remeasure_windows)
        grouping = Grouping(most, on_cpu and most != 1, windows)
        rounds = BatchRounds(self.job, self.launcher, self.device, self.reporter, configs, baseline, grouping, earlier)
        ran = measure_rounds(rounds, Pace(most_rounds, self.allowance, clock=self.clock))
        found = rounds.found
        # the intervals as the records will state them: the contenders' jointly (`joint_among`)
        before = {t.number: t.remeasured for t in known if t.remeasured is not None and t.number not in numbers}
        for number, among in joint_among({**before, **found}).items():
            if number in found:
                found[number].among = among
        if rounds.alive:
            still = rounds.still
            lead = before[still[0]] if still[0] in before else found[still[0]]
            stated = stated_interval(lead.speedups, among=lead.among, drift=lead.drift)
            self._note_undecided(still, stated, _stopped(ran, most_rounds, budget.remeasure_runs), ran.rounds)
            if baseline is not None and (moved := machine_moved(found[baseline.number], still[0], lead)):
                self.reporter.note(moved)
        finished = {t.number: rounds.finished(t) for t in trials}
        for t in trials:
            self.reporter.remeasured(dataclasses.replace(t, remeasured=finished[t.number]))
        return {t.number: found[t.number] for t in trials}

    def _note_undecided(self, still: list[int], lead: Interval | None, stopped: str | None, ran: int) -> None:
        """Say in one line what the rounds left undecided, if anything: the configs still within
        the noise of the leader (`still`, leader first), and the leader's speedup where its stated
        interval `lead` is wider than `budget.remeasure_width` asks, after `ran` rounds or where
        the rounds `stopped` (the cap or the time, as it reads)."""
        width = self.job.spec.budget.remeasure_width
        wide = lead is None or lead.half_width > width
        if len(still) < 2 and not wide:
            return
        after = stopped or f"{ran} round{'s' if ran > 1 else ''}"
        parts = []
        if len(still) > 1:
            parts.append(f"{', '.join(f'#{n}' for n in still)} are within the noise of each other")
        if wide:
            shown = f"{times(lead.estimate)}, {lead.text()}" if lead else "without an interval"
            parts.append(
                f"#{still[0]}'s {'speedup' if lead else 'figure'} is {shown}: "
                f"less certain than budget.remeasure_width (+-{width:.0%}) asks"
            )
        self.reporter.note(f"undecided after {after}: {'; '.join(parts)}")


def _stopped(ran: RoundsRan, most_rounds: int, runs: int) -> str | None:
    """Where the rounds stopped, as the line on what they left undecided says it: at the cap
    (`budget.remeasure_runs`, or what the configs re-measured before left of it) or for time;
    None where no config was left."""
    if ran.stopped == "time":
        return f"{ran.rounds} rounds, in the time budget.remeasure_share leaves"
    if ran.stopped == "cap":
        left = ", what the configs re-measured before left of it" if most_rounds < runs else ""
        return f"{most_rounds} round{'s' if most_rounds > 1 else ''} (budget.remeasure_runs{left})"
    return None
