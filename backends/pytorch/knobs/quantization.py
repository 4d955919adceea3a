"""`quantization` (`task: inference`): torchao's int8 and fp8 quantization of the linear layers."""

from __future__ import annotations

from autotuner.backends._base import Family
from autotuner.backends.pytorch.capabilities import InferenceCapabilities
from autotuner.config.knobs import PRECISION, Config, Knob

QUANTIZATION = Knob(
    "quantization",
    "torchao's `quantize_` of the linear layers: int8 weights (activations in the compute precision); int8 "
    "dynamic activations and int8 weights; fp8 dynamic activations and weights",
    ("none", "int8-weight-only", "int8-dynamic", "fp8"),
    "none",
    not_run_when="torchao not installed (`pip install torchao`); fp8 below compute capability 8.9, or with "
    "`precision: fp16`; on an ONNX runtime",
    recommended=("int8-dynamic", "int8-weight-only"),
)


def pip_line(package: str) -> str:
    """How to install an optional library a knob value needs."""
    return f"pip install {package} (or pip install 'autotuner[inference]')"


def irrelevant(knob: Knob, value: object, caps: InferenceCapabilities) -> str | None:
    if not caps.torchao:
        return f"quantization={value}: torchao is not installed here: {pip_line('torchao')}"
    if value == "fp8" and not caps.fp8:
        return "quantization=fp8: fp8 matmuls need an NVIDIA GPU of compute capability 8.9 or later"
    return None


def conflict(config: Config, caps: InferenceCapabilities) -> str | None:
    if config.get(QUANTIZATION.name) == "fp8" and config.get(PRECISION.name) == "fp16":
        return "quantization=fp8 with precision=fp16: torchao's fp8 matmuls take bf16 or fp32 activations"
    return None


FAMILY = Family[InferenceCapabilities]((QUANTIZATION,), irrelevant, conflict)
