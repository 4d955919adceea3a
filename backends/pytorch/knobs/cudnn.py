"""`cudnn_benchmark`: cuDNN times its convolution algorithms and keeps the fastest."""

from __future__ import annotations

from collections.abc import Mapping

from autotuner.backends.pytorch.capabilities import TorchCapabilities
from autotuner.backends.pytorch.knobs._family import Build, TorchFamily
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


def apply(build: Build) -> None:
    import torch

    torch.backends.cudnn.benchmark = bool(CUDNN_BENCHMARK.of(build.config))


def setup(config: Mapping[str, object]) -> list[str]:
    if not CUDNN_BENCHMARK.of(config):
        return []
    return ["torch.backends.cudnn.benchmark = True  # cudnn_benchmark: cuDNN times its convolutions"]


FAMILY = TorchFamily((CUDNN_BENCHMARK,), irrelevant, apply=apply, setup=setup)
