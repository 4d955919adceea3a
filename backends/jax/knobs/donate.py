"""`donate`: the parameters and optimizer state donated to the jitted update."""

from __future__ import annotations

from autotuner.backends.jax.capabilities import JaxCapabilities
from autotuner.backends.jax.knobs._family import Build, JaxFamily
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
NEEDS_JIT = "donate=on needs jit=on: only a jitted update takes over the donated buffers"


def irrelevant(knob: Knob, value: object, caps: JaxCapabilities) -> str | None:
    return None if caps.donate else "donate=on: XLA cannot donate buffers on this device"


def conflict(config: Config, caps: JaxCapabilities) -> str | None:
    if config.get(DONATE.name, DONATE.reference) == "on" and config.get(JIT.name, JIT.reference) != "on":
        return NEEDS_JIT
    return None


def apply(build: Build) -> None:
    """The update writes the new parameters and optimizer state into the old ones' buffers, which
    `TunedTraining.restart` made and nothing else holds; ValueError without `jit: on`."""
    if DONATE.of(build.config) != "on":
        return
    if JIT.of(build.config) != "on":
        raise ValueError(NEEDS_JIT)
    build.donated = (0, 1)


FAMILY = JaxFamily((DONATE,), irrelevant, conflict, apply=apply)
