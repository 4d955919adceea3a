"""The sampler: an Optuna sampler that only proposes configs worth running.

Optuna proposes (the oracle); `FreshConfigSampler` wraps it and keeps it from proposing a config
the study already has (finished, running in another worker, or queued) or one an out-of-memory
trial has ruled out (same knobs, a batch at least as large). When the wrapped sampler keeps
proposing such configs (TPE exploiting a front it already knows; it is asked `ATTEMPTS` times),
the fresh config fewest knobs away from its proposals runs instead, among equals the one whose
knob values did best in feasible trials, so what the sampler learnt still steers the search.

The wrapped sampler sees the study as the search means it: the throughput is the one objective
(drift, the second objective the study stores for its Pareto front, counts through the
constraints, like out-of-memory and failed trials), and an integer knob (`batch_size`,
`workers`) is the index of its value in the sorted space, an `IntDistribution`, so TPE and GP
can tell a neighbouring value from a distant one; a knob with a single value is not sampled.
Infeasible trials reach it as COMPLETE trials whose constraints are violated, which Optuna's
samplers rank below every feasible trial, so they learn from them; FAIL trials, which they would
ignore, are used only for interrupted runs.

The default sampler (`make_sampler("tpe", ...)`) starts from what optimisation guides recommend
before TPE takes over. After the baseline (trial 0, enqueued by the search) it runs the
rule-of-thumb config (`rule_of_thumb`): the fastest precision the device supports (bf16, else
fp16, else TF32), the largest batch, `torch.compile` or XLA jit on, and the middle of the space's
worker counts (too few starve the step, too many compete with it for the cores: from the middle,
one step reaches either end of a small range). While it does not fit in memory (out of memory,
or over the memory limit) it is tried at the next smaller batch; if its numerics fail (drift
over the tolerance, NaN), at the strict precision. Then a local search around the best feasible
trial so far: every untried config one knob away (precision first, then the knobs in the
space's order; an integer knob one step up or down its sorted values, then two steps), after
which the best trial run by then becomes the centre; when a centre's neighbours hold nothing
faster, TPE proposes the rest. The guided steps skip configs the device cannot run. They read
everything from the stored trials, so workers sharing the study (while one runs the rule-of-thumb
config, the others take its neighbours) and a resumed study go on with the same search.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState

from autotuner.knobs import DERIVED, KNOBS, config_key
from autotuner.optuna_adapter import study_id, study_storage, trial_id

ATTEMPTS = 2
"""Proposals asked of the wrapped sampler before the fresh config nearest to them is run."""
LIVE = (TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING)
GUIDED = ("tpe",)
"""The samplers that start with the rule-of-thumb config and the local search (`make_sampler`)."""
RULE_OF_THUMB: dict[str, tuple[Any, ...]] = {
    "precision": ("bf16", "fp16", "tf32"),
    "compile": ("default", "max-autotune", "reduce-overhead"),
    "jit": ("on",),
}
"""Values of categorical knobs the optimisation guides recommend, most recommended first; a
knob's other values follow them in the space's order. A knob missing here keeps its reference."""
RINGS = (1, 2)
"""The local search's neighbourhoods of a centre, nearest first (`FreshConfigSampler._neighbours`)."""
FIRST = ("precision",)
"""Knobs the local search changes before the others (in the space's order)."""
BATCH = "batch_size"
NUMERICS = "precision"

Unsupported = Callable[[dict[str, Any]], str | None]
"""Why the device cannot run a config (sampled params), or None: the backend's
`unsupported_reason` with the probe's capabilities."""


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


def make_sampler(
    name: str,
    seed: int | None,
    space: dict[str, list[Any]],
    configs: Callable[[], list[dict[str, Any]]],
    unsupported: Unsupported | None = None,
) -> FreshConfigSampler:
    """The search's sampler for the spec's `sampler.name`: the Optuna sampler wrapped in
    `FreshConfigSampler`, guided (rule-of-thumb config, then local search) for the default."""
    return FreshConfigSampler(
        make_base_sampler(name, seed), space, configs, seed, guided=name in GUIDED, unsupported=unsupported
    )


def oom_rules_out(params: dict[str, Any], trials: Sequence[FrozenTrial]) -> FrozenTrial | None:
    """The out-of-memory trial that rules `params` out (same other knobs, a batch no larger), if any."""
    others = {k: v for k, v in params.items() if k != BATCH}
    for t in trials:
        if t.state is TrialState.COMPLETE and t.user_attrs.get("outcome") == "oom":
            if (
                t.params.get(BATCH, 0) <= params.get(BATCH, 0)
                and {k: v for k, v in t.params.items() if k != BATCH} == others
            ):
                return t
    return None


