"""The study loop (the tuner): spec -> study -> trial processes -> storage -> export.

Optuna proposes configs (through `autotuner.proposals.sampler`), the backend runs each one in its own
process (`autotuner.trials.launcher`), and this loop orchestrates: it probes the hardware
(`autotuner.spec.job.Job.probe`), opens the study, runs the fp32 reference once per study
(`autotuner.search.reference`), makes the baseline trial 0, has every trial it asks for run and recorded
(`autotuner.search.dispatch`), keeps to the budget (per study, across runs and workers), re-measures the
top configs (`autotuner.search.remeasure`) and writes the export. What only one of several workers may do
(the reference, a config, a trial of the budget, a retry) goes through claims
(`autotuner.workers.coordination`; a cut-off trial's retry: `autotuner.workers.ownership`). A failed trial is
recorded and the search goes on; bad input or an unusable storage stops it before anything is run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import optuna
import sqlalchemy
from optuna.trial import TrialState

from autotuner.backends import Capabilities
from autotuner.config.knobs import Params, config_key
from autotuner.errors import StorageError
from autotuner.export.writer import export_data, export_path, write_export
from autotuner.output.console import SearchReporter
from autotuner.output.dashboard import publish
from autotuner.proposals.sampler import FreshConfigSampler, make_sampler
from autotuner.results.evidence import Reference
from autotuner.results.profiles import describe
from autotuner.results.records import SearchSummary, baseline, best, records, spent_seconds
from autotuner.results.run_time import RunPlan
from autotuner.search.dispatch import TrialDispatch
from autotuner.search.profiling import artifact_dir, run_profiles
from autotuner.search.reference import REFERENCE_LEASE_TRIALS, run_reference
from autotuner.search.remeasure import Remeasurer
from autotuner.search.warm_start import WARM_START, EarlierStudy, enqueue_warm_start, load_earlier, warm_configs
from autotuner.spec.job import Job
from autotuner.study.claims import Claims
from autotuner.study.names import NOT_SEARCHED, RUN
from autotuner.study.optuna_adapter import study_id
from autotuner.study.storage import (
    check_objectives,
    check_storage_url,
    check_trial_limits,
    open_storage,
    open_study,
    shown_url,
)
from autotuner.trials.launcher import TrialLauncher
from autotuner.trials.probe import PROBE_TIMEOUT_S
from autotuner.workers.coordination import POLL_S, BudgetSlots, ConfigClaims, OncePerStudy, enqueue_baseline
from autotuner.workers.nodes import lead
from autotuner.workers.ownership import Recovery, SearchProcess, TrialOwnership


def unsupported_params(job: Job, capabilities: Capabilities) -> Callable[[Params], str | None]:
    """Why a device with `capabilities` cannot run sampled params of `job`, or None (what the
    samplers and the warm start are given to skip such configs, as the search decides it)."""
    return lambda params: job.backend.unsupported_reason(job.complete(params), capabilities)


def job_sampler(job: Job, capabilities: Capabilities) -> FreshConfigSampler:
    """The spec's sampler for `job` on a device with `capabilities`, as every search builds it."""
    configs = list(job.space.points())
    return make_sampler(
        job.sampler.name,
        job.sampler.seed,
        job.space,
        lambda: configs,
        unsupported_params(job, capabilities),
        knobs=job.backend.knobs,
    )


