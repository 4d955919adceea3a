"""The JAX backend's inference half (`task: inference`), engine side: its knobs and what a device
can honour. Imports no framework.

A trial serves `global_batch` samples a step in calls of `batch_size` (`accumulation` calls), each
call timed alone (`autotuner.trials.serving`), as PyTorch's does; the trial-process half is
`autotuner.backends.jax.inference_runner`, and what a config does to a model is
`autotuner.backends.jax.serving.TunedInference`, the object users serve with too. The knobs:
the batch, the precision (the weights cast once, the inputs' floats at each call, the outputs
returned in fp32; TF32 matmuls for `tf32`), XLA jit, and the host threads that gather and place
the next batches ahead of the call.
"""

from __future__ import annotations

from dataclasses import replace

from autotuner.backends._base import Backend
from autotuner.backends.jax import JIT, JaxCapabilities
from autotuner.backends.jax.knobs import SERVING
from autotuner.config.knobs import BATCH_SIZE, CALLS, Config, Knob, knob_table

INFERENCE_PRECISION = Knob(
    "precision",
    "TF32 matmuls; or bf16/fp16: the weights cast once, the inputs' floats at each call, the outputs returned in fp32",
    ("fp32", "tf32", "bf16", "fp16"),
    "fp32",
    recommended=("bf16", "tf32"),
    not_run_when="the device has no such math (tf32 and fp16 on a CPU)",
)
SERVING_WORKERS = Knob(
    "workers",
    "host threads that gather the next batches and put them on the device ahead of the call",
    None,
    0,
    minimum=0,
    maximum=64,
    compiled=False,
)
JAX_INFERENCE_KNOBS = (
    INFERENCE_PRECISION,
    replace(BATCH_SIZE, description="samples a call, a divisor of `global_batch`"),
    CALLS,
    SERVING_WORKERS,
    replace(JIT, description="XLA jit of the cast, the forward pass and the cast back"),
)


class JaxInference(Backend):
    name = "jax"
    runner = "autotuner.backends.jax.inference_runner"
    knobs = knob_table(*JAX_INFERENCE_KNOBS)
    capabilities_type = JaxCapabilities
    families = SERVING
    builtin_workloads = {
        "mlp": "autotuner.backends.jax.inference_builtin:mlp",
        "gpt": "autotuner.backends.jax.inference_builtin:gpt",
    }
    default_space = "jax-inference"
    requires = ("jax",)
    install = "pip install 'autotuner[jax]'"

    def reference_overrides(self) -> Config:
        """The fp32 reference is served jitted: under strict fp32 matmuls a jitted forward pass is
        strict fp32 too, and op by op every primitive compiles on its own."""
        return {JIT.name: "on"}


JAX_INFERENCE = JaxInference()
