"""Re-measurement: the fastest feasible configs and the baseline measured again, together, before
the best is declared, so that one lucky window or process cannot win, and the winner's speedup is
stated with its interval.

`autotuner.results.records.to_remeasure` picks the configs. They are measured in rounds: in each, every
config still in contention and the baseline run one fresh trial process each, measured together
(`autotuner.trials.lockstep.measure_together`; split into groups the memory holds, `remeasure_groups`
and `processes_that_fit`, the baseline in each). A round gives each config a speedup: its median
window over the baseline's beside it; its rounds give its speedup and, from two rounds on, its 90%
interval (`autotuner.measurement.interval`). From the second round on, a config whose interval the
leader's clears is out (`contenders`); the rounds stop once the leader's interval is narrower than
`budget.remeasure_width` (the leader's promise is then as certain as asked, whoever is left), when no config is left, or
after `budget.remeasure_runs` rounds. Configs that come in later (a re-measurement reordered the
top) are judged against those re-measured before them too (`earlier_standings`), and get the
rounds the first ones left of `budget.remeasure_runs` (`rounds_left`), two at least. Each config's
`autotuner.results.evidence.Remeasurement` is stored in its claim
(`autotuner.workers.coordination.OncePerStudy.remeasure`), where `autotuner.results.records.records` reads it back.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import optuna

from autotuner.measurement.interval import Interval, geometric_mean, ratio_interval
from autotuner.measurement.telemetry import available_memory_mb
from autotuner.output.console import SearchReporter
from autotuner.output.formatting import times
from autotuner.results.evidence import Remeasurement
from autotuner.results.records import TrialRecord, baseline, records, to_remeasure
from autotuner.results.run_time import RunPlan
from autotuner.spec.job import Job
from autotuner.trials.launcher import TrialLauncher, TrialResult
from autotuner.trials.lockstep import in_lockstep, measure_together
from autotuner.trials.outcomes import Outcome
from autotuner.trials.probe import PROBE_TIMEOUT_S
from autotuner.trials.trial_output import TrialOutput
from autotuner.workers.coordination import OncePerStudy

MEMORY_SHARE = 0.8
"""The share of the memory available that a re-measurement group's processes may take."""


@dataclass(frozen=True)
class Standing:
    """A config's speedup so far in a re-measurement: the geometric mean of its rounds' speedups
    (of its processes' throughputs, without a baseline), and its interval once it has two rounds."""

    speedup: float
    interval: Interval | None


def standing(remeasurement: Remeasurement) -> Standing:
    """Where a config's `remeasurement` puts it (`Standing`): by its rounds' speedups; without a
    baseline beside it, by its processes' throughputs the same way."""
    rounds = remeasurement.speedups or remeasurement.throughputs
    return Standing(geometric_mean(rounds), ratio_interval(rounds))


def contenders(standings: dict[int, Standing]) -> list[int]:
    """The configs that can still win, leader first: `standings` maps a trial number to its
    `Standing`. A config is out once the leader's interval clears its own
    (`Interval.clears`: the leader's lower end above its upper end); one without an interval yet
    (one round) is never out, since one round says nothing of how far the next one can land."""
    if not standings:
        return []
    leader = max(standings, key=lambda n: (standings[n].speedup, -n))
    lead = standings[leader].interval
    kept = [leader]
    for number, other in sorted(standings.items(), key=lambda item: -item[1].speedup):
        if number == leader:
            continue
        if lead is None or other.interval is None or not lead.clears(other.interval):
            kept.append(number)
    return kept


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


