"""The search space: knob -> the values a study searches, resolved from the spec and its preset.

`resolve_baseline` and `resolve_space` check the spec's `baseline` and `space` against the
backend's knobs (one `SpecError` line naming the key) and resolve them: the preset's values,
inline choices winning, batch sizes that divide the rank's batch. A `SearchSpace` is a value:
narrowing it to a device (`SearchSpace.narrowed`) returns a new one, and the space a job declared
stays as it was for the study's identity.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from autotuner.backends import Backend
from autotuner.config.knobs import BATCH_SIZE, DERIVED, Config, Knob, Params, Value
from autotuner.errors import SpecError, shown
from autotuner.spec.keys import JobSpec

Irrelevant = Callable[[str, Value], str | None]
"""Why a knob's value cannot matter where the search runs, or None."""


@dataclass(frozen=True, eq=False)
class SearchSpace(Mapping[str, tuple[Value, ...]]):
    """Knob -> the values searched, in the order the search tries them. Compares equal to any
    mapping of the same knobs and values."""

    choices: Mapping[str, tuple[Value, ...]]

    @classmethod
    def of(cls, choices: Mapping[str, Iterable[Value]]) -> SearchSpace:
        return cls({knob: tuple(values) for knob, values in choices.items()})

    def __getitem__(self, knob: str) -> tuple[Value, ...]:
        return self.choices[knob]

    def __iter__(self) -> Iterator[str]:
        return iter(self.choices)

    def __len__(self) -> int:
        return len(self.choices)

    def __repr__(self) -> str:
        return f"SearchSpace({dict(self.choices)!r})"

    @property
    def size(self) -> int:
        """How many configs the space holds."""
        return math.prod(len(values) for values in self.choices.values())

    def points(self) -> Iterator[Params]:
        """Every point of the space, as sampled params."""
        names = list(self.choices)
        for values in itertools.product(*(self.choices[n] for n in names)):
            yield dict(zip(names, values, strict=True))

    def with_first(self, point: Mapping[str, Value]) -> SearchSpace:
        """This space with each of `point`'s values (the baseline, trial 0) in front of its knob's
        values where they lack it."""
        return SearchSpace.of(
            {
                knob: values if knob not in point or point[knob] in values else (point[knob], *values)
                for knob, values in self.choices.items()
            }
        )

    def narrowed(self, irrelevant: Irrelevant) -> tuple[SearchSpace, dict[str, dict[Value, str]]]:
        """This space without the values `irrelevant` gives a reason for, and those values,
        knob -> value -> why."""
        kept: dict[str, list[Value]] = {}
        dropped: dict[str, dict[Value, str]] = {}
        for knob, values in self.choices.items():
            kept[knob] = []
            for value in values:
                reason = irrelevant(knob, value)
                if reason:
                    dropped.setdefault(knob, {})[value] = reason
                else:
                    kept[knob].append(value)
        return SearchSpace.of(kept), dropped


def rank_batch(spec: JobSpec) -> int:
    """Samples each rank takes per optimizer step: `global_batch` / (`nodes` x `processes`) (the
    micro-batch x accumulation of every config)."""
    return spec.global_batch // spec.world


def _choices(value: object, knob: Knob, key: str, source: str) -> list[Any]:
    if not isinstance(value, list):
        value = [value]
    if not value:
        raise SpecError("the list of choices is empty; give at least one value", source=source, key=key)
    for item in value:
        problem = knob.check(item)
        if problem:
            raise SpecError(problem, source=source, key=key)
    return list(dict.fromkeys(value))


