"""The JAX backend, engine side: knobs, built-in workloads, what a device can honour.

Importing this module does not import jax (the engine validates specs and decides what is
unsupported without it). The trial-process half is `autotuner.backends.jax.runner`; user workloads return
a `autotuner.backends.jax.workload.JaxWorkload`; `autotuner.backends.jax.apply.TunedTraining` applies a config to a
JAX training loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotuner.backends._base import Backend, Capabilities, capability
from autotuner.knobs import ACCUMULATION, BATCH_SIZE, PRECISION, WORKERS, Config, Knob, knob_table

JIT = Knob("jit", "XLA jit", ("on", "off"), "off", recommended=("on",))


@dataclass(frozen=True)
class JaxCapabilities(Capabilities):
    jit: bool = capability("XLA jit")
    """XLA can compile a whole function here (JAX jit)."""


class JaxBackend(Backend):
    name = "jax"
    runner = "autotuner.backends.jax.runner"
    knobs = knob_table(PRECISION.restricted("fp32", "tf32", "bf16"), BATCH_SIZE, ACCUMULATION, WORKERS, JIT)
    capabilities_type = JaxCapabilities
    builtin_workloads = {
        "mlp": "autotuner.backends.jax.workloads:mlp",
        "gpt": "autotuner.backends.jax.workloads:gpt",
    }
    default_space = "jax"
    requires = ("jax", "optax")
    install = "pip install 'autotuner[jax]'"

    def unsupported_reason(self, config: Config, capabilities: Capabilities) -> str | None:
        precision = self.unsupported_precision(config.get("precision", "fp32"), capabilities)
        if precision:
            return precision
        if config.get("jit", "off") == "on" and not getattr(capabilities, "jit", False):
            return "jit=on: XLA cannot compile a function here"
        return None


JAX = JaxBackend()

__all__ = ["JAX", "JIT", "JaxBackend", "JaxCapabilities"]
