"""`memory_format`: the model's convolutions and its 4-D inputs in channels_last."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from autotuner.backends.pytorch.capabilities import TorchCapabilities
from autotuner.backends.pytorch.knobs._family import Build, TorchFamily
from autotuner.config.knobs import Knob

if TYPE_CHECKING:
    import torch

MEMORY_FORMAT = Knob(
    "memory_format",
    "the layout of the model's convolutions (`model.to(memory_format=torch.channels_last)`) and of every 4-D "
    "floating-point input batch: contiguous (NCHW) or channels_last (NHWC)",
    ("contiguous", "channels_last"),
    "contiguous",
    not_run_when="the model has no 2-D convolutions; `parallel: fsdp` (it shards contiguous parameters only); "
    "serving on an ONNX runtime",
    quiet=True,
)


def irrelevant(knob: Knob, value: object, caps: TorchCapabilities) -> str | None:
    if not caps.convolutions:
        return "memory_format=channels_last: the model has no 2-D convolutions"
    if caps.fsdp:
        return (
            "memory_format=channels_last: FSDP2 shards contiguous parameters only, and channels_last "
            "lays the convolutions' weights out otherwise"
        )
    return None


def channels_last(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with its 4-D parameters and buffers (convolutions' weights) in channels_last."""
    import torch

    # `Module.to` takes `memory_format` at run time; torch's overloads of it leave that keyword out.
    to: Callable[..., torch.nn.Module] = model.to
    return to(memory_format=torch.channels_last)


def apply(build: Build) -> None:
    """The model's parameters in channels_last; the batches follow (`Build.channels_last`)."""
    if MEMORY_FORMAT.of(build.config) == "channels_last":
        build.model = channels_last(build.model)
        build.channels_last = True


def setup(config: Mapping[str, object]) -> list[str]:
    """The model's layout. The study converted 4-D float batches as well (`Build.channels_last`); a
    convolution with channels_last weights returns channels_last outputs from a contiguous input,
    so the layout holds from the first convolution on without touching the user's batches."""
    if MEMORY_FORMAT.of(config) != "channels_last":
        return []
    return [
        "model = model.to(memory_format=torch.channels_last)  # memory_format=channels_last; inputs follow at "
        "the first conv"
    ]


FAMILY = TorchFamily((MEMORY_FORMAT,), irrelevant, apply=apply, setup=setup)
