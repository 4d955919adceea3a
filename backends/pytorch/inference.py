"""The PyTorch backend's inference half (`task: inference`), engine side: its knobs and what a
device can honour. Imports no framework.

A trial serves `global_batch` samples a step in calls of `batch_size` (`accumulation` calls), each
call timed alone (`autotuner.trials.serving`); the trial-process half is
`autotuner.backends.pytorch.inference_runner`, and what a config does to a model is
`autotuner.backends.pytorch.serving.TunedInference`, the object users serve with too. Its own
knobs and their rules are families of `autotuner.backends.pytorch.knobs` (`SERVING`).

Not offered: unstructured pruning (`autotuner.backends.pytorch.knobs.sparsity` says why), nor
torchao's `autoquant`: it chooses each layer's kernel by timing them in the process that runs it,
so two processes of the same config can serve different kernels, and an export could not say what
it promises; the study itself compares the quantizations it offers.
"""

from __future__ import annotations

from dataclasses import replace

from autotuner.backends._base import Backend
from autotuner.backends.pytorch.capabilities import InferenceCapabilities
from autotuner.backends.pytorch.knobs import LOADER_WORKERS, SERVING, SERVING_ATTENTION
from autotuner.backends.pytorch.knobs.compile import COMPILE
from autotuner.backends.pytorch.knobs.compile import TIMEOUT_FACTOR as COMPILE_TIMEOUT_FACTOR
from autotuner.backends.pytorch.knobs.memory_format import MEMORY_FORMAT
from autotuner.backends.pytorch.knobs.quantization import QUANTIZATION
from autotuner.backends.pytorch.knobs.runtime import ORT_PROVIDERS, RUNTIME
from autotuner.backends.pytorch.knobs.sparsity import SPARSE_COLUMNS, SPARSE_ROWS, SPARSITY
from autotuner.backends.pytorch.knobs.threads import THREADS
from autotuner.config.knobs import BATCH_SIZE, CALLS, Config, Knob, knob_table

INFERENCE_PRECISION = Knob(
    "precision",
    "TF32 matmuls, or bf16/fp16 autocast of the forward pass (the weights stay fp32)",
    ("fp32", "tf32", "bf16", "fp16"),
    "fp32",
    recommended=("bf16", "fp16", "tf32"),
    not_run_when="the device has no such math; any but fp32 on an ONNX runtime (the graph is exported in fp32)",
)
INFERENCE_KNOBS = (
    INFERENCE_PRECISION,
    replace(BATCH_SIZE, description="samples a call, a divisor of `global_batch`"),
    CALLS,
    LOADER_WORKERS,
    COMPILE,
    QUANTIZATION,
    SPARSITY,
    RUNTIME,
    THREADS,
    MEMORY_FORMAT,
    *SERVING_ATTENTION.knobs,
)


class PyTorchInference(Backend):
    name = "pytorch"
    runner = "autotuner.backends.pytorch.inference_runner"
    knobs = knob_table(*INFERENCE_KNOBS)
    capabilities_type = InferenceCapabilities
    families = SERVING
    builtin_workloads = {
        "encoder": "autotuner.backends.pytorch.inference_builtin:encoder",
        "mlp": "autotuner.backends.pytorch.builtin:mlp",
        "cnn": "autotuner.backends.pytorch.builtin:cnn",
        "gpt": "autotuner.backends.pytorch.builtin:gpt",
        "resnet": "autotuner.backends.pytorch.builtin:resnet",
    }
    default_space = "pytorch-inference"
    requires = ("torch",)
    install = "pip install torch"
    formats = "autotuner.backends.pytorch.integrations"

    def timeout_factor(self, config: Config) -> float:
        return COMPILE_TIMEOUT_FACTOR[config.get(COMPILE.name, "none")]


PYTORCH_INFERENCE = PyTorchInference()

__all__ = [
    "INFERENCE_KNOBS",
    "INFERENCE_PRECISION",
    "ORT_PROVIDERS",
    "PYTORCH_INFERENCE",
    "SPARSE_COLUMNS",
    "SPARSE_ROWS",
    "InferenceCapabilities",
    "PyTorchInference",
]
