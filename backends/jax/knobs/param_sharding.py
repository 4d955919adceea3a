"""`param_sharding`: under `parallel: data_parallel`, the parameters replicated or sharded over the devices."""

from __future__ import annotations

from autotuner.backends._base import Family
from autotuner.backends.jax.capabilities import JaxCapabilities
from autotuner.config.knobs import Knob

PARAM_SHARDING = Knob(
    "param_sharding",
    "parallel: data_parallel: the parameters and optimizer state whole on every device (replicated), or each "
    "split along its largest axis the devices divide, FSDP-like, XLA gathering them where they are used (sharded)",
    ("replicated", "sharded"),
    "replicated",
    not_run_when="not `parallel: data_parallel`",
    memory_order=("sharded", "replicated"),
    quiet=True,
)
DATA_PARALLEL = "data_parallel"
"""The JAX backend's way of training a trial over several devices: one process, a mesh of N local
devices, each micro-batch split between them."""


def irrelevant(knob: Knob, value: object, caps: JaxCapabilities) -> str | None:
    if not caps.data_parallel:
        return f"param_sharding={value}: a knob of parallel: {DATA_PARALLEL} (a trial over several devices)"
    return None


FAMILY = Family[JaxCapabilities]((PARAM_SHARDING,), irrelevant)
