"""The Optuna sampler that `autotuner.proposals.sampler.FreshConfigSampler` wraps, and the study as it sees it.

The wrapped sampler sees the study as the search means it: the throughput is the one objective
(drift, the second objective the study stores for its Pareto front, counts through the
constraints, like out-of-memory and failed trials), and an integer knob (`batch_size`,
`workers`) is the index of its value in the sorted space, an `IntDistribution`, so TPE and GP
can tell a neighbouring value from a distant one; a knob with a single value is not sampled.
Infeasible trials reach it as COMPLETE trials whose constraints are violated, which Optuna's
samplers rank below every feasible trial, so they learn from them; a pruned trial as a COMPLETE
one whose throughput is its bound (`autotuner.results.tried.pruned_bound`); FAIL trials, which
they would ignore, are used only for interrupted runs. The study is shown to it through
`autotuner.study.optuna_adapter.StudyView`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from autotuner.config.knobs import Params, Value
from autotuner.results.tried import pruned_bound
from autotuner.study.optuna_adapter import StudyView, study_id, study_storage, trial_id


def is_ordered(values: Sequence[Value]) -> bool:
    """A number knob (batch size, workers, a budget): its values have an order the samplers should see."""
    return bool(values) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


class SpaceEncoding:
    """Knob values as the wrapped sampler sees them: an integer knob's value as its index in the
    sorted values (an `IntDistribution`), a categorical knob as it is; single values left out."""

    def __init__(self, space: Mapping[str, Sequence[Value]]):
        self.sorted = {name: sorted(values) for name, values in space.items() if is_ordered(values)}
        self.space: dict[str, BaseDistribution] = {
            name: IntDistribution(0, len(values) - 1) if name in self.sorted else CategoricalDistribution(values)
            for name, values in space.items()
            if len(values) > 1
        }

    def encode(self, params: Params) -> tuple[dict[str, Any], dict[str, BaseDistribution]]:
        """A trial's params and distributions as the wrapped sampler sees them (values the space
        lacks left out, so the trial does not count where they are needed)."""
        encoded, distributions = {}, {}
        for name, value in params.items():
            distribution = self.space.get(name)
            if distribution is None:
                continue
            if name in self.sorted:
                if value not in self.sorted[name]:
                    continue
                value = self.sorted[name].index(value)
            elif not isinstance(distribution, CategoricalDistribution) or value not in distribution.choices:
                continue
            encoded[name], distributions[name] = value, distribution
        return encoded, distributions

    def decode(self, name: str, value: Any) -> Any:
        return self.sorted[name][int(value)] if name in self.sorted else value


def encoded_trial(trial: FrozenTrial, encoding: SpaceEncoding) -> FrozenTrial:
    """`trial` as the wrapped sampler sees it: its first objective value, its params encoded; a
    pruned trial with a bound as a complete one of that throughput (its own is below it: TPE ranks
    it by what it lost, not below every measured trial by its stretches' count)."""
    params, distributions = encoding.encode(trial.params)
    state, values = trial.state, list(trial.values[:1]) if trial.values else None
    if (bound := pruned_bound(trial)) is not None:
        state, values = TrialState.COMPLETE, [bound]
    return FrozenTrial(
        number=trial.number,
        state=state,
        value=None,
        values=values,
        datetime_start=trial.datetime_start,
        datetime_complete=trial.datetime_complete,
        params=params,
        distributions=distributions,
        user_attrs=trial.user_attrs,
        system_attrs=trial.system_attrs,
        intermediate_values=trial.intermediate_values,
        trial_id=trial_id(trial),
    )


class WrappedSampler:
    """An Optuna sampler shown the study through a `SpaceEncoding`: `propose` maps what it samples
    back to the study's knob values. A finished trial changes no more, so its encoded copy is
    kept, for the one study shown last (a sampler may serve several in one process)."""

    def __init__(self, base: BaseSampler, space: Mapping[str, Sequence[Value]]):
        self.base = base
        self.values = space
        self.encoding = SpaceEncoding(space)
        self.finished: dict[int, tuple[TrialState, FrozenTrial]] = {}
        """Encoded finished trials of the study shown last (with their stored state), by trial id."""
        self.finished_of: tuple[int, int] | None = None
        """That study: its storage's `id()` and its id in the storage."""

    def view(self, study: Study) -> Study:
        """`study` as the wrapped sampler sees it."""
        owner = (id(study_storage(study)), study_id(study))
        if owner != self.finished_of:
            self.finished, self.finished_of = {}, owner
        finished = self.finished
        encoding = self.encoding

        def show(trial: FrozenTrial) -> FrozenTrial:
            state, cached = finished.get(trial_id(trial), (None, None))
            if cached is not None and state is trial.state:
                return cached
            encoded = encoded_trial(trial, encoding)
            if trial.state.is_finished():
                finished[trial_id(trial)] = (trial.state, encoded)
            return encoded

        return StudyView(study, show)  # type: ignore[return-value]

    def propose(self, study: Study, trial: FrozenTrial) -> Params:
        """One proposal of the wrapped sampler, in the study's knob values."""
        view = self.view(study)
        base_space = {
            name: distribution
            for name, distribution in self.base.infer_relative_search_space(view, trial).items()
            if self.encoding.space.get(name) == distribution
        }
        sampled = self.base.sample_relative(view, trial, base_space) if base_space else {}
        params = {}
        for name, values in self.values.items():
            if len(values) == 1:
                params[name] = values[0]
                continue
            if name not in sampled:
                sampled[name] = self.base.sample_independent(view, trial, name, self.encoding.space[name])
            params[name] = self.encoding.decode(name, sampled[name])
        return params

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self.base.before_trial(self.view(study), trial)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None) -> None:
        self.base.after_trial(self.view(study), trial, state, values[:1] if values else values)
