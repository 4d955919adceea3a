"""What a JAX workload factory returns.

A factory is a function named in the spec by import path (`package.module:function`); it is
called in every trial process with the spec's `workload_args` as keyword arguments, after
`random` and `numpy.random` are seeded with the trial's seed (`trial.seed`), and returns a
`JaxWorkload`:

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from autotuner.backends.jax.workload import ArrayDataset, JaxWorkload

    def my_job(hidden: int = 512) -> JaxWorkload:
        key = jax.random.key(np.random.randint(2**31))  # the trial's seed
        params = init_params(key, hidden)               # a pytree of float32 arrays

        def loss_fn(params, batch):                     # the mean loss over a batch
            inputs, labels = batch
            logits = apply(params, inputs)
            return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean()

        return JaxWorkload(
            params=params,
            loss_fn=loss_fn,
            optimizer=optax.adamw(1e-3),
            dataset=ArrayDataset(inputs, labels),       # dataset[i] -> (inputs[i], labels[i])
        )

The backend owns everything the knobs change: the device, the dtype policy and the matmul
precision, jit, batching with its host prefetch threads, and gradient accumulation
(`autotuner.backends.jax.apply.TunedTraining`). So the loss must be a pure function of its arguments
(no side effects, no state outside `params`), written for any float dtype: under bf16 it is
called with bf16 copies of the parameters and of the batch's float arrays. Compute the final
reduction from `logits.astype(jnp.float32)`, as above, so that the loss itself stays in fp32.

The `remat` knob checkpoints the blocks the loss marks with `remat_block` (a transformer layer,
say): wrap the function of one block, and the backward pass recomputes inside each block what the
knob's policy does not keep, holding only the blocks' inputs between them. A loss that marks no
block is checkpointed whole, which recomputes the forward pass but keeps no less memory.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ParamSpec, Protocol, TypeVar

import jax
import numpy as np
import optax


class MapDataset(Protocol):
    """A map-style dataset: a length, and the item at an index, a pytree of arrays (usually a tuple)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> Any: ...


class ArrayDataset:
    """Numpy arrays sharing their first dimension, one sample per row: `dataset[i]` is the tuple
    of the arrays' rows `i` (PyTorch's TensorDataset). Indexed with an array of indices, it
    gathers a whole batch at once, which the loader does."""

    def __init__(self, *arrays: np.ndarray):
        if not arrays:
            raise ValueError("ArrayDataset needs at least one array")
        self.arrays = tuple(np.asarray(a) for a in arrays)
        if len({len(a) for a in self.arrays}) != 1:
            raise ValueError(f"the arrays have different lengths: {[len(a) for a in self.arrays]}")

    def __len__(self) -> int:
        return len(self.arrays[0])

    def __getitem__(self, index: int | np.ndarray) -> tuple[np.ndarray, ...]:
        return tuple(a[index] for a in self.arrays)


def collate(dataset: MapDataset, indices: np.ndarray) -> Any:
    """The items at `indices` stacked into one batch (gathered at once from an ArrayDataset)."""
    if isinstance(dataset, ArrayDataset):
        return dataset[indices]
    items = [dataset[int(i)] for i in indices]
    return jax.tree.map(lambda *leaves: np.stack(leaves), *items)


@dataclass
class JaxWorkload:
    params: Any
    """The initial parameters: a pytree of float32 arrays (the fp32 master copy every precision
    keeps). The backend places them on the device."""
    loss_fn: Callable[[Any, Any], jax.Array]
    """`loss_fn(params, batch) -> scalar`: the mean loss over `batch`, a micro-batch of the
    dataset's items stacked along a new first axis (a tuple of arrays for a tuple item)."""
    optimizer: optax.GradientTransformation
    """The optax optimizer; it sees the mean gradient of each global batch (the backend accumulates)."""
    dataset: MapDataset
    """Map-style, with a length; each item is a pytree (usually a tuple) of numpy arrays. Must give
    the same item for the same index in every process (per-index randomness only), and be safe to
    read from several threads (the prefetch workers)."""
    heldout: MapDataset | None = None
    """The fixed batch drift is measured on, a dataset like `dataset`; default: its last 256 items."""
    tokens_per_sample: int | None = None
    """Set it to get tokens/s as well as samples/s."""
    flops_per_sample: float | None = None
    """The model's training FLOPs (forward and backward) per sample, without what a config
    recomputes (checkpointing, remat); with it, MFU is reported on GPUs. None: counted."""


BlockParameters = ParamSpec("BlockParameters")
BlockResult = TypeVar("BlockResult")

