"""The PyTorch backend's inference half (`task: inference`), engine side: its knobs and what a
device can honour. Imports no framework.

A trial serves `global_batch` samples a step in calls of `batch_size` (`accumulation` calls), each
call timed alone (`autotuner.trials.inference`); the trial-process half is
`autotuner.backends.pytorch.inference_runner`, and what a config does to a model is
`autotuner.backends.pytorch.serving.TunedInference`, the object users serve with too.

Not offered: unstructured pruning (zeroing weights where they are small). Dense kernels do the
same work on zeros, so it cannot make a forward pass faster; only 2:4 semi-structured sparsity
has kernels that skip the zeros (NVIDIA GPUs of compute capability 8.0 and later): the
`sparsity` knob. Nor torchao's `autoquant`: it chooses each layer's kernel by timing them in the
process that runs it, so two processes of the same config can serve different kernels, and an
export could not say what it promises; the study itself compares the quantizations it offers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from autotuner.backends._base import Backend, Capabilities, capability
from autotuner.backends.pytorch import (
    ATTENTION,
    COMPILE,
    COMPILE_TIMEOUT_FACTOR,
    MEMORY_FORMAT,
    TorchCapabilities,
    model_knob_irrelevant,
)
from autotuner.config.knobs import BATCH_SIZE, CALLS, PRECISION, WORKERS, Config, Knob, knob_table

INFERENCE_PRECISION = Knob(
    "precision",
    "fp32; tf32 matmuls; bf16 or fp16 autocast of the forward pass (the weights stay fp32)",
    ("fp32", "tf32", "bf16", "fp16"),
    "fp32",
    recommended=("bf16", "fp16", "tf32"),
)
QUANTIZATION = Knob(
    "quantization",
    "torchao: int8 weights (activations in the compute precision), int8 dynamic activations and int8 "
    "weights, or fp8 dynamic activations and weights (GPUs of compute capability 8.9 and later)",
    ("none", "int8-weight-only", "int8-dynamic", "fp8"),
    "none",
    recommended=("int8-dynamic", "int8-weight-only"),
)
SPARSITY = Knob(
    "sparsity",
    "2:4 semi-structured sparsity of the linear layers: each four weights pruned to their two largest, then "
    "served by sparse kernels (torchao's sparsify_) in the precision's dtype; a model not trained for it drifts",
    ("none", "2:4"),
    "none",
    quiet=True,
)
RUNTIME = Knob(
    "runtime",
    "PyTorch, or ONNX Runtime with one execution provider (CPU, CUDA, TensorRT) on the model "
    "exported through torch.onnx",
    ("pytorch", "onnxruntime-cpu", "onnxruntime-cuda", "onnxruntime-tensorrt"),
    "pytorch",
)
THREADS = Knob(
    "threads",
    "intra-op threads on the CPU (torch.set_num_threads, or ONNX Runtime's intra_op_num_threads); "
    "0: the framework's default (every core)",
    None,
    0,
    minimum=0,
    maximum=4096,
    compiled=False,
)
SPARSE_ROWS, SPARSE_COLUMNS = 32, 64
"""A linear layer's weight the 2:4 kernels take in bf16 and fp16: rows (out_features) a multiple of
32, columns (in_features) of 64 (`torch.sparse.SparseSemiStructuredTensor`'s constraints)."""
ORT_PROVIDERS = {
    "onnxruntime-cpu": "CPUExecutionProvider",
    "onnxruntime-cuda": "CUDAExecutionProvider",
    "onnxruntime-tensorrt": "TensorrtExecutionProvider",
}
INFERENCE_KNOBS = (
    INFERENCE_PRECISION,
    BATCH_SIZE,
    CALLS,
    WORKERS,
    COMPILE,
    QUANTIZATION,
    SPARSITY,
    RUNTIME,
    THREADS,
    MEMORY_FORMAT,
    ATTENTION.restricted("default", "flash", "efficient", "cudnn", "math"),
)


@dataclass(frozen=True)
class InferenceCapabilities(TorchCapabilities):
    torchao: bool = capability("torchao (quantization)")
    fp8: bool = capability("fp8 matmuls")
    sparse24: bool = capability("2:4 sparse matmuls")
    sparse24_layers: bool = capability("workload: linear layers the 2:4 kernels take")
    onnxruntime: bool = capability("ONNX Runtime")
    ort_cpu: bool = capability("ONNX Runtime: CPU provider")
    ort_cuda: bool = capability("ONNX Runtime: CUDA provider")
    ort_tensorrt: bool = capability("ONNX Runtime: TensorRT provider")


def pip_line(package: str) -> str:
    """How to install an optional library a knob value needs."""
    return f"pip install {package} (or pip install 'autotuner[inference]')"


class PyTorchInference(Backend):
    name = "pytorch"
    runner = "autotuner.backends.pytorch.inference_runner"
    knobs = knob_table(*INFERENCE_KNOBS)
    capabilities_type = InferenceCapabilities
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

    def timeout_factor(self, config: Config) -> float:
        return COMPILE_TIMEOUT_FACTOR[config.get(COMPILE.name, "none")]

    def irrelevant(self, knob: str, value: object, capabilities: Capabilities) -> str | None:
        caps = capabilities if isinstance(capabilities, InferenceCapabilities) else InferenceCapabilities()
        if value == self.knobs[knob].reference:
            return None
        if reason := model_knob_irrelevant(knob, value, caps):
            return reason
        if knob == QUANTIZATION.name:
            if not caps.torchao:
                return f"quantization={value}: torchao is not installed here: {pip_line('torchao')}"
            if value == "fp8" and not caps.fp8:
                return "quantization=fp8: fp8 matmuls need an NVIDIA GPU of compute capability 8.9 or later"
        if knob == SPARSITY.name:
            if not caps.torchao:
                return f"sparsity={value}: torchao is not installed here: {pip_line('torchao')}"
            if not caps.sparse24:
                return f"sparsity={value}: 2:4 sparse kernels need an NVIDIA GPU of compute capability 8.0 or later"
            if not caps.sparse24_layers:
                return (
                    f"sparsity={value}: the model has no linear layer the 2:4 kernels take (out_features a "
                    f"multiple of {SPARSE_ROWS}, in_features of {SPARSE_COLUMNS})"
                )
        if knob == RUNTIME.name:
            if not caps.onnxruntime:
                return f"runtime={value}: onnxruntime is not installed here: {pip_line('onnxruntime')}"
            if not getattr(caps, f"ort_{str(value).removeprefix('onnxruntime-')}"):
                return f"runtime={value}: this ONNX Runtime build has no {ORT_PROVIDERS[str(value)]}"
        if knob == THREADS.name:
            if caps.accelerator:
                return f"threads={value}: the CPU's intra-op threads; the model runs on the GPU"
            if int(str(value)) > (os.cpu_count() or 1):
                return f"threads={value}: this machine has {os.cpu_count()} cores"
        return None

    def unsupported_reason(self, config: Config, capabilities: Capabilities) -> str | None:
        precision = config.get(PRECISION.name, "fp32")
        reason = self.unsupported_precision(precision, capabilities)
        if reason:
            return reason
        for knob, value in config.items():
            if knob in self.knobs and (reason := self.irrelevant(knob, value, capabilities)):
                return reason
        runtime = config.get(RUNTIME.name, "pytorch")
        if runtime != "pytorch":
            for other in (COMPILE, QUANTIZATION, SPARSITY, MEMORY_FORMAT, ATTENTION):
                if config.get(other.name, other.reference) != other.reference:
                    return (
                        f"{other.name}={config[other.name]} with runtime={runtime}: ONNX Runtime runs the exported "
                        "fp32 graph with its own optimisations; PyTorch's do not reach it"
                    )
            if precision != "fp32":
                return (
                    f"precision={precision} with runtime={runtime}: the model is exported in fp32 (ONNX Runtime's "
                    "own float16 conversion is not offered)"
                )
        attention = config.get(ATTENTION.name, "default")
        if attention in ("flash", "cudnn") and capabilities.accelerator and precision not in ("bf16", "fp16"):
            return f"attention={attention}: its CUDA kernels compute in bf16 or fp16 only"
        quantization = config.get(QUANTIZATION.name, "none")
        if config.get(SPARSITY.name, "none") != "none":
            if quantization != "none":
                return f"sparsity=2:4 with quantization={quantization}: not offered together"
            if precision not in ("bf16", "fp16"):
                return f"sparsity=2:4 with precision={precision}: the sparse weights are served in bf16 or fp16"
        if quantization == "fp8" and precision == "fp16":
            return "quantization=fp8 with precision=fp16: torchao's fp8 matmuls take bf16 or fp32 activations"
        return None


PYTORCH_INFERENCE = PyTorchInference()
