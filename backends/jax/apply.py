"""A tuned config applied to a JAX training loop: the user's own, and the trials' loop too.

`TunedTraining` is the one implementation of what a config means in JAX. The trial runner
(`autotuner.backends.jax.runner`) trains through it, so what a study measured is what a user gets:

    from autotuner.apply import load_config
    from autotuner.backends.jax.apply import TunedTraining

    tuned = TunedTraining(load_config("runs/quickstart-jax/best.yaml"), loss_fn, optax.adamw(1e-3),
                          dataset, params=params)
    for batch in tuned.loader:
        batch = tuned.to_device(batch)
        with tuned.autocast():
            loss, grads = tuned.model(tuned.params, batch)
        tuned.backward(grads)
        if tuned.step():
            ...  # an optimizer step was taken: logging, checkpoints of tuned.params

Precision is decided once, in the constructor: the dtype policy is part of `model` (bf16 runs the
loss on bf16 copies of the fp32 parameters and of the batch's floats; the gradients come back in
fp32 for the fp32 master parameters), and `autocast()` is the matmul-precision context (TF32 for
`tf32`, strict fp32 otherwise, which JAX does not default to on GPUs). What every other knob does
is its family's (`autotuner.backends.jax.knobs`): its `start` before JAX starts its backend, its
`apply` on the run as it is built (`autotuner.backends.jax.knobs._family.Build`), in `APPLY`'s
order; the step itself has no branches on the config. `jit: on` compiles the
differentiated loss, the gradient accumulation and the optimizer update with XLA; `off` runs
them op by op. Accumulation sums the micro-batches' gradients and updates once with their mean
(what `optax.MultiSteps` does, without its per-micro-step `lax.cond`, which JAX would compile
anew at every call outside jit).
`remat` checkpoints the loss's `remat_block`s (`autotuner.backends.jax.workload`; the whole
loss when it marks none) with the policy the value names; `donate: on` gives the jitted update
the parameters and the optimizer state to write the new ones into, so after a `step()` that
updated, the arrays `params` and `opt_state` held before it are deleted: read `tuned.params`
again after every step, as the loop above does. `xla_flags` names a bundle of XLA flags
(`autotuner.backends.jax.XLA_FLAG_BUNDLES`), which XLA reads from XLA_FLAGS once, when JAX starts
its backend: `use_xla_flags(config)` at the top of a script puts them there (a trial process does
it before anything else), and `TunedTraining` refuses a process whose JAX started without them.
`workers` host threads gather the next micro-batches and put them on the device ahead of the
step. Everything lives on the one device: the parameters, the optimizer state, the batches, and
what the steps compute (under `jax.default_device`), so a `cuda:1` run never touches GPU 0.

Data parallel (`devices=N`, a trial of `processes: N` with `parallel: data_parallel`): one
process drives N local devices through a `jax.sharding.Mesh` over them (axis `data`). The
config's `batch_size` is each device's: a micro-batch is `batch_size` x N samples, in the order
one device would take them, split along its first axis (`NamedSharding(mesh, P("data"))`), and
an optimizer step sees `batch_size` x `accumulation` x N. The loss is the mean over the whole
micro-batch, so the gradients are one device's at the same global batch (XLA inserts the
all-reduce). `param_sharding` places the parameters and the optimizer state: `replicated`, whole
on every device; `sharded`, each array split along its largest axis N divides (one no axis of
which N divides stays whole), FSDP-like, XLA gathering them where the step uses them.

Importing this module does not initialise any device; `autotuner.backends.jax.devices.configure_process`
is what a trial process calls before it does, and where `TunedTraining` finds its devices.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, Sharding
from jax.sharding import PartitionSpec as P
from jax.typing import DTypeLike

from autotuner.backends._base import ExportedConfig, TunedLoop
from autotuner.backends.jax import JAX, JIT, PARAM_SHARDING, REMAT
from autotuner.backends.jax.devices import local_devices, on_device, resolve_device, use_xla_flags
from autotuner.backends.jax.knobs import APPLY
from autotuner.backends.jax.knobs._family import Build
from autotuner.backends.jax.knobs.param_sharding import DATA_AXIS
from autotuner.backends.jax.loader import Loader
from autotuner.backends.jax.workload import MapDataset

__all__ = ["TunedTraining", "use_xla_flags"]

COMPUTE_DTYPES = {"bf16": jnp.bfloat16}
"""Precisions that compute in another dtype than the fp32 parameters."""
STRICT_MATMULS = "float32"
MATMUL_PRECISION = {"tf32": "tensorfloat32"}
"""`jax.default_matmul_precision` per precision; STRICT_MATMULS for the others."""

Tree = TypeVar("Tree")
Loss = Callable[[Any, Any], jax.Array]
"""`loss(params, batch)`: the mean loss over a batch, from pytrees of arrays."""
Gradient = Callable[[Any, Any], tuple[jax.Array, Any]]
"""`model(params, batch) -> (loss, grads)`: the loss differentiated, the gradients a pytree like the parameters'."""
Update = Callable[[Any, optax.OptState, Any], tuple[Any, optax.OptState]]
"""`update(params, opt_state, grads) -> (params, opt_state)`: the optimizer step with the summed gradients."""