class Search:
    """One search process on a job's study: set up, the trial loop within the budget, then the
    re-measurement, the export and the summary."""

    def __init__(
        self,
        job: Job,
        *,
        storage: str | None = None,
        trials: int | None = None,
        timeout: float | None = None,
        device: str | None = None,
        reporter: SearchReporter | None = None,
        profile: bool = True,
        warm_start: EarlierStudy | None = None,
    ):
        self.job = job
        self.storage_url = job.storage_url(storage)
        self.is_default_storage = storage is None and job.spec.storage is None
        self.max_trials = trials if trials is not None else job.spec.budget.trials
        self.timeout = timeout if timeout is not None else job.spec.budget.timeout
        self.device = device or job.spec.device
        self.device_source = "--device" if device else job.source
        self.reporter = reporter or SearchReporter()
        self.profile = profile and job.spec.profile.steps > 0
        self.plan: RunPlan | None = None
        """The real run the study's configs are ranked for (`run:`, `cost:`), set as the search starts."""
        self.warm_start = warm_start
        """An earlier study whose best configs are tried first (`autotuner.search.warm_start`)."""

    def run(self) -> SearchSummary:
        try:
            return self._search()
        except (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError) as exc:
            reason = " ".join(str(getattr(exc, "orig", None) or exc.__cause__ or exc).split())[:200]
            raise StorageError(
                f"the storage {shown_url(self.storage_url)} failed: {reason}; every finished trial is kept "
                "there, and running the same command again resumes the study"
            ) from None
        finally:
            self.reporter.close()

    def _search(self) -> SearchSummary:
        job = self.job
        check_storage_url(self.storage_url, default=self.is_default_storage)  # not after a probe's seconds
        earlier = load_earlier(self.warm_start, job) if self.warm_start else None
        launcher = job.backend.launcher(job.spec.trial.max_memory_mb, job.workload_path())
        with tempfile.TemporaryDirectory(prefix="autotuner-probe-") as folder:  # nothing written if it refuses
            environment = job.probe(launcher, self.device, self.device_source, log=os.path.join(folder, "probe"))
            for log in Path(folder).glob("*.log"):  # what it printed, kept with the trials' logs
                Path(job.log_path("probe")).parent.mkdir(parents=True, exist_ok=True)
                shutil.move(log, Path(job.log_path("probe")).parent / log.name)
        capabilities = job.backend.capabilities(environment.capabilities)
        job, not_searched = job.narrow(capabilities)  # the job searched from here on
        check_objectives(job, environment)
        check_trial_limits(job, environment)
        storage = open_storage(self.storage_url, default=self.is_default_storage, heartbeat=True)
        study = open_study(storage, job, environment)
        self.plan = RunPlan.from_job(job, start_s=environment.framework_start_s or 0.0)
        study.set_user_attr(RUN, self.plan.as_dict() if self.plan else None)  # the export ranks by it
        study.set_user_attr(NOT_SEARCHED, {k: {str(v): why for v, why in d.items()} for k, d in not_searched.items()})
        process, claims = SearchProcess.this(), Claims(storage, study_id(study))
        recovery = Recovery(study, storage, claims, process)
        once = OncePerStudy(study, claims, process)
        configs = ConfigClaims(storage, claims, process)
        slots = BudgetSlots(study, storage, claims, process, self.max_trials)
        self.reporter.start(job, self.storage_url, environment, self.max_trials)
        self.reporter.not_searched(not_searched)
        leading = lead(job, launcher, self.reporter.note) if job.spec.nodes > 1 else None
        launcher = leading or launcher

        sampler = job_sampler(job, capabilities)
        study.sampler = sampler

        interrupted = False
        started = time.monotonic()
        try:
            recovery.recover()  # first: a cut-off baseline is retried, not enqueued afresh
            enqueue_baseline(study, job.baseline)
            if earlier is not None and not study.user_attrs.get(WARM_START):
                self._warm_start(job, study, claims, *earlier, unsupported_params(job, capabilities))
            reference = once.reference(
                lambda: self._run_reference(job, launcher, environment.device),
                REFERENCE_LEASE_TRIALS * job.trial_timeout() + PROBE_TIMEOUT_S,
                lambda: self.reporter.note("waiting for the fp32 reference, which another worker is running"),
            )
            self.reporter.reference(reference, job.spec.objective.max_drift)
            dispatch = TrialDispatch(
                job,
                study,
                configs,
                slots,
                launcher,
                capabilities,
                environment,
                reference,
                self.reporter,
                self.max_trials,
                self.plan,
            )
            self._trials(dispatch, sampler, recovery, started)
            self.reporter.left_s = None  # the trials are over
            Remeasurer(job, study, once, launcher, environment.device, self.reporter, self.plan).run()
            if self.profile:
                for profile in run_profiles(job, study, launcher, environment.device, self.reporter, self.plan):
                    self.reporter.note(f"profile: {describe(profile)}")
        except KeyboardInterrupt:
            interrupted = True
        finally:
            if leading is not None:
                leading.finish(job.spec.nodes)
        return self._finish(study, interrupted)

    def _warm_start(
        self,
        job: Job,
        study: optuna.Study,
        claims: Claims,
        earlier: optuna.Study,
        source: str,
        unsupported: Callable[[Params], str | None],
    ) -> None:
        """Enqueue the earlier study's best configs after the baseline, and say what was taken."""
        tried = {config_key(t.params) for t in study.get_trials(deepcopy=False)}
        warm = warm_configs(records(earlier), source, job, unsupported, self.max_trials, tried)
        if not enqueue_warm_start(study, warm, claims):
            return  # another worker started together with this one enqueued them
        dropped = "; ".join(f"{count} dropped: {why}" for why, count in warm.dropped.items())
        self.reporter.note(
            f"warm start from {warm.source}: {len(warm.configs)} of its best configs are tried first"
            + (f" ({dropped})" if dropped else "")
        )

    def _trials(self, dispatch: TrialDispatch, sampler: FreshConfigSampler, recovery: Recovery, started: float) -> None:
        """Ask for trials and run them (`dispatch`) until the study's budget (in trials, across its
        workers, or in seconds) is spent or no config is left; a trial cut off on another worker is
        retried (`recovery`)."""
        study, slots = dispatch.study, dispatch.slots
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
            with TrialOwnership(recovery.storage, recovery.process, trial):
                done = dispatch.run(trial)
            if done is not None:
                trials = records(study)
                self.reporter.trial(
                    done,
                    sum(t.ran for t in trials),
                    self.max_trials,
                    time.monotonic() - started,
                    best(trials, self.plan),
                    baseline(trials),
                )

    def _finish(self, study: optuna.Study, interrupted: bool) -> SearchSummary:
        """The summary of the study as it stands, with its export (when it has a best) and the
        dashboard's note and charts written, and printed."""
        trials = records(study)
        summary = SearchSummary(trials, best(trials, self.plan), baseline(trials), self.storage_url, None, interrupted)
        if (artifacts := artifact_dir(self.job)).is_dir():
            summary.artifacts = str(artifacts)
        if summary.best is not None:
            path = write_export(export_data(study, self.storage_url), export_path(self.job.name))
            summary.export = str(path)
        publish(study)
        self.reporter.finish(summary, self.plan)
        return summary

    def _run_reference(self, job: Job, launcher: TrialLauncher, device: str) -> Reference:
        with self.reporter.running("fp32 reference (2 runs)"):
            return run_reference(launcher, job, device, self.reporter.progress)
