"""The sampler: an Optuna sampler that only proposes configs worth running.

Optuna proposes (the oracle); this wrapper keeps it from proposing a config the study already
has (finished, or running in another worker) or one an out-of-memory trial has ruled out (same
knobs, a batch at least as large). When the wrapped sampler keeps proposing such configs (TPE
exploiting a front it already knows), the fresh config nearest to its proposals (fewest knobs
changed) is run instead, so what the sampler learnt still steers the search. Infeasible trials
reach the wrapped sampler as COMPLETE trials whose constraints are violated, which Optuna's
samplers rank below every feasible trial, so they learn from them; FAIL trials, which they would
ignore, are used only for interrupted runs.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from autotuner.knobs import DERIVED, config_key

ATTEMPTS = 16
LIVE = (TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING)


def trial_params(trial: FrozenTrial) -> dict[str, Any]:
    """The config a trial runs: its params, or for a trial still waiting in the queue, the params
    it was enqueued with (derived knobs left out, as in sampled params)."""
    if trial.params or trial.state is not TrialState.WAITING:
        return dict(trial.params)
    fixed = trial.system_attrs.get("fixed_params") or {}
    return {k: v for k, v in fixed.items() if k not in DERIVED}


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


def oom_rules_out(params: dict[str, Any], trials: Sequence[FrozenTrial]) -> FrozenTrial | None:
    """The out-of-memory trial that rules `params` out (same other knobs, a batch no larger), if any."""
    others = {k: v for k, v in params.items() if k != "batch_size"}
    for t in trials:
        if t.state is TrialState.COMPLETE and t.user_attrs.get("outcome") == "oom":
            if (
                t.params.get("batch_size", 0) <= params.get("batch_size", 0)
                and {k: v for k, v in t.params.items() if k != "batch_size"} == others
            ):
                return t
    return None


class FreshConfigSampler(BaseSampler):
    def __init__(
        self,
        base: BaseSampler,
        space: dict[str, list[Any]],
        configs: Callable[[], list[dict[str, Any]]],
        seed: int | None = None,
    ):
        self.base = base
        self.space: dict[str, BaseDistribution] = {n: CategoricalDistribution(c) for n, c in space.items()}
        self._configs = configs
        self._rng = random.Random(seed)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()
        self._rng.seed()

    def is_fresh(self, params: dict[str, Any], trials: Sequence[FrozenTrial], exclude: int | None = None) -> bool:
        key = config_key(params)
        if any(t.state in LIVE and t.number != exclude and config_key(trial_params(t)) == key for t in trials):
            return False
        return oom_rules_out(params, trials) is None

    def fresh_configs(self, study: Study, exclude: int | None = None) -> list[dict[str, Any]]:
        trials = study.get_trials(deepcopy=False)
        return [c for c in self._configs() if self.is_fresh(c, trials, exclude)]

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self.space)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space or trial.system_attrs.get("fixed_params"):
            return {}  # an enqueued trial (the baseline, a retry) carries its own params
        trials = study.get_trials(deepcopy=False)
        base_space = self.base.infer_relative_search_space(study, trial)
        proposals = []
        for _ in range(ATTEMPTS):
            params = self.base.sample_relative(study, trial, base_space) if base_space else {}
            for name, distribution in self.space.items():
                if name not in params:
                    params[name] = self.base.sample_independent(study, trial, name, distribution)
            if self.is_fresh(params, trials, exclude=trial.number):
                return params
            proposals.append(params)
        fresh = [c for c in self._configs() if self.is_fresh(c, trials, exclude=trial.number)]
        if not fresh:
            return proposals[-1]
        distance = {i: min(sum(c[k] != p[k] for k in c) for p in proposals) for i, c in enumerate(fresh)}
        nearest = min(distance.values())
        return self._rng.choice([fresh[i] for i, d in distance.items() if d == nearest])

    def sample_independent(
        self, study: Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        return self.base.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self.base.before_trial(study, trial)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None) -> None:
        self.base.after_trial(study, trial, state, values)
