"""`checkpointing`: activation checkpointing of the model's repeated blocks."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from autotuner.backends.pytorch.capabilities import TorchCapabilities
from autotuner.backends.pytorch.knobs._family import Build, TorchFamily
from autotuner.config.knobs import Knob
from autotuner.trials.outcomes import Unsupported

if TYPE_CHECKING:
    import torch

CHECKPOINTING = Knob(
    "checkpointing",
    "activation checkpointing (non-reentrant) of the model's blocks: a Hugging Face model's own, the types "
    "`TorchWorkload.checkpoint_blocks` names, or else the largest module type the model repeats; less memory for "
    "a larger micro-batch",
    ("none", "blocks"),
    "none",
    not_run_when="no Hugging Face checkpointing, no `checkpoint_blocks`, and no module type repeated (layers and "
    "`nn.Sequential` aside)",
    memory_order=("blocks", "none"),
    quiet=True,
)


def irrelevant(knob: Knob, value: object, caps: TorchCapabilities) -> str | None:
    if not caps.checkpoint_blocks:
        return "checkpointing=blocks: the model has no repeated blocks (name them: TorchWorkload.checkpoint_blocks)"
    return None


def _checkpointed(forward: Callable[..., object], *args: object, **kwargs: Any) -> object:
    import torch.utils.checkpoint

    return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)


def enable_checkpointing(model: torch.nn.Module, blocks: Sequence[type[torch.nn.Module]] | None = None) -> None:
    """Activation checkpointing of `model`'s blocks: instances of `blocks`, or where None, a Hugging
    Face model's own gradient checkpointing, or else the largest module type it repeats
    (`autotuner.backends.pytorch.modules.repeated_blocks`). Each block's forward keeps only its
    inputs and recomputes the rest in the backward (non-reentrant `torch.utils.checkpoint`).
    Applying it twice changes nothing. `Unsupported` when the model has no such blocks."""
    from autotuner.backends.pytorch.modules import is_hugging_face, repeated_blocks

    if not blocks and is_hugging_face(model) and getattr(model, "supports_gradient_checkpointing", False):
        # transformers 5 renamed it activation checkpointing (the old names warn)
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            if not model.is_activation_checkpointing:
                model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)  # type: ignore[operator]
        elif not model.is_gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # type: ignore[operator]
        return
    kinds = tuple(blocks or ()) or repeated_blocks(model)
    if not kinds:
        raise Unsupported("checkpointing=blocks: the model repeats no block (name them: checkpoint_blocks)")
    for module in model.modules():
        if isinstance(module, kinds) and not getattr(module, "_autotuner_checkpointed", False):
            module.forward = functools.partial(_checkpointed, module.forward)  # type: ignore[method-assign]
            module._autotuner_checkpointed = True  # type: ignore[assignment]


@contextlib.contextmanager
def without_checkpointing(model: torch.nn.Module) -> Iterator[None]:
    """`model` without the activation checkpointing `enable_checkpointing` gave it, put back after:
    its blocks run their own forward and keep what the backward needs (the model FLOPs are counted
    so, without the backward's recomputed forwards)."""
    from autotuner.backends.pytorch.modules import is_hugging_face

    blocks: list[tuple[torch.nn.Module, functools.partial[object]]] = [
        (m, m.forward)
        for m in model.modules()
        if isinstance(m.forward, functools.partial) and m.forward.func is _checkpointed
    ]
    # transformers 5 renamed it activation checkpointing; reading the old name warns
    renamed = hasattr(model, "activation_checkpointing_enable")
    flag = "is_activation_checkpointing" if renamed else "is_gradient_checkpointing"
    hugging_face = is_hugging_face(model) and bool(getattr(model, flag, False))
    try:
        for module, checkpointed in blocks:
            module.forward = checkpointed.args[0]  # type: ignore[method-assign]
        if hugging_face:
            disable: Callable[[], None] | None = getattr(model, "activation_checkpointing_disable", None)
            (disable or model.gradient_checkpointing_disable)()  # type: ignore[operator]
        yield
    finally:
        for module, checkpointed in blocks:
            module.forward = checkpointed  # type: ignore[method-assign]
        if hugging_face:
            enable_checkpointing(model)


def apply(build: Build) -> None:
    if CHECKPOINTING.of(build.config) == "blocks":
        enable_checkpointing(build.module, build.checkpoint_blocks)


FAMILY = TorchFamily((CHECKPOINTING,), irrelevant, apply=apply)