def feasible(trial: FrozenTrial) -> bool:
    """A complete trial within every constraint (as `autotuner.recording.record` stores them, and as
    Optuna's samplers read them)."""
    return (
        trial.state is TrialState.COMPLETE
        and bool(trial.values)
        and all(v <= 0 for v in trial.system_attrs.get("constraints") or ())
    )


def is_ordered(values: Sequence[Any]) -> bool:
    """An integer knob (batch size, workers): its values have an order the samplers should see."""
    return bool(values) and all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def preferred(name: str, values: Sequence[Any]) -> list[Any]:
    """A categorical knob's values, the ones the guides recommend first (`RULE_OF_THUMB`)."""
    first = [v for v in RULE_OF_THUMB.get(name, ()) if v in values]
    return first + [v for v in values if v not in first]


def rule_of_thumb(space: dict[str, list[Any]], unsupported: Unsupported | None = None) -> dict[str, Any]:
    """The config the optimisation guides recommend, within `space` and what the device supports:
    the largest batch, the middle worker count (any integer knob but the batch: the middle of its
    sorted values, the upper one of two), and for a categorical knob the first value of
    `RULE_OF_THUMB` the device supports (bf16, else fp16, else tf32; compile and jit on), else
    its reference (or first) value."""
    config: dict[str, Any] = {}
    for name, values in space.items():
        reference = KNOBS[name].reference if name in KNOBS else None
        config[name] = reference if reference in values else values[0]
    for name, values in space.items():
        if is_ordered(values):
            ordered = sorted(values)
            config[name] = ordered[-1] if name == BATCH else ordered[len(ordered) // 2]
            continue
        for value in RULE_OF_THUMB.get(name, ()):
            if value in values and (unsupported is None or unsupported({**config, name: value}) is None):
                config[name] = value
                break
    return config


class _Tried:
    """The study's configs as one ask sees them, built once: the live ones (finished, running or
    queued; `exclude`, the trial being asked for, left out) and the out-of-memory trials."""

    def __init__(self, trials: Sequence[FrozenTrial], exclude: int | None = None):
        live = (t for t in trials if t.state in LIVE and t.number != exclude)
        self.numbers = {config_key(trial_params(t)): t.number for t in live}
        self.ooms = [t for t in trials if t.state is TrialState.COMPLETE and t.user_attrs.get("outcome") == "oom"]

    def fresh(self, params: dict[str, Any]) -> bool:
        return config_key(params) not in self.numbers and oom_rules_out(params, self.ooms) is None


class _Encoding:
    """Knob values as the wrapped sampler sees them: an integer knob's value as its index in the
    sorted values (an `IntDistribution`), a categorical knob as it is; single values left out."""

    def __init__(self, space: dict[str, list[Any]]):
        self.sorted = {name: sorted(values) for name, values in space.items() if is_ordered(values)}
        self.space: dict[str, BaseDistribution] = {
            name: IntDistribution(0, len(values) - 1) if name in self.sorted else CategoricalDistribution(values)
            for name, values in space.items()
            if len(values) > 1
        }

    def encode(self, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, BaseDistribution]]:
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


class _StudyView:
    """The study as the wrapped sampler sees it (the module docstring): one objective, the
    throughput, and the knobs in `_Encoding`. Everything else is the study itself."""

    def __init__(self, study: Study, encoding: _Encoding, cache: dict[int, FrozenTrial]):
        self._study = study
        self._encoding = encoding
        self._cache = cache

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

    def _view(self, trial: FrozenTrial) -> FrozenTrial:
        cached = self._cache.get(trial_id(trial))
        if cached is not None and cached.state is trial.state:
            return cached
        params, distributions = self._encoding.encode(trial.params)
        viewed = FrozenTrial(
            number=trial.number,
            state=trial.state,
            value=None,
            values=list(trial.values[:1]) if trial.values else None,
            datetime_start=trial.datetime_start,
            datetime_complete=trial.datetime_complete,
            params=params,
            distributions=distributions,
            user_attrs=trial.user_attrs,
            system_attrs=trial.system_attrs,
            intermediate_values=trial.intermediate_values,
            trial_id=trial_id(trial),
        )
        if trial.state.is_finished():  # a finished trial changes no more
            self._cache[trial_id(trial)] = viewed
        return viewed

    def _get_trials(
        self, deepcopy: bool = True, states: Sequence[TrialState] | None = None, use_cache: bool = False
    ) -> list[FrozenTrial]:
        return [self._view(t) for t in self._study._get_trials(deepcopy=False, states=states, use_cache=use_cache)]

    def get_trials(self, deepcopy: bool = True, states: Sequence[TrialState] | None = None) -> list[FrozenTrial]:
        return self._get_trials(deepcopy=False, states=states)

    @property
    def trials(self) -> list[FrozenTrial]:
        return self._get_trials(deepcopy=False)


