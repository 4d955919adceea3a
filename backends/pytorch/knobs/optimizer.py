"""`optimizer`: the workload's optimizer as given, or rebuilt with its multi-tensor or fused kernels."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from autotuner.backends.pytorch.capabilities import TorchCapabilities
from autotuner.backends.pytorch.knobs._family import Build, TorchFamily
from autotuner.config.knobs import Knob
from autotuner.trials.outcomes import Unsupported

if TYPE_CHECKING:
    import torch

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


FLAGS = ("foreach", "fused")


def rebuilt_optimizer(optimizer: torch.optim.Optimizer, choice: str) -> torch.optim.Optimizer:
    """`optimizer` for the `optimizer` knob: itself for `as-given`; for `foreach` or `fused`, a new
    optimizer of its class over its parameter groups with the same hyperparameters and that flag on
    (the other off). Only an optimizer that has not stepped yet is rebuilt: its state would be lost.
    `Unsupported` when its class takes no such flag."""
    if choice == "as-given":
        return optimizer
    kind = type(optimizer)
    accepted = inspect.signature(kind.__init__).parameters
    if choice not in accepted:
        raise Unsupported(f"optimizer={choice}: {kind.__name__} takes no {choice} argument")
    if optimizer.state:
        raise ValueError(
            f"optimizer={choice} rebuilds the optimizer: pass one that has not stepped yet "
            "(then load its state into TunedTraining.optimizer)"
        )
    groups = [{k: v for k, v in group.items() if k not in FLAGS} for group in optimizer.param_groups]
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted and k not in FLAGS}
    flags: dict[str, Any] = {flag: flag == choice for flag in FLAGS if flag in accepted}
    try:
        return kind(groups, **defaults, **flags)
    except (RuntimeError, ValueError) as exc:  # e.g. fused kernels for this device or dtype do not exist
        raise Unsupported(f"optimizer={choice}: {kind.__name__} refused it: {exc}") from None


def apply(build: Build) -> None:
    build.optimizer = rebuilt_optimizer(build.optimizer, OPTIMIZER.of(build.config))


FAMILY = TorchFamily((OPTIMIZER,), irrelevant, apply=apply)
