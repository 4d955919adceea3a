"""The sampler: an Optuna sampler that only proposes configs worth running.

Optuna proposes (the oracle); `FreshConfigSampler` wraps it and keeps it from proposing a config
the study already has (finished, running in another worker, or queued) or one an out-of-memory
trial has ruled out (one that needs at least as much memory, knob by knob, in the order of memory
the backend's knobs declare: `autotuner.results.tried`), nor, while it has other configs, one
with a knob value every move to which lost more than 30% where the study made it
(`autotuner.proposals.guided_start.lost_values`: bf16 ten times behind on a CPU without bf16
instructions). When the wrapped sampler keeps proposing such configs (TPE exploiting a front it
already knows; it is asked `ATTEMPTS` times), the fresh config fewest knobs away from its
proposals runs instead, among equals the one whose knob values did best in feasible trials, so
what the sampler learnt still steers the search.

The wrapped sampler sees the study as the search means it, the throughput as the one objective
and integer knobs as indices (`autotuner.proposals.wrapped_sampler`). The default sampler
(`make_sampler("tpe", ...)`) starts from what optimisation guides recommend, a rule-of-thumb
config and a local search around the best, before TPE takes over (`autotuner.proposals.guided_start`).
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from autotuner.config.knobs import COMMON_TABLE, Knob, Params, Value
from autotuner.proposals.guided_start import GuidedStart, Unsupported, lost_values, one_knob_moves, rule_of_thumb
from autotuner.proposals.wrapped_sampler import WrappedSampler
from autotuner.results.tried import TriedConfigs, feasible
from autotuner.study.names import FIXED_PARAMS

ATTEMPTS = 2
"""Proposals asked of the wrapped sampler before the fresh config nearest to them is run."""
GUIDED = ("tpe",)
"""The samplers that start with the rule-of-thumb config and the local search (`make_sampler`)."""


def make_base_sampler(name: str, seed: int | None, startup_trials: int = 5) -> BaseSampler:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if name == "tpe":
            return optuna.samplers.TPESampler(
                multivariate=True, constant_liar=True, n_startup_trials=startup_trials, seed=seed
            )
        if name == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if name == "gp":
            return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup_trials)
        if name == "nsga2":
            return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, startup_trials))
    raise ValueError(f"unknown sampler {name!r}")


def make_sampler(
    name: str,
    seed: int | None,
    space: Mapping[str, Sequence[Value]],
    configs: Callable[[], list[Params]],
    unsupported: Unsupported | None = None,
    knobs: Mapping[str, Knob] = COMMON_TABLE,
) -> FreshConfigSampler:
    """The search's sampler for the spec's `sampler.name`: the Optuna sampler wrapped in
    `FreshConfigSampler`, guided (rule-of-thumb config, then local search) for the default."""
    return FreshConfigSampler(
        make_base_sampler(name, seed),
        space,
        configs,
        seed,
        guided=name in GUIDED,
        unsupported=unsupported,
        knobs=knobs,
    )


def value_evidence(trials: Sequence[FrozenTrial]) -> dict[tuple[str, Value], float]:
    """Knob value -> the best throughput of a feasible trial with that value, over the best of all
    (0 for a value no feasible trial has)."""
    best: dict[tuple[str, Value], float] = {}
    for t in trials:
        if feasible(t):
            for item in t.params.items():
                best[item] = max(best.get(item, 0.0), t.values[0])
    top = max(best.values(), default=0.0)
    return {k: v / top for k, v in best.items()} if top > 0 else {}


def nearest_fresh(
    fresh: list[Params], proposals: list[Params], evidence: dict[tuple[str, Value], float]
) -> list[Params]:
    """The configs of `fresh` fewest knobs away from any of `proposals`, among those the ones whose
    knob values did best (`evidence`, summed), in `fresh`'s order."""
    rank = {
        i: (min(sum(c[k] != p[k] for k in c) for p in proposals), -sum(evidence.get(k, 0.0) for k in c.items()))
        for i, c in enumerate(fresh)
    }
    first = min(rank.values())
    return [fresh[i] for i, r in rank.items() if r == first]


class FreshConfigSampler(BaseSampler):
    """Wraps an Optuna sampler (the module docstring). `space`: knob -> values; `configs`: every
    config of the space; `guided`: the rule-of-thumb config and a local search before the
    wrapped sampler; `unsupported`: what the device cannot run (the guided steps skip it);
    `knobs`: the backend's knob table, whose order of memory says what an out-of-memory trial
    rules out (`autotuner.results.tried.oom_rules_out`)."""

    def __init__(
        self,
        base: BaseSampler,
        space: Mapping[str, Sequence[Value]],
        configs: Callable[[], list[Params]],
        seed: int | None = None,
        *,
        guided: bool = False,
        unsupported: Unsupported | None = None,
        knobs: Mapping[str, Knob] = COMMON_TABLE,
    ):
        self.knobs = knobs
        values = {n: list(c) for n, c in space.items()}
        self.space: dict[str, BaseDistribution] = {n: CategoricalDistribution(c) for n, c in space.items()}
        self.configs = configs
        self.rng = random.Random(seed)
        """Picks among equally near fresh configs (`nearest_fresh`)."""
        self.wrapped = WrappedSampler(base, values)
        reference = {name: knobs[name].reference for name in values if name in knobs}
        self.guided_start = GuidedStart(values, unsupported, reference)
        self.rule: Params | None = rule_of_thumb(values, unsupported) if guided else None
        """The rule-of-thumb config (`rule_of_thumb`) the guided start begins at; None: not guided."""

    def reseed_rng(self) -> None:
        self.wrapped.base.reseed_rng()
        self.rng.seed()

    def is_fresh(self, params: Params, trials: Sequence[FrozenTrial], exclude: int | None = None) -> bool:
        return self.tried(trials, exclude).fresh(params)

    def tried(self, trials: Sequence[FrozenTrial], exclude: int | None = None) -> TriedConfigs:
        return TriedConfigs(trials, exclude, self.knobs)

    def fresh_configs(self, study: Study, exclude: int | None = None) -> list[Params]:
        tried = self.tried(study.get_trials(deepcopy=False), exclude)
        return [c for c in self.configs() if tried.fresh(c)]

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self.space)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space or trial.system_attrs.get(FIXED_PARAMS):
            return {}  # an enqueued trial (the baseline, a retry) carries its own params
        trials = study.get_trials(deepcopy=False)
        tried = self.tried(trials, exclude=trial.number)
        if self.rule is not None:
            guided = self.guided_start.next_config(self.rule, trials, tried)
            if guided is not None:
                return guided
        lost = lost_values(one_knob_moves(trials))

        def worth(params: Params) -> bool:
            return tried.fresh(params) and not any(item in lost for item in params.items())

        proposals = []
        for _ in range(ATTEMPTS):
            params = self.wrapped.propose(study, trial)
            if worth(params):
                return params
            proposals.append(params)
        fresh = [c for c in self.configs() if tried.fresh(c)]
        if not fresh:
            return proposals[-1]
        fresh = [c for c in fresh if worth(c)] or fresh
        return self.rng.choice(nearest_fresh(fresh, proposals, value_evidence(trials)))

    # ---------------------------------------------------------------- the rest is the wrapped sampler's

    def sample_independent(
        self, study: Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        return self.wrapped.base.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self.wrapped.before_trial(study, trial)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None) -> None:
        self.wrapped.after_trial(study, trial, state, values)
