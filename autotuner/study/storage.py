"""The study in its RDB storage: opening the storage and the study, checking that a job and a
machine may join it, and what its creator writes on it.

Everything a report or an export needs lives in the storage, so `autotuner export` and the
dashboard work from the storage alone. What is stored where, and under which name, is
`autotuner.study.names`; trials are written by `autotuner.results.store` and read back by
`autotuner.results.records`, and the claims that coordinate the workers of a study are kept by
`autotuner.study.claims`, `autotuner.workers.coordination` and `autotuner.workers.ownership`.
"""

from __future__ import annotations

import random
import sqlite3
import time
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

import optuna
import sqlalchemy

from autotuner.errors import HardwareMismatch, SpecError
from autotuner.spec.job import Job
from autotuner.study.claims import Claims
from autotuner.study.fingerprint import fingerprint, framework_versions
from autotuner.study.names import (
    CONSTRAINT_NAMES,
    CONSTRAINTS,
    DIRECTIONS,
    ENERGY,
    ENVIRONMENT,
    FINGERPRINT,
    IDENTITY_CLAIM,
    INFERENCE_CONSTRAINT_NAMES,
    METRIC_NAMES,
    SETTINGS,
    STUDY_ATTRS,
)
from autotuner.trials.probe import Environment


def objectives(job: Job) -> tuple[list[str], list[Literal["maximize", "minimize"]]]:
    """The study's metric names and directions: throughput and drift, and energy where asked."""
    if job.spec.objective.energy:
        return [*METRIC_NAMES, ENERGY], [*DIRECTIONS, "minimize"]
    return list(METRIC_NAMES), list(DIRECTIONS)


HEARTBEAT_S = 10
"""How often a search process records, in the storage, that its running trial is alive."""
GRACE_S = 60
"""A running trial without a heartbeat for this long belongs to a worker that is gone."""
SQLITE_BUSY_S = 30
"""How long an SQLite writer waits for another worker's transaction before it gives up."""
OPEN_ATTEMPTS = 5

optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclass(frozen=True)
class StudySettings:
    """The job's settings a study's creator stores on it (`autotuner.study.names.SETTINGS`): what
    the export, the report and the dashboard say of the job. A study made by an older autotuner
    may lack some: None."""

    identity: str | None = None
    """`autotuner.spec.job.Job.identity`: the job a study measures."""
    spec_path: str | None = None
    backend: str | None = None
    workload: str | None = None
    """The spec's `workload`, as written (`builtin:mlp`, `package.module:function`)."""
    global_batch: int | None = None
    max_drift: float | None = None
    """The drift tolerance (`objective.max_drift`)."""
    max_memory_mb: float | None = None
    """The peak-memory limit (`objective.max_memory_mb`), or None."""
    processes: int | None = None
    """Ranks of every trial on each node (the spec's `processes`)."""
    nodes: int = 1
    """Machines every trial spans (the spec's `nodes`)."""
    rendezvous: str | None = None
    """Where its nodes meet (the spec's `rendezvous`), with `nodes` above 1."""
    parallel: str | None = None
    """How the ranks train together (`autotuner.spec.job.Job.parallel`); None for one process."""
    task: str = "train"
    """What a trial measures (the spec's `task`): `train` or `inference`."""

    @classmethod
    def of(cls, job: Job) -> StudySettings:
        return cls(
            identity=job.identity(),
            spec_path=job.source,
            backend=job.backend.name,
            workload=job.spec.workload,
            global_batch=job.spec.global_batch,
            max_drift=job.spec.objective.max_drift,
            max_memory_mb=job.spec.objective.max_memory_mb,
            processes=job.spec.processes,
            nodes=job.spec.nodes,
            rendezvous=job.spec.rendezvous,
            parallel=job.parallel,
            task=job.spec.task,
        )

    def as_dict(self) -> dict[str, object]:
        """The stored form (JSON)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StudySettings:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def study_settings(attrs: Mapping[str, object]) -> StudySettings | None:
    """The settings among a study's user attrs, or None for a study autotuner did not make."""
    stored = attrs.get(SETTINGS)
    return StudySettings.from_dict(stored) if isinstance(stored, Mapping) else None


def study_environment(attrs: Mapping[str, Any]) -> Environment:
    """The environment among a study's user attrs (empty fields where it has none)."""
    return Environment.from_dict(attrs.get(ENVIRONMENT) or {})


def shown_url(url: str) -> str:
    """The storage URL without its password, for what is written down and passed around."""
    try:
        return str(sqlalchemy.engine.make_url(url).render_as_string(hide_password=True))
    except sqlalchemy.exc.ArgumentError:
        return url


GRPC_REFUSED = (
    "{url!r}: Optuna's gRPC storage proxy cannot carry a study's workers: their claims are rows only one "
    "worker can insert and compare-and-set updates, in SQL, and the proxy only overwrites attributes and "
    "records no heartbeat; give the database's own URL, e.g. postgresql://user@db-host/studies"
)
"""A `grpc://host:port` URL (`optuna.storages.GrpcStorageProxy`), refused: `autotuner.study.claims`."""


