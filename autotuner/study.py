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

Live Optuna trials are written only through `record` (and `give_up`, for a trial a worker asked
for but does not run); `TrialRecord` is the stored view. Trial user attrs that say how a trial
relates to others: `retry_of` (the cut-off trial it runs again), `given_up` and `duplicate_of`.
The claims that coordinate the workers of a study are its `autotuner:*` system attrs
(`autotuner.claims`, `autotuner.coordination`, `autotuner.ownership`).
"""

from __future__ import annotations

import math
import random
import statistics
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import optuna
import sqlalchemy
from optuna.trial import FrozenTrial

from autotuner.claims import PREFIX, Claims
from autotuner.drift import measure_drift
from autotuner.environment import fingerprint, framework_versions
from autotuner.errors import HardwareMismatch, SpecError
from autotuner.knobs import Config
from autotuner.optuna_adapter import study_id, study_storage, trial_id
from autotuner.outcomes import Outcome
from autotuner.spec import Job
from autotuner.trial import TrialResult

METRIC_NAMES = ["throughput", "drift"]
DIRECTIONS: list[Literal["maximize", "minimize"]] = ["maximize", "minimize"]
ENERGY = "energy_j_per_sample"
"""The optional third objective (`objective.energy`), minimized."""


def objectives(job: Job) -> tuple[list[str], list[Literal["maximize", "minimize"]]]:
    """The study's metric names and directions: throughput and drift, and energy where asked."""
    if job.spec.objective.energy:
        return [*METRIC_NAMES, ENERGY], [*DIRECTIONS, "minimize"]
    return list(METRIC_NAMES), list(DIRECTIONS)


CONSTRAINT_NAMES = ["drift", "outcome", "memory"]
DRIFT_CAP = 1e6
"""Infinite drift is stored as this in constraint values, which must be finite JSON."""

HEARTBEAT_S = 10
"""How often a search process records, in the storage, that its running trial is alive."""
GRACE_S = 60
"""A running trial without a heartbeat for this long belongs to a worker that is gone."""
SQLITE_BUSY_S = 30
"""How long an SQLite writer waits for another worker's transaction before it gives up."""
OPEN_ATTEMPTS = 5
STUDY_ATTRS = ("autotuner", "environment", "fingerprint", "constraints")
"""The study user attrs a study's creator writes; until all are there, its `identity` claim decides."""
REMEASURE_PREFIX = PREFIX + "remeasure:"
"""Study system attr (a claim, `autotuner.claims`) holding the re-measurement of a trial's config."""
GIVEN_UP = "given_up"
"""Trial user attr: why a worker gave the trial up without running it (see `give_up`)."""
CUT_OFF = "its worker stopped while it ran (killed, or cut off from the storage); it is retried"
"""The reason of a trial failed for a missing heartbeat, which Optuna fails without one."""

optuna.logging.set_verbosity(optuna.logging.WARNING)


def shown_url(url: str) -> str:
    """The storage URL without its password, for what is written down and passed around."""
    try:
        return str(sqlalchemy.engine.make_url(url).render_as_string(hide_password=True))
    except sqlalchemy.exc.ArgumentError:
        return url


def open_storage(
    url: str, *, default: bool = False, heartbeat: bool = False, create: bool = True
) -> optuna.storages.RDBStorage:
    """An Optuna RDB storage at `url`, or one clear SpecError line saying why not. Without
    `create`, a SQLite file that does not exist is refused rather than created (for commands
    that only read a study).

    With `heartbeat`, a search process records that its running trial is alive every
    `HEARTBEAT_S` seconds (`autotuner.ownership.TrialOwnership`), and a running trial without a heartbeat
    for `GRACE_S` is failed as stale by any worker of the study."""
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
    if parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise SpecError(
            f"{url!r}: an in-memory database keeps nothing; give a file, e.g. sqlite:///x.db", key="storage"
        )
    if parsed.get_backend_name() == "sqlite" and parsed.database:
        if not create and not Path(parsed.database).exists():
            raise SpecError(f"no study database at {parsed.database}; run autotuner search first", key="storage")
        folder = Path(parsed.database).parent
        if default:
            folder.mkdir(parents=True, exist_ok=True)
        elif not folder.is_dir():
            raise SpecError(f"{url!r}: the folder {str(folder)!r} does not exist", key="storage")
    sqlite = parsed.get_backend_name() == "sqlite"
    # SQLite: writers wait for each other (busy timeout) instead of failing with "database is locked".
    engine_kwargs: dict[str, Any] = {"connect_args": {"timeout": SQLITE_BUSY_S}} if sqlite else {"pool_pre_ping": True}
    beat: dict[str, Any] = {"heartbeat_interval": HEARTBEAT_S, "grace_period": GRACE_S} if heartbeat else {}
    for attempt in range(OPEN_ATTEMPTS):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, **beat)
            break
        except ImportError:
            hint = " (pip install 'autotuner[postgres]')" if parsed.get_backend_name() == "postgresql" else ""
            raise SpecError(
                f"cannot open the storage {url!r}: the driver for {parsed.drivername!r} is not installed{hint}",
                key="storage",
            ) from None
        except Exception as exc:
            if attempt + 1 < OPEN_ATTEMPTS and _creation_race(exc, sqlite):
                time.sleep(random.uniform(0.1, 0.5))  # another worker is creating the tables: look again
                continue
            reason = " ".join(str(getattr(exc, "orig", None) or exc).split())[:200]
            raise SpecError(f"cannot open the storage {url!r}: {reason}", key="storage") from None
    if sqlite:
        _serialize_sqlite(storage.engine)
    return storage


