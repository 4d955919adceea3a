"""The default sampler's guided start: the config optimisation guides recommend, then a local
search around the best trial, before TPE takes over (`autotuner.proposals.sampler.make_sampler`).

After the baseline (trial 0, enqueued by the search) it runs the rule-of-thumb config
(`rule_of_thumb`): the fastest precision the device supports (bf16, else fp16, else TF32), the
largest batch, `torch.compile` or XLA jit on, and the middle of the space's worker counts (too
few starve the step, too many compete with it for the cores: from the middle, one step reaches
either end of a small range). While it does not fit in memory (out of memory, or over the memory
limit) it is tried at the next smaller batch; if its numerics fail (drift over the tolerance,
NaN) or it is pruned (bf16 on a CPU without bf16 instructions), at the strict precision. Then a
local search around the best feasible trial so far (`LocalSearch`): every untried config one
knob away (an integer knob one step up or down its sorted values, and from two or more below
the largest batch, the largest batch first; then two steps), in the order of what the same
moves did elsewhere in the study (a pruned trial by its bound, a loss of at least that size):
those that gained more than a trial's noise first, then the moves not made yet (precision
first, then the space's order), last those that gained less or lost, never those that lost more
than `LOST`; after which the best trial run by then becomes the centre (at once, when a trial
comes out `LEAP` ahead of it); when a centre's neighbours hold nothing faster, the guided start
has nothing left. It skips configs the device cannot run, and reads everything from the stored
trials, so workers sharing the study (while one runs the rule-of-thumb config, the others take
its neighbours) and a resumed study go on with the same search.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from optuna.trial import FrozenTrial, TrialState

from autotuner.backends import knob_named
from autotuner.config.knobs import BATCH_SIZE, PRECISION, Params, Value, config_key
from autotuner.proposals.wrapped_sampler import is_ordered
from autotuner.results.tried import TriedConfigs, evidence, feasible
from autotuner.study.names import CONSTRAINT_NAMES, DRIFT_LIMIT, MEMORY_LIMIT, OUTCOME, TRIAL_CONSTRAINTS
from autotuner.trials.outcomes import Outcome

RINGS = (1, 2)
"""The local search's neighbourhoods of a centre, nearest first (`LocalSearch.neighbours`)."""
FIRST = (PRECISION.name,)
"""Knobs the local search changes before the others (in the space's order)."""
NUMERICS = PRECISION.name
LEAP = 0.3
"""A trial this far ahead of the local search's centre becomes the centre at once, before the
centre's ring is used up (`LocalSearch.next_config`): twice a trial's noise
(`autotuner.measurement.pruning.TRIAL_NOISE`), it is no luck, and the rest of the ring around a
centre that far behind is unlikely to hold the best."""
SMALL_EFFECT = math.log(1.05)
"""A one-knob move that gained less than 5% (in log terms): within a trial's noise, it has not
paid here (`LocalSearch.move_order`)."""
LOST = math.log(1 - LEAP)
"""A one-knob move that lost more than `LEAP` where the study made it (bf16 on a CPU without its
instructions, ten times slower): the local search does not make it again from another centre
(`LocalSearch.move_order`); TPE, which sees the loss, still may."""


def one_knob_moves(trials: Sequence[FrozenTrial]) -> dict[tuple[str, Value, Value], float]:
    """What each one-knob move did where the stored trials made it: (knob, from, to) -> the mean
    log of the throughput's ratio (to over from), over the pairs of trials that differ in that
    knob alone, either way round, each a feasible trial's throughput or a pruned trial's bound
    (`autotuner.results.tried.evidence`: its throughput is below it, so a move to it lost at least
    that much), one of the two measured (two bounds say nothing of each other). The local search
    makes such moves, so these pairs accumulate as it goes; a move no pair has made is absent."""
    known = [(t, value) for t in trials if (value := evidence(t)) is not None]
    logs: dict[tuple[str, Value, Value], list[float]] = {}
    for (a, (rate_a, bound_a)), (b, (rate_b, bound_b)) in itertools.combinations(known, 2):
        differing = [k for k in a.params if a.params[k] != b.params.get(k)]
        if len(differing) == 1 and rate_a > 0 and rate_b > 0 and not (bound_a and bound_b):
            knob = differing[0]
            effect = math.log(rate_b / rate_a)
            logs.setdefault((knob, a.params[knob], b.params[knob]), []).append(effect)
            logs.setdefault((knob, b.params[knob], a.params[knob]), []).append(-effect)
    return {move: sum(effects) / len(effects) for move, effects in logs.items()}