def baseline_standing(runs: int) -> Standing:
    """The baseline's `Standing` after `runs` rounds: a speedup of 1 by definition, exactly (its
    interval a point, from two rounds on), so a config whose interval lies below 1 is out."""
    return Standing(1.0, Interval(1.0, 1.0, 1.0, runs) if runs >= 2 else None)


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

    def run(self) -> None:
        """Measure the fastest feasible configs and the baseline again, in rounds of one more trial
        process each, measured together (`measure_together`), until the leader's interval is as
        narrow as `budget.remeasure_width` or after `budget.remeasure_runs` rounds in all, the
        configs the leader's interval clears dropped on the way (`contenders`). A config's
        throughput is then the median over every window of its processes, and its speedup the
        geometric mean of its rounds' speedups over the baseline measured beside it, with its
        interval; when that reorders the top, the newcomers are re-measured too,
        and so are the configs within the machine's noise of the best
        (`autotuner.results.records.to_remeasure`): at most twice `budget.remeasure_top` configs and the
        baseline in all."""
        settings = self.job.spec.budget
        if not settings.remeasure_top:
            return
        attempted: set[int] = set()
        while True:
            trials = records(self.study)
            candidates = to_remeasure(trials, settings.remeasure_top, self.plan)
            fresh = [t for t in candidates if t.remeasured is None and t.number not in attempted]
            if not fresh:
                return
            attempted.update(t.number for t in fresh)
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

    def _measure(
        self, candidates: dict[int, TrialRecord], baseline: TrialRecord | None, numbers: list[int]
    ) -> dict[int, Remeasurement]:
        """Re-measure the configs of trials `numbers` in rounds: in each, a process of every config
        still in `contenders` and one of the baseline, measured together (in groups the memory
        holds, `remeasure_groups`), until the leader's interval is as narrow as
        `budget.remeasure_width`, or no config is left, or after the rounds left (`rounds_left`)."""
        budget = self.job.spec.budget
        trials = [candidates[n] for n in numbers]
        configs = [t for t in trials if baseline is None or t.number != baseline.number]
        everyone = [*configs, *([baseline] if baseline is not None else [])]
        # in lockstep every process of a group is alive at once (on a GPU, one at a time)
        on_cpu = in_lockstep(self.device)
        most = budget.remeasure_group or (processes_that_fit(everyone) if on_cpu else None)
        lockstep = on_cpu and most != 1
        found = {t.number: Remeasurement() for t in everyone}
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
        alive, still = configs, [t.number for t in everyone]
        standings: dict[int, Standing] = {}
        for round_number in range(1, most_rounds + 1):
            parts = remeasure_groups(alive, baseline, most)
            what = ", ".join(f"#{t.number}" for t in alive) + (" beside the baseline" if alive and baseline else "")
            how = f" in {len(parts)} groups" if len(parts) > 1 else ""
            with self.reporter.running(
                f"re-measuring {what or 'the baseline'}{how}: round {round_number} of at most "
                f"{most_rounds}, {budget.remeasure_windows} windows a process"
            ):
                for part in parts:
                    self._measure_group(part, baseline, found, beside, groups, lockstep)
            alive = [t for t in alive if not found[t.number].error]
            standings = dict(earlier)
            standings.update({t.number: standing(found[t.number]) for t in alive})
            if baseline is not None and not found[baseline.number].error:
                standings[baseline.number] = baseline_standing(len(found[baseline.number].throughputs))
            still = contenders(standings)
            alive = [t for t in alive if t.number in still]
            lead = standings[still[0]].interval if still else None
            narrow = lead is not None and lead.half_width <= budget.remeasure_width
            if not alive or narrow:
                break
        if alive:
            self._note_undecided(still, standings, cap if not narrow else None, round_number)
        baseline_failed = baseline is None or found[baseline.number].error
        for t in trials:
            found[t.number].group = sorted(groups[t.number])
            found[t.number].lockstep = lockstep
            if not baseline_failed:
                found[t.number].baseline_windows = beside[t.number]
        for t in trials:
            self.reporter.remeasured(dataclasses.replace(t, remeasured=found[t.number]))
        return {t.number: found[t.number] for t in trials}

    def _note_undecided(self, still: list[int], standings: dict[int, Standing], cap: str | None, ran: int) -> None:
        """Say what the rounds left undecided: configs still within the noise of the leader (`still`,
        leader first), and at the cap (`cap`, how it reads; None before it), a leader's speedup
        less certain than `budget.remeasure_width` asks."""
        after = cap or f"{ran} round{'s' if ran > 1 else ''}"
        if len(still) > 1:
            self.reporter.note(f"after {after} {', '.join(f'#{n}' for n in still)} are within the noise of each other")
        lead = standings[still[0]].interval
        width = self.job.spec.budget.remeasure_width
        if cap is not None:
            shown = f"{times(lead.estimate)}, {lead.text()}" if lead else "without an interval"
            self.reporter.note(
                f"after {after} #{still[0]}'s {'speedup' if lead else 'figure'} is {shown}: "
                f"less certain than budget.remeasure_width (+-{width:.0%}) asks"
            )

    def _measure_group(
        self,
        part: list[TrialRecord],
        baseline: TrialRecord | None,
        found: dict[int, Remeasurement],
        beside: dict[int, list[float]],
        groups: dict[int, set[int]],
        lockstep: bool,
    ) -> None:
        """One process of each of `part`'s configs, measured together; their runs added to `found`,
        the baseline's windows to `beside` of each config measured with it."""
        job, device = self.job, self.device
        requests = [
            dataclasses.replace(
                job.trial_request(
                    t.config, device, progress=self.reporter.progress, log=job.log_path(f"trial-{t.number}")
                ),
                windows=job.spec.budget.remeasure_windows,
                drift=False,  # its trial measured it: the same config, seed and data
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
