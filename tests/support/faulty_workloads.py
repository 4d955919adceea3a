"""Workloads that misbehave on purpose, for the trial-process tests.

Each factory builds a real `TorchWorkload` (a tiny MLP on a small `TensorDataset`) whose model
misbehaves when its forward runs, or a factory that fails by itself. They are imported by path
(`tests.support.faulty_workloads:NAME`) in trial processes, exactly as a user's workload would be.
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

from autotuner.backends.pytorch.workload import TorchWorkload

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


def wrong_features(samples: int = 64) -> TorchWorkload:
    """A model that takes one feature more than the dataset's items hold: its first forward fails."""
    return _workload(nn.Linear(FEATURES + 1, CLASSES), samples)


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


# ---------------------------------------------------------------- one workload, a fault per config


def _result_pipe() -> int:
    """The file descriptor this trial process sends its result on (the writable end of the
    launcher's pipe), found the way any code in the process could find it."""
    import gc
    import multiprocessing.connection

    for obj in gc.get_objects():
        if isinstance(obj, multiprocessing.connection.Connection) and obj.writable and not obj.closed:
            return obj.fileno()
    raise RuntimeError("no result pipe in this process")


def _precision_seen() -> str:
    """The precision a forward runs in, as a config sets it: fp32, or bf16/fp16 autocast."""
    if torch.is_autocast_enabled("cpu"):
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}[torch.get_autocast_dtype("cpu")]
    return "fp32"


def _fault(kind: str, x: torch.Tensor, allocate_mb: int) -> torch.Tensor | None:
    if kind == "segfault":
        _no_core_dump()
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(60)
    elif kind == "abort":
        _no_core_dump()
        os.abort()
    elif kind == "hang":
        time.sleep(3600)
    elif kind == "oom":
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (injected)")
    elif kind == "allocate":  # never touched: any machine grants it, a memory limit on the process does not
        torch.empty(allocate_mb * 2**20, dtype=torch.uint8)
    elif kind == "nan":
        return torch.full((x.shape[0], CLASSES), float("nan"), requires_grad=True)
    elif kind == "garbage":  # bytes that are no message where the result goes; then carry on
        os.write(_result_pipe(), b"this is not a message\n")
    elif kind == "garbage_hang":  # the start of a message that never ends
        os.write(_result_pipe(), (1000).to_bytes(8, "big") + b"partial")
        time.sleep(3600)
    elif kind == "exit":
        os._exit(3)
    elif kind == "error":
        raise KeyError(f"user code failed on a batch of {x.shape[0]} [/] (not markup)")
    else:
        raise ValueError(f"unknown fault {kind!r}")
    return None


FAULTS = ("segfault", "abort", "hang", "oom", "allocate", "nan", "garbage", "garbage_hang", "exit", "error")


def by_config(
    faults: dict[str, str],
    samples: int = 128,
    allocate_mb: int = 1536,
    state_dir: str | None = None,
    fail_call: int = 0,
) -> TorchWorkload:
    """A healthy tiny workload that misbehaves for the configs named in `faults`, so that one study
    meets every fault in turn: keys `<precision>/<micro-batch>` (the precision the forward runs
    in: fp32, bf16 or fp16), values from FAULTS (`allocate` asks for `allocate_mb` MiB). With
    `state_dir`, the factory counts its calls there and raises on call number `fail_call` (1 is
    the first): a factory that fails once. The faults strike in forwards that compute gradients,
    the trials' training steps: not in the probe's check of the first two items, which is no
    config's."""
    for kind in faults.values():
        if kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r}; choose from {', '.join(FAULTS)}")
    if state_dir is not None:
        calls = Path(state_dir) / "calls"
        count = int(calls.read_text()) + 1 if calls.exists() else 1
        calls.write_text(str(count))
        if count == fail_call:
            raise ValueError(f"the factory failed on call {count} (injected)")

    def act(x: torch.Tensor) -> torch.Tensor | None:
        if not torch.is_grad_enabled():
            return None
        kind = faults.get(f"{_precision_seen()}/{x.shape[0]}")
        return _fault(kind, x, allocate_mb) if kind else None

    workload = _workload(_Misbehaving(act), samples)
    # declared, so that no FLOP count (a forward of 2 samples after the measured phase) meets
    # batch 2's fault in every config
    workload.flops_per_sample = 6.0 * sum(p.numel() for p in workload.model.parameters())
    return workload


# ---------------------------------------------------------------- the GPU path's fixes, on the CPU


def records_forwards(folder: str, oom_at: int = 0, samples: int = 64) -> TorchWorkload:
    """A healthy tiny workload whose model appends each forward's batch size, and the matmul
    precision flags it runs under, to `folder`/forwards (one line per forward); with `oom_at`, the
    forward of that number (1 is the first) raises torch's out-of-memory error."""
    log = Path(folder) / "forwards"

    def act(x: torch.Tensor) -> None:
        with log.open("a") as out:
            flags = (
                torch.get_float32_matmul_precision(),
                torch.backends.cuda.matmul.allow_tf32,
                torch.backends.cudnn.allow_tf32,
                torch.is_grad_enabled(),
            )
            out.write(f"{x.shape[0]} {' '.join(map(str, flags))}\n")
        if oom_at and len(log.read_text().splitlines()) == oom_at:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")

    return _workload(_Misbehaving(act), samples)


# ---------------------------------------------------------------- a fault on one rank of several


def on_rank(fault: str, rank: int = 1, samples: int = 64) -> TorchWorkload:
    """Healthy on every rank of a trial of several processes but `rank`, where the forward does
    `fault`: `crash` (SIGKILL, no word), `raise` (a ValueError), `hang` (sleeps for an hour, its
    peers waiting in their all-reduce), `oom` (torch's out-of-memory error), `nan` (NaN inputs,
    so a NaN loss and NaN gradients) or `count` (a ValueError while the trial counts the model's
    FLOPs only, after its windows were measured)."""
    faults: dict[str, Callable[[torch.Tensor], torch.Tensor | None]] = {
        "crash": lambda x: _raise(None),
        "raise": lambda x: _raise(ValueError("this rank's forward fails")),
        "count": lambda x: _raise(ValueError("this rank cannot be counted")) if _counting_flops() else None,
        "hang": lambda x: _raise(None, sleep_s=3600),
        "oom": lambda x: _raise(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")),
        "nan": _poison,
    }
    act = faults[fault]

    def on_this_rank(x: torch.Tensor) -> torch.Tensor | None:
        return act(x) if torch.distributed.is_initialized() and torch.distributed.get_rank() == rank else None

    return _workload(_Misbehaving(on_this_rank), samples)


def _counting_flops() -> bool:
    """Whether torch's FLOP counter is counting this forward."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    from torch.utils.flop_counter import _FlopCounterMode

    return any(isinstance(mode, _FlopCounterMode) for mode in _get_current_dispatch_mode_stack())


def _raise(exc: BaseException | None, sleep_s: float = 0) -> None:
    """Raise `exc`; None: sleep `sleep_s` (a hang), or with no sleep die by SIGKILL."""
    if exc is not None:
        raise exc
    if sleep_s:
        time.sleep(sleep_s)
    os.kill(os.getpid(), signal.SIGKILL)


def _poison(x: torch.Tensor) -> None:
    """NaN inputs: the loss and every gradient are NaN (and all-reduced to the other ranks)."""
    x.mul_(float("nan"))
