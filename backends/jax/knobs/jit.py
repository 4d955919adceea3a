"""`jit`: the step (or the served forward pass) compiled whole by XLA."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from autotuner.backends.jax.capabilities import JaxCapabilities
from autotuner.backends.jax.knobs._family import Build, Compiler, JaxFamily, OpByOp
from autotuner.config.knobs import Knob

JIT = Knob(
    "jit",
    "`jax.jit` of the differentiated loss, the accumulation and the update, or op by op",
    ("on", "off"),
    "off",
    recommended=("on",),
    not_run_when="XLA cannot compile a function here",
)

Result = TypeVar("Result")


def irrelevant(knob: Knob, value: object, caps: JaxCapabilities) -> str | None:
    return None if caps.jit else "jit=on: XLA cannot compile a function here"


class Jitted:
    """Each function compiled whole by XLA (`jax.jit`, `jit: on`)."""

    def function(self, fn: Callable[..., Result], out_shardings: object = None) -> Callable[..., Result]:
        import jax

        return jax.jit(fn) if out_shardings is None else jax.jit(fn, out_shardings=out_shardings)

    def update(
        self, fn: Callable[..., Result], out_shardings: object = None, donated: tuple[int, ...] = ()
    ) -> Callable[..., Result]:
        import jax

        if out_shardings is None:
            return jax.jit(fn, donate_argnums=donated)
        return jax.jit(fn, donate_argnums=donated, out_shardings=out_shardings)


def compiler(config: Mapping[str, object]) -> Compiler:
    """How a config's step (or served forward pass) runs: jitted for `jit: on`, else op by op."""
    return Jitted() if JIT.of(config) == "on" else OpByOp()


def apply(build: Build) -> None:
    """The step's functions compiled as `jit` says."""
    build.compiler = compiler(build.config)


FAMILY = JaxFamily((JIT,), irrelevant, apply=apply)
