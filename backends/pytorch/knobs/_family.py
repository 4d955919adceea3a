"""A PyTorch knob family: its rules (`autotuner.backends._base.Family`) and what its knobs do to a
training run while `autotuner.backends.pytorch.apply.TunedTraining` builds it (`TorchFamily.apply`
on a `Build`). Imports no framework: a family's `apply` imports torch when it is called."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotuner.backends._base import Family
from autotuner.backends.pytorch.capabilities import TorchCapabilities

if TYPE_CHECKING:
    import torch
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel


def import_torchao(module: str) -> None:
    """Import torchao's `module` with its import-time warnings held back, in whatever process
    applies a config (a trial's own log filters them: `autotuner.backends.pytorch.process`):
    torchao logs each CUDA kernel library it cannot load on a machine without them, and torch's
    pytree a deprecation of an enum torchao registers; neither says anything about the config."""
    import importlib
    import logging

    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        importlib.import_module(module)
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _no_step() -> None:
    return None


@dataclass
class Build:
    """A `TunedTraining` as it is built: what the families' `apply` read and change, one family
    after another in `autotuner.backends.pytorch.knobs.APPLY`'s order."""

    config: Mapping[str, object]
    """The knob values (every knob of the table)."""
    device: torch.device
    model: torch.nn.Module
    """What the training loop calls: the model on its device, wrapped as the families go (DDP,
    torch.compile)."""
    wrapped: torch.nn.Module
    """The model without torch.compile's wrapper: DDP's wrapper where it was tuned before (the
    runner's drift phase), else the user's module."""
    module: torch.nn.Module
    """The user's model under the wrappers (FSDP2 shards it in place)."""
    optimizer: torch.optim.Optimizer
    accumulation: int
    parallel: str | None = None
    """`ddp` or `fsdp`: this process is one rank of several; None: one process."""
    checkpoint_blocks: Sequence[type[torch.nn.Module]] | None = None
    """The block types the workload names for checkpointing and sharding (None: found)."""
    attention: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext
    """The context the forward and the backward run in for the attention kernel."""
    ddp: DistributedDataParallel | None = None
    """DistributedDataParallel's wrapper, under `parallel: ddp`."""
    fsdp: FSDPModule | None = None
    """The module FSDP2 sharded (an `FSDPModule`), under `parallel: fsdp`."""
    channels_last: bool = False
    """4-D floating-point batches go to the device in the channels_last layout."""
    mark_step: Callable[[], None] = _no_step
    """Called before every forward: a new CUDA-graph step where torch.compile captures graphs."""
    keep_grads: bool = False
    """The gradients are allocated once and zeroed in place (CUDA graphs with accumulation)."""
    pin_memory: bool = False
    """The loader pins its batches, and they are copied to the device non-blocking."""
    after_step: Callable[[], None] = _no_step
    """Called after every optimizer step (float8's scales of the weights FSDP2 gathers in fp8)."""


def _nothing(build: Build) -> None:
    return None


def _no_lines(config: Mapping[str, object]) -> list[str]:
    return []


@dataclass(frozen=True)
class TorchFamily(Family[TorchCapabilities]):
    """A family of PyTorch's knobs: its rules; `apply`, what its knobs do to a training run as it
    is built (`Build`), called once per `TunedTraining` in `APPLY`'s order; and `setup`, the lines
    of Python that do the same in a trainer's snippet whose own arguments cannot
    (`autotuner.backends.pytorch.integrations.common_setup`)."""

    apply: Callable[[Build], None] = _nothing
    setup: Callable[[Mapping[str, object]], list[str]] = _no_lines
    """The lines for a config's values of its knobs (none at their reference values), each with a
    comment naming the knob; they run before the trainer is built, on `model` and `torch`."""
