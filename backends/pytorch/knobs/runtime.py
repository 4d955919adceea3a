"""`runtime` (`task: inference`): PyTorch, or ONNX Runtime with one execution provider on the
model exported through torch.onnx."""

from __future__ import annotations

from autotuner.backends._base import Family
from autotuner.backends.pytorch.capabilities import InferenceCapabilities
from autotuner.backends.pytorch.knobs.attention import ATTENTION
from autotuner.backends.pytorch.knobs.compile import COMPILE
from autotuner.backends.pytorch.knobs.memory_format import MEMORY_FORMAT
from autotuner.backends.pytorch.knobs.quantization import QUANTIZATION, pip_line
from autotuner.backends.pytorch.knobs.sparsity import SPARSITY
from autotuner.config.knobs import PRECISION, Config, Knob

RUNTIME = Knob(
    "runtime",
    "PyTorch, or ONNX Runtime with that execution provider on the fp32 model exported through `torch.onnx` (once "
    "per study and batch size, kept in `runs/<name>/compile-cache/onnx/`); TensorRT's session hands what TensorRT "
    "lacks to CUDA, then the CPU",
    ("pytorch", "onnxruntime-cpu", "onnxruntime-cuda", "onnxruntime-tensorrt"),
    "pytorch",
    not_run_when="onnxruntime not installed (`pip install onnxruntime`); the build has no such provider; a CUDA "
    "provider on the CPU; the provider does not start in the trial (never timed on another provider)",
)
ORT_PROVIDERS = {
    "onnxruntime-cpu": "CPUExecutionProvider",
    "onnxruntime-cuda": "CUDAExecutionProvider",
    "onnxruntime-tensorrt": "TensorrtExecutionProvider",
}
PYTORCH_ONLY = (COMPILE, QUANTIZATION, SPARSITY, MEMORY_FORMAT, ATTENTION)
"""What PyTorch does to the model, which ONNX Runtime's own optimisations of the exported graph replace."""


def irrelevant(knob: Knob, value: object, caps: InferenceCapabilities) -> str | None:
    if not caps.onnxruntime:
        return f"runtime={value}: onnxruntime is not installed here: {pip_line('onnxruntime')}"
    if not getattr(caps, f"ort_{str(value).removeprefix('onnxruntime-')}"):
        return f"runtime={value}: this ONNX Runtime build has no {ORT_PROVIDERS[str(value)]}"
    return None


def conflict(config: Config, caps: InferenceCapabilities) -> str | None:
    runtime = config.get(RUNTIME.name, RUNTIME.reference)
    if runtime == RUNTIME.reference:
        return None
    for other in PYTORCH_ONLY:
        if config.get(other.name, other.reference) != other.reference:
            return (
                f"{other.name}={config[other.name]} with runtime={runtime}: ONNX Runtime runs the exported "
                "fp32 graph with its own optimisations; PyTorch's do not reach it"
            )
    precision = config.get(PRECISION.name, "fp32")
    if precision != "fp32":
        return (
            f"precision={precision} with runtime={runtime}: the model is exported in fp32 (ONNX Runtime's "
            "own float16 conversion is not offered)"
        )
    return None


FAMILY = Family[InferenceCapabilities]((RUNTIME,), irrelevant, conflict)
