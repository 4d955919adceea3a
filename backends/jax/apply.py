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
`tf32`, strict fp32 otherwise, which JAX does not default to on GPUs). `jit: on` compiles the
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

Importing this module does not initialise any device; `configure_process` is what a trial process
calls before it does.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import re
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, Sharding
from jax.sharding import PartitionSpec as P

from autotuner.backends._base import ExportedConfig, TunedLoop
from autotuner.backends.jax import JAX, XLA_FLAG_BUNDLES
from autotuner.backends.jax.workload import REMAT_POLICIES, ArrayDataset, remat_scope
from autotuner.trials.outcomes import Unsupported

COMPUTE_DTYPES = {"bf16": jnp.bfloat16}
"""Precisions that compute in another dtype than the fp32 parameters."""
STRICT_MATMULS = "float32"
MATMUL_PRECISION = {"tf32": "tensorfloat32"}
"""`jax.default_matmul_precision` per precision; STRICT_MATMULS for the others."""
PREFETCH_PER_WORKER = 2
"""Micro-batches each prefetch thread keeps in flight (DataLoader's prefetch_factor)."""
PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"
MEMORY_FRACTIONS = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")
"""JAX's GPU allocator settings, read from the environment when its CUDA backend starts
(https://docs.jax.dev/en/latest/gpu_memory_allocation.html)."""
WHOLE_CARD_FRACTION = ("XLA_PYTHON_CLIENT_MEM_FRACTION", "1.0")
"""The fraction a trial without preallocation is given: the card's whole memory. Without one, JAX's
allocator stops at its default fraction (75%) when it does not preallocate as well. The name
every supported jaxlib reads (a newer one reads it where `XLA_CLIENT_MEM_FRACTION` is not set,
and refuses both set at once)."""
VISIBLE_CUDA_DEVICES = "jax_cuda_visible_devices"
"""JAX's own list of the CUDA devices its client opens ("all", or CUDA ordinals)."""
XLA_FLAGS_VARIABLE = "XLA_FLAGS"
"""What XLA reads its flags from, once, when JAX starts its backend."""
CPU_DEVICES = "jax_num_cpu_devices"
"""JAX's count of host (CPU) devices, read when its CPU client starts (JAX >= 0.4.38)."""
HOST_DEVICE_COUNT = "--xla_force_host_platform_device_count"
"""XLA's flag for the same, which older JAX reads from XLA_FLAGS."""
STUCK_COLLECTIVE = ("--xla_cpu_collective_call_terminate_timeout_seconds", 3600)
"""XLA:CPU aborts the process (SIGABRT) when a host device's thread has waited 40 s in a
collective for the others; on a loaded 2-core machine the threads of two host devices can take
that long to meet, and the trial crashed where it was only slow. A trial's own timeout ends one
that hangs, so the abort waits an hour here (unless XLA_FLAGS sets it)."""
DATA_AXIS = "data"
"""The mesh axis a data-parallel micro-batch is split along."""


def _spec_ordinal(spec: str) -> int | None:
    """N of `cuda:N` (0 for `cuda`); None for any other spec."""
    match = re.fullmatch(r"cuda(?::(\d+))?", spec)
    return int(match.group(1) or 0) if match else None


def _backend_started() -> bool:
    """Whether this process's JAX has started its backends, after which the platforms, the visible
    devices and the allocator settings no longer change anything (JAX reads them once, then)."""
    try:
        from jax._src import xla_bridge  # no public API says it

        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):  # a JAX without it: a config update after the start is a no-op anyway
        return False


