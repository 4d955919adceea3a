"""Recording a trial in the study: what a trial process measured becomes user attrs, constraint
values and Optuna objective values.

Live Optuna trials are written only through `record` (and `give_up`, for a trial a worker asked
for but does not run); `autotuner.results.records.TrialRecord` is the stored view. What goes on each
trial is listed in `autotuner.study.storage`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import optuna

from autotuner.config.knobs import PRECISION, Config
from autotuner.measurement.contention import CONTENDED_SHARE, contention
from autotuner.results.evidence import Reference
from autotuner.results.records import Metrics, TrialRecord
from autotuner.spec.job import Job
from autotuner.study.names import (
    CONFIG,
    ENERGY,
    FEASIBLE,
    GIVEN_UP,
    OUTCOME,
    REASON,
    ROLE,
    TRACEBACK,
    TRIAL_CONSTRAINTS,
)
from autotuner.study.optuna_adapter import trial_id
from autotuner.trials.launcher import TrialResult
from autotuner.trials.outcomes import Outcome
from autotuner.trials.probe import Environment
from autotuner.trials.trial_output import TrialOutput

DRIFT_CAP = 1e6
"""Infinite drift is stored as this in constraint values, which must be finite JSON."""


def trial_metrics(
    result: TrialResult[TrialOutput], reference: Reference | None, config: Config, environment: Environment
) -> Metrics:
    """Everything measured about one trial, derived from the trial process's output."""
    metrics: Metrics = {"startup_s": result.startup_s, "wall_s": result.wall_s}
    if result.warned is not None:  # what its process wrote, kept in its log (`autotuner logs`)
        metrics.update(warned=result.warned, log=result.log)
    output = result.output
    if output is not None:
        metrics.update(_measured(output, config, environment))
    if result.outcome is Outcome.NAN:  # the loss diverged: no finite drift
        metrics["drift"] = math.inf
    elif output is not None and output.output_drift is not None and not pruned(result):
        served = output.output_drift  # an inference trial: its outputs against the fp32 model's
        metrics["drift"] = served.relative_error
        for name in ("top1_agreement", "accuracy", "reference_accuracy"):
            if (value := getattr(served, name)) is not None:
                metrics[name] = value
    elif output is not None and reference is not None and not pruned(result):
        losses = output.losses
        drift = reference.drift(losses)
        metrics.update(drift=drift.heldout, drift_trajectory_max=drift.trajectory_max, heldout_loss=losses.heldout)
        if losses.skipped_steps is not None:  # fp16's GradScaler skipped these drift steps
            metrics["drift_skipped_steps"] = int(losses.skipped_steps)
    return metrics


def pruned(result: TrialResult[TrialOutput]) -> str | None:
    """Why the trial stopped after its first windows (`autotuner.measurement.pruning`), or None."""
    throughput = result.output.throughput if result.output is not None else None
    return throughput.stopped if result.outcome is Outcome.OK and throughput is not None else None


def _measured(output: TrialOutput, config: Config, environment: Environment) -> Metrics:
    """What the measured phase gave (nothing for the reference's drift-only run)."""
    metrics: Metrics = {}
    throughput = output.throughput
    if throughput is not None:
        rate = throughput.samples_per_s
        metrics.update(
            throughput=rate,
            throughput_spread=throughput.spread,
            throughput_windows=throughput.window_samples_per_s,
            window_steps=throughput.steps,
            warmup_s=throughput.warmup_s,
            warmup_steps=throughput.warmup_steps,
            measured_s=throughput.measured_s,
        )
        if output.setup_s is not None:
            metrics["setup_s"] = output.setup_s
        if throughput.stopped is not None and throughput.bound is not None:  # pruned: what it missed
            metrics.update(prune_bound=throughput.bound, prune_floor=throughput.floor, trained_s=throughput.trained_s)
        if output.tokens_per_sample:
            metrics["tokens_per_s"] = rate * output.tokens_per_sample
        if output.flops_per_sample:  # model FLOPs: the same for every config of the model
            metrics["flops_per_sample"] = output.flops_per_sample
            metrics["tflops"] = rate * output.flops_per_sample / 1e12
            peak = environment.peak_flops.get(config.get(PRECISION.name, PRECISION.reference))
            if peak:  # the device's datasheet figure for this precision (autotuner/measurement/hardware.py)
                metrics["mfu"] = rate * output.flops_per_sample / peak
    share = contention(output.telemetry or {})
    if share is not None:
        metrics.update(contention=share, contended=share > CONTENDED_SHARE)
    if output.latency is not None:  # an inference trial's calls, each a batch
        latency = output.latency
        metrics.update(
            latency_p50_ms=latency.p50_ms,
            latency_p99_ms=latency.p99_ms,
            latency_mean_ms=latency.mean_ms,
            latency_calls=latency.calls,
        )
    if output.peak_memory_mb is not None:
        metrics["peak_memory_mb"] = output.peak_memory_mb
    if output.dataset_items is not None:
        metrics["dataset_items"] = output.dataset_items
    if output.compile_cache:  # cold or warm: what warmup_s paid for compiling
        metrics["compile_cache"] = output.compile_cache
    if output.prune_held_off:  # behind the best, but other work took the CPU: it ran on
        metrics["prune_held_off"] = output.prune_held_off
    metrics.update(output.telemetry or {})
    return metrics


