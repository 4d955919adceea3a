"""The runtimes a served PyTorch model runs on (`Runtime`, `autotuner.backends.pytorch.runtimes._base`),
by the `runtime` knob's values."""

from __future__ import annotations

from autotuner.backends.pytorch.runtimes._base import Runtime, Session, model_inputs, primary_output
from autotuner.backends.pytorch.runtimes.eager import PYTORCH
from autotuner.backends.pytorch.runtimes.onnxruntime import ONNX_RUNTIME

RUNTIMES: tuple[Runtime, ...] = (PYTORCH, ONNX_RUNTIME)


def runtime_named(value: str) -> Runtime:
    """The runtime that serves the `runtime` knob's `value`."""
    for runtime in RUNTIMES:
        if value in runtime.values:
            return runtime
    raise ValueError(f"runtime={value}: no such runtime (offered: {', '.join(v for r in RUNTIMES for v in r.values)})")


__all__ = ["RUNTIMES", "Runtime", "Session", "model_inputs", "primary_output", "runtime_named"]
