"""Framework backends: each turns a config + a workload into a timed, seeded training run.

This package is the only place that imports torch or jax, and only inside each backend's
`runner` module, which the trial process imports. The backend objects listed here are light:
the engine uses them to validate a spec and to decide which configs the hardware can honour
without importing a framework.
"""

from __future__ import annotations

from autotuner.backends._base import Backend, Capabilities
from autotuner.backends.jax import JAX
from autotuner.backends.pytorch import PYTORCH

BACKENDS: dict[str, Backend] = {PYTORCH.name: PYTORCH, JAX.name: JAX}


def get_backend(name: str) -> Backend:
    """The backend registered under `name`; KeyError when there is none."""
    return BACKENDS[name]


__all__ = ["BACKENDS", "Backend", "Capabilities", "get_backend"]
