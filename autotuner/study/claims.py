"""Claims: what exactly one worker of a study may do, decided by the storage itself.

Several workers (processes, machines) share a study through its RDB storage. Whatever only one
of them may do (create the study's identity, run the fp32 reference, run a config, spend a
trial of the budget, enqueue a retry) is a claim: a row of Optuna's `study_system_attributes`
table, whose (study_id, key) is unique. The INSERT that creates a claim succeeds for one worker
and fails for every other, on SQLite and PostgreSQL alike. A claim whose holder is gone (its
trial was cut off, its process died) is taken over with a compare-and-set UPDATE that matches
the exact value that was read, so of two workers taking over the same claim, one wins.

Claims are study system attrs: their keys start with `autotuner:`, `study.system_attrs` shows
them, and they are deleted with the study.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import sqlalchemy
from optuna.storages import RDBStorage

from autotuner.study.names import CLAIM_PREFIX

# The columns of Optuna's study system attrs table that a claim uses (Optuna's stable schema).
_TABLE = sqlalchemy.table(
    "study_system_attributes",
    sqlalchemy.column("study_id"),
    sqlalchemy.column("key"),
    sqlalchemy.column("value_json"),
)


@dataclass(frozen=True)
class Held:
    """A claim as read from the storage."""

    key: str
    raw: str
    """The stored JSON, exactly: what a take-over compares against."""

    @property
    def value(self) -> dict[str, object]:
        value = json.loads(self.raw)
        return value if isinstance(value, dict) else {}

    def integer(self, key: str, default: int = -1) -> int:
        """The claim's value at `key`, an integer (a trial's number), or `default` where it holds none."""
        found = self.value.get(key, default)
        return found if isinstance(found, int) else default


class Claims:
    """The claims of one study."""

    def __init__(self, storage: RDBStorage, study_id: int):
        self.engine = storage.engine
        self.study_id = study_id

    def claim(self, name: str, value: Mapping[str, object]) -> Held | None:
        """Create the claim `name`: None when this worker now holds it, else the current holder."""
        key = CLAIM_PREFIX + name
        try:
            with self.engine.begin() as connection:
                connection.execute(
                    sqlalchemy.insert(_TABLE).values(study_id=self.study_id, key=key, value_json=json.dumps(value))
                )
            return None
        except sqlalchemy.exc.IntegrityError:
            held = self.get(name)
            if held is None:
                raise  # not a lost race (a claim is never deleted): the study itself is gone
            return held

    def take_over(self, held: Held, value: Mapping[str, object]) -> bool:
        """Replace `held` with `value`, unless another worker changed it since it was read."""
        with self.engine.begin() as connection:
            done = connection.execute(
                sqlalchemy.update(_TABLE)
                .where(
                    _TABLE.c.study_id == self.study_id,
                    _TABLE.c.key == held.key,
                    _TABLE.c.value_json == held.raw,
                )
                .values(value_json=json.dumps(value))
            )
        return bool(done.rowcount == 1)

    def get(self, name: str) -> Held | None:
        key = CLAIM_PREFIX + name
        with self.engine.begin() as connection:
            raw = connection.execute(
                sqlalchemy.select(_TABLE.c.value_json).where(_TABLE.c.study_id == self.study_id, _TABLE.c.key == key)
            ).scalar()
        return None if raw is None else Held(key, raw)

    def all(self, prefix: str = "") -> dict[str, Held]:
        """Every claim whose name starts with `prefix`, by key."""
        pattern = CLAIM_PREFIX + prefix
        with self.engine.begin() as connection:
            rows = connection.execute(
                sqlalchemy.select(_TABLE.c.key, _TABLE.c.value_json).where(
                    _TABLE.c.study_id == self.study_id, _TABLE.c.key.startswith(pattern, autoescape=True)
                )
            ).all()
        return {key: Held(key, raw) for key, raw in rows}
