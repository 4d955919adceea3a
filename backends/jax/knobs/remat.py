"""`remat`: `jax.checkpoint` of the loss's marked blocks, and what the backward recomputes."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from autotuner.backends.jax.capabilities import JaxCapabilities
from autotuner.backends.jax.knobs._family import Build, JaxFamily
from autotuner.config.knobs import Knob

if TYPE_CHECKING:
    import jax

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


def checkpointed(loss_fn: Callable[[Any, Any], jax.Array], remat: str) -> Callable[[Any, Any], jax.Array]:
    """`loss_fn` with its `remat_block`s checkpointed under the `remat` value's policy, or, when its
    first call marks none, all of it as one checkpoint (the first call decides: a trace under jit,
    one more forward pass eagerly)."""
    if remat == "none":
        return loss_fn
    import jax

    from autotuner.backends.jax.workload import REMAT_POLICIES, remat_scope

    whole = jax.checkpoint(loss_fn, policy=REMAT_POLICIES[remat])
    marks_blocks: list[bool] = []

    def loss(params: Any, batch: Any) -> jax.Array:
        if not marks_blocks or marks_blocks[0]:
            with remat_scope(remat) as scope:
                value = loss_fn(params, batch)
            if not marks_blocks:
                marks_blocks.append(scope.marked)
            if scope.marked:
                return value
        return whole(params, batch)

    return loss


def apply(build: Build) -> None:
    """The loss checkpointed as `remat` says."""
    build.loss = checkpointed(build.loss, REMAT.of(build.config))


FAMILY = JaxFamily((REMAT,), irrelevant, apply=apply)