def _creation_race(exc: BaseException, sqlite: bool) -> bool:
    """Workers opening a new database at once race to create Optuna's tables; the losers retry."""
    cause = exc.__cause__ if isinstance(exc, optuna.exceptions.StorageInternalError) else exc
    if isinstance(cause, (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError)):
        return True
    return sqlite and isinstance(cause, sqlalchemy.exc.OperationalError)


def _serialize_sqlite(engine: sqlalchemy.engine.Engine) -> None:
    """Make every SQLite transaction take the write lock when it begins (BEGIN IMMEDIATE).

    By default pysqlite starts a transaction at its first write, so a read-then-write (Optuna
    moving a trial from WAITING to RUNNING) is not atomic between processes, and two transactions
    that both read before writing deadlock, which SQLite reports at once as "database is
    locked" without waiting. Taking the lock up front makes each transaction atomic and lets the
    busy timeout queue the workers. (The recipe of SQLAlchemy's pysqlite documentation.)
    """

    @sqlalchemy.event.listens_for(engine, "connect")
    def _no_implicit_begin(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @sqlalchemy.event.listens_for(engine, "begin")
    def _begin_immediate(connection: sqlalchemy.engine.Connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections opened while the storage was created predate the hooks


def check_objectives(job: Job, environment: dict[str, Any]) -> None:
    """Refuse an objective this device cannot measure (before anything is stored)."""
    if job.spec.objective.energy and not environment.get("energy_counter"):
        raise SpecError(
            f"objective.energy needs a GPU whose energy counter NVML reads; {environment.get('device')} "
            f"({environment.get('device_name')}) has none",
            source=job.source,
            key="objective.energy",
        )


def check_trial_limits(job: Job, environment: dict[str, Any]) -> None:
    """Refuse `trial.max_memory_mb` on a GPU: RLIMIT_DATA counts the private writable mappings the
    CUDA driver makes for device and pinned memory, so the limit would fail trials that fit, and
    it could not say what it limits. Device memory is `objective.max_memory_mb`'s."""
    limit = job.spec.trial.max_memory_mb
    if limit is not None and (environment.get("capabilities") or {}).get("accelerator"):
        raise SpecError(
            f"trial.max_memory_mb ({limit:g}) limits a CPU trial's host memory; on {environment.get('device')} "
            "the GPU driver's mappings would count against it. Remove it, and limit device memory with "
            "objective.max_memory_mb",
            source=job.source,
            key="trial.max_memory_mb",
        )


def open_study(storage: optuna.storages.RDBStorage, job: Job, environment: dict[str, Any]) -> optuna.Study:
    """Create the study, or load it and check that this spec and this hardware match it.

    Workers that start together race to create it: the one that wins the `identity` claim
    writes the study's attributes, and every other worker is checked against that claim."""
    ours = fingerprint(environment)
    check_objectives(job, environment)
    _, directions = objectives(job)
    try:
        study = optuna.load_study(study_name=job.name, storage=storage)
    except KeyError:
        study = optuna.create_study(study_name=job.name, storage=storage, directions=directions, load_if_exists=True)
    if [d.name.lower() for d in study.directions] != directions:
        raise SpecError(
            f"study {job.name!r} in this storage was not made by autotuner with these objectives; choose another name",
            key="name",
        )
    attrs = study.user_attrs
    if not all(key in attrs for key in STUDY_ATTRS):  # new, or another worker is writing them now
        mine = {"fingerprint": ours, "identity": job.identity(), "environment": environment}
        claimed = Claims(storage, storage.get_study_id_from_name(job.name)).claim("identity", mine)
        theirs = claimed.value if claimed is not None else mine
        if (theirs.get("fingerprint"), theirs.get("identity")) == (ours, job.identity()):
            _write_study_attrs(study, job, environment, ours)  # every matching worker alike: idempotent
            return study
        # The worker creating this study has other hardware or another job: refused below.
        attrs = {
            "autotuner": {"identity": theirs.get("identity")},
            "fingerprint": theirs.get("fingerprint"),
            "environment": theirs.get("environment", {}),
        }
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


def _write_study_attrs(study: optuna.Study, job: Job, environment: dict[str, Any], fingerprint: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(objectives(job)[0])
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
    study.set_user_attr("fingerprint", fingerprint)
    study.set_user_attr("constraints", CONSTRAINT_NAMES)


def _machine(environment: dict[str, Any]) -> str:
    return f"{environment.get('device_name')} ({framework_versions(environment)})"


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
        if data.get("flops_per_sample"):
            metrics["flops_per_sample"] = data["flops_per_sample"]
            metrics["tflops"] = rate * data["flops_per_sample"] / 1e12
            peak = (environment.get("peak_flops") or {}).get(config.get("precision", "fp32"))
            if peak:  # the device's datasheet figure for this precision (autotuner/hardware.py)
                metrics["mfu"] = rate * data["flops_per_sample"] / peak
    if data.get("peak_memory_mb") is not None:
        metrics["peak_memory_mb"] = data["peak_memory_mb"]
    if data.get("compile_cache"):  # cold or warm: what warmup_s paid for compiling
        metrics["compile_cache"] = data["compile_cache"]
    metrics.update(data.get("telemetry") or {})
    losses = data.get("losses")
    if losses and reference:
        drift = measure_drift(losses["heldout"], losses["trajectory"], reference["heldout"], reference["trajectory"])
        metrics.update(drift=drift.heldout, drift_trajectory_max=drift.trajectory_max, heldout_loss=losses["heldout"])
        if losses.get("skipped_steps") is not None:  # fp16's GradScaler skipped these drift steps
            metrics["drift_skipped_steps"] = int(losses["skipped_steps"])
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
    trial.storage.set_trial_system_attr(trial_id(trial), "constraints", [violations[name] for name in CONSTRAINT_NAMES])
    values = [metrics.get("throughput", 0.0), drift if drift is not None else math.inf]
    if len(study.directions) > len(values):  # objective.energy: not measured is no better than any
        values.append(float(metrics.get(ENERGY) or math.inf))
    frozen = study.tell(trial, values)
    return TrialRecord.from_frozen(frozen)


def give_up(study: optuna.Study, trial: optuna.Trial, reason: str, **attrs: Any) -> None:
    """Store a trial this worker asked for but does not run (another trial has its config, or the
    budget is spent): FAIL, so samplers ignore it, and marked, so it is neither counted, retried
    nor shown. Optuna cannot delete a trial."""
    for key, value in {GIVEN_UP: reason, **attrs}.items():
        trial.set_user_attr(key, value)
    study.tell(trial, state=optuna.trial.TrialState.FAIL)


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
    remeasured: dict[str, Any] | None = None
    """The config's re-measurement (`autotuner.search.Search._remeasure`), once done: for each of
    its runs (a fresh trial process) the median `throughputs` and the rates of its `windows`;
    `baseline_windows`, the rates of the baseline's windows measured in the same group (in
    lockstep, between its own); the trial numbers of that `group`, and whether it was measured
    in `lockstep`; and `error` when one of them failed."""

    @property
    def trial_throughput(self) -> float:
        """What the trial itself measured (the Optuna value the dashboard plots)."""
        return float(self.metrics.get("throughput") or 0.0)

    @property
    def throughputs(self) -> list[float]:
        """Every measurement of the config: the trial's, then its re-measurement runs'."""
        return [self.trial_throughput, *((self.remeasured or {}).get("throughputs") or [])]

    @property
    def rerun_windows(self) -> list[float]:
        """The rate of every window of the config's re-measurement runs."""
        return [rate for run in (self.remeasured or {}).get("windows") or [] for rate in run]

    @property
    def throughput(self) -> float:
        """The config's throughput: the trial's median window, or once it is re-measured, the
        median over every window of its re-measurement processes. The trial that got it chosen
        is left out of that: where it was chosen for a lucky window, counting it would carry the
        luck into the figure."""
        windows = self.rerun_windows
        return float(statistics.median(windows)) if windows else self.trial_throughput

    @property
    def run_spread(self) -> float | None:
        """(max - min) / median of the config's processes' medians; None before it is re-measured."""
        runs = self.throughputs
        middle = statistics.median(runs)
        return (max(runs) - min(runs)) / middle if len(runs) > 1 and middle else None

    @property
    def remeasure_error(self) -> str | None:
        """Why a re-run of the config failed (it is then not declared best), or None."""
        return (self.remeasured or {}).get("error")

    @property
    def drift(self) -> float:
        value = self.metrics.get("drift")
        return math.inf if value in (None, "inf") else float(value)

    @property
    def ran(self) -> bool:
        """It cost a trial process (unsupported configs are decided without one)."""
        return self.state == "COMPLETE" and self.outcome != Outcome.UNSUPPORTED.value

    @classmethod
    def from_frozen(cls, t: FrozenTrial, remeasured: dict[str, Any] | None = None) -> TrialRecord:
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
            reason=attrs.get("reason", CUT_OFF if state == "FAIL" else ""),
            feasible=bool(attrs.get("feasible", False)) and state == "COMPLETE",
            metrics={k: v for k, v in attrs.items() if k not in known},
            remeasured=remeasured,
        )


def records(study: optuna.Study) -> list[TrialRecord]:
    """Every trial of the study, but those given up without running (`give_up`), with their
    re-measurements."""
    done = remeasurements(study)
    return [
        TrialRecord.from_frozen(t, done.get(t.number))
        for t in study.get_trials(deepcopy=False)
        if GIVEN_UP not in t.user_attrs
    ]


def remeasurements(study: optuna.Study) -> dict[int, dict[str, Any]]:
    """The finished re-measurements of the study, by trial number (claims `remeasure:<number>`)."""
    found: dict[int, dict[str, Any]] = {}
    for key, value in study_storage(study).get_study_system_attrs(study_id(study)).items():
        if key.startswith(REMEASURE_PREFIX) and isinstance(value, dict) and value.get("status") == "done":
            found[int(key.removeprefix(REMEASURE_PREFIX))] = value
    return found


def speedup(trial: TrialRecord, base: TrialRecord | None) -> float | None:
    """The config's throughput over the baseline's. Once it is re-measured, over the baseline's
    windows measured in the same group, so that a change in the machine's speed between groups
    (in lockstep, between windows) falls on both; None without a baseline throughput."""
    beside = (trial.remeasured or {}).get("baseline_windows") or []
    if trial.rerun_windows and beside:
        return trial.throughput / float(statistics.median(beside))
    return trial.throughput / base.throughput if base is not None and base.throughput > 0 else None


def ranked(trials: list[TrialRecord]) -> list[TrialRecord]:
    """The feasible trials, fastest first: by `speedup` over the baseline (re-measured configs by
    their re-measurement beside the baseline), by `TrialRecord.throughput` without a baseline. A
    config whose re-measurement failed is left out: it is not reliable."""
    base = baseline(trials)
    by_speedup = base is not None and base.throughput > 0  # else there are no speedups
    feasible = [t for t in trials if t.feasible and not t.remeasure_error]
    return sorted(feasible, key=lambda t: (-(speedup(t, base) or 0.0) if by_speedup else -t.throughput, t.number))


def to_remeasure(trials: list[TrialRecord], top: int) -> list[TrialRecord]:
    """The configs to measure again before the best is declared: the `top` fastest feasible ones
    and the baseline; then, once some are re-measured, up to `top` more whose one trial came out
    below the best by less than the machine's noise (the median spread between the processes of
    the re-measured configs), since an unlucky process can hide the best as a lucky one can
    crown another. The ones already re-measured are included: the caller skips them."""
    order = ranked(trials)
    chosen = order[:top]
    base = baseline(trials)
    if base is not None and base.outcome == Outcome.OK.value and base not in chosen:
        chosen.append(base)
    spreads = [t.run_spread for t in trials if t.remeasured is not None and t.run_spread is not None]
    if order and spreads:
        within_noise = order[0].throughput * (1 - statistics.median(spreads))
        chosen += [t for t in order[top:] if t.remeasured is None and t.throughput >= within_noise][:top]
    return chosen


def best(trials: list[TrialRecord]) -> TrialRecord | None:
    """The best config: the first of `ranked`."""
    return next(iter(ranked(trials)), None)


def baseline(trials: list[TrialRecord]) -> TrialRecord | None:
    return next((t for t in trials if t.role == "baseline" and t.state == "COMPLETE"), None)


def spent_seconds(trials: list[TrialRecord]) -> float:
    return sum(float(t.metrics.get("wall_s") or 0.0) for t in trials)
