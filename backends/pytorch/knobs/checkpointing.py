"""`checkpointing`: activation checkpointing of the model's repeated blocks."""

from __future__ import annotations

from autotuner.backends._base import Family
from autotuner.backends.pytorch.capabilities import TorchCapabilities
from autotuner.config.knobs import Knob

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


FAMILY = Family[TorchCapabilities]((CHECKPOINTING,), irrelevant)