def lost_values(made: dict[tuple[str, Value, Value], float]) -> set[tuple[str, Value]]:
    """The knob values every move to which lost more than `LOST` where the study made it (`made`:
    `one_knob_moves`): bf16 on a CPU without its instructions, once it came out ten times behind.
    The sampler does not propose them again while it has other configs
    (`autotuner.proposals.sampler.FreshConfigSampler`)."""
    effects: dict[tuple[str, Value], list[float]] = {}
    for (knob, _, value), effect in made.items():
        effects.setdefault((knob, value), []).append(effect)
    return {item for item, known in effects.items() if max(known) < LOST}


Unsupported = Callable[[Params], str | None]
"""Why the device cannot run a config (sampled params), or None: the backend's
`unsupported_reason` with the probe's capabilities."""


def recommended(name: str) -> tuple[Value, ...]:
    """The values of knob `name` the optimisation guides recommend, most recommended first
    (`autotuner.config.knobs.Knob.recommended`); none for a knob no backend defines."""
    knob = knob_named(name)
    return knob.recommended if knob is not None else ()


def preferred(name: str, values: Sequence[Value]) -> list[Value]:
    """A categorical knob's values, the ones the guides recommend first (`recommended`); its other
    values follow them in the space's order."""
    first = [v for v in recommended(name) if v in values]
    return first + [v for v in values if v not in first]


