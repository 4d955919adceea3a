"""The study loop (the tuner): spec -> study -> trial processes -> storage -> export.

Optuna proposes configs (through `autotuner.sampler`), the backend runs each one in its own
process (`autotuner.trial`), and this loop orchestrates: it probes the hardware, opens the
study, runs the fp32 reference once per study, makes the baseline trial 0, records every trial
(`autotuner.recording.record`), keeps to the budget (per study, across runs and workers) and writes
the export. What only one of several workers may do (the reference, a config, a trial of the
budget, a retry) goes through claims (`autotuner.coordination`; a cut-off trial's retry:
`autotuner.ownership`). A failed trial is recorded and the search goes on; bad input or an
unusable storage stops it before anything is run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
import warnings
from dataclasses import dataclass
from typing import Any

import optuna
import sqlalchemy
from optuna.trial import TrialState

from autotuner.backends import Backend, Capabilities
from autotuner.claims import Claims
from autotuner.console import SearchReporter
from autotuner.coordination import POLL_S, BudgetSlots, ConfigClaims, OncePerStudy, enqueue_baseline
from autotuner.dashboard import publish
from autotuner.drift import measure_drift
from autotuner.errors import BackendError, SpecError, StorageError
from autotuner.export import export_data, export_path, write_export
from autotuner.knobs import Config, format_config
from autotuner.lockstep import in_lockstep, measure_together
from autotuner.optuna_adapter import study_id
from autotuner.outcomes import Outcome
from autotuner.ownership import Recovery, SearchProcess, TrialOwnership
from autotuner.recording import give_up, record
from autotuner.records import TrialRecord, baseline, best, records, spent_seconds, to_remeasure
from autotuner.results import Losses, Reference, Remeasurement, TrialOutput
from autotuner.sampler import FreshConfigSampler, make_sampler
from autotuner.spec import Job
from autotuner.study import check_objectives, check_trial_limits, open_storage, open_study, shown_url
from autotuner.telemetry import available_memory_mb
from autotuner.trial import TrialLauncher, TrialRequest, TrialResult
from autotuner.tried_configs import oom_rules_out

PROBE_TIMEOUT_S = 300.0
REFERENCE_LEASE_TRIALS = 3
"""A worker running the reference (two trial runs) holds it for this many trial timeouts, plus
the probe's; past that, another worker takes it over."""


def make_launcher(backend: Backend, memory_limit_mb: float | None = None) -> TrialLauncher:
    return TrialLauncher([backend.runner], memory_limit_mb=memory_limit_mb)


def job_sampler(job: Job, capabilities: Capabilities) -> FreshConfigSampler:
    """The spec's sampler for `job` on a device with `capabilities`, as every search builds it."""
    configs = list(job.configs())
    return make_sampler(job.sampler.name, job.sampler.seed, job.space, lambda: configs, job.unsupported(capabilities))