def cast_floats(tree: Tree, dtype: DTypeLike) -> Tree:
    """`tree` with every floating-point array cast to `dtype` (integers, such as token ids, kept)."""
    cast: Tree = jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(jnp.result_type(x), jnp.floating) else x, tree
    )
    return cast


def _with_policy(loss_fn: Loss, dtype: DTypeLike | None) -> Loss:
    """`loss_fn` computed on `dtype` copies of the parameters and of the batch's floats, its value
    in fp32: the gradient of the cast brings the gradients back to the parameters' fp32."""
    if dtype is None:
        return loss_fn

    def loss(params: Any, batch: Any) -> jax.Array:
        return loss_fn(cast_floats(params, dtype), cast_floats(batch, dtype)).astype(jnp.float32)

    return loss


def model_gradient(tuned: TunedTraining) -> Gradient:
    """The differentiated loss of `tuned` as its `model` computes it (its precision's dtype
    policy), but without `remat` and not jitted: the model's own computation, for its FLOP count."""
    return jax.value_and_grad(_with_policy(tuned.loss_fn, COMPUTE_DTYPES.get(tuned.precision)))


def _devices(first: jax.Device, devices: int | Sequence[jax.Device] | None) -> list[jax.Device]:
    """The devices a training runs on, `first` alone for None or 1: that many local devices from
    `first` on (`local_devices`), or the devices given."""
    if devices is None or isinstance(devices, int):
        return [first] if (devices or 1) == 1 else local_devices(first, devices or 1)
    return list(devices)