REMAT_POLICIES: dict[str, Callable[..., bool] | None] = {
    "full": None,  # jax.checkpoint's default: nothing saved, every intermediate recomputed
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
"""The `jax.checkpoint` policy of each `remat` value but none: what the forward pass keeps for the backward."""

_REMAT_KEY = jax.make_user_context("none") if hasattr(jax, "make_user_context") else None
"""The `remat` value a loss is traced under, in JAX's trace and jit cache keys (JAX >= 0.7): a
loss that is under a `jax.jit` of its own is traced again for another value, not served the
trace of the last. Older JAX keys on the arguments only."""


@dataclass
class RematScope:
    """The `remat` value a loss is traced under (`remat_scope`), and whether it marked a block."""

    remat: str
    marked: bool = False


_REMAT_SCOPE: contextvars.ContextVar[RematScope | None] = contextvars.ContextVar("autotuner_remat", default=None)


@contextlib.contextmanager
def remat_scope(remat: str) -> Iterator[RematScope]:
    """Trace a loss with its `remat_block`s checkpointed as `remat` (a value of the knob) says;
    `TunedTraining` opens it around the loss for a `remat` other than none, nothing else does."""
    scope = RematScope(remat)
    token = _REMAT_SCOPE.set(scope)
    try:
        with _REMAT_KEY(remat) if _REMAT_KEY is not None else contextlib.nullcontext():
            yield scope
    finally:
        _REMAT_SCOPE.reset(token)


def remat_block(
    fn: Callable[BlockParameters, BlockResult], *, static_argnums: Sequence[int] = ()
) -> Callable[BlockParameters, BlockResult]:
    """Mark `fn`, one block of the model (a transformer layer), as a place the `remat` knob
    checkpoints: with `remat` other than none, calls of it inside the loss are
    `jax.checkpoint(fn, policy=...)`; otherwise (and outside a tuned loss, e.g. the held-out
    evaluation) `fn` itself runs. `static_argnums` are the arguments that are not arrays (a head
    count): `jax.checkpoint` traces every other one."""
    checkpointed: dict[str, Callable[BlockParameters, BlockResult]] = {}

    @functools.wraps(fn)
    def block(*args: BlockParameters.args, **kwargs: BlockParameters.kwargs) -> BlockResult:
        scope = _REMAT_SCOPE.get()
        remat = _REMAT_KEY.value if _REMAT_KEY is not None else (scope.remat if scope else "none")
        if remat == "none":
            return fn(*args, **kwargs)
        if scope is not None:
            scope.marked = True
        if remat not in checkpointed:  # one checkpointed function per value: JAX caches its traces
            policy = REMAT_POLICIES[remat]
            checkpointed[remat] = jax.checkpoint(fn, policy=policy, static_argnums=tuple(static_argnums))
        return checkpointed[remat](*args, **kwargs)

    return block


def _is_float_array(leaf: object) -> bool:
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and np.issubdtype(dtype, np.floating) and getattr(leaf, "shape", None) is not None


def as_workload(built: object, ref: str) -> JaxWorkload:
    """Check what a factory returned; a 4-tuple (params, loss_fn, optimizer, dataset) is accepted."""
    if isinstance(built, tuple) and len(built) == 4:
        built = JaxWorkload(*built)
    if not isinstance(built, JaxWorkload):
        raise TypeError(f"workload factory {ref} returned {type(built).__name__}, expected a JaxWorkload")
    leaves = jax.tree.leaves(built.params)
    if not leaves or not all(_is_float_array(leaf) for leaf in leaves):
        raise TypeError(f"workload factory {ref}: params must be a pytree of float arrays")
    if not callable(built.loss_fn):
        raise TypeError(f"workload factory {ref}: loss_fn must be a callable loss_fn(params, batch)")
    if not (callable(getattr(built.optimizer, "init", None)) and callable(getattr(built.optimizer, "update", None))):
        kind = type(built.optimizer).__name__
        raise TypeError(f"workload factory {ref}: optimizer is {kind}, not an optax GradientTransformation")
    for name in ("dataset", "heldout"):
        data = getattr(built, name)
        if data is not None and (not hasattr(data, "__getitem__") or not hasattr(data, "__len__")):
            raise TypeError(
                f"workload factory {ref}: {name} must be map-style (__getitem__ and __len__); a stream is read by "
                "the pytorch backend only"
            )
    return built


def first_batch_problem(workload: JaxWorkload, count: int) -> str | None:
    """What fails, in a few words, when the dataset's first `count` items are read, stacked into
    a batch as the loaders stack them and `loss_fn` is computed on them with the initial
    parameters, as JAX arrays on the default device (the probe's check); None when nothing does.

    The loss is traced abstractly first (`jax.eval_shape`: its shapes and dtypes, nothing compiled
    or run), which tells every shape or type error as running it would, in milliseconds: run op by
    op, each of its primitives would compile first (4.6 s of a small GPT's probe). A loss that
    cannot be traced so (Python that reads a value: a concretization error) is run instead."""
    try:
        batch = collate(workload.dataset, np.arange(count))
    except Exception as exc:
        return f"the dataset's first {count} items cannot be read and stacked: {type(exc).__name__}: {exc}"
    as_arrays = functools.partial(jax.tree.map, jax.numpy.asarray)
    try:
        try:
            loss = jax.eval_shape(workload.loss_fn, as_arrays(workload.params), as_arrays(batch))
        except jax.errors.JAXTypeError:  # it reads a value while tracing: run it
            loss = workload.loss_fn(as_arrays(workload.params), as_arrays(batch))
    except Exception as exc:
        return f"loss_fn fails on the first batch: {type(exc).__name__}: {exc}"
    if getattr(loss, "shape", None) != ():
        shape = getattr(loss, "shape", None)
        kind = "an array" if shape is not None else type(loss).__name__  # traced: its shape alone
        return f"loss_fn returned {kind} of shape {shape}, not a scalar loss"
    return None
