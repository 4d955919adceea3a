"""Knobs (performance settings) and what a config is.

The knobs every backend has are defined here; a backend lists the knobs it has, restricting
their values to what it honours and adding the ones only its framework has
(`autotuner.backends._base.Backend.knobs`). `accumulation` is never searched: with
`global_batch` fixed it is derived from `batch_size`, so a config always holds
`batch_size * accumulation == global_batch`.

Memory is a dimension of the space, not a wall: a knob whose values rank by the memory a step
needs declares that order (`Knob.memory_order`: a larger micro-batch needs more, activation
checkpointing less), and a config that needs at least as much memory as one that ran out of it,
knob by knob, is not run (`needs_as_much_memory`, `autotuner.results.tried.oom_rules_out`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, Literal, TypeVar, cast

from autotuner.errors import shown

Value = str | int | float | bool
"""A knob's value: a word, a flag or a number, as a spec, a trial's params and an export hold it."""

Config = dict[str, Any]
"""One value per knob, `accumulation` included: an open set of keys, since each backend has knobs
of its own (`Backend.knobs`). Plain data: it is stored with its trial."""
Params = dict[str, Any]
"""A config as Optuna samples and stores it (a trial's params): one value per searched knob,
`accumulation` left out, since it is derived (`autotuner.spec.job.Job.complete` makes a `Config`
of it)."""

V = TypeVar("V")
"""A knob's value type: `str` for words, `bool`, `int` or `float` for numbers."""

ASCENDING: Literal["ascending"] = "ascending"
"""The `Knob.memory_order` of an integer knob whose larger values need more memory (the micro-batch)."""


@dataclass(frozen=True)
class Knob(Generic[V]):
    """A setting of the job that a config gives a value, typed by its values (`Knob[str]`,
    `Knob[int]`, ...): `of` reads its value out of a config as that type."""

    name: str
    description: str
    """What it does, as the knob tables in the documentation say it (`knob_rows`)."""
    choices: tuple[V, ...] | None
    """The values the knob can take; None for a number (an integer unless `real`) between
    `minimum` and `maximum`."""
    reference: V
    """The numerically strictest value, used by the fp32 reference and the default baseline."""
    minimum: float = 1
    """For number knobs: the smallest allowed value."""
    maximum: float | None = None
    """For number knobs: the largest allowed value, if any."""
    real: bool = False
    """A number knob (`choices` None) of real values, not only integers: a share, a budget."""
    recommended: tuple[V, ...] = ()
    """Values the optimisation guides recommend, most recommended first: the guided start tries
    them before the knob's other values (`autotuner.proposals.sampler.rule_of_thumb`)."""
    compiled: bool = True
    """Whether its value changes what the framework compiles. Two configs that differ only in
    knobs that do not (loader workers) share their compiled graphs, and the second one's warm-up
    finds them cached (`autotuner.results.records.with_cold_warmups`)."""
    quiet: bool = False
    """A knob added after the first four, at its reference value in most configs (memory format,
    attention backend, ...): left out of a config's one-line form at that value
    (`autotuner.output.formatting.format_config`), filled in at it for a config exported before
    the knob existed (`autotuner.backends._base.with_defaults`), and left out of a study's
    identity while the space holds it at that value alone (`autotuner.spec.job.Job`), so that
    adding one changes no existing export or study."""
    implied: Callable[[str], V] | None = None
    """The value a config exported before the knob existed implies, from the device it was tuned on
    (`cuda:0`, `cpu`): what the study ran then without the knob. None: its reference value."""
    not_run_when: str = ""
    """When a value of it is left out of the search or recorded unsupported, in words, as the knob
    tables say it (its family's rules, `autotuner.backends._base.Family`, decide it)."""
    memory_order: tuple[V, ...] | Literal["ascending"] | None = None
    """How the knob's values rank by the memory a training step needs, the rest of the config
    equal: its values from least memory to most; `ASCENDING` for a number knob whose larger
    values need more; None when its values do not rank (each needs a run of its own to know).
    A value left out of the tuple ranks with none but itself, so an order may leave out the
    values it cannot place. An out-of-memory trial rules out every config that needs at least as
    much memory knob by knob (`needs_as_much_memory`)."""

    def __post_init__(self) -> None:
        if isinstance(self.memory_order, tuple) and self.choices is not None:
            unknown = [v for v in self.memory_order if v not in self.choices]
            if unknown:
                raise ValueError(f"{self.name}'s memory_order has values it has not: {', '.join(map(str, unknown))}")
        if self.memory_order == ASCENDING and self.choices is not None:
            raise ValueError(f"{self.name}: memory_order {ASCENDING!r} is for number knobs (integers or reals)")

    def needs_as_much_memory(self, value: Value, than: Value) -> bool:
        """Whether a step at `value` of this knob needs at least as much memory as one at `than`,
        the rest of the config equal: the same value, or one at or above it in `memory_order`."""
        if value == than:
            return True
        if self.memory_order == ASCENDING:
            return isinstance(value, int | float) and isinstance(than, int | float) and value >= than
        if isinstance(self.memory_order, tuple) and value in self.memory_order and than in self.memory_order:
            return self.memory_order.index(value) >= self.memory_order.index(than)
        return False

    def check(self, value: object) -> str | None:
        """Return why `value` is not allowed for this knob, or None when it is."""
        if self.choices is None:
            kinds, what = ((int, float), "a number") if self.real else ((int,), "an integer")
            if isinstance(value, bool) or not isinstance(value, kinds):
                return f"must be {what} >= {self.minimum:g}, got {shown(value)}"
            if value < self.minimum:
                return f"must be {what} >= {self.minimum:g}, got {shown(value)}"
            if self.maximum is not None and value > self.maximum:
                return f"must be {what} <= {self.maximum:g}, got {shown(value)}"
            return None
        if value not in self.choices or isinstance(value, bool) != any(isinstance(a, bool) for a in self.choices):
            # YAML 1.1 reads a bare on/off/yes/no as a boolean: say so where the knob's values are words.
            quote = " (quote it: YAML reads a bare on/off as a boolean)" if isinstance(value, bool) else ""
            return f"{shown(value)} is not allowed; choose between {', '.join(map(str, self.choices))}{quote}"
        return None

    def of(self, config: Mapping[str, object]) -> V:
        """This knob's value in `config` (a config of a table that holds it: `Backend.config_params`)."""
        return cast(V, config[self.name])

    def before(self, device: str) -> V:
        """The value of this (quiet) knob in a config exported before it existed, tuned on `device`."""
        return self.reference if self.implied is None else self.implied(device)

    def values_text(self) -> str:
        """Its values as the knob tables write them: `` `fp32`, `bf16` ``, `` `false`, `true` ``
        (YAML's spelling), `"on"` where YAML would read the bare word as a boolean, or the integers
        it takes."""
        if self.choices is None:
            upper = f" to {self.maximum:g}" if self.maximum is not None else ""
            return f"{'numbers' if self.real else 'integers'} from {self.minimum:g}{upper}"
        return ", ".join(_yaml_text(choice) for choice in self.choices)

    def restricted(self, *choices: V) -> Knob[V]:
        """This knob with only `choices` (a backend that honours fewer values than the table)."""
        unknown = [c for c in choices if self.choices is None or c not in self.choices]
        if unknown:
            raise ValueError(f"{self.name} has no value {', '.join(map(str, unknown))}")
        order = self.memory_order
        return replace(
            self,
            choices=tuple(choices),
            recommended=tuple(v for v in self.recommended if v in choices),
            memory_order=tuple(v for v in order if v in choices) if isinstance(order, tuple) else order,
        )


PRECISION = Knob(
    "precision",
    "the compute precision: strict fp32, TF32 matmuls, or bf16 or fp16 compute (each backend says how)",
    ("fp32", "tf32", "bf16", "fp16"),
    "fp32",
    recommended=("bf16", "fp16", "tf32"),
    not_run_when="the device has no such math (tf32: an NVIDIA GPU of compute capability 8.0 or newer)",
)
BATCH_SIZE: Knob[int] = Knob(
    "batch_size",
    "the micro-batch, a divisor of `global_batch`: `accumulation = global_batch / batch_size` micro-steps, their "
    "gradients summed, per optimizer step",
    None,
    1,
    memory_order=ASCENDING,
)
ACCUMULATION: Knob[int] = Knob("accumulation", "micro-steps per optimizer step (derived)", None, 1)
WORKERS: Knob[int] = Knob(
    "workers", "the data loader's worker processes", None, 0, minimum=0, maximum=1024, compiled=False
)
CALLS = Knob(ACCUMULATION.name, "calls a measured step serves its global batch in (derived)", None, 1)
"""`task: inference`'s `accumulation`: a served step is `global_batch` samples in calls of `batch_size`."""
COMMON_KNOBS = (PRECISION, BATCH_SIZE, ACCUMULATION, WORKERS)
"""The knobs every backend has (a backend may restrict their values). A knob only one framework
has (torch.compile's mode, XLA jit) is defined by its backend (`Backend.knobs`)."""

DERIVED = (ACCUMULATION.name,)


YAML_BOOLEANS = frozenset({"on", "off", "yes", "no", "y", "n", "true", "false"})
"""Words YAML 1.1 reads as booleans when they stand bare: a knob value spelled so is quoted."""


def _yaml_text(value: object) -> str:
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str) and value.lower() in YAML_BOOLEANS:
        return f'`"{value}"`'
    return f"`{value}`"


