"""The study in its RDB storage: opening the storage and the study, and what is stored on it.

Everything a report or an export needs lives in the storage, so `autotuner export` and the
dashboard work from the storage alone:

* on the study (user attrs): `autotuner` (spec identity and path, tolerance, memory limit,
  global batch), `environment` and `fingerprint`, `reference` (the fp32 run drift is measured
  against, with its noise floor: `autotuner.results.evidence.Reference`), `constraints` (the names of the
  constraint values);
* on each trial (user attrs): `config` (every knob, accumulation included), `role` (baseline or
  search), `outcome`, `reason`, `traceback` (for `error`), `feasible`, and the metrics;
  the constraint values as the `constraints` system attr (what Optuna's samplers and
  optuna-dashboard both read).

Trials are written by `autotuner.results.store` and read back by `autotuner.results.records`. Trial user
attrs that say how a trial relates to others: `retry_of` (the cut-off trial it runs again),
`given_up` and `duplicate_of`. The claims that coordinate the workers of a study are its
`autotuner:*` system attrs (`autotuner.study.claims`, `autotuner.workers.coordination`,
`autotuner.workers.ownership`), a config's re-measurement (`autotuner.results.evidence.Remeasurement`) among them.
"""

from __future__ import annotations

import random
import time
import warnings
from pathlib import Path
from typing import Any, Literal

import optuna
import sqlalchemy

from autotuner.errors import HardwareMismatch, SpecError
from autotuner.spec.job import Job
from autotuner.study.claims import Claims
from autotuner.study.fingerprint import fingerprint, framework_versions

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
"""The constraint values in the order a trial's `constraints` system attr lists them."""

HEARTBEAT_S = 10
"""How often a search process records, in the storage, that its running trial is alive."""
GRACE_S = 60
"""A running trial without a heartbeat for this long belongs to a worker that is gone."""
SQLITE_BUSY_S = 30
"""How long an SQLite writer waits for another worker's transaction before it gives up."""
OPEN_ATTEMPTS = 5
STUDY_ATTRS = ("autotuner", "environment", "fingerprint", "constraints")
"""The study user attrs a study's creator writes; until all are there, its `identity` claim decides."""

optuna.logging.set_verbosity(optuna.logging.WARNING)


def shown_url(url: str) -> str:
    """The storage URL without its password, for what is written down and passed around."""
    try:
        return str(sqlalchemy.engine.make_url(url).render_as_string(hide_password=True))
    except sqlalchemy.exc.ArgumentError:
        return url


def check_storage_url(url: str, *, default: bool = False, create: bool = True) -> sqlalchemy.engine.URL:
    """`url` parsed, or one clear SpecError line saying why no storage can be opened there, found
    without connecting or writing anything (a search checks it before its probe, which takes
    seconds): not a URL, no such dialect or driver, an in-memory SQLite, a SQLite file in a folder
    that does not exist (`default`: the study's folder, created as it opens), and without
    `create` a SQLite file that does not exist."""
    try:
        parsed = sqlalchemy.engine.make_url(url)
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
