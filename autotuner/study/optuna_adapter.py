"""The one module that reaches into Optuna's private attributes, each with why it must.

Everything else in autotuner uses Optuna's public API: `optuna.Study`, `optuna.Trial`,
`FrozenTrial` and the public methods of `optuna.storages.BaseStorage`. Where that API stops short
(the storage addresses trials and studies by ids that the objects holding them do not expose;
Optuna's samplers read a study through its private methods), the gap is bridged here, so an
Optuna release that renames an attribute breaks one module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState


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


class StudyView:
    """A study as a wrapped Optuna sampler is shown it (`autotuner.proposals.wrapped_sampler`): every trial
    through `show` (a stored trial -> the trial the sampler sees) and the first objective alone.
    Everything else is the study itself.

    Optuna's samplers read a study through private members, so the view provides them:

    - `_get_trials(deepcopy, states, use_cache)`: how every sampler reads the trials (TPE, GP,
      NSGA-II, QMC), never through the public `get_trials`; a view of `get_trials` alone would
      show them the stored trials.
    - `_is_multi_objective()`: how they tell one objective from several (TPE's multivariate
      default and its split of good trials, NSGA-II's crossover, CMA-ES's refusal); the study's
      own reads the study's two directions.
    - `_storage` and `_study_id`, through `__getattr__`: where the samplers keep their own state
      (TPE's constant-liar params, NSGA-II's generations), which must land in the study, where the
      other workers read it.

    No public API does this: Optuna offers no hook that shows a sampler other params or fewer
    objectives, and a second study holding converted copies would have to be kept in step with
    the storage on every ask and would take the samplers' own state away from the study.
    """

    def __init__(self, study: optuna.Study, show: Callable[[FrozenTrial], FrozenTrial]):
        self._study = study
        self._show = show

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    @property
    def directions(self) -> list[StudyDirection]:
        return self._study.directions[:1]

    @property
    def direction(self) -> StudyDirection:
        return self._study.directions[0]

    def _is_multi_objective(self) -> bool:
        return False

    def _get_trials(
        self, deepcopy: bool = True, states: Sequence[TrialState] | None = None, use_cache: bool = False
    ) -> list[FrozenTrial]:
        return [self._show(t) for t in self._study._get_trials(deepcopy=False, states=states, use_cache=use_cache)]

    def get_trials(self, deepcopy: bool = True, states: Sequence[TrialState] | None = None) -> list[FrozenTrial]:
        return self._get_trials(deepcopy=False, states=states)

    @property
    def trials(self) -> list[FrozenTrial]:
        return self._get_trials(deepcopy=False)
