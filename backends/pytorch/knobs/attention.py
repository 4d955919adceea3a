"""`attention`: the scaled-dot-product-attention kernel, or a Hugging Face model's eager attention."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from autotuner.backends.pytorch.capabilities import TorchCapabilities
from autotuner.backends.pytorch.knobs._family import Build, TorchFamily
from autotuner.config.knobs import PRECISION, Config, Knob
from autotuner.trials.outcomes import Unsupported

if TYPE_CHECKING:
    import torch
    from torch.nn.attention import SDPBackend

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


NO_KERNEL = "No available kernel"
"""What scaled_dot_product_attention raises when none of the backends allowed can take its inputs."""


def kernel(attention: str) -> SDPBackend:
    """The `torch.nn.attention.SDPBackend` of an `attention` value among `SDPA_BACKENDS`."""
    from torch.nn.attention import SDPBackend

    return {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }[attention]


def choose_attention(model: torch.nn.Module, attention: str) -> Callable[[], contextlib.AbstractContextManager[None]]:
    """The context the forward runs in for the `attention` knob: `sdpa_kernel` with that one backend,
    or nothing for `default` and `eager`. A Hugging Face model is switched to its `sdpa`
    implementation for a backend, to `eager` for eager; eager on any other model is `Unsupported`."""
    from autotuner.backends.pytorch.modules import is_hugging_face

    if attention == "eager" or (attention in SDPA_BACKENDS and is_hugging_face(model)):
        if not is_hugging_face(model):
            raise Unsupported("attention=eager: only Hugging Face models choose their attention implementation")
        try:
            model.set_attn_implementation("eager" if attention == "eager" else "sdpa")  # type: ignore[operator]
        except (ValueError, ImportError) as exc:
            raise Unsupported(f"attention={attention}: {exc}") from None
    if attention in SDPA_BACKENDS:
        from torch.nn.attention import sdpa_kernel

        return functools.partial(sdpa_kernel, [kernel(attention)])
    return contextlib.nullcontext


@contextlib.contextmanager
def _only_kernel(chosen: Callable[[], contextlib.AbstractContextManager[None]], attention: str) -> Iterator[None]:
    """`chosen`'s context, where the one kernel it leaves refusing what it cannot compute (dropout on
    a CPU's flash kernel, a head size or a mask it lacks) is `Unsupported`."""
    try:
        with chosen():
            yield
    except RuntimeError as exc:
        if NO_KERNEL not in f"{exc} {exc.__cause__}":
            raise
        raise Unsupported(f"attention={attention}: its kernel cannot compute this model's attention here") from exc


SDPA_FLAGS = {
    "flash": "enable_flash_sdp",
    "efficient": "enable_mem_efficient_sdp",
    "math": "enable_math_sdp",
    "cudnn": "enable_cudnn_sdp",
}
"""`attention` backend -> the `torch.backends.cuda` function that turns its kernel on or off."""


def sdpa_code(attention: str) -> list[str]:
    """Lines leaving `attention` the only scaled-dot-product-attention kernel, for the whole process:
    the flags `torch.nn.attention.sdpa_kernel` with that one backend sets around each of the study's
    forwards (CPU kernels obey them too); nothing for `default` and `eager`."""
    if attention not in SDPA_FLAGS:
        return []
    return [
        f"torch.backends.cuda.{flag}({name == attention})"
        + (f"  # attention={attention}: the only SDPA kernel left on" if name == attention else "")
        for name, flag in SDPA_FLAGS.items()
    ]


def setup(config: Mapping[str, object]) -> list[str]:
    return sdpa_code(ATTENTION.of(config))


def apply(build: Build) -> None:
    attention = ATTENTION.of(build.config)
    chosen = choose_attention(build.module, attention)
    build.attention = functools.partial(_only_kernel, chosen, attention) if attention in SDPA_BACKENDS else chosen


FAMILY = TorchFamily((ATTENTION,), irrelevant, conflict, apply, setup)
