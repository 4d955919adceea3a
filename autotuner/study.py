"""The study in its RDB storage: opening it, what is stored on it, and reading it back.

Everything a report or an export needs lives in the storage, so `autotuner export` and the
dashboard work from the storage alone:

* on the study (user attrs): `autotuner` (spec identity and path, tolerance, memory limit,
  global batch), `environment` and `fingerprint`, `reference` (the fp32 run drift is measured
  against, with its noise floor), `constraints` (the names of the constraint values);
* on each trial (user attrs): `config` (every knob, accumulation included), `role` (baseline or
  search), `outcome`, `reason`, `traceback` (for `error`), `feasible`, and the metrics;
  the constraint values as the `constraints` system attr (what Optuna's samplers and
  optuna-dashboard both read).

Live Optuna trials are written only through `record`; `TrialRecord` is the stored view.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import optuna
import sqlalchemy
from optuna.trial import FrozenTrial

from autotuner.drift import measure_drift
from autotuner.environment import fingerprint
from autotuner.errors import HardwareMismatch, SpecError
from autotuner.knobs import Config
from autotuner.outcomes import Outcome
from autotuner.spec import Job
from autotuner.trial import TrialResult

METRIC_NAMES = ["throughput", "drift"]
DIRECTIONS: list[Literal["maximize", "minimize"]] = ["maximize", "minimize"]
CONSTRAINT_NAMES = ["drift", "outcome", "memory"]
DRIFT_CAP = 1e6
"""Infinite drift is stored as this in constraint values, which must be finite JSON."""

optuna.logging.set_verbosity(optuna.logging.WARNING)


def shown_url(url: str) -> str:
    """The storage URL without its password, for what is written down and passed around."""
    try:
        return str(sqlalchemy.engine.make_url(url).render_as_string(hide_password=True))
    except sqlalchemy.exc.ArgumentError:
        return url


def open_storage(url: str, *, default: bool = False) -> optuna.storages.BaseStorage:
    """An Optuna RDB storage at `url`, or one clear SpecError line saying why not."""
    try:
        parsed = sqlalchemy.engine.make_url(url)
        parsed.get_dialect()
    except sqlalchemy.exc.ArgumentError:
        raise SpecError(
            f"{url!r} is not a SQLAlchemy database URL (e.g. sqlite:///studies/x.db, postgresql://host/db)",
            key="storage",
        ) from None
    except sqlalchemy.exc.NoSuchModuleError:
        raise SpecError(f"{url!r}: no SQLAlchemy dialect {parsed.drivername!r} is installed", key="storage") from None
    except ImportError as exc:
        raise SpecError(
            f"{url!r}: its database driver is not installed ({exc}); e.g. pip install psycopg2-binary", key="storage"
        ) from None
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        folder = Path(parsed.database).parent
        if default:
            folder.mkdir(parents=True, exist_ok=True)
        elif not folder.is_dir():
            raise SpecError(f"{url!r}: the folder {str(folder)!r} does not exist", key="storage")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return optuna.storages.RDBStorage(
                url, engine_kwargs={"pool_pre_ping": True} if parsed.get_backend_name() != "sqlite" else None
            )
    except ImportError:
        hint = " (pip install 'autotuner[postgres]')" if parsed.get_backend_name() == "postgresql" else ""
        raise SpecError(
            f"cannot open the storage {url!r}: the driver for {parsed.drivername!r} is not installed{hint}",
            key="storage",
        ) from None
    except Exception as exc:
        reason = " ".join(str(getattr(exc, "orig", None) or exc).split())[:200]
        raise SpecError(f"cannot open the storage {url!r}: {reason}", key="storage") from None


def open_study(storage: optuna.storages.BaseStorage, job: Job, environment: dict[str, Any]) -> optuna.Study:
    """Create the study, or load it and check that this spec and this hardware match it."""
    ours = fingerprint(environment)
    try:
        study = optuna.load_study(study_name=job.name, storage=storage)
    except KeyError:
        study = optuna.create_study(study_name=job.name, storage=storage, directions=DIRECTIONS, load_if_exists=True)
    attrs = study.user_attrs
    if "autotuner" not in attrs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(METRIC_NAMES)
        study.set_user_attr(
            "autotuner",
            {
                "identity": job.identity(),
                "spec_path": job.source,
                "backend": job.backend.name,
                "workload": job.spec.workload,
                "global_batch": job.spec.global_batch,
                "max_drift": job.spec.objective.max_drift,
                "max_memory_mb": job.spec.objective.max_memory_mb,
            },
        )
        study.set_user_attr("environment", environment)
        study.set_user_attr("fingerprint", ours)
        study.set_user_attr("constraints", CONSTRAINT_NAMES)
        return study
    if [d.name.lower() for d in study.directions] != DIRECTIONS:
        raise SpecError(
            f"study {job.name!r} in this storage was not made by autotuner; choose another name", key="name"
        )
    if attrs.get("fingerprint") != ours:
        theirs = attrs.get("environment", {})
        raise HardwareMismatch(
            f"study {job.name!r} was measured on {_machine(theirs)}, fingerprint {attrs.get('fingerprint')}; "
            f"this worker is {_machine(environment)}, fingerprint {ours}: its timings would not compare. "
            "Use another study name for this hardware."
        )
    if attrs["autotuner"].get("identity") != job.identity():
        raise SpecError(
            f"study {job.name!r} was made from a different job (workload, batch, space, tolerance or trial "
            "settings changed); rename the study to start a new one, or restore the spec",
            source=job.source,
            key="name",
        )
    return study


def _machine(environment: dict[str, Any]) -> str:
    return f"{environment.get('device_name')} (torch {environment.get('versions', {}).get('torch')})"


# ------------------------------------------------------------------ recording


def trial_metrics(
    result: TrialResult, reference: dict[str, Any] | None, config: Config, environment: dict[str, Any]
) -> dict[str, Any]:
    """Everything measured about one trial, derived from the trial process's result."""
    metrics: dict[str, Any] = {"startup_s": result.startup_s, "wall_s": result.wall_s}
    data = result.result
    throughput = data.get("throughput")
    if throughput:
        rate = throughput["samples_per_s"]
        metrics.update(
            throughput=rate,
            throughput_spread=throughput["spread"],
            throughput_windows=throughput["window_samples_per_s"],
            warmup_s=throughput["warmup_s"],
            measured_s=throughput["measured_s"],
        )
        if data.get("tokens_per_sample"):
            metrics["tokens_per_s"] = rate * data["tokens_per_sample"]
        peak = (environment.get("peak_flops") or {}).get(config.get("precision", "fp32"))
        if data.get("flops_per_sample") and peak:
            metrics["mfu"] = rate * data["flops_per_sample"] / peak
    if data.get("peak_memory_mb") is not None:
        metrics["peak_memory_mb"] = data["peak_memory_mb"]
    metrics.update(data.get("gpu") or {})
    losses = data.get("losses")
    if losses and reference:
        drift = measure_drift(losses["heldout"], losses["trajectory"], reference["heldout"], reference["trajectory"])
        metrics.update(drift=drift.heldout, drift_trajectory_max=drift.trajectory_max, heldout_loss=losses["heldout"])
    elif result.outcome is Outcome.NAN:
        metrics["drift"] = math.inf
    return metrics


