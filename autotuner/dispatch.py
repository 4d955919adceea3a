"""One asked-for trial, from Optuna's proposal to its record: given up when another trial has its
config or an out-of-memory trial rules it out, recorded as unsupported when the device cannot run
it, given up when other workers spent the budget, else run in its own trial process and recorded
(`autotuner.recording.record`)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from autotuner.backends import Capabilities
from autotuner.console import SearchReporter
from autotuner.coordination import BudgetSlots, ConfigClaims
from autotuner.knobs import format_config
from autotuner.recording import give_up, record
from autotuner.records import TrialRecord
from autotuner.results import Reference
from autotuner.spec import Job
from autotuner.trial import TrialLauncher, TrialResult
from autotuner.trial_requests import trial_request
from autotuner.tried_configs import oom_rules_out


@dataclass
class TrialDispatch:
    """What a search process needs to run the trials it asks its study for: the claims on configs
    and budget slots it shares with other workers, its launcher, the device's capabilities and
    environment, and the reference that drift is measured against."""

    job: Job
    study: optuna.Study
    configs: ConfigClaims
    slots: BudgetSlots
    launcher: TrialLauncher
    capabilities: Capabilities
    environment: dict[str, Any]
    reference: Reference
    reporter: SearchReporter
    max_trials: int

    def run(self, trial: optuna.Trial) -> TrialRecord | None:
        """Run and record one asked-for trial; None when it is given up without running."""
        job, study = self.job, self.study
        try:
            holder = self.configs.claim(trial)
            if holder is not None:
                give_up(study, trial, f"trial {holder} has this config", duplicate_of=holder)
                return None
            ruled_out = oom_rules_out(trial.params, study.get_trials(deepcopy=False))
            if ruled_out is not None:
                give_up(study, trial, f"trial {ruled_out.number} ran out of memory", ruled_out_by=ruled_out.number)
                return None
            config = job.complete(trial.params)
            role = trial.user_attrs.get("role", "search")
            reason = job.backend.unsupported_reason(config, self.capabilities)
            if reason:
                result = TrialResult.unsupported(reason)
            else:
                slot = self.slots.claim(trial)
                if slot is None:
                    give_up(study, trial, "the budget was spent by other workers")
                    return None
                with self.reporter.running(f"trial {slot + 1}/{self.max_trials}: {format_config(config)}"):
                    request = trial_request(job, config, self.environment["device"])
                    result = self.launcher.call(job.backend.runner, "run", request, job.trial_timeout(config))
            return record(
                study, trial, job, config, result, role=role, reference=self.reference, environment=self.environment
            )
        except KeyboardInterrupt:
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):  # it was recorded already
                trial.set_user_attr("reason", "the search was interrupted while this trial ran; it is retried")
                study.tell(trial, state=TrialState.FAIL)
            raise
        except optuna.exceptions.UpdateFinishedTrialError:
            self.reporter.note(f"trial {trial.number} was failed as stale by another worker; it is retried")
            return None
