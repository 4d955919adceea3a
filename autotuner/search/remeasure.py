"""Re-measurement: the fastest feasible configs and the baseline measured again, together, before
the best is declared, so that one lucky window or process cannot win, and the winner's speedup is
stated with its interval.

`autotuner.results.records.to_remeasure` picks the configs. They are measured in rounds: in each, every
config still in contention and the baseline run one fresh trial process each, measured together
(`autotuner.trials.lockstep.measure_together`; split into groups the memory holds, `remeasure_groups`
and `processes_that_fit`, the baseline in each). A round gives each config a speedup: its median
window over the baseline's beside it; its rounds give its speedup and, from two rounds on, its 90%
interval (`autotuner.measurement.interval`). From the second round on, a config whose interval the
leader's clears is out (`autotuner.results.standings.contenders`); the rounds run to
`budget.remeasure_runs`, or as many as `budget.remeasure_share`'s time holds, or until no config
is left, never stopping on the leader's interval (`settled`); the configs still in contention at
the end are stated jointly (`autotuner.results.standings.joint_among`). Configs that come in
later (a re-measurement reordered the top) are judged against those re-measured before them too
(`earlier_standings`), and get the rounds the first ones left of `budget.remeasure_runs`
(`rounds_left`), two at least. Each config's
`autotuner.results.evidence.Remeasurement` is stored in its claim
(`autotuner.workers.coordination.OncePerStudy.remeasure`), where `autotuner.results.records.records` reads it back.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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
from autotuner.results.standings import Standing, baseline_standing, contenders, joint_among, standing
from autotuner.spec.job import Job
from autotuner.trials.launcher import TrialLauncher, TrialResult
from autotuner.trials.lockstep import in_lockstep, measure_together
from autotuner.trials.outcomes import Outcome
from autotuner.trials.probe import PROBE_TIMEOUT_S
from autotuner.trials.trial_output import TrialOutput
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


def calibrated(t: TrialRecord) -> dict[str, Any]:
    """A re-measurement process's window as its config's trial calibrated it (its steps a window,
    no calibration again: half a second a process), where the trial kept it; else nothing (the
    process calibrates)."""
    steps = t.metrics.get("window_steps")
    return {"steps": int(steps), "min_window_s": 0.0} if steps else {}


def settled(alive: bool) -> bool:
    """Whether the rounds stop before the cap: only once no config is left to measure (`alive`
    false). Never on the leader's interval: stopping on the first narrow interval keeps the
    rounds whose spread happened to be small, and the interval then holds less often than its
    level says (`benchmarks/interval_procedure.py`)."""
    return not alive


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


def remeasure_groups(
    configs: list[TrialRecord], baseline: TrialRecord | None, most: int | None
) -> list[list[TrialRecord]]:
    """The groups of processes one round of a re-measurement measures together, one after
    another: a process of every config and of the baseline. One group when it has at most `most`
    processes (None: no limit); else the configs in parts of `most - 1` with the baseline in each,
    so that every config's speedup is over the baseline's windows measured beside it."""
    in_every_group = [baseline] if baseline is not None else []
    everyone = [*configs, *in_every_group]
    if most is None or len(everyone) <= most:
        return [everyone]
    size = max(1, most - len(in_every_group))
    return [[*configs[k : k + size], *in_every_group] for k in range(0, len(configs), size)]


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
        """Re-measure the configs of trials `numbers` in rounds: in each, a process of every config
        still in `contenders` and one of the baseline, measured together (in groups the memory
        holds, `remeasure_groups`), for the rounds left (`rounds_left`) or as many as the time
        holds, or until no config is left; the intervals are then stated jointly among the
        contenders (`joint_among`), and what is left undecided said in one line."""
        budget = self.job.spec.budget
        trials = [candidates[n] for n in numbers]
        configs = [t for t in trials if baseline is None or t.number != baseline.number]
        everyone = [*configs, *([baseline] if baseline is not None else [])]
        # in lockstep every process of a group is alive at once (on a GPU, one at a time)
        on_cpu = in_lockstep(self.device)
        most = budget.remeasure_group or (processes_that_fit(everyone) if on_cpu else None)
        lockstep = on_cpu and most != 1
        found = {t.number: Remeasurement(drift=budget.remeasure_drift) for t in everyone}
        # each config's share of the baseline's windows: those measured in its groups
        beside: dict[int, list[float]] = {t.number: [] for t in everyone}
        groups: dict[int, set[int]] = {t.number: set() for t in everyone}
        if len(remeasure_groups(configs, baseline, most)) > 1:
            self.reporter.note(
                f"re-measuring {', '.join(f'#{t.number}' for t in everyone)} in groups of at most {most} processes "
                f"({_why_split(budget.remeasure_group)}), the baseline beside the configs in each"
            )
        # configs re-measured in an earlier batch: the newcomers must beat them too, in the rounds left
        known = records(self.study)
        earlier = earlier_standings(known, numbers, baseline.number if baseline is not None else None)
        most_rounds = rounds_left(known, numbers, budget.remeasure_runs)
        cap = f"{most_rounds} round{'s' if most_rounds > 1 else ''} (budget.remeasure_runs" + (
            ", what the configs re-measured before left of it)" if most_rounds < budget.remeasure_runs else ")"
        )
        costs = [process_cost(t) for t in everyone]
        windows = windows_that_fit(costs, self.allowance.left if self.allowance else None, budget.remeasure_windows)
        alive, still = configs, [t.number for t in everyone]
        last: tuple[float, int] | None = None  # the last round's seconds and processes
        stopped = None
        for round_number in range(1, most_rounds + 1):
            parts = remeasure_groups(alive, baseline, most)
            processes = sum(len(part) for part in parts)
            if self.allowance is not None and last is not None and round_number > 2:
                expected = last[0] * processes / last[1]  # the last round's pace, for this round's processes
                if not self.allowance.holds(expected):
                    stopped = f"{round_number - 1} rounds, in the time budget.remeasure_share leaves"
                    break
            what = ", ".join(f"#{t.number}" for t in alive) + (" beside the baseline" if alive and baseline else "")
            how = f" in {len(parts)} groups" if len(parts) > 1 else ""
            left = f", {self.allowance.left:.0f} s left" if self.allowance is not None else ""
            began = self.clock()
            with self.reporter.running(
                f"re-measuring {what or 'the baseline'}{how}: round {round_number} of at most "
                f"{most_rounds}, {windows} windows a process{left}",
                logged=True,
            ):
                for part in parts:
                    self._measure_group(part, baseline, found, beside, groups, lockstep, windows)
            last = (self.clock() - began, processes)
            if self.allowance is not None:
                self.allowance.spent += last[0]
            alive = [t for t in alive if not found[t.number].error]
            standings = dict(earlier)
            standings.update({t.number: standing(found[t.number]) for t in alive})
            if baseline is not None and not found[baseline.number].error:
                standings[baseline.number] = baseline_standing(len(found[baseline.number].throughputs))
            still = contenders(standings)
            alive = [t for t in alive if t.number in still]
            if settled(bool(alive)):
                break
        else:
            stopped = cap
        # the intervals as the records will state them: the contenders' jointly (`joint_among`)
        before = {t.number: t.remeasured for t in known if t.remeasured is not None and t.number not in numbers}
        for number, among in joint_among({**before, **found}).items():
            if number in found:
                found[number].among = among
        if alive:
            lead = before[still[0]] if still[0] in before else found[still[0]]
            self._note_undecided(
                still, stated_interval(lead.speedups, among=lead.among, drift=lead.drift), stopped, round_number
            )
            if baseline is not None and (moved := machine_moved(found[baseline.number], still[0], lead)):
                self.reporter.note(moved)
        baseline_failed = baseline is None or found[baseline.number].error
        for t in trials:
            found[t.number].group = sorted(groups[t.number])
            found[t.number].lockstep = lockstep
            if not baseline_failed:
                found[t.number].baseline_windows = beside[t.number]
        for t in trials:
            self.reporter.remeasured(dataclasses.replace(t, remeasured=found[t.number]))
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

    def _measure_group(
        self,
        part: list[TrialRecord],
        baseline: TrialRecord | None,
        found: dict[int, Remeasurement],
        beside: dict[int, list[float]],
        groups: dict[int, set[int]],
        lockstep: bool,
        windows: int,
    ) -> None:
        """One process of each of `part`'s configs, `windows` windows each, measured together; their
        runs added to `found`, the baseline's windows to `beside` of each config measured with it."""
        job, device = self.job, self.device
        requests = [
            dataclasses.replace(
                job.trial_request(
                    t.config, device, progress=self.reporter.progress, log=job.log_path(f"trial-{t.number}")
                ),
                windows=windows,
                drift=False,  # its trial measured it: the same config, seed and data
                **calibrated(t),
            )
            for t in part
        ]
        timeout_s = job.trial_timeout(*(r.config for r in requests))
        results = measure_together(self.launcher, job.backend.runner, requests, device, timeout_s, lockstep=lockstep)
        for t, result in zip(part, results, strict=True):
            self._add_run(found[t.number], result)
            groups[t.number].update(other.number for other in part)
        if baseline is not None and not found[baseline.number].error:
            base_median = found[baseline.number].throughputs[-1]
            for t, result in zip(part, results, strict=True):  # each config's round: over the baseline beside it
                if t.number != baseline.number and result.outcome is Outcome.OK and not found[t.number].error:
                    found[t.number].speedups.append(found[t.number].throughputs[-1] / base_median)
        if baseline is not None and not found[baseline.number].error:
            measured = found[baseline.number].windows[-1]
            for t in part:  # its windows in this group (the baseline's: its own)
                beside[t.number].extend(measured)

    def _add_run(self, remeasurement: Remeasurement, result: TrialResult[TrialOutput]) -> None:
        """Add one re-measurement process's result to its config's `remeasurement`, or its error."""
        if remeasurement.error:
            return
        run = len(remeasurement.throughputs) + 1
        if result.outcome is not Outcome.OK:
            remeasurement.error = f"re-run {run}: {result.outcome.value}: {result.reason}"
            return
        output = result.output
        assert output is not None and output.throughput is not None  # it measured, and ended ok
        remeasurement.throughputs.append(output.throughput.samples_per_s)
        remeasurement.windows.append(output.throughput.window_samples_per_s)
        remeasurement.measured_s.append(output.throughput.measured_s)