def _finite(value: float) -> float:
    return min(value, DRIFT_CAP)


def record(
    study: optuna.Study,
    trial: optuna.Trial,
    job: Job,
    config: Config,
    result: TrialResult,
    *,
    role: str,
    reference: dict[str, Any] | None,
    environment: dict[str, Any],
) -> TrialRecord:
    """Store one finished trial: metrics, outcome, feasibility, constraints, objective values."""
    metrics = trial_metrics(result, reference, config, environment)
    objective = job.spec.objective
    drift = metrics.get("drift")
    memory = metrics.get("peak_memory_mb")
    outcome, reason = result.outcome, result.reason
    violations = {
        "drift": _finite(drift) - objective.max_drift if drift is not None else 0.0,
        "outcome": 0.0 if outcome is Outcome.OK else 1.0,
        "memory": memory - objective.max_memory_mb if objective.max_memory_mb and memory is not None else 0.0,
    }
    if outcome is Outcome.OK and violations["drift"] > 0:
        reason = f"drift {drift:.3%} is over the tolerance of {objective.max_drift:.3%}"
    elif outcome is Outcome.OK and violations["memory"] > 0:
        reason = f"peak memory {memory:.0f} MiB is over the limit of {objective.max_memory_mb:.0f} MiB"
    feasible = all(v <= 0 for v in violations.values())
    attrs = {
        "config": config,
        "role": role,
        "outcome": outcome.value,
        "reason": reason,
        "feasible": feasible,
        **{k: (v if not (isinstance(v, float) and math.isinf(v)) else "inf") for k, v in metrics.items()},
    }
    if result.traceback:
        attrs["traceback"] = result.traceback
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    # The list form of the constraints is read by Optuna's samplers and by optuna-dashboard alike.
    trial.storage.set_trial_system_attr(trial._trial_id, "constraints", [violations[name] for name in CONSTRAINT_NAMES])
    values = [metrics.get("throughput", 0.0), drift if drift is not None else math.inf]
    frozen = study.tell(trial, values)
    return TrialRecord.from_frozen(frozen)


# ------------------------------------------------------------------ reading back


@dataclass(frozen=True)
class TrialRecord:
    """One stored trial, as reports and exports see it."""

    number: int
    state: str
    config: dict[str, Any]
    params: dict[str, Any]
    role: str
    outcome: str
    reason: str
    feasible: bool
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        return float(self.metrics.get("throughput") or 0.0)

    @property
    def drift(self) -> float:
        value = self.metrics.get("drift")
        return math.inf if value in (None, "inf") else float(value)

    @property
    def ran(self) -> bool:
        """It cost a trial process (unsupported configs are decided without one)."""
        return self.state == "COMPLETE" and self.outcome != Outcome.UNSUPPORTED.value

    @classmethod
    def from_frozen(cls, t: FrozenTrial) -> TrialRecord:
        attrs = dict(t.user_attrs)
        known = {"config", "role", "outcome", "reason", "feasible", "traceback"}
        state = t.state.name
        return cls(
            number=t.number,
            state=state,
            config=attrs.get("config") or dict(t.params),
            params=dict(t.params),
            role=attrs.get("role", "search"),
            outcome=attrs.get("outcome", "interrupted" if state == "FAIL" else state.lower()),
            reason=attrs.get("reason", ""),
            feasible=bool(attrs.get("feasible", False)) and state == "COMPLETE",
            metrics={k: v for k, v in attrs.items() if k not in known},
        )


def records(study: optuna.Study) -> list[TrialRecord]:
    return [TrialRecord.from_frozen(t) for t in study.get_trials(deepcopy=False)]


def best(trials: list[TrialRecord]) -> TrialRecord | None:
    """The highest-throughput feasible trial."""
    feasible = [t for t in trials if t.feasible]
    return max(feasible, key=lambda t: t.throughput) if feasible else None


def baseline(trials: list[TrialRecord]) -> TrialRecord | None:
    return next((t for t in trials if t.role == "baseline" and t.state == "COMPLETE"), None)


def spent_seconds(trials: list[TrialRecord]) -> float:
    return sum(float(t.metrics.get("wall_s") or 0.0) for t in trials)
