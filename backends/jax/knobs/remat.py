"""`remat`: `jax.checkpoint` of the loss's marked blocks, and what the backward recomputes."""

from __future__ import annotations

from autotuner.backends._base import Family
from autotuner.backends.jax.capabilities import JaxCapabilities
from autotuner.config.knobs import Knob

REMAT = Knob(
    "remat",
    "`jax.checkpoint` of the loss's marked blocks (else of the whole loss) with that `jax.checkpoint_policies` "
    "policy: the backward pass recomputes what the policy does not keep (full: everything; dots_saveable: all but "
    "matmul outputs; dots_with_no_batch_dims_saveable: all but the weights' matmul outputs)",
    ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable"),
    "none",
    quiet=True,
    not_run_when="`full` where the loss marks no `remat_block` (checkpointed whole, it keeps as much as none)",
    # No memory_order: the values rank by memory only where the loss marks its blocks. Checkpointed
    # whole, `full` keeps as much as none and the dots policies less (XLA on an H100), and on a CPU
    # XLA keeps more with any policy than with none: an out-of-memory trial rules out its value only.
)


def irrelevant(knob: Knob, value: object, caps: JaxCapabilities) -> str | None:
    if value == "full" and not caps.remat_blocks:
        return "remat=full: the loss marks no remat_block, and checkpointed whole it keeps as much memory as none"
    return None


FAMILY = Family[JaxCapabilities]((REMAT,), irrelevant)