def check_storage_url(url: str, *, default: bool = False, create: bool = True) -> sqlalchemy.engine.URL:
    """`url` parsed, or one clear SpecError line saying why no storage can be opened there, found
    without connecting or writing anything (a search checks it before its probe, which takes
    seconds): not a URL, Optuna's gRPC proxy (`GRPC_REFUSED`), no such dialect or driver, an in-memory
    SQLite, a SQLite file in a folder that does not exist (`default`: the study's folder, created as
    it opens), and without `create` a SQLite file that does not exist."""
    try:
        parsed = sqlalchemy.engine.make_url(url)
        if parsed.drivername == "grpc":
            raise SpecError(GRPC_REFUSED.format(url=url), key="storage")
        parsed.get_dialect()
    except sqlalchemy.exc.ArgumentError:
        raise SpecError(
            f"{url!r} is not a SQLAlchemy database URL (e.g. sqlite:///runs/x/study.db, postgresql://host/db)",
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
        if not default and not folder.is_dir():
            raise SpecError(f"{url!r}: the folder {str(folder)!r} does not exist", key="storage")
    return parsed


def open_storage(
    url: str, *, default: bool = False, heartbeat: bool = False, create: bool = True
) -> optuna.storages.RDBStorage:
    """An Optuna RDB storage at `url`, or one clear SpecError line saying why not
    (`check_storage_url`; `default`: the study's own folder is created). Without `create`, a SQLite
    file that does not exist is refused rather than created (for commands that only read a study).

    With `heartbeat`, a search process records that its running trial is alive every
    `HEARTBEAT_S` seconds (`autotuner.workers.ownership.TrialOwnership`), and a running trial without a heartbeat
    for `GRACE_S` is failed as stale by any worker of the study."""
    parsed = check_storage_url(url, default=default, create=create)
    sqlite = parsed.get_backend_name() == "sqlite"
    if default and sqlite and parsed.database:
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
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
    def _no_implicit_begin(dbapi_connection: sqlite3.Connection, _record: sqlalchemy.pool.ConnectionPoolEntry) -> None:
        dbapi_connection.isolation_level = None

    @sqlalchemy.event.listens_for(engine, "begin")
    def _begin_immediate(connection: sqlalchemy.engine.Connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections opened while the storage was created predate the hooks


def check_objectives(job: Job, environment: Environment) -> None:
    """Refuse an objective this device cannot measure (before anything is stored)."""
    if job.spec.objective.energy and not environment.energy_counter:
        raise SpecError(
            f"objective.energy needs a GPU whose energy counter NVML reads; {environment.device} "
            f"({environment.device_name}) has none",
            source=job.source,
            key="objective.energy",
        )


def check_trial_limits(job: Job, environment: Environment) -> None:
    """Refuse `trial.max_memory_mb` on a GPU: RLIMIT_DATA counts the private writable mappings the
    CUDA driver makes for device and pinned memory, so the limit would fail trials that fit, and
    it could not say what it limits. Device memory is `objective.max_memory_mb`'s."""
    limit = job.spec.trial.max_memory_mb
    if limit is not None and environment.accelerator:
        raise SpecError(
            f"trial.max_memory_mb ({limit:g}) limits a CPU trial's host memory; on {environment.device} "
            "the GPU driver's mappings would count against it. Remove it, and limit device memory with "
            "objective.max_memory_mb",
            source=job.source,
            key="trial.max_memory_mb",
        )


def open_study(storage: optuna.storages.RDBStorage, job: Job, environment: Environment) -> optuna.Study:
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
        mine = {FINGERPRINT: ours, "identity": job.identity(), ENVIRONMENT: environment.as_dict()}
        claimed = Claims(storage, storage.get_study_id_from_name(job.name)).claim(IDENTITY_CLAIM, mine)
        theirs = claimed.value if claimed is not None else mine
        if (theirs.get(FINGERPRINT), theirs.get("identity")) == (ours, job.identity()):
            _write_study_attrs(study, job, environment, ours)  # every matching worker alike: idempotent
            return study
        # The worker creating this study has other hardware or another job: refused below.
        attrs = {
            SETTINGS: {"identity": theirs.get("identity")},
            FINGERPRINT: theirs.get(FINGERPRINT),
            ENVIRONMENT: theirs.get(ENVIRONMENT, {}),
        }
    if attrs.get(FINGERPRINT) != ours:
        measured = Environment.from_dict(attrs.get(ENVIRONMENT, {}))
        raise HardwareMismatch(
            f"study {job.name!r} was measured on {_machine(measured)}, fingerprint {attrs.get(FINGERPRINT)}; "
            f"this worker is {_machine(environment)}, fingerprint {ours}: its timings would not compare. "
            "Use another study name for this hardware."
        )
    if StudySettings.from_dict(attrs[SETTINGS]).identity != job.identity():
        raise SpecError(
            f"study {job.name!r} was made from a different job (workload, batch, space, tolerance or trial "
            "settings changed); rename the study to start a new one, or restore the spec",
            source=job.source,
            key="name",
        )
    return study


def _write_study_attrs(study: optuna.Study, job: Job, environment: Environment, fingerprint: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(objectives(job)[0])
    study.set_user_attr(SETTINGS, StudySettings.of(job).as_dict())
    study.set_user_attr(ENVIRONMENT, environment.as_dict())
    study.set_user_attr(FINGERPRINT, fingerprint)
    names = INFERENCE_CONSTRAINT_NAMES if job.task.latency else CONSTRAINT_NAMES
    study.set_user_attr(CONSTRAINTS, list(names))


def _machine(environment: Environment) -> str:
    return f"{environment.device_name} ({framework_versions(environment)})"
