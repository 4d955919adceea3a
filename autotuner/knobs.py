"""Knobs (performance settings) and what a config is.

The knobs every backend has are defined here; a backend lists the knobs it has, restricting
their values to what it honours and adding the ones only its framework has
(`autotuner.backends._base.Backend.knobs`). `accumulation` is never searched: with
`global_batch` fixed it is derived from `batch_size`, so a config always holds
`batch_size * accumulation == global_batch`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from autotuner.errors import shown

Config = dict[str, Any]
"""One value per knob, `accumulation` included. Plain data: it is stored as trial params."""


@dataclass(frozen=True)
class Knob:
    name: str
    description: str
    choices: tuple[Any, ...] | None
    """The values the knob can take; None for a positive integer."""
    reference: Any
    """The numerically strictest value, used by the fp32 reference and the default baseline."""
    minimum: int = 1
    """For integer knobs: the smallest allowed value."""
    maximum: int | None = None
    """For integer knobs: the largest allowed value, if any."""
    recommended: tuple[Any, ...] = ()
    """Values the optimisation guides recommend, most recommended first: the guided start tries
    them before the knob's other values (`autotuner.sampler.rule_of_thumb`)."""
    compiled: bool = True
    """Whether its value changes what the framework compiles. Two configs that differ only in
    knobs that do not (loader workers) share their compiled graphs, and the second one's warm-up
    finds them cached (`autotuner.records.with_cold_warmups`)."""

    def check(self, value: Any) -> str | None:
        """Return why `value` is not allowed for this knob, or None when it is."""
        if self.choices is None:
            if isinstance(value, bool) or not isinstance(value, int):
                return f"must be an integer >= {self.minimum}, got {shown(value)}"
            if value < self.minimum:
                return f"must be an integer >= {self.minimum}, got {shown(value)}"
            if self.maximum is not None and value > self.maximum:
                return f"must be an integer <= {self.maximum}, got {shown(value)}"
            return None
        if value not in self.choices or isinstance(value, bool) != any(isinstance(a, bool) for a in self.choices):
            # YAML 1.1 reads a bare on/off/yes/no as a boolean: say so where the knob's values are words.
            quote = " (quote it: YAML reads a bare on/off as a boolean)" if isinstance(value, bool) else ""
            return f"{shown(value)} is not allowed; choose between {', '.join(map(str, self.choices))}{quote}"
        return None

    def restricted(self, *choices: Any) -> Knob:
        """This knob with only `choices` (a backend that honours fewer values than the table)."""
        unknown = [c for c in choices if self.choices is None or c not in self.choices]
        if unknown:
            raise ValueError(f"{self.name} has no value {', '.join(map(str, unknown))}")
        return replace(self, choices=tuple(choices), recommended=tuple(v for v in self.recommended if v in choices))


PRECISION = Knob(
    "precision",
    "fp32; tf32 matmuls; bf16 or fp16 autocast (fp16 with a gradient scaler)",
    ("fp32", "tf32", "bf16", "fp16"),
    "fp32",
    recommended=("bf16", "fp16", "tf32"),
)
BATCH_SIZE = Knob("batch_size", "micro-batch per forward/backward", None, None)
ACCUMULATION = Knob("accumulation", "micro-steps per optimizer step (derived)", None, 1)
WORKERS = Knob("workers", "data-loader worker processes", None, 0, minimum=0, maximum=1024, compiled=False)
COMMON_KNOBS = (PRECISION, BATCH_SIZE, ACCUMULATION, WORKERS)
"""The knobs every backend has (a backend may restrict their values). A knob only one framework
has (torch.compile's mode, XLA jit) is defined by its backend (`Backend.knobs`)."""

DERIVED = ("accumulation",)


def knob_table(*knobs: Knob) -> dict[str, Knob]:
    """Name -> knob, in the order given: a backend's `knobs`."""
    return {knob.name: knob for knob in knobs}


def config_key(config: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """A hashable identity of a config: two configs with the same key are the same run."""
    return tuple(sorted(config.items()))


def format_config(config: Mapping[str, Any]) -> str:
    """`precision=bf16 batch=64x4 workers=2 compile=none`: batch shown as micro-batch x accumulation."""
    parts = []
    for name, value in config.items():
        if name == "accumulation":
            continue
        if name == "batch_size":
            parts.append(f"batch={value}x{config.get('accumulation', 1)}")
        else:
            parts.append(f"{name}={value}")
    return " ".join(parts)
