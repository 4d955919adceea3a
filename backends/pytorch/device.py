"""Where a PyTorch run computes, shared by training (`autotuner.backends.pytorch.apply`) and serving
(`autotuner.backends.pytorch.serving`): the device a config names, the matmul precision it sets
process-wide, and a user's batch moved onto the device. Importing it does not initialise CUDA."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar, cast

import torch

B = TypeVar("B")
"""A batch of any structure: `to_device` returns it as it was given, its tensors moved."""


def resolve_device(spec: str | torch.device | None) -> torch.device:
    """`auto` (or None): cuda:0 if there is a GPU, else the CPU; otherwise a checked cpu/cuda device."""
    spec = "auto" if spec is None else str(spec)
    if spec == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {spec!r}: CUDA is not available here")
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise ValueError(f"device {spec!r}: only {torch.cuda.device_count()} CUDA device(s) visible")
        return torch.device("cuda", index)
    if device.type != "cpu":
        raise ValueError(f"device {spec!r}: the pytorch backend runs on cpu or cuda")
    return device


def set_matmul_precision(precision: str) -> None:
    """TF32 matmuls and convolutions for `tf32`, strict fp32 for every other precision (process-wide)."""
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


@contextlib.contextmanager
def strict_fp32() -> Iterator[None]:
    """Strict fp32 matmuls and convolutions inside (no TF32, whatever the config set), restored after:
    an evaluation that compares weights must not mix in the evaluation's own numerics."""
    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
    )
    set_matmul_precision("fp32")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])


def to_device(value: B, device: torch.device, *, non_blocking: bool = False, channels_last: bool = False) -> B:
    """`value` with every tensor in it on `device` (see `TunedTraining.to_device`), each container
    rebuilt as its own type; with `channels_last`, its 4-D floating-point tensors (images) in that
    layout."""
    return cast(B, _moved(value, device, non_blocking, channels_last))  # the same structure, so the same type


def _moved(value: object, device: torch.device, non_blocking: bool, channels_last: bool) -> object:
    if isinstance(value, torch.Tensor):
        if channels_last and value.dim() == 4 and value.is_floating_point():
            return value.to(device, non_blocking=non_blocking, memory_format=torch.channels_last)
        return value.to(device, non_blocking=non_blocking)
    move = functools.partial(_moved, device=device, non_blocking=non_blocking, channels_last=channels_last)
    if isinstance(value, Mapping):
        moved = {k: move(v) for k, v in value.items()}
        return moved if type(value) is dict else _rebuilt(value, moved)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple: built from its fields
        namedtuple: Callable[..., object] = type(value)
        return namedtuple(*(move(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(move(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: move(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **changes)
    return value


def _rebuilt(mapping: Mapping[object, object], items: dict[object, object]) -> object:
    """A mapping of `mapping`'s type holding `items` (an OrderedDict, a Hugging Face `BatchEncoding`),
    or a plain dict where that type cannot be built from a dict."""
    rebuild: Callable[..., object] = type(mapping)  # whether it takes a dict is known by calling it
    try:
        return rebuild(items)
    except TypeError:
        return items