def configure_process(device_spec: str, devices: int | None = 1) -> None:
    """Set up this process's JAX for a trial on `device_spec` before its backend starts: trial
    processes overlap (`--jobs` workers, a process that outlives its trial), so each must hold only
    what it uses, on its own GPUs only. `devices`: the local devices the process drives from
    `device_spec` on (data parallel, `TunedTraining(devices=N)`); None: every GPU (the probe of a
    data-parallel job, which counts them).

    - No preallocation (`XLA_PYTHON_CLIENT_PREALLOCATE=false`, unless the environment already sets
      it or a memory fraction): by default every JAX process reserves 75% of every GPU it opens,
      and the next process to overlap it fails with RESOURCE_EXHAUSTED, which a study records as
      `oom` and takes as ruling out a batch size that fits.
    - Without preallocation and without a memory fraction of the user's, the whole card
      (`XLA_PYTHON_CLIENT_MEM_FRACTION=1.0`, `WHOLE_CARD_FRACTION`): the fraction is also the
      allocator's limit, 75% by default with preallocation off too, so a batch size that needs
      more of the card would be recorded `oom` and rule out every larger one. Allocating on
      demand, a process still holds only what it uses.
    - `cpu`: only the CPU platform (`jax_platforms=cpu`), so no CUDA context is created at all.
    - `cuda:i` (`cuda` is `cuda:0`): JAX's CUDA client opens CUDA device i only, or i to
      i+devices-1 (`jax_cuda_visible_devices`, set unless the process set it already). JAX numbers
      its devices after the user's CUDA_VISIBLE_DEVICES, and a restricted GPU keeps its CUDA
      ordinal as its `local_hardware_id`, so `cuda:i` still names it (`device_name`).
    - `auto` opens every GPU: only probes get it (trials get the device the probe resolved), and
      the probe's `device_count` is what `search --jobs` starts its workers by.
    - `cpu` and `auto` with `devices` above 1: JAX's CPU client starts with that many host devices
      (`jax_num_cpu_devices`, or XLA's `--xla_force_host_platform_device_count` in an older JAX).

    Once JAX's backend has started (a user's script that ran JAX before), none of it could take
    effect, so nothing is changed and nothing raises.
    """
    if _backend_started():
        return
    if not any(os.environ.get(name) for name in MEMORY_FRACTIONS):  # a fraction is a preallocation asked for
        os.environ.setdefault(PREALLOCATE, "false")
        if os.environ[PREALLOCATE] in ("false", "False", "0"):  # off, as jaxlib reads it: never 100% preallocated
            name, whole = WHOLE_CARD_FRACTION
            os.environ[name] = whole
    spec = str(device_spec)
    if spec == "cpu":
        jax.config.update("jax_platforms", "cpu")
    if spec in ("cpu", "auto"):
        _host_devices(devices or 1)
        return
    ordinal = _spec_ordinal(spec)
    # "all" is JAX's default; a list the process set itself stands; None: a JAX without the option
    if ordinal is not None and devices is not None and jax.config.values.get(VISIBLE_CUDA_DEVICES) == "all":
        jax.config.update(VISIBLE_CUDA_DEVICES, ",".join(str(ordinal + i) for i in range(devices)))


def _host_devices(count: int) -> None:
    """JAX's CPU client to start with `count` host devices (nothing changed for one), whose
    collectives may wait as long as the trial does (`STUCK_COLLECTIVE`)."""
    if count <= 1:
        return
    flag, seconds = STUCK_COLLECTIVE
    if not any(f.startswith(f"{flag}=") for f in _flags_set()):
        os.environ[XLA_FLAGS_VARIABLE] = " ".join([*_flags_set(), f"{flag}={seconds}"])
    if CPU_DEVICES in jax.config.values:
        jax.config.update(CPU_DEVICES, count)
        return
    kept = [flag for flag in _flags_set() if not flag.startswith(f"{HOST_DEVICE_COUNT}=")]
    os.environ[XLA_FLAGS_VARIABLE] = " ".join([*kept, f"{HOST_DEVICE_COUNT}={count}"])


def _flags_set() -> list[str]:
    return os.environ.get(XLA_FLAGS_VARIABLE, "").split()


