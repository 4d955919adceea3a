"""What a PyTorch workload factory returns.

A factory is a function named in the spec by import path (`package.module:function`); it is
called in every trial process with the spec's `workload_args` as keyword arguments, after the
random seeds are fixed, and returns a `TorchWorkload`:

    from autotuner.backends.pytorch.workload import TorchWorkload

    def my_job(hidden: int = 512) -> TorchWorkload:
        return TorchWorkload(
            model=MyModel(hidden),                 # built on the CPU; the backend moves it
            dataset=MyDataset(),                   # map-style: dataset[i] -> (inputs, target)
            loss_fn=torch.nn.functional.cross_entropy,   # loss_fn(model(inputs), target)
            optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        )

The backend owns everything the knobs change: the device, autocast and the gradient scaler,
torch.compile, the DataLoader (batch size, workers, pinning) and gradient accumulation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class TorchWorkload:
    model: torch.nn.Module
    dataset: torch.utils.data.Dataset[Any]
    """Map-style, with a length; each item is `(inputs, target)`. Must give the same item for the
    same index in every process (per-index randomness only), so drift compares like with like."""
    loss_fn: Callable[[Any, Any], torch.Tensor]
    optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
    """A factory: the backend builds a fresh optimizer for each phase of a trial."""
    heldout: torch.utils.data.Dataset[Any] | None = None
    """The fixed batch drift is measured on; default: the dataset's last 256 items."""
    tokens_per_sample: int | None = None
    """Set it to get tokens/s as well as samples/s."""
    flops_per_sample: float | None = None
    """Training FLOPs (forward and backward) per sample; with it, MFU is reported on GPUs."""


def as_workload(built: Any, ref: str) -> TorchWorkload:
    """Check what a factory returned; a 4-tuple (model, dataset, loss_fn, optimizer) is accepted."""
    if isinstance(built, tuple) and len(built) == 4:
        built = TorchWorkload(*built)
    if not isinstance(built, TorchWorkload):
        raise TypeError(f"workload factory {ref} returned {type(built).__name__}, expected a TorchWorkload")
    if not isinstance(built.model, torch.nn.Module):
        raise TypeError(f"workload factory {ref}: model is {type(built.model).__name__}, not a torch.nn.Module")
    if not hasattr(built.dataset, "__getitem__") or not hasattr(built.dataset, "__len__"):
        raise TypeError(f"workload factory {ref}: dataset must be map-style (__getitem__ and __len__)")
    if not callable(built.loss_fn) or not callable(built.optimizer):
        raise TypeError(f"workload factory {ref}: loss_fn and optimizer must be callables")
    return built
