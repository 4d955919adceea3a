"""The one module that reaches into Optuna's private attributes, each with why it must.

Everything else in autotuner uses Optuna's public API: `optuna.Study`, `optuna.Trial`,
`FrozenTrial` and the public methods of `optuna.storages.BaseStorage`. Where that API stops short
(the storage addresses trials and studies by ids that the objects holding them do not expose),
the gap is bridged here, so an Optuna release that renames an attribute breaks one module.
"""

from __future__ import annotations

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial


def trial_id(trial: optuna.Trial | FrozenTrial) -> int:
    """The storage's id of `trial`. The storage's public methods (`set_trial_system_attr`,
    `set_trial_state_values`, Optuna's heartbeat) address a trial by this id, but neither `Trial`
    nor `FrozenTrial` exposes it; the public lookup
    (`get_trial_id_from_study_id_trial_number`) would cost a query per call."""
    return int(trial._trial_id)


def study_storage(study: optuna.Study) -> BaseStorage:
    """The storage `study` reads and writes: `Study` keeps it without a public accessor, and a
    sampler given only the study needs it to key what it caches per study."""
    return study._storage


def study_id(study: optuna.Study) -> int:
    """The storage's id of `study`, which the storage's study-level methods
    (`get_study_system_attrs`, ...) take; `Study` keeps it without a public accessor (the public
    lookup by name, `get_study_id_from_name`, costs a query per call)."""
    return int(study._study_id)
