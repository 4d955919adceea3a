"""`attention`: the scaled-dot-product-attention kernel, or a Hugging Face model's eager attention."""

from __future__ import annotations

from autotuner.backends._base import Family
from autotuner.backends.pytorch.capabilities import TorchCapabilities
from autotuner.config.knobs import PRECISION, Config, Knob

ATTENTION = Knob(
    "attention",
    "the forward under `torch.nn.attention.sdpa_kernel` with that one backend (a Hugging Face model switched to "
    "its `sdpa` implementation; `default`: PyTorch's choice); `eager`: a Hugging Face model's eager attention",
    ("default", "flash", "efficient", "cudnn", "math", "eager"),
    "default",
    not_run_when="the model calls no `scaled_dot_product_attention` (and is not a Hugging Face model); flash and "
    "cuDNN need a GPU of compute capability 8.0 or newer, efficient and cuDNN a GPU; flash and cuDNN in fp32 or "
    "TF32 on a GPU (their kernels take bf16 and fp16); `eager`: not a Hugging Face model; serving on an ONNX runtime",
    quiet=True,
)
SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")
HALF_PRECISION_ONLY = ("flash", "cudnn")
"""SDPA backends whose CUDA kernels take fp16 and bf16 only (flash attention's CPU kernel takes fp32)."""


def irrelevant(knob: Knob, value: object, caps: TorchCapabilities) -> str | None:
    if value == "eager":
        return None if caps.hf_attention else "attention=eager: only Hugging Face models choose their attention"
    if not (caps.sdpa or caps.hf_attention):
        return f"attention={value}: the model calls no scaled_dot_product_attention"
    if value != "math" and not getattr(caps, f"sdpa_{value}"):
        return f"attention={value}: this device or torch build has no {value} attention kernel"
    return None


def conflict(config: Config, caps: TorchCapabilities) -> str | None:
    attention = config.get(ATTENTION.name, ATTENTION.reference)
    if attention in HALF_PRECISION_ONLY and caps.accelerator and config.get(PRECISION.name) not in ("bf16", "fp16"):
        return f"attention={attention}: its CUDA kernels compute in bf16 or fp16 only"
    return None


FAMILY = Family[TorchCapabilities]((ATTENTION,), irrelevant, conflict)
