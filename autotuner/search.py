"""The study loop (the tuner): spec -> study -> trial processes -> storage -> export.

Optuna proposes configs (through `autotuner.sampler`), the backend runs each one in its own
process (`autotuner.trial`), and this loop orchestrates: it probes the hardware, opens the
study, runs the fp32 reference once per study, makes the baseline trial 0, records every trial
(`autotuner.study.record`), keeps to the budget (per study, across runs and workers) and writes
the export. A failed trial is recorded and the search goes on; bad input or an unusable storage
stops it before anything is run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from autotuner.console import SearchReporter
from autotuner.dashboard import publish
from autotuner.drift import measure_drift
from autotuner.errors import BackendError, SpecError
from autotuner.export import export_data, export_path, write_export
from autotuner.knobs import Config, config_key, format_config
from autotuner.outcomes import Outcome
from autotuner.sampler import FreshConfigSampler, make_base_sampler
from autotuner.spec import Job
from autotuner.study import TrialRecord, baseline, best, open_storage, open_study, record, records, spent_seconds
from autotuner.trial import TrialLauncher, TrialRequest, TrialResult
from backends import Backend, Capabilities

PROBE_TIMEOUT_S = 300.0


def make_launcher(backend: Backend) -> TrialLauncher:
    return TrialLauncher([backend.runner])


def probe_environment(
    launcher: TrialLauncher, backend: Backend, device: str, workload: str, source: str | None = None
) -> dict[str, Any]:
    """The device's environment and capabilities, from a trial process; checks the workload imports."""
    probed = launcher.call(backend.runner, "probe", {"device": device, "workload": workload}, PROBE_TIMEOUT_S)
    if probed.outcome is not Outcome.OK:
        if probed.outcome is Outcome.ERROR and probed.reason.startswith("ValueError: device"):
            raise SpecError(probed.reason.removeprefix("ValueError: "), source=source)
        raise BackendError(f"the {backend.name} backend could not start: {probed.outcome}: {probed.reason}")
    environment = dict(probed.result)
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
    )


def run_reference(launcher: TrialLauncher, job: Job, device: str) -> dict[str, Any]:
    """Run the fp32 eager reference twice; the gap between the two runs is its noise floor."""
    config = job.reference_config()
    request = trial_request(job, config, device, measure=False)
    runs: list[TrialResult] = []
    for _ in range(2):
        result = launcher.call(job.backend.runner, "run", request, job.spec.trial.timeout)
        if result.outcome is not Outcome.OK:
            raise BackendError(
                f"the fp32 reference run failed ({result.outcome}: {result.reason}); no drift can be measured"
            )
        runs.append(result)
    first, second = (r.result["losses"] for r in runs)
    noise = measure_drift(second["heldout"], second["trajectory"], first["heldout"], first["trajectory"])
    return {
        "config": config,
        "heldout": first["heldout"],
        "trajectory": first["trajectory"],
        "noise_floor": noise.heldout,
        "noise_floor_trajectory": noise.trajectory_max,
        "runs_heldout": [first["heldout"], second["heldout"]],
        "wall_s": sum(r.wall_s for r in runs),
    }


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
        reporter: SearchReporter | None = None,
    ):
        self.job = job
        self.storage_url = job.storage_url(storage)
        self.is_default_storage = storage is None and job.spec.storage is None
        self.max_trials = trials if trials is not None else job.spec.budget.trials
        self.timeout = timeout if timeout is not None else job.spec.budget.timeout
        self.reporter = reporter or SearchReporter()

    def run(self) -> SearchSummary:
        job = self.job
        launcher = make_launcher(job.backend)
        environment = probe_environment(launcher, job.backend, job.spec.device, job.workload_path(), job.source)
        capabilities = Capabilities.from_dict(environment["capabilities"])
        storage = open_storage(self.storage_url, default=self.is_default_storage)
        study = open_study(storage, job, environment)
        self.reporter.start(job, self.storage_url, environment, self.max_trials)
        reference = study.user_attrs.get("reference")
        if reference is None:
            with self.reporter.running("fp32 reference (2 runs)"):
                reference = run_reference(launcher, job, environment["device"])
            study.set_user_attr("reference", reference)
        self.reporter.reference(reference, job.spec.objective.max_drift)

        all_configs = list(job.configs())
        settings = job.sampler
        sampler = FreshConfigSampler(
            make_base_sampler(settings.name, settings.seed), job.space, lambda: all_configs, settings.seed
        )
        study.sampler = sampler
        self._enqueue_baseline_and_retries(study)

        interrupted = False
        started = time.monotonic()
        current: optuna.Trial | None = None
        try:
            while True:
                trials = records(study)
                ran = sum(t.ran for t in trials)
                if ran >= self.max_trials:
                    break
                if self.timeout is not None and spent_seconds(trials) >= self.timeout:
                    self.reporter.note(f"the study's time budget of {self.timeout:g} s is spent")
                    break
                waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
                if not waiting and not sampler.fresh_configs(study):
                    self.reporter.note("every config of the space has been tried")
                    break
                current = study.ask(dict(sampler.space))
                config = job.complete(current.params)
                role = current.user_attrs.get("role", "search")
                if not sampler.is_fresh(current.params, study.get_trials(deepcopy=False), exclude=current.number):
                    current.set_user_attr("reason", "another worker took this config first")
                    study.tell(current, state=TrialState.FAIL)
                    current = None
                    continue
                reason = job.backend.unsupported_reason(config, capabilities)
                if reason:
                    result = TrialResult.unsupported(reason)
                else:
                    with self.reporter.running(f"trial {ran + 1}/{self.max_trials}: {format_config(config)}"):
                        request = trial_request(job, config, environment["device"])
                        result = launcher.call(job.backend.runner, "run", request, job.spec.trial.timeout)
                done = record(
                    study, current, job, config, result, role=role, reference=reference, environment=environment
                )
                current = None
                trials = records(study)
                self.reporter.trial(
                    done,
                    sum(t.ran for t in trials),
                    self.max_trials,
                    time.monotonic() - started,
                    best(trials),
                    baseline(trials),
                )
        except KeyboardInterrupt:
            interrupted = True
            if current is not None:
                current.set_user_attr(
                    "reason", "the search was interrupted while this trial ran; it is retried on resume"
                )
                study.tell(current, state=TrialState.FAIL)
        trials = records(study)
        summary = SearchSummary(trials, best(trials), baseline(trials), self.storage_url, None, interrupted)
        if summary.best is not None:
            path = write_export(export_data(study, self.storage_url), export_path(job.name))
            summary.export = str(path)
        publish(study)
        self.reporter.finish(summary)
        return summary

    def _enqueue_baseline_and_retries(self, study: optuna.Study) -> None:
        """Trial 0 is the baseline; configs whose trial was cut off (FAIL) run again."""
        trials = study.get_trials(deepcopy=False)
        live = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING)]
        if not any(t.user_attrs.get("role") == "baseline" for t in live):
            study.enqueue_trial(self.job.baseline, user_attrs={"role": "baseline"})
        done = {config_key(t.params) for t in live}
        for t in trials:
            if t.state is TrialState.FAIL and t.params and config_key(t.params) not in done:
                study.enqueue_trial(
                    dict(t.params), user_attrs={"role": t.user_attrs.get("role", "search"), "retry_of": t.number}
                )
                done.add(config_key(t.params))
