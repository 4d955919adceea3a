"""`param_sharding`: under `parallel: data_parallel`, the parameters replicated or sharded over the devices."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from autotuner.backends.jax.capabilities import JaxCapabilities
from autotuner.backends.jax.knobs._family import Build, JaxFamily
from autotuner.config.knobs import Knob
from autotuner.trials.outcomes import Unsupported

if TYPE_CHECKING:
    from jax.sharding import Mesh, NamedSharding

PARAM_SHARDING = Knob(
    "param_sharding",
    "parallel: data_parallel: the parameters and optimizer state whole on every device (replicated), or each "
    "split along its largest axis the devices divide, FSDP-like, XLA gathering them where they are used (sharded)",
    ("replicated", "sharded"),
    "replicated",
    not_run_when="not `parallel: data_parallel`",
    memory_order=("sharded", "replicated"),
    quiet=True,
)
DATA_PARALLEL = "data_parallel"
"""The JAX backend's way of training a trial over several devices: one process, a mesh of N local
devices, each micro-batch split between them."""
DATA_AXIS = "data"
"""The mesh axis a data-parallel micro-batch is split along."""


def irrelevant(knob: Knob, value: object, caps: JaxCapabilities) -> str | None:
    if not caps.data_parallel:
        return f"param_sharding={value}: a knob of parallel: {DATA_PARALLEL} (a trial over several devices)"
    return None


def shard_axis(shape: Sequence[int], count: int) -> int | None:
    """The axis of an array of `shape` that `param_sharding: sharded` splits between `count`
    devices: its largest that `count` divides (the first of equals); None when there is none."""
    axes = [axis for axis, size in enumerate(shape) if size >= count and size % count == 0]
    return max(axes, key=lambda axis: (shape[axis], -axis)) if axes else None


def placement(mesh: Mesh, sharded: bool) -> Callable[[Any], Any]:
    """Where each array of a pytree lives over `mesh`: a `NamedSharding`, whole on every device
    (`P()`), or with `sharded` split along `shard_axis` (whole when it has none: scalars, a vector
    no count divides)."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    count = mesh.devices.size

    def place(leaf: Any) -> NamedSharding:
        axis = shard_axis(np.shape(leaf), count) if sharded else None
        return NamedSharding(mesh, P() if axis is None else P(*[None] * axis, DATA_AXIS))

    return lambda tree: jax.tree.map(place, tree)


def apply(build: Build) -> None:
    """With data parallel, the parameters, the gradients and the optimizer state placed over the
    mesh as the value says; `Unsupported` where `sharded` would split nothing: one device, or no
    parameter with an axis the devices divide."""
    value = PARAM_SHARDING.of(build.config)
    sharded = value == "sharded"
    if build.mesh is None:
        if sharded:
            raise Unsupported(
                f"param_sharding={value}: it splits the parameters between devices, and this "
                "training has one (data parallel: devices=N)"
            )
        return
    import jax
    import numpy as np

    count = build.mesh.devices.size
    if sharded and all(shard_axis(np.shape(leaf), count) is None for leaf in jax.tree.leaves(build.params)):
        raise Unsupported(
            f"param_sharding={value}: no parameter has an axis {count} devices divide, "
            "so every one would stay whole on every device"
        )
    build.placement = placement(build.mesh, sharded)


FAMILY = JaxFamily((PARAM_SHARDING,), irrelevant, apply=apply)
