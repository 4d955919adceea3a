"""`compile`: the model under `torch.compile` in one of its modes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotuner.backends.pytorch.capabilities import TorchCapabilities
from autotuner.backends.pytorch.knobs._family import Build, TorchFamily
from autotuner.config.knobs import Knob

if TYPE_CHECKING:
    import torch

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


MODES = {"default": None, "reduce-overhead": "reduce-overhead", "max-autotune": "max-autotune"}
"""`torch.compile`'s `mode` argument for each value but `none`."""
CUDA_GRAPH_MODES = frozenset({"reduce-overhead", "max-autotune"})
"""Compile modes that capture CUDA graphs on a GPU (inductor's `triton.cudagraphs`)."""


def uses_cuda_graphs(mode: str, device: torch.device) -> bool:
    """Whether `torch.compile` with `mode` captures CUDA graphs on `device`."""
    return device.type == "cuda" and mode in CUDA_GRAPH_MODES


def compiled(model: torch.nn.Module, mode: str) -> torch.nn.Module:
    """`model` under `torch.compile` with `mode` (itself for `none`, or where it is compiled
    already: the runner's drift phase compiles once)."""
    if mode == "none":
        return model
    import torch
    from torch._dynamo.eval_frame import OptimizedModule

    if isinstance(model, OptimizedModule):
        return model
    wrapped: torch.nn.Module = torch.compile(model, mode=MODES[mode])  # type: ignore[assignment]
    return wrapped


def apply(build: Build) -> None:
    """The model compiled. Where the mode captures CUDA graphs, every forward starts a new graph
    step, and with accumulation the gradients are kept in place (see
    `autotuner.backends.pytorch.apply`)."""
    mode = COMPILE.of(build.config)
    build.model = compiled(build.model, mode)
    if uses_cuda_graphs(mode, build.device):
        import torch

        build.mark_step = torch.compiler.cudagraph_mark_step_begin
        build.keep_grads = build.accumulation > 1


FAMILY = TorchFamily((COMPILE,), irrelevant, apply=apply)
