"""The JAX backend, engine side: its knob table, built-in workloads and presets; the knobs and
their rules are one family a module in `autotuner.backends.jax.knobs`.

A trial is one process whatever the spec's `processes`: with `processes: N` and `parallel:
data_parallel`, that process drives N local devices (JAX's single controller: a mesh over them,
each micro-batch split between them, `autotuner.backends.jax.apply.TunedTraining`).

Importing this module does not import jax (the engine validates specs and decides what is
unsupported without it). The trial-process half is `autotuner.backends.jax.runner`; user workloads return
a `autotuner.backends.jax.workload.JaxWorkload`; `autotuner.backends.jax.apply.TunedTraining` applies a config to a
JAX training loop.
"""

from __future__ import annotations

from dataclasses import replace

from autotuner.backends._base import Backend
from autotuner.backends.jax.capabilities import JaxCapabilities
from autotuner.backends.jax.knobs import TRAINING
from autotuner.backends.jax.knobs.donate import DONATE
from autotuner.backends.jax.knobs.jit import JIT
from autotuner.backends.jax.knobs.param_sharding import DATA_PARALLEL, PARAM_SHARDING
from autotuner.backends.jax.knobs.remat import REMAT
from autotuner.backends.jax.knobs.xla_flags import XLA_FLAG_BUNDLES, XLA_FLAGS, FlagBundle
from autotuner.config.knobs import ACCUMULATION, BATCH_SIZE, PRECISION, WORKERS, Config, Knob, knob_table


class JaxBackend(Backend):
    name = "jax"
    runner = "autotuner.backends.jax.runner"
    knobs = knob_table(
        replace(
            PRECISION.restricted("fp32", "tf32", "bf16"),
            description='tf32: `jax.default_matmul_precision("tensorfloat32")`; bf16: the loss computed on bf16 '
            "copies of the fp32 parameters; fp32: strict fp32 matmuls (JAX's default on a GPU would be TF32-like)",
        ),
        BATCH_SIZE,
        ACCUMULATION,
        replace(
            WORKERS,
            description="host threads that gather the next micro-batches and put them on the device ahead of the "
            "step (0: synchronous)",
        ),
        *(knob for family in TRAINING for knob in family.knobs),
    )
    capabilities_type = JaxCapabilities
    families = TRAINING
    parallel = (DATA_PARALLEL,)
    builtin_workloads = {
        "mlp": "autotuner.backends.jax.builtin:mlp",
        "gpt": "autotuner.backends.jax.builtin:gpt",
    }
    default_space = "jax"
    requires = ("jax", "optax")
    install = "pip install 'autotuner[jax]'"

    def job_knobs(self, parallel: str | None) -> dict[str, Knob]:
        """`param_sharding` only in a data-parallel job: one device has nothing to split."""
        if parallel == DATA_PARALLEL:
            return dict(self.knobs)
        return {name: knob for name, knob in self.knobs.items() if name != PARAM_SHARDING.name}

    def reference_overrides(self) -> Config:
        """The reference runs jitted: under the fp32 precision's strict matmuls
        (`jax.default_matmul_precision`) a jitted step is strict fp32 too, and it compiles a few
        executables where op by op every primitive compiles (on a GPU, each with XLA's GEMM
        autotuning) in each of the reference's two processes."""
        return {JIT.name: "on"}


JAX = JaxBackend()

__all__ = [
    "DATA_PARALLEL",
    "DONATE",
    "JAX",
    "JIT",
    "PARAM_SHARDING",
    "REMAT",
    "XLA_FLAGS",
    "XLA_FLAG_BUNDLES",
    "FlagBundle",
    "JaxBackend",
    "JaxCapabilities",
]
