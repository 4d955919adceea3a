"""`donate`: the parameters and optimizer state donated to the jitted update."""

from __future__ import annotations

from autotuner.backends._base import Family
from autotuner.backends.jax.capabilities import JaxCapabilities
from autotuner.backends.jax.knobs.jit import JIT
from autotuner.config.knobs import Config, Knob

DONATE = Knob(
    "donate",
    "the parameters and optimizer state donated to the jitted update (`donate_argnums`), which writes the new "
    "ones into their buffers",
    ("off", "on"),
    "off",
    not_run_when='the platform cannot donate buffers; without `jit: "on"`',
    recommended=("on",),
    quiet=True,
)


def irrelevant(knob: Knob, value: object, caps: JaxCapabilities) -> str | None:
    return None if caps.donate else "donate=on: XLA cannot donate buffers on this device"


def conflict(config: Config, caps: JaxCapabilities) -> str | None:
    if config.get(DONATE.name, DONATE.reference) == "on" and config.get(JIT.name, JIT.reference) != "on":
        return "donate=on needs jit=on: only a jitted update takes over the donated buffers"
    return None


FAMILY = Family[JaxCapabilities]((DONATE,), irrelevant, conflict)
