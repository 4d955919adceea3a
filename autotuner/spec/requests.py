"""What the engine asks of trial processes for a job: the launcher with its backend's runner, the
probe of the device and the workload, and the request that runs one config.

The search, `autotuner apply`, `autotuner env` and the `--jobs` launcher all start their trial
processes through these, so a config is measured the same way wherever it runs.
"""

from __future__ import annotations

from typing import Any

from autotuner.backends import Backend
from autotuner.config.knobs import Config
from autotuner.errors import BackendError, SpecError
from autotuner.spec.job import Job
from autotuner.trials.launcher import TrialLauncher, TrialRequest, TrialResult
from autotuner.trials.outcomes import Outcome

PROBE_TIMEOUT_S = 300.0


def make_launcher(backend: Backend, memory_limit_mb: float | None = None) -> TrialLauncher:
    return TrialLauncher([backend.runner], memory_limit_mb=memory_limit_mb)


def probe_environment(
    launcher: TrialLauncher,
    backend: Backend,
    device: str,
    workload: str,
    source: str | None = None,
    workload_args: dict[str, Any] | None = None,
    global_batch: int | None = None,
) -> dict[str, Any]:
    """The device's environment and capabilities, from a trial process; checks that the workload
    imports and, given its `workload_args`, that the factory builds a workload from them, and, given
    the `global_batch` too, that its dataset holds a global batch the model computes a loss on."""
    arg = {"device": device, "workload": workload, "workload_args": workload_args, "global_batch": global_batch}
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
    # The first process of a launcher waits for its fork server to start: the interpreter and the
    # framework's import, which every run of the job pays before its first line (`autotuner.results.run_time`).
    environment["framework_start_s"] = probed.startup_s
    return environment


def probe_job(launcher: TrialLauncher, job: Job, device: str, source: str | None = None) -> dict[str, Any]:
    """`probe_environment` for `job` on `device`: its workload built from the spec's arguments and
    its data checked against its global batch, before anything is stored or run."""
    return probe_environment(
        launcher,
        job.backend,
        device,
        job.workload_path(),
        source or job.source,
        dict(job.spec.workload_args),
        job.spec.global_batch,
    )


def trial_request(
    job: Job,
    config: Config,
    device: str,
    *,
    measure: bool = True,
    prune_best: float | None = None,
    progress: str | None = None,
) -> TrialRequest:
    """The request that runs `config`; with `prune_best` (a search trial: the best feasible
    throughput so far), one stopped early when it cannot reach it (`trial.prune_after`); with
    `progress`, one that writes its phase there (`autotuner.trials.progress`)."""
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
        prune_best=prune_best,
        prune_after=settings.prune_after if prune_best is not None else 0,
        progress=progress,
        compile_cache=str(job.compile_cache_dir()),
    )