def _finite(value: float) -> float:
    return min(value, DRIFT_CAP)


@dataclass(frozen=True)
class Yardstick:
    """What every trial of a search is recorded against: the job (its objective's limits, its
    task's constraints), the fp32 reference its drift is measured against (None: none to measure
    against) and the device's environment (its peak FLOP/s, for the MFU)."""

    job: Job
    reference: Reference | None
    environment: Environment


def record(
    study: optuna.Study,
    trial: optuna.Trial,
    config: Config,
    result: TrialResult[TrialOutput],
    *,
    role: str,
    against: Yardstick,
    extra: Metrics | None = None,
) -> TrialRecord:
    """Store one finished trial: metrics (and `extra`), outcome, feasibility, constraints,
    objective values; a pruned one as Optuna PRUNED (`record_pruned`)."""
    metrics = {**trial_metrics(result, against.reference, config, against.environment), **(extra or {})}
    if (why := pruned(result)) is not None:
        return record_pruned(study, trial, config, why, metrics, role=role)
    job = against.job
    objective = job.spec.objective
    drift = metrics.get("drift")
    memory = metrics.get("peak_memory_mb")
    outcome, reason = result.outcome, result.reason
    drift_over = _finite(drift) - objective.max_drift if drift is not None else 0.0
    memory_over = memory - objective.max_memory_mb if objective.max_memory_mb and memory is not None else 0.0
    violations = [drift_over, 0.0 if outcome is Outcome.OK else 1.0, memory_over]  # names.CONSTRAINT_NAMES
    latency = metrics.get("latency_p99_ms")
    latency_over = 0.0
    if job.task.latency:  # names.INFERENCE_CONSTRAINT_NAMES
        limit = objective.max_latency_ms
        latency_over = latency - limit if limit and latency is not None else 0.0
        violations.append(latency_over)
    if outcome is Outcome.OK and drift_over > 0:
        reason = f"drift {drift:.3%} is over the tolerance of {objective.max_drift:.3%}"
    elif outcome is Outcome.OK and memory_over > 0:
        reason = f"peak memory {memory:.0f} MiB is over the limit of {objective.max_memory_mb:.0f} MiB"
    elif outcome is Outcome.OK and latency_over > 0:
        reason = f"p99 latency {latency:.1f} ms is over the limit of {objective.max_latency_ms:g} ms"
    feasible = all(v <= 0 for v in violations)
    attrs = {
        CONFIG: config,
        ROLE: role,
        OUTCOME: outcome.value,
        REASON: reason,
        FEASIBLE: feasible,
        **{k: (v if not (isinstance(v, float) and math.isinf(v)) else "inf") for k, v in metrics.items()},
    }
    if result.traceback:
        attrs[TRACEBACK] = result.traceback
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    # The list form of the constraints is read by Optuna's samplers and by optuna-dashboard alike.
    trial.storage.set_trial_system_attr(trial_id(trial), TRIAL_CONSTRAINTS, violations)
    values = [metrics.get("throughput", 0.0), drift if drift is not None else math.inf]
    if len(study.directions) > len(values):  # objective.energy: not measured is no better than any
        values.append(float(metrics.get(ENERGY) or math.inf))
    frozen = study.tell(trial, values)
    return TrialRecord.from_frozen(frozen)


def record_pruned(
    study: optuna.Study, trial: optuna.Trial, config: Config, reason: str, metrics: Metrics, *, role: str
) -> TrialRecord:
    """Store a trial its rule stopped (`autotuner.measurement.pruning`): the rates of the stretches
    judged behind as Optuna intermediate values (one per stretch; `Trial.report` refuses a study of
    two objectives, the storage does not), its metrics (`prune_bound`, the fastest of them, and
    `prune_floor`, the throughput it missed, among them), and the state PRUNED, with no objective
    values and no constraints: no drift was measured. The search reads its bound as a loss
    (`autotuner.results.tried.pruned_bound`)."""
    attrs = {CONFIG: config, ROLE: role, OUTCOME: Outcome.PRUNED.value, REASON: reason, FEASIBLE: False}
    for key, value in {**attrs, **metrics}.items():
        trial.set_user_attr(key, value)
    for window, value in enumerate(metrics.get("throughput_windows") or []):
        trial.storage.set_trial_intermediate_value(trial_id(trial), window, float(value))
    return TrialRecord.from_frozen(study.tell(trial, state=optuna.trial.TrialState.PRUNED))


def give_up(study: optuna.Study, trial: optuna.Trial, reason: str, **attrs: Any) -> None:
    """Store a trial this worker asked for but does not run (another trial has its config, or the
    budget is spent): FAIL, so samplers ignore it, and marked, so it is neither counted, retried
    nor shown. Optuna cannot delete a trial."""
    for key, value in {GIVEN_UP: reason, **attrs}.items():
        trial.set_user_attr(key, value)
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