def use_xla_flags(config: ExportedConfig | Mapping[str, Any]) -> None:
    """Add the flags of `config`'s `xla_flags` bundle to this process's XLA_FLAGS (after the ones
    it holds, so they win), for XLA to read when JAX starts its backend: call it before the first
    JAX computation. Once the backend has started, XLA has read XLA_FLAGS already: a RuntimeError
    then when they lack a flag of the bundle (the config would not run as it was measured)."""
    bundle = JAX.config_params(config)["xla_flags"]
    missing = [flag for flag in XLA_FLAG_BUNDLES[bundle].flags if flag not in _flags_set()]
    if not missing:
        return
    if _backend_started():
        raise RuntimeError(
            f"xla_flags={bundle}: JAX started without {' '.join(missing)} in XLA_FLAGS; "
            "call use_xla_flags(config) before the script's first JAX computation"
        )
    os.environ[XLA_FLAGS_VARIABLE] = " ".join([*_flags_set(), *missing])


def gpus() -> list[jax.Device]:
    """The CUDA GPUs JAX sees (none with a CPU-only jaxlib; only its own in a `cuda:i` trial process)."""
    try:
        return list(jax.devices("gpu"))
    except RuntimeError:  # no GPU platform in this jaxlib, or none initialised
        return []


def cuda_ordinal(device: jax.Device) -> int:
    """A GPU's CUDA device number (what `cuda:N` and CUDA_VISIBLE_DEVICES count): its
    `local_hardware_id`, which a process that sees only some GPUs keeps, unlike its place in `gpus()`."""
    hardware_id = getattr(device, "local_hardware_id", None)
    return int(hardware_id) if hardware_id is not None else gpus().index(device)


def resolve_device(spec: str | jax.Device | None) -> jax.Device:
    """`auto` (or None): the first GPU if JAX has one, else the CPU; `cpu`, `cuda` or `cuda:N` (CUDA
    device N, found by its number, since a `cuda:N` trial process sees no other)."""
    if isinstance(spec, jax.Device):
        return spec
    spec = "auto" if spec is None else str(spec)
    if spec == "auto":
        visible = gpus()
        return visible[0] if visible else jax.devices("cpu")[0]
    if spec == "cpu":
        return jax.devices("cpu")[0]
    index = _spec_ordinal(spec)
    if index is None:
        raise ValueError(f"device {spec!r}: the jax backend runs on cpu or cuda")
    visible = gpus()
    if not visible:
        raise ValueError(
            f"device {spec!r}: JAX sees no CUDA GPU {index} here (a CUDA jaxlib is `pip install 'jax[cuda13]'`, "
            "`'jax[cuda12]'` on a CUDA 12 driver; "
            "cuda:N counts the GPUs CUDA_VISIBLE_DEVICES leaves visible, from 0)"
        )
    for gpu in visible:
        if cuda_ordinal(gpu) == index:
            return gpu
    names = ", ".join(device_name(gpu) for gpu in visible)
    raise ValueError(f"device {spec!r}: JAX sees {names} here")


def local_devices(first: jax.Device, count: int) -> list[jax.Device]:
    """`count` local devices from `first` on, of its platform: host devices by id, GPUs by CUDA
    ordinal (`cuda:i` to `cuda:i+count-1`). ValueError, saying what JAX has, when there are fewer."""
    if first.platform == "cpu":
        host = sorted(jax.devices("cpu"), key=lambda d: d.id)
        chosen = host[host.index(first) :][:count]
        if len(chosen) < count:
            raise ValueError(
                f"data parallel over {count} devices: JAX started with {len(host)} host device(s) here; set "
                f"jax.config.update({CPU_DEVICES!r}, {count}) (or XLA_FLAGS={HOST_DEVICE_COUNT}={count}) "
                "before the first JAX computation"
            )
        return chosen
    by_ordinal = {cuda_ordinal(gpu): gpu for gpu in gpus()}
    start = cuda_ordinal(first)
    wanted = range(start, start + count)
    if any(ordinal not in by_ordinal for ordinal in wanted):
        names = ", ".join(device_name(gpu) for gpu in by_ordinal.values())
        raise ValueError(
            f"data parallel over {count} GPUs from cuda:{start} needs cuda:{start} to cuda:{start + count - 1}; "
            f"JAX sees {names}"
        )
    return [by_ordinal[ordinal] for ordinal in wanted]


