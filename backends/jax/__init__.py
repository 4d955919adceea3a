"""The JAX backend, engine side: knobs, built-in workloads, what a device can honour.

Importing this module does not import jax (the engine validates specs and decides what is
unsupported without it). The trial-process half is `autotuner.backends.jax.runner`; user workloads return
a `autotuner.backends.jax.workload.JaxWorkload`; `autotuner.backends.jax.apply.TunedTraining` applies a config to a
JAX training loop.
"""

from __future__ import annotations

from autotuner.backends._base import Backend, Capabilities
from autotuner.knobs import Config


class JaxBackend(Backend):
    name = "jax"
    runner = "autotuner.backends.jax.runner"
    knobs = {
        "precision": ("fp32", "tf32", "bf16"),
        "batch_size": None,
        "accumulation": None,
        "workers": None,
        "jit": ("on", "off"),
    }
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
        if config.get("jit", "off") == "on" and not capabilities.jit:
            return "jit=on: XLA cannot compile a function here"
        return None


JAX = JaxBackend()

__all__ = ["JAX", "JaxBackend"]