def resolve_space(spec: JobSpec, backend: Backend, parallel: str | None, baseline: Config, source: str) -> SearchSpace:
    """The space `spec` declares for a job training its ranks `parallel`: its preset's values,
    inline choices winning, a knob neither names held at `baseline`'s value."""
    per_rank = rank_batch(spec)
    searchable = [k for k in backend.job_knobs(parallel) if k not in DERIVED]
    raw = spec.space
    inline: dict[str, Any] = {}
    preset_name = backend.default_preset(parallel)
    if isinstance(raw, str):
        preset_name = raw
    elif isinstance(raw, dict):
        inline = dict(raw)
        preset = inline.pop("preset", preset_name)
        if not isinstance(preset, str):
            raise SpecError(
                f"must be the name of a preset ({', '.join(backend.presets())})",
                source=source,
                key="space.preset",
            )
        preset_name = preset
    try:
        preset = backend.load_preset(preset_name)
    except KeyError:
        key = "space.preset" if isinstance(raw, dict) else "space"
        raise SpecError(
            f"no preset {shown(preset_name)}; choose between {', '.join(backend.presets())}",
            source=source,
            key=key,
        ) from None
    for knob in inline:
        if knob not in searchable:
            raise SpecError(
                _no_such_knob(backend, knob, searchable),
                source=source,
                key=f"space.{knob}",
            )
    space: dict[str, list[Any]] = {}
    for knob in searchable:
        if knob in inline:
            values = _choices(inline[knob], backend.knobs[knob], f"space.{knob}", source)
            if knob == BATCH_SIZE.name:
                for b in values:
                    if per_rank % b:
                        raise SpecError(
                            f"{b} does not divide {_rank_batch_shown(spec)}",
                            source=source,
                            key="space.batch_size",
                        )
        elif knob == BATCH_SIZE.name and spec.objective.optimize == "latency":
            values = [per_rank]  # one call a request (`Task.check`)
        elif knob in preset:
            values = _choices(preset[knob], backend.knobs[knob], f"{preset_name} preset: {knob}", source)
            if knob == BATCH_SIZE.name:
                dividing = [b for b in values if per_rank % b == 0]
                # No preset size divides an odd global batch: use its divisors in the preset's range.
                values = dividing or [
                    d for d in range(min(values), min(max(values), per_rank) + 1) if per_rank % d == 0
                ]
        else:
            values = [baseline.get(knob, backend.knobs[knob].reference)]
        space[knob] = values
    return SearchSpace.of(space)


def resolve_baseline(spec: JobSpec, backend: Backend, parallel: str | None, source: str) -> Config:
    """The baseline config (trial 0) of a job training its ranks `parallel`: the knobs' reference
    values, the rank's whole batch in one micro-batch, and what `spec.baseline` sets."""
    knobs = backend.job_knobs(parallel)
    for knob, value in spec.baseline.items():
        if knob not in knobs or knob in DERIVED:
            raise SpecError(
                _no_such_knob(backend, knob, [k for k in knobs if k not in DERIVED]),
                source=source,
                key=f"baseline.{knob}",
            )
        problem = backend.knobs[knob].check(value)
        if problem:
            raise SpecError(problem, source=source, key=f"baseline.{knob}")
    baseline = {k: knob.reference for k, knob in knobs.items() if k not in DERIVED}
    baseline[BATCH_SIZE.name] = rank_batch(spec)
    baseline.update(spec.baseline)
    if rank_batch(spec) % baseline[BATCH_SIZE.name]:
        raise SpecError(
            f"{baseline[BATCH_SIZE.name]} does not divide {_rank_batch_shown(spec)}",
            source=source,
            key="baseline.batch_size",
        )
    return baseline


def _no_such_knob(backend: Backend, knob: str, knobs: list[str]) -> str:
    """Why a spec cannot name `knob`: the backend has no such knob, or it is a knob of a way of
    training across processes that this job does not use."""
    if knob in backend.knobs and knob not in DERIVED:
        modes = [mode for mode in backend.parallel if knob in backend.job_knobs(mode)]
        return f"{knob} is a knob of parallel: {' or '.join(modes)}, with processes: 2 or more"
    return f"the {backend.name} backend has no knob {shown(knob)}; knobs: {', '.join(knobs)}"


def _rank_batch_shown(spec: JobSpec) -> str:
    """The batch a micro-batch must divide, as the user knows it."""
    if spec.world == 1:
        return f"global_batch ({spec.global_batch})"
    ranks = "processes" if spec.nodes == 1 else "(nodes x processes)"
    return f"global_batch / {ranks} ({spec.global_batch} / {spec.world} = {spec.global_batch // spec.world})"
