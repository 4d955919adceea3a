"""`compile`: the model under `torch.compile` in one of its modes."""

from __future__ import annotations

from autotuner.backends._base import Family
from autotuner.backends.pytorch.capabilities import TorchCapabilities
from autotuner.config.knobs import Knob

COMPILE = Knob(
    "compile",
    "`torch.compile(model, mode=...)` (`reduce-overhead` captures CUDA graphs)",
    ("none", "default", "reduce-overhead", "max-autotune"),
    "none",
    not_run_when="torch.compile cannot build kernels here; `reduce-overhead` without CUDA; serving on an ONNX runtime",
    recommended=("default", "max-autotune", "reduce-overhead"),
)
TIMEOUT_FACTOR = {"none": 1.0, "default": 2.0, "reduce-overhead": 2.0, "max-autotune": 4.0}
"""A trial's default timeout per compile mode, in default timeouts: max-autotune benchmarks
candidate kernels for every matmul and convolution, which on a large model takes minutes."""


def irrelevant(knob: Knob, value: object, caps: TorchCapabilities) -> str | None:
    if not caps.compile:
        return f"compile={value}: torch.compile cannot build kernels here"
    if value == "reduce-overhead" and not caps.cuda_graphs:
        return "compile=reduce-overhead: CUDA graphs need a CUDA device"
    return None


FAMILY = Family[TorchCapabilities]((COMPILE,), irrelevant)
