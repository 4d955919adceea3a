"""`memory_format`: the model's convolutions and its 4-D inputs in channels_last."""

from __future__ import annotations

from autotuner.backends._base import Family
from autotuner.backends.pytorch.capabilities import TorchCapabilities
from autotuner.config.knobs import Knob

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


FAMILY = Family[TorchCapabilities]((MEMORY_FORMAT,), irrelevant)
