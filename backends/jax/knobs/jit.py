"""`jit`: the step (or the served forward pass) compiled whole by XLA."""

from __future__ import annotations

from autotuner.backends._base import Family
from autotuner.backends.jax.capabilities import JaxCapabilities
from autotuner.config.knobs import Knob

JIT = Knob(
    "jit",
    "`jax.jit` of the differentiated loss, the accumulation and the update, or op by op",
    ("on", "off"),
    "off",
    recommended=("on",),
    not_run_when="XLA cannot compile a function here",
)


def irrelevant(knob: Knob, value: object, caps: JaxCapabilities) -> str | None:
    return None if caps.jit else "jit=on: XLA cannot compile a function here"


FAMILY = Family[JaxCapabilities]((JIT,), irrelevant)