def probe_environment(
    launcher: TrialLauncher,
    backend: Backend,
    device: str,
    workload: str,
    source: str | None = None,
    workload_args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The device's environment and capabilities, from a trial process; checks that the workload
    imports and, given its `workload_args`, that the factory builds a workload from them."""
    arg = {"device": device, "workload": workload, "workload_args": workload_args}
    probed: TrialResult[dict[str, Any]] = launcher.call(backend.runner, "probe", arg, PROBE_TIMEOUT_S)
    if probed.outcome is not Outcome.OK:
        if probed.outcome is Outcome.ERROR and probed.reason.startswith("ValueError: device"):
            raise SpecError(probed.reason.removeprefix("ValueError: "), source=source)
        raise BackendError(f"the {backend.name} backend could not start: {probed.outcome}: {probed.reason}")
    environment = dict(probed.output or {})
    problem = environment.pop("workload_error", None)
    if problem:
        raise SpecError(problem, source=source, key="workload")
    environment["backend"] = backend.name
    return environment


def trial_request(job: Job, config: Config, device: str, *, measure: bool = True) -> TrialRequest:
    settings = job.spec.trial
    return TrialRequest(
        workload=job.workload_path(),
        workload_args=dict(job.spec.workload_args),
        device=device,
        config=dict(config),
        global_batch=job.spec.global_batch,
        seed=settings.seed,
        warmup_steps=settings.warmup_steps,
        steps=settings.steps,
        windows=settings.windows,
        drift_steps=settings.drift_steps,
        heldout_batch=job.baseline["batch_size"],
        measure=measure,
        min_window_s=settings.min_window_s,
        compile_cache=str(job.compile_cache_dir()),
    )


def remeasure_groups(
    configs: list[TrialRecord], companion: TrialRecord | None, runs: int, most: int | None
) -> list[list[TrialRecord]]:
    """The groups of processes a re-measurement measures together, one after another: every
    config `runs` times and the baseline (`companion`) beside them. One group, interleaved (run 1
    of each, then run 2, ...), when it has at most `most` processes (None: no limit); else a group
    per run, the configs of a run split into parts of `most - 1` with the baseline in each, so
    that every config's speedup is over the baseline's windows measured beside it."""
    beside = [companion] if companion is not None else []
    whole = [*configs, *beside]
    if most is None or runs * len(whole) <= most:
        return [[t for _ in range(runs) for t in whole]]
    size = max(1, most - len(beside))
    return [[*configs[k : k + size], *beside] for _ in range(runs) for k in range(0, len(configs), size)]


MEMORY_SHARE = 0.8
"""The share of the memory available that a re-measurement group's processes may take."""


def processes_that_fit(trials: list[TrialRecord]) -> int | None:
    """How many trial processes of these configs the memory available now holds at once, judged
    from the largest peak RSS of their trials (`autotuner.telemetry.CpuSampler`); None when
    either is not known (no /proc)."""
    available = available_memory_mb()
    peak = max((float(t.metrics.get("peak_rss_mb") or 0.0) for t in trials), default=0.0)
    if available is None or peak <= 0:
        return None
    return max(1, int(MEMORY_SHARE * available / peak))


def run_reference(launcher: TrialLauncher, job: Job, device: str) -> Reference:
    """Run the fp32 eager reference twice; the gap between the two runs is its noise floor."""
    config = job.reference_config()
    request = trial_request(job, config, device, measure=False)
    runs: list[Losses] = []
    wall_s = 0.0
    for _ in range(2):
        result: TrialResult[TrialOutput] = launcher.call(job.backend.runner, "run", request, job.trial_timeout())
        if result.outcome is not Outcome.OK:
            raise BackendError(
                f"the fp32 reference run failed ({result.outcome}: {result.reason}); no drift can be measured"
            )
        assert result.output is not None  # it ended ok: it sent its output
        runs.append(result.output.losses)
        wall_s += result.wall_s
    first, second = runs
    noise = measure_drift(second.heldout, second.trajectory, first.heldout, first.trajectory)
    return Reference(
        config=config,
        heldout=first.heldout,
        trajectory=first.trajectory,
        noise_floor=noise.heldout,
        noise_floor_trajectory=noise.trajectory_max,
        runs_heldout=[first.heldout, second.heldout],
        wall_s=wall_s,
    )


@dataclass
class SearchSummary:
    trials: list[TrialRecord]
    best: TrialRecord | None
    baseline: TrialRecord | None
    storage_url: str
    export: str | None
    interrupted: bool = False

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        return 0 if self.best is not None else 1


class Search:
    def __init__(
        self,
        job: Job,
        *,
        storage: str | None = None,
        trials: int | None = None,
        timeout: float | None = None,
        device: str | None = None,
        reporter: SearchReporter | None = None,
    ):
        self.job = job
        self.storage_url = job.storage_url(storage)
        self.is_default_storage = storage is None and job.spec.storage is None
        self.max_trials = trials if trials is not None else job.spec.budget.trials
        self.timeout = timeout if timeout is not None else job.spec.budget.timeout
        self.device = device or job.spec.device
        self.device_source = "--device" if device else job.source
        self.reporter = reporter or SearchReporter()

    def run(self) -> SearchSummary:
        try:
            return self._search()
        except (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError) as exc:
            reason = " ".join(str(getattr(exc, "orig", None) or exc.__cause__ or exc).split())[:200]
            raise StorageError(
                f"the storage {shown_url(self.storage_url)} failed: {reason}; every finished trial is kept "
                "there, and running the same command again resumes the study"
            ) from None

    def _search(self) -> SearchSummary:
        job = self.job
        launcher = make_launcher(job.backend, job.spec.trial.max_memory_mb)
        environment = probe_environment(
            launcher, job.backend, self.device, job.workload_path(), self.device_source, dict(job.spec.workload_args)
        )
        capabilities = job.backend.capabilities(environment["capabilities"])
        check_objectives(job, environment)
        check_trial_limits(job, environment)
        storage = open_storage(self.storage_url, default=self.is_default_storage, heartbeat=True)
        study = open_study(storage, job, environment)
        process, claims = SearchProcess.this(), Claims(storage, study_id(study))
        recovery = Recovery(study, storage, claims, process)
        once = OncePerStudy(study, claims, process)
        configs = ConfigClaims(storage, claims, process)
        slots = BudgetSlots(study, storage, claims, process, self.max_trials)
        self.reporter.start(job, self.storage_url, environment, self.max_trials)

        sampler = job_sampler(job, capabilities)
        study.sampler = sampler

        interrupted = False
        started = time.monotonic()
        try:
            recovery.recover()  # first: a cut-off baseline is retried, not enqueued afresh
            enqueue_baseline(study, self.job.baseline)
            reference = once.reference(
                lambda: self._run_reference(launcher, environment["device"]),
                REFERENCE_LEASE_TRIALS * job.trial_timeout() + PROBE_TIMEOUT_S,
                lambda: self.reporter.note("waiting for the fp32 reference, which another worker is running"),
            )
            self.reporter.reference(reference, job.spec.objective.max_drift)
            waiting_noted = False
            while True:
                recovery.recover()
                trials = records(study)
                if sum(t.ran for t in trials) >= self.max_trials:
                    break
                if self.timeout is not None and spent_seconds(trials) >= self.timeout:
                    self.reporter.note(f"the study's time budget of {self.timeout:g} s is spent")
                    break
                if not slots.any_free():
                    if not waiting_noted:
                        self.reporter.note("the rest of the budget is running on other workers: waiting for them")
                        waiting_noted = True
                    time.sleep(POLL_S)  # a trial cut off there frees its slot, and this worker retries it
                    continue
                waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
                if not waiting and not sampler.fresh_configs(study):
                    self.reporter.note("every config of the space has been tried")
                    break
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # Optuna warns that heartbeats are meant for optimize()
                    trial = study.ask(dict(sampler.space))
                with TrialOwnership(storage, process, trial):
                    done = self._run_trial(study, trial, configs, slots, launcher, capabilities, environment, reference)
                if done is not None:
                    trials = records(study)
                    self.reporter.trial(
                        done,
                        sum(t.ran for t in trials),
                        self.max_trials,
                        time.monotonic() - started,
                        best(trials),
                        baseline(trials),
                    )
            self._remeasure(study, once, launcher, environment, reference)
        except KeyboardInterrupt:
            interrupted = True
        trials = records(study)
        summary = SearchSummary(trials, best(trials), baseline(trials), self.storage_url, None, interrupted)
        if summary.best is not None:
            path = write_export(export_data(study, self.storage_url), export_path(job.name))
            summary.export = str(path)
        publish(study)
        self.reporter.finish(summary)
        return summary

    def _remeasure(
        self,
        study: optuna.Study,
        once: OncePerStudy,
        launcher: TrialLauncher,
        environment: dict[str, Any],
        reference: Reference,
    ) -> None:
        """Measure the fastest feasible configs and the baseline again before the best is declared,
        so that one lucky window or process cannot win: each in `budget.remeasure_runs` more trial
        processes, measured together (`measure_together`). A config's throughput is then the median
        over every window of those processes, and its speedup is over the baseline's windows
        measured with them; when that reorders the top, the newcomers are re-measured too, and so
        are the configs within the machine's noise of the best (`autotuner.records.to_remeasure`): at
        most twice `budget.remeasure_top` configs and the baseline in all."""
        settings = self.job.spec.budget
        if not settings.remeasure_top:
            return
        attempted: set[int] = set()
        while True:
            trials = records(study)
            candidates = to_remeasure(trials, settings.remeasure_top)
            fresh = [t for t in candidates if t.remeasured is None and t.number not in attempted]
            if not fresh:
                return
            attempted.update(t.number for t in fresh)
            allowed = once.remeasure_slots([t.number for t in fresh], 2 * settings.remeasure_top + 1)
            todo = {t.number: t for t in fresh if t.number in allowed}
            if not todo:
                continue
            todo_configs = [t.config for t in todo.values()]
            base = baseline(trials)
            companion = base if base is not None and base.outcome == Outcome.OK.value else None
            # each config's runs and the baseline's: a group of processes; its lease, generously
            lease_s = 2 * settings.remeasure_runs * self.job.trial_timeout(*todo_configs) + PROBE_TIMEOUT_S
            run = functools.partial(self._remeasure_runs, todo, companion, launcher, environment, reference)
            once.remeasure(list(todo), run, lease_s)

    def _remeasure_runs(
        self,
        candidates: dict[int, TrialRecord],
        companion: TrialRecord | None,
        launcher: TrialLauncher,
        environment: dict[str, Any],
        reference: Reference,
        numbers: list[int],
    ) -> dict[int, Remeasurement]:
        """Re-measure the configs of trials `numbers`, each in `budget.remeasure_runs` processes,
        with as many of the baseline (`companion`) beside them, measured together: in one group
        when the memory holds it, else in several (`remeasure_groups`)."""
        job, budget, device = self.job, self.job.spec.budget, environment["device"]
        runs, windows = budget.remeasure_runs, budget.remeasure_windows
        trials = [candidates[n] for n in numbers]
        configs = [t for t in trials if companion is None or t.number != companion.number]
        everyone = [*configs, *([companion] if companion is not None else [])]
        by_number = {t.number: t for t in everyone}
        # in lockstep every process of a group is alive at once (on a GPU, one at a time)
        on_cpu = in_lockstep(device)
        most = budget.remeasure_group or (processes_that_fit(everyone) if on_cpu else None)
        lockstep = on_cpu and most != 1
        groups = [[t.number for t in group] for group in remeasure_groups(configs, companion, runs, most)]
        shown = ", ".join(f"#{t.number}" for t in everyone)
        if len(groups) > 1:
            why = "budget.remeasure_group" if budget.remeasure_group else "what the memory available holds"
            how = f"in {len(groups)} groups of at most {most} processes" if lockstep else "one process at a time"
            self.reporter.note(f"re-measuring {shown} {how} ({why}), the baseline beside the configs in each")
        found = {t.number: Remeasurement() for t in everyone}
        beside: dict[int, list[float]] = {t.number: [] for t in everyone}  # the baseline's windows with each
        with self.reporter.running(f"re-measuring {shown}, {runs} runs of {windows} windows each"):
            for group in groups:
                requests = [
                    dataclasses.replace(trial_request(job, by_number[n].config, device), windows=windows) for n in group
                ]
                rounds = runs if len(groups) == 1 else 1  # one group: the runs interleaved, a round each
                results = measure_together(launcher, job, requests, device, lockstep=lockstep, rounds=rounds)
                for number, result in zip(group, results, strict=True):
                    self._remeasured_run(found[number], result, reference)
                if companion is not None and not found[companion.number].error:
                    measured = found[companion.number].windows[-group.count(companion.number) :]
                    for number in set(group):  # its windows in this group (the baseline's: its own)
                        beside[number].extend(rate for run in measured for rate in run)
        companion_failed = companion is None or found[companion.number].error
        for t in trials:
            found[t.number].group = sorted({n for g in groups if t.number in g for n in g})
            found[t.number].lockstep = lockstep
            if not companion_failed:
                found[t.number].baseline_windows = beside[t.number]
        for t in trials:
            self.reporter.remeasured(dataclasses.replace(t, remeasured=found[t.number]))
        return {t.number: found[t.number] for t in trials}

    def _remeasured_run(self, done: Remeasurement, result: TrialResult[TrialOutput], reference: Reference) -> None:
        """Add one re-measurement process's result to its config's (`done`), or its error."""
        if done.error:
            return
        run = len(done.throughputs) + 1
        if result.outcome is not Outcome.OK:
            done.error = f"re-run {run}: {result.outcome.value}: {result.reason}"
            return
        output = result.output
        assert output is not None and output.throughput is not None  # it measured, and ended ok
        drift = reference.drift(output.losses)
        if drift.heldout > self.job.spec.objective.max_drift:
            done.error = f"re-run {run}: drift {drift.heldout:.3%} is over the tolerance"
            return
        done.throughputs.append(output.throughput.samples_per_s)
        done.windows.append(output.throughput.window_samples_per_s)

    def _run_reference(self, launcher: TrialLauncher, device: str) -> Reference:
        with self.reporter.running("fp32 reference (2 runs)"):
            return run_reference(launcher, self.job, device)

    def _run_trial(
        self,
        study: optuna.Study,
        trial: optuna.Trial,
        configs: ConfigClaims,
        slots: BudgetSlots,
        launcher: TrialLauncher,
        capabilities: Capabilities,
        environment: dict[str, Any],
        reference: Reference,
    ) -> TrialRecord | None:
        """Run and record one asked-for trial; None when it is given up without running."""
        job = self.job
        try:
            holder = configs.claim(trial)
            if holder is not None:
                give_up(study, trial, f"trial {holder} has this config", duplicate_of=holder)
                return None
            ruled_out = oom_rules_out(trial.params, study.get_trials(deepcopy=False))
            if ruled_out is not None:
                give_up(study, trial, f"trial {ruled_out.number} ran out of memory", ruled_out_by=ruled_out.number)
                return None
            config = job.complete(trial.params)
            role = trial.user_attrs.get("role", "search")
            reason = job.backend.unsupported_reason(config, capabilities)
            if reason:
                result = TrialResult.unsupported(reason)
            else:
                slot = slots.claim(trial)
                if slot is None:
                    give_up(study, trial, "the budget was spent by other workers")
                    return None
                with self.reporter.running(f"trial {slot + 1}/{self.max_trials}: {format_config(config)}"):
                    request = trial_request(job, config, environment["device"])
                    result = launcher.call(job.backend.runner, "run", request, job.trial_timeout(config))
            return record(study, trial, job, config, result, role=role, reference=reference, environment=environment)
        except KeyboardInterrupt:
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):  # it was recorded already
                trial.set_user_attr("reason", "the search was interrupted while this trial ran; it is retried")
                study.tell(trial, state=TrialState.FAIL)
            raise
        except optuna.exceptions.UpdateFinishedTrialError:
            self.reporter.note(f"trial {trial.number} was failed as stale by another worker; it is retried")
            return None
