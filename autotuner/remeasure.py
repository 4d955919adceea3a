"""Re-measurement: the fastest feasible configs and the baseline measured again, together, before
the best is declared, so that one lucky window or process cannot win.

`autotuner.records.to_remeasure` picks the configs, `remeasure_groups` splits their processes into
groups the memory holds (`processes_that_fit`), `autotuner.lockstep.measure_together` runs each
group, and each config's `autotuner.results.Remeasurement` is stored in its claim
(`autotuner.coordination.OncePerStudy.remeasure`), where `autotuner.records.records` reads it back.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import optuna

from autotuner.console import SearchReporter
from autotuner.coordination import OncePerStudy
from autotuner.lockstep import in_lockstep, measure_together
from autotuner.outcomes import Outcome
from autotuner.records import TrialRecord, baseline, records, to_remeasure
from autotuner.results import Reference, Remeasurement, TrialOutput
from autotuner.spec import Job
from autotuner.telemetry import available_memory_mb
from autotuner.trial import TrialLauncher, TrialResult
from autotuner.trial_requests import PROBE_TIMEOUT_S, trial_request

MEMORY_SHARE = 0.8
"""The share of the memory available that a re-measurement group's processes may take."""


def remeasure_groups(
    configs: list[TrialRecord], baseline: TrialRecord | None, runs: int, most: int | None
) -> list[list[TrialRecord]]:
    """The groups of processes a re-measurement measures together, one after another: every
    config `runs` times and the baseline beside them. One group, interleaved (run 1 of each, then
    run 2, ...), when it has at most `most` processes (None: no limit); else a group per run, the
    configs of a run split into parts of `most - 1` with the baseline in each, so that every
    config's speedup is over the baseline's windows measured beside it."""
    in_every_group = [baseline] if baseline is not None else []
    everyone = [*configs, *in_every_group]
    if most is None or runs * len(everyone) <= most:
        return [[t for _ in range(runs) for t in everyone]]
    size = max(1, most - len(in_every_group))
    return [[*configs[k : k + size], *in_every_group] for _ in range(runs) for k in range(0, len(configs), size)]


def processes_that_fit(trials: list[TrialRecord]) -> int | None:
    """How many trial processes of these configs the memory available now holds at once, judged
    from the largest peak RSS of their trials (`autotuner.telemetry.CpuSampler`); None when
    either is not known (no /proc)."""
    available = available_memory_mb()
    peak = max((float(t.metrics.get("peak_rss_mb") or 0.0) for t in trials), default=0.0)
    if available is None or peak <= 0:
        return None
    return max(1, int(MEMORY_SHARE * available / peak))


@dataclass
class Remeasurer:
    """The re-measurement of a study's top configs by one search process, once its budget is
    spent: on `device`, through `launcher`, drift checked against `reference`."""

    job: Job
    study: optuna.Study
    once: OncePerStudy
    launcher: TrialLauncher
    device: str
    reference: Reference
    reporter: SearchReporter

    def run(self) -> None:
        """Measure the fastest feasible configs and the baseline again: each in
        `budget.remeasure_runs` more trial processes, measured together (`measure_together`). A
        config's throughput is then the median over every window of those processes, and its
        speedup is over the baseline's windows measured with them; when that reorders the top, the
        newcomers are re-measured too, and so are the configs within the machine's noise of the
        best (`autotuner.records.to_remeasure`): at most twice `budget.remeasure_top` configs and
        the baseline in all."""
        settings = self.job.spec.budget
        if not settings.remeasure_top:
            return
        attempted: set[int] = set()
        while True:
            trials = records(self.study)
            candidates = to_remeasure(trials, settings.remeasure_top)
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
        """Re-measure the configs of trials `numbers`, each in `budget.remeasure_runs` processes,
        with as many of the baseline beside them, measured together: in one group when the memory
        holds it, else in several (`remeasure_groups`)."""
        job, budget, device = self.job, self.job.spec.budget, self.device
        runs, windows = budget.remeasure_runs, budget.remeasure_windows
        trials = [candidates[n] for n in numbers]
        configs = [t for t in trials if baseline is None or t.number != baseline.number]
        everyone = [*configs, *([baseline] if baseline is not None else [])]
        by_number = {t.number: t for t in everyone}
        # in lockstep every process of a group is alive at once (on a GPU, one at a time)
        on_cpu = in_lockstep(device)
        most = budget.remeasure_group or (processes_that_fit(everyone) if on_cpu else None)
        lockstep = on_cpu and most != 1
        groups = [[t.number for t in group] for group in remeasure_groups(configs, baseline, runs, most)]
        shown = ", ".join(f"#{t.number}" for t in everyone)
        if len(groups) > 1:
            why = "budget.remeasure_group" if budget.remeasure_group else "what the memory available holds"
            how = f"in {len(groups)} groups of at most {most} processes" if lockstep else "one process at a time"
            self.reporter.note(f"re-measuring {shown} {how} ({why}), the baseline beside the configs in each")
        found = {t.number: Remeasurement() for t in everyone}
        # each trial's share of the baseline's windows: those measured in its groups
        baseline_windows_by_trial: dict[int, list[float]] = {t.number: [] for t in everyone}
        with self.reporter.running(f"re-measuring {shown}, {runs} runs of {windows} windows each"):
            for group in groups:
                requests = [
                    dataclasses.replace(trial_request(job, by_number[n].config, device), windows=windows) for n in group
                ]
                rounds = runs if len(groups) == 1 else 1  # one group: the runs interleaved, a round each
                results = measure_together(self.launcher, job, requests, device, lockstep=lockstep, rounds=rounds)
                for number, result in zip(group, results, strict=True):
                    self._add_run(found[number], result)
                if baseline is not None and not found[baseline.number].error:
                    measured = found[baseline.number].windows[-group.count(baseline.number) :]
                    for number in set(group):  # its windows in this group (the baseline's: its own)
                        baseline_windows_by_trial[number].extend(rate for run in measured for rate in run)
        baseline_failed = baseline is None or found[baseline.number].error
        for t in trials:
            found[t.number].group = sorted({n for g in groups if t.number in g for n in g})
            found[t.number].lockstep = lockstep
            if not baseline_failed:
                found[t.number].baseline_windows = baseline_windows_by_trial[t.number]
        for t in trials:
            self.reporter.remeasured(dataclasses.replace(t, remeasured=found[t.number]))
        return {t.number: found[t.number] for t in trials}

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
        drift = self.reference.drift(output.losses)
        if drift.heldout > self.job.spec.objective.max_drift:
            remeasurement.error = f"re-run {run}: drift {drift.heldout:.3%} is over the tolerance"
            return
        remeasurement.throughputs.append(output.throughput.samples_per_s)
        remeasurement.windows.append(output.throughput.window_samples_per_s)
