"""`cudnn_benchmark`: cuDNN times its convolution algorithms and keeps the fastest."""

from __future__ import annotations

from autotuner.backends._base import Family
from autotuner.backends.pytorch.capabilities import TorchCapabilities
from autotuner.config.knobs import Knob

CUDNN_BENCHMARK = Knob(
    "cudnn_benchmark",
    "`torch.backends.cudnn.benchmark`: cuDNN times its convolution algorithms for each new input shape and keeps "
    "the fastest",
    (False, True),
    False,
    not_run_when="no GPU with cuDNN, or no convolutions",
    recommended=(True,),
    compiled=False,
    quiet=True,
)


def irrelevant(knob: Knob, value: object, caps: TorchCapabilities) -> str | None:
    if not (caps.cudnn and caps.convolutions):
        why = "the model has no convolutions" if caps.cudnn else "there is no GPU with cuDNN"
        return f"cudnn_benchmark=True: cuDNN times convolution algorithms, and {why}"
    return None


FAMILY = Family[TorchCapabilities]((CUDNN_BENCHMARK,), irrelevant)
