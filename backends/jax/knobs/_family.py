"""A JAX knob family: its rules (`autotuner.backends._base.Family`) and what its knobs do to a
training run while `autotuner.backends.jax.apply.TunedTraining` builds it: `JaxFamily.start`, on
the process before JAX starts its backend, and `JaxFamily.apply`, on a `Build`. Imports no
framework: a family's functions import jax when they are called."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from autotuner.backends._base import Family
from autotuner.backends.jax.capabilities import JaxCapabilities

if TYPE_CHECKING:
    import jax
    from jax.sharding import Mesh

Result = TypeVar("Result")


class Compiler(Protocol):
    """How the functions of a training step (or a served forward pass) run: op by op, or compiled
    whole by XLA (the `jit` knob, `autotuner.backends.jax.knobs.jit`)."""

    def function(self, fn: Callable[..., Result], out_shardings: object = None) -> Callable[..., Result]:
        """`fn` as it runs; compiled, its outputs placed as `out_shardings` says (None: as XLA picks)."""
        ...

    def update(
        self, fn: Callable[..., Result], out_shardings: object = None, donated: tuple[int, ...] = ()
    ) -> Callable[..., Result]:
        """`fn`, the optimizer update, as it runs, its outputs (the new state, kept from step to
        step) placed as `out_shardings` says (None: as they come), writing them into the buffers of
        the arguments `donated` names."""
        ...


class OpByOp:
    """Every operation dispatched on its own (`jit: off`)."""

    def function(self, fn: Callable[..., Result], out_shardings: object = None) -> Callable[..., Result]:
        return fn

    def update(
        self, fn: Callable[..., Result], out_shardings: object = None, donated: tuple[int, ...] = ()
    ) -> Callable[..., Result]:
        """Op by op, each operation's output is placed as XLA propagates it: the new state is put
        back where it lives after the update."""
        if out_shardings is None:
            return fn
        import jax

        def put_back(*args: object) -> Result:
            result: Result = jax.device_put(fn(*args), out_shardings)
            return result

        return put_back


@dataclass
class Build:
    """A `TunedTraining` as it is built: what the families' `apply` read and change, one family
    after another in `autotuner.backends.jax.knobs.APPLY`'s order. `TunedTraining` then takes the
    gradient of `loss` under the precision's dtype policy and makes the step's functions with
    `compiler`, placed by `placement`."""

    config: Mapping[str, object]
    """The knob values (every knob of the table)."""
    device: jax.Device
    """The first device: JAX's default device while the step runs."""
    mesh: Mesh | None
    """The mesh over the data-parallel devices; None: `device` alone."""
    params: Any
    """The initial parameters (a pytree): the shapes the placement is decided by."""
    loss: Callable[[Any, Any], jax.Array]
    """`loss(params, batch)`: the user's loss, wrapped as the families go (remat's checkpoints)."""
    placement: Callable[[Any], Any]
    """Where each array of a pytree of the parameters' shapes (the parameters, the gradients, the
    optimizer state) lives: a pytree of devices or shardings of the same structure (`device`, until
    `param_sharding` places them over `mesh`)."""
    donated: tuple[int, ...] = ()
    """The update's arguments (0: the parameters, 1: the optimizer state) whose buffers it writes
    the new ones into."""
    compiler: Compiler = OpByOp()
    """How the step's functions run."""


def _nothing(build: Build) -> None:
    return None


def _as_started(config: Mapping[str, object]) -> None:
    return None


@dataclass(frozen=True)
class JaxFamily(Family[JaxCapabilities]):
    """A family of JAX's knobs: its rules; `start`, what its knobs do to this process before JAX
    starts its backend (XLA reads its flags then), called before `TunedTraining` finds its devices;
    and `apply`, what they do to a training run as it is built (`Build`), called once per
    `TunedTraining` in `APPLY`'s order."""

    apply: Callable[[Build], None] = _nothing
    start: Callable[[Mapping[str, object]], None] = _as_started
