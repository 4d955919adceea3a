"""Workloads for the study-level tests: small, and failing in ways a study must absorb."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from autotuner.backends.pytorch.workload import TorchWorkload
from autotuner.backends.pytorch.workloads import mlp


class _MemoryCeiling(nn.Module):
    """A linear layer that runs out of memory, with the real exception type, from a batch size up."""

    def __init__(self, ceiling: int):
        super().__init__()
        self.ceiling = ceiling
        self.linear = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] >= self.ceiling:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {x.shape[0]} rows (ceiling {self.ceiling})"
            )
        return self.linear(x)


def memory_ceiling(ceiling: int = 32, samples: int = 512) -> TorchWorkload:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(samples, 16, generator=generator)
    labels = torch.randint(4, (samples,), generator=generator)
    return TorchWorkload(
        model=_MemoryCeiling(ceiling),
        dataset=torch.utils.data.TensorDataset(inputs, labels),
        loss_fn=F.cross_entropy,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
    )


# ---------------------------------------------------------------- many workers, kill -9


class _TrainingLog:
    """A forward pre-hook: the first forward pass of each process appends its pid to
    `folder`/trained (one short O_APPEND write: concurrent processes never mix lines), so the file
    counts the processes that trained (the probe builds a workload but never trains it). The
    `hang_at`-th of them (from 1) writes `hang-<pid>` and hangs there."""

    def __init__(self, folder: str, hang_at: int | None = None):
        self.folder, self.hang_at, self.pid = Path(folder), hang_at, 0

    def __call__(self, module: nn.Module, args: Any) -> None:
        if self.pid == os.getpid():
            return
        self.pid = os.getpid()
        with open(self.folder / "trained", "a") as log:
            log.write(f"{self.pid}\n")
        if len((self.folder / "trained").read_text().splitlines()) == self.hang_at:
            (self.folder / f"hang-{self.pid}").touch()
            time.sleep(3600)


def counted_mlp(folder: str, **mlp_args: Any) -> TorchWorkload:
    """The built-in MLP; every process that trains it is logged in `folder`/trained."""
    workload = mlp(**mlp_args)
    workload.model.register_forward_pre_hook(_TrainingLog(folder))
    return workload


class _PidDataset(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Writes `loader-<parent pid>-<pid>` into `folder` from each data-loader worker that reads it."""

    def __init__(self, folder: str, samples: int):
        generator = torch.Generator().manual_seed(0)
        self.inputs = torch.randn(samples, 16, generator=generator)
        self.labels = torch.randint(4, (samples,), generator=generator)
        self.folder = folder
        self.owner = os.getpid()

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if os.getpid() != self.owner:  # a loader worker
            self.owner = os.getpid()
            (Path(self.folder) / f"loader-{os.getppid()}-{os.getpid()}").touch()
        return self.inputs[index], self.labels[index]


def hang_once(folder: str, hang_at: int, samples: int = 256) -> TorchWorkload:
    """A small linear model whose `hang_at`-th training process (logged as `counted_mlp` logs)
    hangs in its first forward pass, its data-loader workers running (`loader-<pid>-<worker pid>`)."""
    model = nn.Linear(16, 4)
    model.register_forward_pre_hook(_TrainingLog(folder, hang_at))
    return TorchWorkload(
        model=model,
        dataset=_PidDataset(folder, samples),
        loss_fn=F.cross_entropy,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
    )
