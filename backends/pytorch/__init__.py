"""The PyTorch backend, engine side: knobs, built-in workloads, what a device can honour.

The trial-process half is `autotuner.backends.pytorch.runner`; user workloads return a
`autotuner.backends.pytorch.workload.TorchWorkload`.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotuner.backends._base import Backend, Capabilities, capability
from autotuner.knobs import COMMON_KNOBS, Config, Knob, knob_table

COMPILE = Knob(
    "compile",
    "torch.compile mode",
    ("none", "default", "reduce-overhead", "max-autotune"),
    "none",
    recommended=("default", "max-autotune", "reduce-overhead"),
)

COMPILE_TIMEOUT_FACTOR = {"none": 1.0, "default": 2.0, "reduce-overhead": 2.0, "max-autotune": 4.0}
"""A trial's default timeout per compile mode, in default timeouts: max-autotune benchmarks
candidate kernels for every matmul and convolution, which on a large model takes minutes."""


@dataclass(frozen=True)
class TorchCapabilities(Capabilities):
    compile: bool = capability("torch.compile")
    """torch.compile can build kernels here (a working inductor backend)."""
    cuda_graphs: bool = capability("CUDA graphs")


class PyTorchBackend(Backend):
    name = "pytorch"
    runner = "autotuner.backends.pytorch.runner"
    knobs = knob_table(*COMMON_KNOBS, COMPILE)
    capabilities_type = TorchCapabilities
    builtin_workloads = {
        "mlp": "autotuner.backends.pytorch.workloads:mlp",
        "cnn": "autotuner.backends.pytorch.workloads:cnn",
        "gpt": "autotuner.backends.pytorch.workloads:gpt",
        "resnet": "autotuner.backends.pytorch.workloads:resnet",
    }
    default_space = "pytorch"
    requires = ("torch",)
    install = "pip install torch"

    def timeout_factor(self, config: Config) -> float:
        return COMPILE_TIMEOUT_FACTOR[config.get("compile", "none")]

    def unsupported_reason(self, config: Config, capabilities: Capabilities) -> str | None:
        precision = self.unsupported_precision(config.get("precision", "fp32"), capabilities)
        if precision:
            return precision
        mode = config.get("compile", "none")
        # a plain `Capabilities` (no probe of torch's) has neither
        if mode != "none" and not getattr(capabilities, "compile", False):
            return f"compile={mode}: torch.compile cannot build kernels here"
        if mode == "reduce-overhead" and not getattr(capabilities, "cuda_graphs", False):
            return "compile=reduce-overhead: CUDA graphs need a CUDA device"
        return None


PYTORCH = PyTorchBackend()

__all__ = ["COMPILE", "PYTORCH", "PyTorchBackend", "TorchCapabilities"]
