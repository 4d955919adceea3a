"""One asked-for trial, from Optuna's proposal to its record: given up when another trial has its
config or an out-of-memory trial rules it out, recorded as unsupported when the device cannot run
it, given up when other workers spent the budget, else run in its own trial process and recorded
(`autotuner.results.store.record`)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from autotuner.backends import Capabilities
from autotuner.config.knobs import Config
from autotuner.measurement.contention import CONTENDED_SHARE, contention, wait_until_quiet
from autotuner.output.console import SearchReporter
from autotuner.output.formatting import format_config
from autotuner.results.evidence import Reference
from autotuner.results.records import Metrics, TrialRecord
from autotuner.results.run_time import RunPlan
from autotuner.results.store import Yardstick, give_up, record
from autotuner.results.tried import best_feasible, oom_rules_out
from autotuner.spec.job import Job
from autotuner.trials.launcher import TrialLauncher, TrialResult
from autotuner.trials.outcomes import Outcome
from autotuner.trials.probe import Environment
from autotuner.trials.trial_output import TrialOutput
from autotuner.workers.coordination import BudgetSlots, ConfigClaims


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
    environment: Environment
    reference: Reference
    reporter: SearchReporter
    max_trials: int
    plan: RunPlan | None = None
    """The real run the configs are ranked for: with its length, the pruning bound is its pace."""

    def run(self, trial: optuna.Trial) -> TrialRecord | None:
        """Run and record one asked-for trial; None when it is given up without running."""
        job, study = self.job, self.study
        try:
            holder = self.configs.claim(trial)
            if holder is not None:
                give_up(study, trial, f"trial {holder} has this config", duplicate_of=holder)
                return None
            tried = study.get_trials(deepcopy=False)
            ruled_out = oom_rules_out(trial.params, tried, job.backend.knobs)
            if ruled_out is not None:
                give_up(study, trial, f"trial {ruled_out.number} ran out of memory", ruled_out_by=ruled_out.number)
                return None
            config = job.complete(trial.params)
            role = trial.user_attrs.get("role", "search")
            reason = job.backend.unsupported_reason(config, self.capabilities)
            extra: Metrics = {}
            if reason:
                result: TrialResult[TrialOutput] = TrialResult.unsupported(reason)
            else:
                slot = self.slots.claim(trial)
                if slot is None:
                    give_up(study, trial, "the budget was spent by other workers")
                    return None
                shown = f"trial {slot + 1}/{self.max_trials}: {format_config(config)}"
                best = self._prune_bound(tried) if role == "search" else None
                with self.reporter.running(shown):
                    result = self._run(trial.number, config, best)
                result, extra = self._when_contended(trial.number, config, result, shown, best)
            against = Yardstick(job, self.reference, self.environment)
            return record(study, trial, config, result, role=role, against=against, extra=extra)
        except KeyboardInterrupt:
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):  # it was recorded already
                trial.set_user_attr("reason", "the search was interrupted while this trial ran; it is retried")
                study.tell(trial, state=TrialState.FAIL)
            raise
        except optuna.exceptions.UpdateFinishedTrialError:
            self.reporter.note(f"trial {trial.number} was failed as stale by another worker; it is retried")
            return None

    def _prune_bound(self, tried: list[optuna.trial.FrozenTrial]) -> float | None:
        """The throughput a search trial is pruned against (`autotuner.measurement.pruning`): the best feasible
        one so far; with a run length, the pace at which the run's steps alone would take as long
        as the best config's whole predicted run (its set-up and compilation are not the pace, and
        a slower config that compiles nothing can win a short run)."""
        best = best_feasible(tried)
        if best is None or self.plan is None or not self.plan.has_length:
            return best
        done = [TrialRecord.from_frozen(t) for t in tried if t.state == TrialState.COMPLETE]
        pace = self.plan.pace_to_win(done, self.job.spec.trial.warmup_steps)
        return best if pace is None else min(best, pace)

    def _run(self, number: int, config: Config, best: float | None) -> TrialResult[TrialOutput]:
        """Run trial `number`'s `config` in a trial process; with `best`, stopped early if it cannot
        reach it."""
        device = self.environment.device
        request = self.job.trial_request(
            config, device, prune_best=best, progress=self.reporter.progress, log=self.job.log_path(f"trial-{number}")
        )
        return self.launcher.call(self.job.backend.runner, "run", request, self.job.trial_timeout(config))

    def _when_contended(
        self, number: int, config: Config, result: TrialResult[TrialOutput], shown: str, best: float | None
    ) -> tuple[TrialResult[TrialOutput], Metrics]:
        """`result`, or when other work took the CPU during its windows (`autotuner.measurement.contention`), a
        second run once the machine is quiet (at most `trial.quiet_wait` seconds later); and the
        metrics to record beside it (the first run's contention). One warning line says which."""
        first = _contention(result)
        if result.outcome is not Outcome.OK or first is None or first <= CONTENDED_SHARE:
            return result, {}
        wait = self.job.spec.trial.quiet_wait
        with self.reporter.running(f"{shown}: other work took {first:.0%} of the CPU; waiting for it to stop"):
            load = wait_until_quiet(wait)
        quiet = load is None or load <= CONTENDED_SHARE
        with self.reporter.running(f"{shown}: again, the machine {'quiet' if quiet else 'still busy'}"):
            second = self._run(number, config, best)
        again = _contention(second)
        # windows too short to tell their own contention: the wait before them told
        flagged = second.outcome is not Outcome.OK or (again > CONTENDED_SHARE if again is not None else not quiet)
        if second.outcome is not Outcome.OK:
            outcome, second = f"its run again ended {second.outcome.value}: the first run is recorded", result
        elif not flagged:
            outcome = (
                f"ran it again on a quiet machine{f' ({again:.0%})' if again is not None else ''}: that run is recorded"
            )
        else:
            share = f"{again:.0%}" if again is not None else "unmeasured"
            outcome = f"ran it again ({share}{'' if quiet else f' after waiting {wait:.0f} s'}): recorded"
        self.reporter.warn(
            f"trial {number}: other work took {first:.0%} of the CPU during its windows; {outcome}"
            + (", flagged contended" if flagged else "")
        )
        # flagged whether or not the run kept could tell its own contention
        return second, {"contention_first_run": first, **({"contended": True} if flagged else {})}


def _contention(result: TrialResult[TrialOutput]) -> float | None:
    return contention(result.output.telemetry or {}) if result.output is not None else None