def knob_rows(knobs: Sequence[Knob[Any]]) -> list[str]:
    """The Markdown table of `knobs` the guides show (generated from the knobs themselves): each
    knob's values, what it does and when it is not run; the derived `accumulation` left out."""
    lines = ["| knob | values | what it does | not run when |", "|---|---|---|---|"]
    for knob in knobs:
        if knob.name not in DERIVED:
            lines.append(f"| `{knob.name}` | {knob.values_text()} | {knob.description} | {knob.not_run_when} |")
    return lines


def knob_table(*knobs: Knob[Any]) -> dict[str, Knob[Any]]:
    """Name -> knob, in the order given: a backend's `knobs`."""
    return {knob.name: knob for knob in knobs}


COMMON_TABLE = knob_table(*COMMON_KNOBS)
"""The knobs every backend has, by name: what a config's memory is ranked by where no backend's
table is given (`needs_as_much_memory`)."""


def needs_as_much_memory(
    config: Mapping[str, Value], than: Mapping[str, Value], knobs: Mapping[str, Knob[Any]]
) -> bool:
    """Whether `config` needs at least as much memory as `than`, knob by knob: both set the same
    knobs, and at each one `config`'s value needs at least as much as `than`'s
    (`Knob.needs_as_much_memory`; a knob not in `knobs`, the backend's table, must be equal).
    A partial order: a larger micro-batch with checkpointing and a smaller one without it rank
    neither way."""
    if config.keys() != than.keys():
        return False
    for name, value in config.items():
        knob = knobs.get(name)
        if not (value == than[name] if knob is None else knob.needs_as_much_memory(value, than[name])):
            return False
    return True


def config_key(config: Mapping[str, Value]) -> tuple[tuple[str, Value], ...]:
    """A hashable identity of a config: two configs with the same key are the same run."""
    return tuple(sorted(config.items()))