def rule_of_thumb(space: Mapping[str, Sequence[Value]], unsupported: Unsupported | None = None) -> Params:
    """The config the optimisation guides recommend, within `space` and what the device supports:
    the largest batch, the middle worker count (any integer knob but the batch: the middle of its
    sorted values, the upper one of two; a real-valued knob, a budget, stays at its reference), and
    for a categorical knob the first value of
    `recommended` the device supports (bf16, else fp16, else tf32; compile and jit on), else
    its reference (or first) value."""
    config: Params = {}
    for name, values in space.items():
        knob = knob_named(name)
        reference = knob.reference if knob is not None else None
        config[name] = reference if reference in values else values[0]
    for name, values in space.items():
        knob = knob_named(name)
        if is_ordered(values) and not (knob is not None and knob.real):  # a real knob: its reference, as above
            ordered = sorted(values)
            config[name] = ordered[-1] if name == BATCH_SIZE.name else ordered[len(ordered) // 2]
            continue
        for value in recommended(name):
            if value in values and (unsupported is None or unsupported({**config, name: value}) is None):
                config[name] = value
                break
    return config


class LocalSearch:
    """Configs one knob away from a centre, the best feasible trial; `supported`: whether the
    device can run a config (the search skips those it cannot)."""

    def __init__(
        self, space: Mapping[str, Sequence[Value]], supported: Callable[[Params], bool], reference: Params | None = None
    ):
        self.space = space
        self.supported = supported
        self.reference = {k: v for k, v in (reference or {}).items() if v in space.get(k, ())}
        """Each searched knob's reference value (the strictest): what a move resets a knob that
        depends on the one it changes to (`moves`)."""

    def next_config(self, trials: Sequence[FrozenTrial], tried: TriedConfigs, last: int | None) -> Params | None:
        """Every fresh neighbour of the centre (first the best feasible trial up to the trial
        number `last`), ring by ring (`RINGS`); once a ring is used up, the best feasible trial run
        by then becomes the centre if it is faster; when none is, the search ends (None)."""
        candidates = [t for t in trials if feasible(t)]

        def best(until: int | None) -> FrozenTrial | None:
            eligible = (t for t in candidates if until is None or t.number <= until)
            return max(eligible, key=lambda t: (t.values[0], -t.number), default=None)

        centre, leader = best(last), best(None)
        if centre is not None and leader is not None and leader.values[0] > (1 + LEAP) * centre.values[0]:
            centre = leader  # far ahead: move there without finishing the ring of a centre that far behind
        made = one_knob_moves(trials)
        while centre is not None:
            scanned, moved = centre.number, False
            for ring in RINGS:
                neighbours = self.move_order(centre.params, list(self.moves(centre.params, ring)), made)
                for params in neighbours:
                    if tried.fresh(params):
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

    def first_fresh_neighbour(self, params: Params, tried: TriedConfigs) -> Params | None:
        """The first fresh config the device supports among the neighbours of `params`, ring by ring."""
        return next((p for ring in RINGS for p in self.moves(params, ring) if tried.fresh(p)), None)

    def move_order(
        self, centre: Params, moves: list[Params], made: dict[tuple[str, Value, Value], float]
    ) -> list[Params]:
        """`moves` from `centre` in the order the local search tries them: first those whose same
        move (the knob from the centre's value to the move's) gained more than `SMALL_EFFECT`
        where the stored trials made it (`made`: `one_knob_moves`), the largest gain first; then
        the moves never made; last those that gained less or lost, and not at all those that lost
        more than `LOST`: what a knob's move did at another centre is the best guess of what it
        does here."""

        def effect(move: Params) -> float | None:
            moved = [k for k in move if move[k] != centre.get(k)]
            return made.get((moved[0], centre[moved[0]], move[moved[0]])) if len(moved) == 1 else None

        def rank(move: Params) -> tuple[int, float]:
            known = effect(move)
            if known is None:  # never made, or a move that resets other knobs too
                return (1, 0.0)
            return (0, -known) if known > SMALL_EFFECT else (2, -known)

        kept = [m for m in moves if (known := effect(m)) is None or known >= LOST]
        return sorted(kept, key=rank)

    def moves(self, params: Params, ring: int = 1) -> Iterator[Params]:
        """The supported configs one move from `params`: each neighbour (`neighbours`) the device
        can run; one it cannot, with one other knob reset to its reference value where that makes
        it one it can (ONNX Runtime from a bf16 centre, at fp32), else with every other knob at its
        reference value, so that no value of a knob is out of reach because others rule it out."""
        for neighbour in self.neighbours(params, ring):
            if self.supported(neighbour):
                yield neighbour
                continue
            moved = next(k for k in neighbour if neighbour[k] != params.get(k))
            others = {k: v for k, v in self.reference.items() if k != moved and neighbour.get(k) != v}
            resets = [{**neighbour, knob: value} for knob, value in others.items()]
            resets.append({**neighbour, **others})  # where one reset is not enough: every other knob's
            reset = next((r for r in resets if self.supported(r)), None)
            if reset is not None:
                yield reset

    def neighbours(self, params: Params, ring: int = 1) -> Iterator[Params]:
        """The configs one knob away from `params`, knob by knob (precision first, then the
        space's order): `ring` 1, every other value of a categorical knob and
        an integer knob's next value up and down its sorted values (the batch: the largest first,
        when that is further up; a larger batch at equal knobs is rarely slower, and it is what
        the batch finders would run); `ring` 2, an integer knob two values up and down."""
        for name in [n for n in FIRST if n in self.space] + [n for n in self.space if n not in FIRST]:
            values = self.space[name]
            if len(values) < 2 or params.get(name) not in values:
                continue
            if is_ordered(values):
                ordered = sorted(values)
                i = ordered.index(params[name])
                others = [ordered[j] for j in (i - ring, i + ring) if 0 <= j < len(ordered)]
                if name == BATCH_SIZE.name and ring == 1 and i + 1 < len(ordered) - 1:
                    others.insert(0, ordered[-1])
            else:
                others = [v for v in preferred(name, values) if v != params[name]] if ring == 1 else []
            for value in others:
                yield {**params, name: value}


@dataclass(frozen=True)
class StartStep:
    """Where the start of the guided search stands (`GuidedStart.step`)."""

    run: Params | None = None
    """The start config to run now; None: none now."""
    last: int | None = None
    """The number of the start's last finished trial; None: none."""
    pending: Params | None = None
    """A start config another worker is running (or has queued); None: none."""


class GuidedStart:
    """The guided start over `space`: the rule-of-thumb config and its fallbacks, then the local
    search. `unsupported`: what the device cannot run (skipped)."""

    def __init__(
        self,
        space: Mapping[str, Sequence[Value]],
        unsupported: Unsupported | None = None,
        reference: Params | None = None,
    ):
        self.space = space
        self.unsupported = unsupported
        self.local_search = LocalSearch(space, self.supported, reference)

    def supported(self, params: Params) -> bool:
        return self.unsupported is None or self.unsupported(params) is None

    def next_config(self, rule: Params, trials: Sequence[FrozenTrial], tried: TriedConfigs) -> Params | None:
        """The next config from the start at `rule` (`step`), then from the local search; None
        when it has none left (or none now)."""
        step = self.step(rule, trials, tried)
        if step.run is not None:
            return step.run
        if step.pending is not None:  # another worker runs the start: its neighbours meanwhile
            return self.local_search.first_fresh_neighbour(step.pending, tried)
        return self.local_search.next_config(trials, tried, step.last)

    def starts(self, rule: Params) -> list[Params]:
        """The rule-of-thumb config, then the same at each smaller batch, largest first."""
        batches = self.space.get(BATCH_SIZE.name, [])
        if BATCH_SIZE.name not in rule or not is_ordered(batches):
            return [rule]
        return [rule] + [
            {**rule, BATCH_SIZE.name: b} for b in sorted(batches, reverse=True) if b < rule[BATCH_SIZE.name]
        ]

    def step(self, rule: Params, trials: Sequence[FrozenTrial], tried: TriedConfigs) -> StartStep:
        """The rule-of-thumb config; smaller batches of it while it does not fit in memory; at
        the strict precision when its numerics fail (drift over the tolerance, NaN) or it is pruned
        (so far behind that its precision is the likely cause: the pair is then the one-knob move
        that tells the local search what that precision costs here)."""
        done = {config_key(t.params): t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)}
        last = None
        for start in self.starts(rule):
            if tried.fresh(start):
                return StartStep(run=start if self.supported(start) else None, last=last)
            t = done.get(config_key(start))
            if t is None:
                if config_key(start) in tried.numbers:
                    return StartStep(last=last, pending=start)  # running, or queued
                continue  # ruled out by an out-of-memory trial: the next smaller batch
            last = t.number
            violations = dict(zip(CONSTRAINT_NAMES, t.system_attrs.get(TRIAL_CONSTRAINTS) or (), strict=False))
            outcome = t.user_attrs.get(OUTCOME)
            if outcome == Outcome.OOM.value or violations.get(MEMORY_LIMIT, 0.0) > 0:
                continue  # did not fit: the next smaller batch
            drifted = outcome == Outcome.OK.value and violations.get(DRIFT_LIMIT, 0.0) > 0
            # pruned: far behind the baseline, and its precision is the knob the hardware decides
            # most (bf16 ten times slower on a CPU without its instructions)
            failed = outcome in (Outcome.NAN.value, Outcome.PRUNED.value) or drifted
            strict = {**start, NUMERICS: PRECISION.reference}
            if failed and strict[NUMERICS] in self.space.get(NUMERICS, []):
                if tried.fresh(strict):
                    return StartStep(run=strict, last=last)
                t = done.get(config_key(strict))
                if t is None:
                    return StartStep(last=last, pending=strict if config_key(strict) in tried.numbers else None)
                last = t.number
            return StartStep(last=last)
        return StartStep(last=last)
