"""`optimizer`: the workload's optimizer as given, or rebuilt with its multi-tensor or fused kernels."""

from __future__ import annotations

from autotuner.backends._base import Family
from autotuner.backends.pytorch.capabilities import TorchCapabilities
from autotuner.config.knobs import Knob

OPTIMIZER = Knob(
    "optimizer",
    "your optimizer, or the same class rebuilt over the same parameter groups and hyperparameters with "
    "`foreach=True` (multi-tensor kernels) or `fused=True` (one kernel)",
    ("as-given", "foreach", "fused"),
    "as-given",
    not_run_when="the optimizer's class takes no such argument, or (fused) its fused kernel fails on the device",
    recommended=("fused",),
    quiet=True,
)


def irrelevant(knob: Knob, value: object, caps: TorchCapabilities) -> str | None:
    if not getattr(caps, f"{value}_optimizer"):
        return f"optimizer={value}: the workload's optimizer takes no {value}=True on this device"
    return None


FAMILY = Family[TorchCapabilities]((OPTIMIZER,), irrelevant)
