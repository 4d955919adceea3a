"""What the PyTorch knobs ask of a model, whichever knob asks: whether it is a Hugging Face model
(it checkpoints and chooses its attention itself), the blocks it repeats (what checkpointing and
FSDP2's sharding take as units), and the user's module under the wrappers the knobs put round it."""

from __future__ import annotations

import collections

import torch

CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)


def is_hugging_face(model: torch.nn.Module) -> bool:
    """A transformers `PreTrainedModel`: it checkpoints and chooses its attention itself."""
    return callable(getattr(model, "gradient_checkpointing_enable", None)) and callable(
        getattr(model, "set_attn_implementation", None)
    )


def repeated_blocks(model: torch.nn.Module) -> tuple[type[torch.nn.Module], ...]:
    """The largest module type `model` holds at least twice, containers and layers without
    submodules aside (a transformer's blocks, a ResNet's residual blocks); empty when there is none."""
    counts = collections.Counter(type(m) for m in model.modules())
    first: dict[type[torch.nn.Module], torch.nn.Module] = {}
    for module in model.modules():
        first.setdefault(type(module), module)
    candidates = [
        kind
        for kind, count in counts.items()
        if count >= 2 and not issubclass(kind, CONTAINERS) and any(True for _ in first[kind].children())
    ]
    if not candidates:
        return ()
    return (max(candidates, key=lambda kind: sum(p.numel() for p in first[kind].parameters())),)


def uncompiled(model: torch.nn.Module) -> torch.nn.Module:
    """The module `torch.compile` wrapped, or `model` itself."""
    from torch._dynamo.eval_frame import OptimizedModule

    return model._orig_mod if isinstance(model, OptimizedModule) else model  # type: ignore[return-value]


def users_module(model: torch.nn.Module) -> torch.nn.Module:
    """The module DistributedDataParallel wraps, or `model` itself (FSDP2 shards a module in place)."""
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model
