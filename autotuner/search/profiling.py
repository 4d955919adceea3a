"""The profile that explains the winner: where a step's time goes, baseline against winner.

After re-measurement, the study's best config and its baseline each run `profile.steps` optimizer
steps under the framework's profiler in a trial process of their own (`run_profile`, after the
trial's warm-up steps, so compilation is not in it): `torch.profiler` with CPU activities, and CUDA
ones on a GPU; `jax.profiler` for JAX. Each trace (Chrome trace JSON, which Perfetto and
chrome://tracing open) is stored in the study's Optuna artifact store
(`optuna.artifacts.FileSystemArtifactStore`, `runs/<name>/artifacts/` unless `profile.artifacts`
names another folder), as an artifact of the study: Optuna refuses to change a finished trial, the
trials being finished by then, so the artifact's name says whose trace it is
(`profile-trial-<n>-<baseline|best>.json`). `optuna-dashboard <storage> --artifact-dir <folder>`
lists them on the study's page.

Each trace's operators are ranked by **self time** (an operator's time less its children's, on
the same thread or stream, per step): the device's kernels where the trace has a device (a GPU),
else the host's operators. The top ones go into the study's system attrs (`profile:<trial
number>`) and from there into the report, the baseline's next to the winner's.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import optuna

from autotuner.results.profiles import Profile, stored_profiles
from autotuner.results.records import TrialRecord, baseline, best, records
from autotuner.spec.job import Job
from autotuner.study.names import PROFILE_PREFIX
from autotuner.study.optuna_adapter import study_id, study_storage
from autotuner.trials.outcomes import Outcome
from autotuner.trials.request import ProfileRequest
from autotuner.trials.trial_output import ProfileOutput

if TYPE_CHECKING:
    from autotuner.output.console import SearchReporter
    from autotuner.results.run_time import RunPlan
    from autotuner.trials.launcher import TrialLauncher, TrialResult


def artifact_dir(job: Job) -> Path:
    """The folder of the study's file-system artifact store."""
    folder = job.spec.profile.artifacts
    return Path(folder) if folder else job.output_dir() / "artifacts"


def profile_targets(trials: list[TrialRecord], best: TrialRecord | None) -> list[tuple[TrialRecord, str]]:
    """The trials to profile: the baseline and the best (one, when the baseline is the best)."""
    base = baseline(trials)
    targets = [(base, "baseline")] if base is not None and base.outcome == "ok" else []
    if best is not None and (base is None or best.number != base.number):
        targets.append((best, "best"))
    return targets


def store_profile(study: optuna.Study, job: Job, profile: Profile, trace: Path) -> Profile:
    """Upload `trace` into the study's artifact store and keep `profile` (with its artifact id) in
    the study's system attrs."""
    folder = artifact_dir(job)
    folder.mkdir(parents=True, exist_ok=True)
    store = optuna.artifacts.FileSystemArtifactStore(str(folder))
    name = f"profile-trial-{profile.trial}-{profile.role}.json{'.gz' if trace.suffix == '.gz' else ''}"
    named = trace.with_name(name)
    trace.replace(named)
    profile.artifact = optuna.artifacts.upload_artifact(
        artifact_store=store, file_path=str(named), study_or_trial=study, storage=study_storage(study)
    )
    profile.artifact_name = name
    study_storage(study).set_study_system_attr(study_id(study), f"{PROFILE_PREFIX}{profile.trial}", profile.as_dict())
    return profile


def run_profiles(
    job: Job, study: optuna.Study, launcher: TrialLauncher, device: str, reporter: SearchReporter, plan: RunPlan | None
) -> list[Profile]:
    """Profile the study's baseline and best (`profile_targets`) unless already stored (by another
    worker, or an earlier run of the search), each in a trial process of its own; store the traces
    and the profiles. A profile that fails is said in one line and costs nothing else."""
    trials = records(study)
    stored = stored_profiles(study)
    steps = job.spec.profile.steps
    profiles = []
    for trial, role in profile_targets(trials, best(trials, plan)):
        if trial.number in stored:
            profiles.append(stored[trial.number])
            continue
        job.output_dir().mkdir(parents=True, exist_ok=True)  # with another storage, nothing may be there yet
        folder = Path(tempfile.mkdtemp(prefix=f"profile-{trial.number}-", dir=job.output_dir())).resolve()
        try:
            request = job.trial_request(
                trial.config, device, progress=reporter.progress, log=job.log_path(f"trial-{trial.number}")
            )
            asked = ProfileRequest(request, steps, str(folder))
            started = time.monotonic()
            with reporter.running(f"profiling the {role}, trial #{trial.number}: {steps} steps after its warm-up"):
                result: TrialResult[ProfileOutput] = launcher.call(
                    job.backend.runner, "profile", asked, job.trial_timeout(trial.config)
                )
            if result.outcome is not Outcome.OK or result.output is None:
                reporter.note(f"no profile of trial #{trial.number}: {result.outcome.value}: {result.reason}")
                continue
            output = result.output
            seconds = time.monotonic() - started
            profile = Profile(trial.number, role, steps, seconds, output.where, output.total_ms, output.operators)
            profiles.append(store_profile(study, job, profile, Path(output.trace)))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return profiles