class FreshConfigSampler(BaseSampler):
    """Wraps an Optuna sampler (the module docstring). `space`: knob -> values; `configs`: every
    config of the space; `guided`: the rule-of-thumb config and a local search before the
    wrapped sampler; `unsupported`: what the device cannot run (the guided steps skip it)."""

    def __init__(
        self,
        base: BaseSampler,
        space: dict[str, list[Any]],
        configs: Callable[[], list[dict[str, Any]]],
        seed: int | None = None,
        *,
        guided: bool = False,
        unsupported: Unsupported | None = None,
    ):
        self.base = base
        self.space: dict[str, BaseDistribution] = {n: CategoricalDistribution(c) for n, c in space.items()}
        self._values = {n: list(c) for n, c in space.items()}
        self._configs = configs
        self._rng = random.Random(seed)
        self._encoding = _Encoding(self._values)
        self._views: dict[int, FrozenTrial] = {}
        self._views_of: tuple[int, int] | None = None
        self._unsupported = unsupported
        self.rule: dict[str, Any] | None = rule_of_thumb(self._values, unsupported) if guided else None
        """The rule-of-thumb config (`rule_of_thumb`); None: not guided."""

    def reseed_rng(self) -> None:
        self.base.reseed_rng()
        self._rng.seed()

    def _view(self, study: Study) -> Study:
        owner = (id(study_storage(study)), study_id(study))
        if owner != self._views_of:  # the cache holds one study's finished trials
            self._views, self._views_of = {}, owner
        return _StudyView(study, self._encoding, self._views)  # type: ignore[return-value]

    def is_fresh(self, params: dict[str, Any], trials: Sequence[FrozenTrial], exclude: int | None = None) -> bool:
        return _Tried(trials, exclude).fresh(params)

    def fresh_configs(self, study: Study, exclude: int | None = None) -> list[dict[str, Any]]:
        tried = _Tried(study.get_trials(deepcopy=False), exclude)
        return [c for c in self._configs() if tried.fresh(c)]

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self.space)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space or trial.system_attrs.get("fixed_params"):
            return {}  # an enqueued trial (the baseline, a retry) carries its own params
        trials = study.get_trials(deepcopy=False)
        tried = _Tried(trials, exclude=trial.number)
        if self.rule is not None:
            guided = self._guided(trials, tried)
            if guided is not None:
                return guided
        proposals = []
        for _ in range(ATTEMPTS):
            params = self._propose(study, trial)
            if tried.fresh(params):
                return params
            proposals.append(params)
        fresh = [c for c in self._configs() if tried.fresh(c)]
        if not fresh:
            return proposals[-1]
        evidence = self._evidence(trials)
        rank = {
            i: (min(sum(c[k] != p[k] for k in c) for p in proposals), -sum(evidence.get(k, 0.0) for k in c.items()))
            for i, c in enumerate(fresh)
        }
        first = min(rank.values())
        return self._rng.choice([fresh[i] for i, r in rank.items() if r == first])

    def _evidence(self, trials: Sequence[FrozenTrial]) -> dict[tuple[str, Any], float]:
        """Knob value -> the best throughput of a feasible trial with that value, over the best
        of all (0 for a value no feasible trial has)."""
        best: dict[tuple[str, Any], float] = {}
        for t in trials:
            if feasible(t):
                for item in t.params.items():
                    best[item] = max(best.get(item, 0.0), t.values[0])
        top = max(best.values(), default=0.0)
        return {k: v / top for k, v in best.items()} if top > 0 else {}

    def _propose(self, study: Study, trial: FrozenTrial) -> dict[str, Any]:
        """One proposal of the wrapped sampler, in the study's knob values."""
        view = self._view(study)
        base_space = {
            name: distribution
            for name, distribution in self.base.infer_relative_search_space(view, trial).items()
            if self._encoding.space.get(name) == distribution
        }
        sampled = self.base.sample_relative(view, trial, base_space) if base_space else {}
        params = {}
        for name, values in self._values.items():
            if len(values) == 1:
                params[name] = values[0]
                continue
            if name not in sampled:
                sampled[name] = self.base.sample_independent(view, trial, name, self._encoding.space[name])
            params[name] = self._encoding.decode(name, sampled[name])
        return params

    # ---------------------------------------------------------------- the guided start

    def _supported(self, params: dict[str, Any]) -> bool:
        return self._unsupported is None or self._unsupported(params) is None

    def _guided(self, trials: Sequence[FrozenTrial], tried: _Tried) -> dict[str, Any] | None:
        """The next config of the guided start (`_start`, then `_local`), or None when it has
        none left (or none now)."""
        start, last, pending = self._start(trials, tried)
        if start is not None:
            return start
        if pending is not None:  # another worker runs the start: its neighbours meanwhile
            return next(
                (p for ring in RINGS for p in self._neighbours(pending, ring) if tried.fresh(p) and self._supported(p)),
                None,
            )
        return self._local(trials, tried, last)

    def _starts(self) -> list[dict[str, Any]]:
        """The rule-of-thumb config, then the same at each smaller batch, largest first."""
        assert self.rule is not None
        rule, batches = self.rule, self._values.get(BATCH, [])
        if BATCH not in rule or not is_ordered(batches):
            return [rule]
        return [rule] + [{**rule, BATCH: b} for b in sorted(batches, reverse=True) if b < rule[BATCH]]

    def _start(
        self, trials: Sequence[FrozenTrial], tried: _Tried
    ) -> tuple[dict[str, Any] | None, int | None, dict[str, Any] | None]:
        """The rule-of-thumb config; smaller batches of it while it does not fit in memory; at
        the strict precision when its numerics fail (drift over the tolerance, NaN). Returns the
        config to run now (None when there is none), the number of the start's last finished
        trial (None: none), and the start config another worker is running (None: none)."""
        done = {config_key(t.params): t for t in trials if t.state is TrialState.COMPLETE}
        last = None
        for start in self._starts():
            if tried.fresh(start):
                return (start if self._supported(start) else None), last, None
            t = done.get(config_key(start))
            if t is None:
                if config_key(start) in tried.numbers:
                    return None, last, start  # running, or queued
                continue  # ruled out by an out-of-memory trial: the next smaller batch
            last = t.number
            violations = t.system_attrs.get("constraints") or [0.0, 0.0, 0.0]
            outcome = t.user_attrs.get("outcome")
            if outcome == "oom" or (len(violations) > 2 and violations[2] > 0):
                continue  # did not fit: the next smaller batch
            numerics_failed = outcome == "nan" or (outcome == "ok" and violations[0] > 0)
            strict = {**start, NUMERICS: KNOBS[NUMERICS].reference}
            if numerics_failed and strict[NUMERICS] in self._values.get(NUMERICS, []):
                if tried.fresh(strict):
                    return strict, last, None
                t = done.get(config_key(strict))
                if t is None:
                    return None, last, strict if config_key(strict) in tried.numbers else None
                last = t.number
            return None, last, None
        return None, last, None

    def _local(self, trials: Sequence[FrozenTrial], tried: _Tried, last: int | None) -> dict[str, Any] | None:
        """The local search: every fresh neighbour of the centre (first the best feasible trial up
        to the start's `last`), ring by ring (`RINGS`); once a ring is used up, the best feasible
        trial run by then becomes the centre if it is faster; when none is, the search ends."""
        candidates = [t for t in trials if feasible(t)]

        def best(until: int | None) -> FrozenTrial | None:
            eligible = (t for t in candidates if until is None or t.number <= until)
            return max(eligible, key=lambda t: (t.values[0], -t.number), default=None)

        centre = best(last)
        while centre is not None:
            scanned, moved = centre.number, False
            for ring in RINGS:
                neighbours = list(self._neighbours(centre.params, ring))
                for params in neighbours:
                    if tried.fresh(params) and self._supported(params):
                        return params
                keys = (config_key(p) for p in neighbours)
                scanned = max([scanned] + [tried.numbers[k] for k in keys if k in tried.numbers])
                better = best(scanned)
                if better is not None and better.values[0] > centre.values[0]:
                    centre, moved = better, True
                    break
            if not moved:
                return None
        return None

    def _neighbours(self, params: dict[str, Any], ring: int = 1) -> Iterator[dict[str, Any]]:
        """The configs one knob away from `params`, in the order the local search tries them:
        `ring` 1, every other value of a categorical knob and an integer knob's next value up
        and down its sorted values; `ring` 2, an integer knob two values up and down."""
        names = [n for n in FIRST if n in self._values] + [n for n in self._values if n not in FIRST]
        for name in names:
            values = self._values[name]
            if len(values) < 2 or params.get(name) not in values:
                continue
            if is_ordered(values):
                ordered = sorted(values)
                i = ordered.index(params[name])
                others = [ordered[j] for j in (i - ring, i + ring) if 0 <= j < len(ordered)]
            else:
                others = [v for v in preferred(name, values) if v != params[name]] if ring == 1 else []
            for value in others:
                yield {**params, name: value}

    # ---------------------------------------------------------------- the rest is the wrapped sampler's

    def sample_independent(
        self, study: Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        return self.base.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self.base.before_trial(self._view(study), trial)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None) -> None:
        self.base.after_trial(self._view(study), trial, state, values[:1] if values else values)
