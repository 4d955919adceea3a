"""Workloads that misbehave on purpose, for the trial-process tests.

Each factory builds a real `TorchWorkload` (a tiny MLP on a small `TensorDataset`) whose model
misbehaves when its forward runs, or a factory that fails by itself. They are imported by path
(`tests.faulty_workloads:NAME`) in trial processes, exactly as a user's workload would be.
"""

from __future__ import annotations

import os
import resource
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from backends.pytorch.workload import TorchWorkload

FEATURES = 8
CLASSES = 3


def _no_core_dump() -> None:
    """A deliberate crash must not leave a core file behind."""
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ValueError, OSError):
        pass


class _Misbehaving(nn.Module):
    """A tiny MLP whose forward first does `act` (once per forward)."""

    def __init__(self, act: Callable[[torch.Tensor], torch.Tensor | None] | None = None):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.act is not None:
            replaced = self.act(x)
            if replaced is not None:
                return replaced
        return self.net(x)


class _RecordingDataset(torch.utils.data.Dataset):
    """A TensorDataset that, in a data-loader worker, writes the worker's pid to `pid_dir` (and,
    with `hang_in_worker`, then sleeps for an hour: a worker that never exits by itself)."""

    def __init__(self, inputs: torch.Tensor, labels: torch.Tensor, pid_dir: str | None, hang_in_worker: bool = False):
        self.inputs, self.labels, self.pid_dir, self.hang_in_worker = inputs, labels, pid_dir, hang_in_worker

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.pid_dir is not None and torch.utils.data.get_worker_info() is not None:
            marker = Path(self.pid_dir) / f"worker-{os.getpid()}"
            if not marker.exists():
                marker.write_text(f"{os.getpid()} {os.getpgrp()}\n")
            if self.hang_in_worker:
                time.sleep(3600)
        return self.inputs[index], self.labels[index]


def _workload(
    model: nn.Module, samples: int = 64, pid_dir: str | None = None, hang_in_worker: bool = False
) -> TorchWorkload:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(samples, FEATURES, generator=generator)
    labels = torch.randint(CLASSES, (samples,), generator=generator)
    return TorchWorkload(
        model=model,
        dataset=_RecordingDataset(inputs, labels, pid_dir, hang_in_worker),
        heldout=torch.utils.data.TensorDataset(inputs[:16], labels[:16]),
        loss_fn=F.cross_entropy,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
    )


# ---------------------------------------------------------------- the factories


def ok(samples: int = 64) -> TorchWorkload:
    """A healthy tiny workload."""
    return _workload(_Misbehaving(), samples)


def segfault(samples: int = 64) -> TorchWorkload:
    def act(x: torch.Tensor) -> None:
        _no_core_dump()
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(60)  # the signal is delivered before this returns

    return _workload(_Misbehaving(act), samples)


def abort(samples: int = 64) -> TorchWorkload:
    def act(x: torch.Tensor) -> None:
        _no_core_dump()
        os.abort()

    return _workload(_Misbehaving(act), samples)


def hang(samples: int = 64, pid_dir: str | None = None, where: str = "forward") -> TorchWorkload:
    """Sleeps for an hour: in the model's forward (`where="forward"`), or in every data-loader
    worker (`where="loader"`, with workers > 0; the trial process then waits for data forever).
    With `pid_dir`, the factory writes `trial` there (the trial process's pid and process group)
    and each data-loader worker writes `worker-<pid>` (its pid and group) first."""
    if where not in ("forward", "loader"):
        raise ValueError(f"where: forward or loader, not {where!r}")
    if pid_dir is not None:
        path = Path(pid_dir) / "trial"
        path.with_suffix(".tmp").write_text(f"{os.getpid()} {os.getpgrp()}\n")
        path.with_suffix(".tmp").rename(path)

    def act(x: torch.Tensor) -> None:
        time.sleep(3600)

    if where == "loader":
        return _workload(_Misbehaving(), samples, pid_dir, hang_in_worker=True)
    return _workload(_Misbehaving(act), samples, pid_dir)


def oom(samples: int = 64) -> TorchWorkload:
    def act(x: torch.Tensor) -> None:
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.10 GiB total capacity)"
        )

    return _workload(_Misbehaving(act), samples)


def nan(samples: int = 64) -> TorchWorkload:
    def act(x: torch.Tensor) -> torch.Tensor:
        return torch.full((x.shape[0], CLASSES), float("nan"), requires_grad=True)

    return _workload(_Misbehaving(act), samples)


def raises_in_factory(samples: int = 64) -> TorchWorkload:
    raise ValueError(f"the factory refuses to build (samples={samples})")


def wrong_return(samples: int = 64) -> Any:
    return "not a workload"


def exit_code(samples: int = 64, code: int = 3) -> TorchWorkload:
    def act(x: torch.Tensor) -> None:
        os._exit(code)

    return _workload(_Misbehaving(act), samples)


class _TransformedDataset(torch.utils.data.Dataset):
    def __init__(self, inputs: torch.Tensor, labels: torch.Tensor, transform: Callable[[torch.Tensor], torch.Tensor]):
        self.inputs, self.labels, self.transform = inputs, labels, transform

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.transform(self.inputs[index]), self.labels[index]


def lambda_transform(samples: int = 64) -> TorchWorkload:
    """Healthy, but its dataset holds a lambda (as user datasets often do): it cannot be pickled,
    which a data-loader worker started by fork, Linux's default, never needs."""
    workload = _workload(_Misbehaving(), samples)
    base = workload.dataset
    workload.dataset = _TransformedDataset(base.inputs, base.labels, lambda x: x * 2.0)
    return workload