def shard_axis(shape: Sequence[int], count: int) -> int | None:
    """The axis of an array of `shape` that `param_sharding: sharded` splits between `count`
    devices: its largest that `count` divides (the first of equals); None when there is none."""
    axes = [axis for axis, size in enumerate(shape) if size >= count and size % count == 0]
    return max(axes, key=lambda axis: (shape[axis], -axis)) if axes else None


def device_name(device: jax.Device) -> str:
    """`cpu` or `cuda:N` (N its CUDA device number), as specs and `--jobs` workers name devices."""
    return "cpu" if device.platform == "cpu" else f"cuda:{cuda_ordinal(device)}"


def on_device(device: jax.Device, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` run with `device` as JAX's default device, so what it makes (and what a jitted call with
    uncommitted inputs computes) lands on `device`, not on the process's first device."""

    @functools.wraps(fn)
    def placed(*args: Any, **kwargs: Any) -> Any:
        with jax.default_device(device):
            return fn(*args, **kwargs)

    return placed


def cast_floats(tree: Any, dtype: Any) -> Any:
    """`tree` with every floating-point array cast to `dtype` (integers, such as token ids, kept)."""
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(jnp.result_type(x), jnp.floating) else x, tree)


def _with_policy(loss_fn: Callable[[Any, Any], jax.Array], dtype: Any) -> Callable[[Any, Any], jax.Array]:
    """`loss_fn` computed on `dtype` copies of the parameters and of the batch's floats, its value
    in fp32: the gradient of the cast brings the gradients back to the parameters' fp32."""
    if dtype is None:
        return loss_fn

    def loss(params: Any, batch: Any) -> jax.Array:
        return loss_fn(cast_floats(params, dtype), cast_floats(batch, dtype)).astype(jnp.float32)

    return loss


def _with_remat(loss_fn: Callable[[Any, Any], jax.Array], remat: str) -> Callable[[Any, Any], jax.Array]:
    """`loss_fn` with its `remat_block`s checkpointed under the `remat` value's policy, or, when its
    first call marks none, all of it as one checkpoint (the first call decides: a trace under jit,
    one more forward pass eagerly)."""
    if remat == "none":
        return loss_fn
    policy = REMAT_POLICIES[remat]
    whole = jax.checkpoint(loss_fn, policy=policy)
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


def model_gradient(tuned: TunedTraining) -> Callable[[Any, Any], tuple[jax.Array, Any]]:
    """The differentiated loss of `tuned` as its `model` computes it (its precision's dtype
    policy), but without `remat` and not jitted: the model's own computation, for its FLOP count."""
    return jax.value_and_grad(_with_policy(tuned.loss_fn, COMPUTE_DTYPES.get(tuned.precision)))


def collate(dataset: Any, indices: np.ndarray) -> Any:
    """The items at `indices` stacked into one batch (gathered at once from an ArrayDataset)."""
    if isinstance(dataset, ArrayDataset):
        return dataset[indices]
    items = [dataset[int(i)] for i in indices]
    return jax.tree.map(lambda *leaves: np.stack(leaves), *items)


class Loader:
    """Micro-batches of a map-style dataset; each iteration is one epoch (reshuffled from `seed`,
    as a DataLoader with a seeded generator), the last partial micro-batch dropped. With
    `workers` > 0, that many host threads gather the next micro-batches and put them on `device`
    (a device, or a sharding: data parallel's split batch) ahead of the step (PREFETCH_PER_WORKER
    each); with 0, batches are gathered when asked for and come as numpy arrays
    (`TunedTraining.to_device` places them). The order of the items does not depend on
    `batch_size`, so an optimizer step takes the same items at any micro-batch and on any number
    of devices."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        *,
        shuffle: bool,
        seed: int | None,
        workers: int,
        device: jax.Device | Sharding,
    ):
        self.dataset, self.batch_size, self.shuffle, self.drop_last = dataset, batch_size, shuffle, True
        self.workers, self.device = workers, device
        self._rng = np.random.default_rng(seed)
        self._pool: ThreadPoolExecutor | None = None
        if workers > 0:  # kept across epochs (DataLoader's persistent workers), ended with the loader
            self._pool = ThreadPoolExecutor(workers, thread_name_prefix="autotuner-prefetch")
            weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)

    def __len__(self) -> int:
        return len(self.dataset) // self.batch_size

    def _batches(self) -> list[np.ndarray]:
        count = len(self) * self.batch_size
        order = self._rng.permutation(len(self.dataset))[:count] if self.shuffle else np.arange(count)
        return list(order.reshape(len(self), self.batch_size))

    def _placed(self, indices: np.ndarray) -> Any:
        return jax.device_put(collate(self.dataset, indices), self.device)

    def __iter__(self) -> Iterator[Any]:
        batches = self._batches()
        pool = self._pool
        if pool is None:
            for indices in batches:
                yield collate(self.dataset, indices)
            return
        pending: collections.deque[Future[Any]] = collections.deque()
        upcoming = iter(batches)

        def prefetch() -> None:
            indices = next(upcoming, None)
            if indices is not None:
                pending.append(pool.submit(self._placed, indices))

        try:
            for _ in range(PREFETCH_PER_WORKER * self.workers):
                prefetch()
            while pending:
                batch = pending.popleft().result()
                prefetch()  # refill before handing the batch over
                yield batch
        finally:
            for future in pending:  # an epoch left early: drop what was prefetched for it
                future.cancel()


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
        config: ExportedConfig | Mapping[str, Any],
        model: Callable[[Any, Any], jax.Array],
        optimizer: optax.GradientTransformation,
        dataset: Any | None = None,
        device: str | jax.Device | None = None,
        *,
        params: Any,
        devices: int | Sequence[jax.Device] | None = None,
    ):
        super().__init__(JAX, config)
        use_xla_flags(self.config)  # before resolve_device starts JAX's backend, if nothing did yet
        self.device = resolve_device(device)
        if devices is None or isinstance(devices, int):
            self.devices = [self.device] if (devices or 1) == 1 else local_devices(self.device, devices or 1)
        else:
            self.devices = list(devices)
            self.device = self.devices[0]
        self.mesh = Mesh(np.array(self.devices), (DATA_AXIS,)) if len(self.devices) > 1 else None
        self.param_sharding: str = self.config["param_sharding"]
        self.jit = self.config["jit"] == "on"
        self.donate = self.config["donate"] == "on"
        if self.donate and not self.jit:
            raise ValueError("donate=on needs jit=on: only a jitted update takes over the donated buffers")
        self._check_sharding(params)
        self.remat: str = self.config["remat"]
        cast = COMPUTE_DTYPES.get(self.precision)
        self.compute_dtype = cast or jnp.float32
        self.matmul_precision = MATMUL_PRECISION.get(self.precision, STRICT_MATMULS)
        self.loss_fn = model
        self.optimizer = optimizer
        accumulation = self.accumulation

        def add(total: Any, grads: Any) -> Any:
            return jax.tree.map(jnp.add, total, grads)

        def update(params: Any, opt_state: Any, total: Any) -> tuple[Any, Any]:
            grads = jax.tree.map(lambda g: g / accumulation, total) if accumulation > 1 else total
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        grad_fn = jax.value_and_grad(_with_policy(_with_remat(model, self.remat), cast))
        donated = (0, 1) if self.donate else ()  # params and opt_state: restart made them, nothing else holds them
        if self.mesh is None:
            model_fn: Callable[..., Any] = jax.jit(grad_fn) if self.jit else grad_fn
            add_fn: Callable[..., Any] = jax.jit(add) if self.jit else add
            update_fn: Callable[..., Any] = jax.jit(update, donate_argnums=donated) if self.jit else update
        else:  # the gradients and the new state placed as the parameters are, whatever XLA would pick
            placed = self.placement(params)
            state = self.placement(jax.eval_shape(optimizer.init, params))
            whole = NamedSharding(self.mesh, P())
            if self.jit:
                model_fn = jax.jit(grad_fn, out_shardings=(whole, placed))
                add_fn = jax.jit(add, out_shardings=placed)
                update_fn = jax.jit(update, donate_argnums=donated, out_shardings=(placed, state))
            else:  # op by op, each operation's output is placed as XLA propagates it: put back after the update
                model_fn, add_fn = grad_fn, add

                def update_fn(params: Any, opt_state: Any, total: Any) -> tuple[Any, Any]:
                    new_params, new_state = update(params, opt_state, total)
                    return jax.device_put(new_params, placed), jax.device_put(new_state, state)

        self.model: Callable[[Any, Any], tuple[jax.Array, Any]] = on_device(self.device, model_fn)
        self._add = on_device(self.device, add_fn)
        self._update = on_device(self.device, update_fn)
        self.params: Any = None
        self.opt_state: Any = None
        self.restart(params)
        self.loader = self.make_loader(dataset) if dataset is not None else None

    @property
    def micro_batch(self) -> int:
        """Samples of one micro-batch over all the devices: `batch_size` x devices."""
        return self.batch_size * len(self.devices)

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step: micro-batch x accumulation x devices."""
        return self.batch_size * self.accumulation * len(self.devices)

    def _check_sharding(self, params: Any) -> None:
        if self.param_sharding == "replicated":
            return
        if self.mesh is None:
            raise Unsupported(
                f"param_sharding={self.param_sharding}: it splits the parameters between devices, and this "
                "training has one (data parallel: devices=N)"
            )
        count = len(self.devices)
        if all(shard_axis(np.shape(leaf), count) is None for leaf in jax.tree.leaves(params)):
            raise Unsupported(
                f"param_sharding={self.param_sharding}: no parameter has an axis {count} devices divide, "
                "so every one would stay whole on every device"
            )

    def placement(self, tree: Any) -> Any:
        """Where each array of `tree` (parameters, or a pytree of the same shapes: gradients, the
        optimizer's state) lives: `device` for one device; with data parallel, a `NamedSharding`
        over `mesh`, whole on every device (`P()`) for `replicated`, split along `shard_axis` for
        `sharded` (whole when it has none: scalars, a vector no count divides)."""
        if self.mesh is None:
            return jax.tree.map(lambda _: self.device, tree)
        mesh, count, sharded = self.mesh, len(self.devices), self.param_sharding == "sharded"

        def place(leaf: Any) -> NamedSharding:
            axis = shard_axis(np.shape(leaf), count) if sharded else None
            return NamedSharding(mesh, P() if axis is None else P(*[None] * axis, DATA_AXIS))

        return jax.tree.map(place, tree)

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

    def make_loader(self, dataset: Any, *, shuffle: bool = True, seed: int | None = None) -> Loader:
        """A `Loader` of micro-batches (`micro_batch` samples each) with the config's prefetch
        threads, the last partial micro-batch dropped so every optimizer step sees `global_batch`
        samples. `seed` fixes the shuffling, which is the same for any micro-batch and any number
        of devices: every optimizer step takes the same items."""
        return Loader(
            dataset, self.micro_batch, shuffle=shuffle, seed=seed, workers=self.workers, device=self.batch_placement
        )