class TunedTraining(TunedLoop):
    """One tuned config applied to a loss function, its optax optimizer, the parameters and
    (optionally) a dataset.

    `model` is `loss_fn` differentiated under the config's dtype policy, `model(params, batch) ->
    (loss, grads)`, jitted for `jit: on`; `params` are the fp32 master parameters on `device`
    (default: the first GPU if JAX has one, else the CPU), which `step()` updates with the optax
    `optimizer`, whose state is `opt_state`. All of them, the batches and the gradients stay on
    `device`: `model`, `backward` and `step` compute with it as JAX's default device.
    `config` is a `TunedConfig` from `autotuner.apply.load_config`, or a plain mapping of knob
    values (precision, batch_size, accumulation, workers, jit, remat, donate, xla_flags,
    param_sharding), kept as `config`. With `dataset`, `loader` is its `Loader` (see
    `make_loader`). The caller's `params` are never donated: they stay usable whatever the config.

    `devices`: data parallel over that many local devices from `device` on (`local_devices`), or
    over the devices given; None or 1: `device` alone. Then `mesh` is the `jax.sharding.Mesh`
    over `devices` (axis `data`; None for one device), a micro-batch is `batch_size` x N samples
    (`micro_batch`) split between the devices by `to_device`, and the parameters, the gradients
    and the optimizer state are placed as `param_sharding` says (`placement`).
    """

    def __init__(
        self,
        config: ExportedConfig | Mapping[str, object],
        model: Loss,
        optimizer: optax.GradientTransformation,
        dataset: MapDataset | None = None,
        device: str | jax.Device | None = None,
        *,
        params: Any,
        devices: int | Sequence[jax.Device] | None = None,
    ):
        super().__init__(JAX, config)
        for family in APPLY:  # before resolve_device starts JAX's backend, if nothing did yet
            family.start(self.config)
        self.devices = _devices(resolve_device(device), devices)
        self.device = self.devices[0]
        self.mesh = Mesh(np.array(self.devices), (DATA_AXIS,)) if len(self.devices) > 1 else None
        self.jit = JIT.of(self.config) == "on"
        self.remat = REMAT.of(self.config)
        self.param_sharding = PARAM_SHARDING.of(self.config)
        self.compute_dtype = COMPUTE_DTYPES.get(self.precision, jnp.float32)
        self.matmul_precision = MATMUL_PRECISION.get(self.precision, STRICT_MATMULS)
        self.loss_fn = model
        self.optimizer = optimizer
        build = Build(self.config, self.device, self.mesh, params, model, self._on_the_device)
        for family in APPLY:
            family.apply(build)
        self._placement = build.placement
        self.donate = bool(build.donated)
        self.model, self._add, self._update = self._steps(build)
        self.params: Any = None
        self.opt_state: optax.OptState = None
        self.restart(params)
        self.loader = self.make_loader(dataset) if dataset is not None else None

    def _steps(self, build: Build) -> tuple[Gradient, Callable[[Any, Any], Any], Update]:
        """The step's functions, made from what the families built: the loss differentiated under
        the precision's dtype policy, the gradients' sum, the optimizer update with their mean; run
        as `build.compiler` says, with `device` as JAX's default device."""
        accumulation, optimizer = self.accumulation, self.optimizer

        def add(total: Any, grads: Any) -> Any:
            return jax.tree.map(jnp.add, total, grads)

        def update(params: Any, opt_state: optax.OptState, total: Any) -> tuple[Any, optax.OptState]:
            grads = jax.tree.map(lambda g: g / accumulation, total) if accumulation > 1 else total
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        grad_fn: Gradient = jax.value_and_grad(_with_policy(build.loss, COMPUTE_DTYPES.get(self.precision)))
        run = build.compiler
        if build.mesh is None:
            model, add_fn, update_fn = run.function(grad_fn), run.function(add), run.update(update, None, build.donated)
        else:  # the gradients and the new state placed as the parameters are, whatever XLA would pick
            placed = build.placement(build.params)
            state = build.placement(jax.eval_shape(optimizer.init, build.params))
            whole = NamedSharding(build.mesh, P())
            model = run.function(grad_fn, (whole, placed))
            add_fn = run.function(add, placed)
            update_fn = run.update(update, (placed, state), build.donated)
        return on_device(self.device, model), on_device(self.device, add_fn), on_device(self.device, update_fn)

    def _on_the_device(self, tree: Any) -> Any:
        return jax.tree.map(lambda _: self.device, tree)

    @property
    def micro_batch(self) -> int:
        """Samples of one micro-batch over all the devices: `batch_size` x devices."""
        return self.batch_size * len(self.devices)

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step: micro-batch x accumulation x devices."""
        return self.batch_size * self.accumulation * len(self.devices)

    def placement(self, tree: Any) -> Any:
        """Where each array of `tree` (parameters, or a pytree of the same shapes: gradients, the
        optimizer's state) lives: `device` for one device; with data parallel, a `NamedSharding`
        over `mesh`, whole on every device (`P()`) for `replicated`, split along `shard_axis`
        (`autotuner.backends.jax.knobs.param_sharding`) for `sharded` (whole when it has none:
        scalars, a vector no count divides)."""
        return self._placement(tree)

    def _place(self, tree: Any) -> Any:
        if self.mesh is None:
            return jax.device_put(tree, self.device)
        return jax.device_put(tree, self.placement(tree))

    def restart(self, params: Any) -> None:
        """Train from `params` again (placed on the device, or as `placement` says) with a fresh
        optimizer state; the compiled functions are kept, so nothing is compiled twice. With
        `donate`, both are copied into buffers of their own: `device_put` hands back an array
        already on the device as it is, and optax may keep the parameters themselves in its state,
        and a donated update would delete the caller's arrays (the runner's initial weights) or
        fail on a buffer given twice."""
        placed = self._place(params)
        with jax.default_device(self.device):  # optax makes some of its state (step counts) from scratch
            state = self._place(self.optimizer.init(placed))
            if self.donate:
                placed, state = self._place(jax.tree.map(jnp.copy, (placed, state)))
        self.params, self.opt_state = placed, state
        self._total: Any = None
        self._handed = False
        self._micro_steps = 0

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The context for `model`: TF32 matmuls for `tf32`, strict fp32 matmuls otherwise, with
        `device` as JAX's default device, so what the loop computes around `model` stays there too."""
        with jax.default_matmul_precision(self.matmul_precision), jax.default_device(self.device):
            yield

    def backward(self, grads: Any) -> None:
        """Accumulate this micro-batch's gradients (from `model`): the optimizer step takes their
        mean over the `accumulation` micro-batches, the gradient of the global batch's mean loss."""
        self._total = grads if self._total is None else self._add(self._total, grads)
        self._handed = True

    def step(self) -> bool:
        """Call after every `backward`. Every `accumulation`-th call applies the optax update with
        the mean gradient to `params`, clears the accumulated gradients and returns True; the other
        calls return False."""
        if not self._handed:
            raise RuntimeError("step() needs the gradients of a micro-batch first: call backward(grads)")
        self._handed = False
        self._micro_steps += 1
        if self._micro_steps % self.accumulation:
            return False
        self.params, self.opt_state = self._update(self.params, self.opt_state, self._total)
        self._total = None
        return True

    @property
    def batch_placement(self) -> jax.Device | Sharding:
        """Where `to_device` puts a micro-batch: `device`, or with data parallel split along its
        first axis between the devices (`NamedSharding(mesh, P("data"))`)."""
        return self.device if self.mesh is None else NamedSharding(self.mesh, P(DATA_AXIS))

    def to_device(self, value: Any, *, whole: bool = False) -> Any:
        """A batch (a pytree of arrays) on the device; what a prefetch thread placed stays put.
        With data parallel, split along its first axis between the devices (its size a multiple
        of theirs, as a micro-batch is), or with `whole` a whole copy on every device (a batch of
        any size: an evaluation's)."""
        if whole and self.mesh is not None:
            return jax.device_put(value, NamedSharding(self.mesh, P()))
        return jax.device_put(value, self.batch_placement)

    def make_loader(self, dataset: MapDataset, *, shuffle: bool = True, seed: int | None = None) -> Loader:
        """A `Loader` of micro-batches (`micro_batch` samples each) with the config's prefetch
        threads, the last partial micro-batch dropped so every optimizer step sees `global_batch`
        samples. `seed` fixes the shuffling, which is the same for any micro-batch and any number
        of devices: every optimizer step takes the same items."""
        return Loader(
            dataset, self.micro_batch, shuffle=shuffle, seed=seed, workers=self.workers, device=self.batch_placement
        )
