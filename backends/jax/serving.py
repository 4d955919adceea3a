"""A tuned inference config applied to a JAX model: the user's serving code, and the trials' too.

`TunedInference` is the one implementation of what an inference config means in JAX; the
inference trials (`autotuner.backends.jax.inference_runner`) serve through it, so what a study
measured is what a user gets:

    from autotuner.apply import load_config
    from autotuner.backends.jax.serving import TunedInference

    serving = TunedInference(load_config("runs/served-jax/best.yaml"), apply_fn, params=params)
    outputs = serving(inputs)           # a batch of `serving.batch_size` inputs

Precision is decided once, in the constructor: `bf16` and `fp16` cast the weights once (the
fp32 parameters are not kept on the device) and the inputs' floats at each call, and return the
outputs in fp32; `tf32` computes the fp32 model with TF32 matmuls, and `fp32` with strict fp32
matmuls (`jax.default_matmul_precision`, which JAX does not default to on GPUs). `jit: on`
compiles the cast, the forward pass and the cast back with XLA as one function; `off` runs them
op by op. `workers` host threads gather the next batches and put them on the device ahead of the
call (`make_loader`). Everything lives on the one device.

A workload for `task: inference` is a `JaxInferenceWorkload`: the parameters, the forward
function, and the inputs it serves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from autotuner.backends._base import ExportedConfig, TunedLoop
from autotuner.backends.jax.apply import STRICT_MATMULS, cast_floats
from autotuner.backends.jax.devices import on_device, resolve_device
from autotuner.backends.jax.inference import JAX_INFERENCE
from autotuner.backends.jax.knobs.jit import JIT, compiler
from autotuner.backends.jax.loader import Loader
from autotuner.backends.jax.workload import MapDataset

COMPUTE_DTYPES = {"bf16": jnp.bfloat16, "fp16": jnp.float16}
"""Precisions that serve in another dtype than the fp32 parameters."""
MATMUL_PRECISION = {"tf32": "tensorfloat32"}
Outputs = TypeVar("Outputs")


@dataclass
class JaxInferenceWorkload:
    """What a factory returns for a JAX `task: inference` spec:

        def my_classifier() -> JaxInferenceWorkload:
            params = init_params(jax.random.key(np.random.randint(2**31)))   # the trial's seed
            return JaxInferenceWorkload(params=params, apply_fn=apply, dataset=ArrayDataset(inputs, labels))

    Write `apply_fn` for any float dtype: under bf16 it is called with bf16 parameters and inputs."""

    params: Any
    """The model's parameters: a pytree of float32 arrays."""
    apply_fn: Callable[[Any, Any], Any]
    """`apply_fn(params, inputs) -> outputs`: the forward pass on a batch of inputs (the dataset's
    items' inputs stacked along a new first axis); the outputs are an array or a pytree whose
    first array (a mapping's `logits` first) is what drift compares."""
    dataset: MapDataset
    """Map-style, with a length: the inputs a trial serves, one item each: `(inputs, label)` (an
    `ArrayDataset` of two arrays), `(inputs,)`, or the inputs themselves (a pytree of arrays). The
    same item for the same index in every process."""
    heldout: MapDataset | None = None
    """The inputs drift is measured on; default: the dataset's last items (256 at most)."""
    drift_fn: Callable[[np.ndarray, np.ndarray], float] | None = None
    """`drift_fn(outputs, reference) -> float`: a drift of your own in place of the relative error
    of the outputs (both the primary output over the held-out items, float64 numpy arrays)."""
    tokens_per_sample: int | None = None
    """Set it to get tokens/s as well as samples/s."""
    flops_per_sample: float | None = None
    """The forward pass's FLOPs per sample, for MFU where the device's peak is known."""


def as_inference_workload(built: object, ref: str) -> JaxInferenceWorkload:
    """Check what a factory returned for `task: inference` (a pair `(params, apply_fn)` is not
    enough: the inputs are needed too); TypeError says what is wrong."""
    if not isinstance(built, JaxInferenceWorkload):
        raise TypeError(
            f"workload factory {ref} returned {type(built).__name__}, expected a JaxInferenceWorkload "
            "(params, apply_fn, dataset) for task: inference"
        )
    leaves = jax.tree.leaves(built.params)
    if not leaves or not all(jnp.issubdtype(jnp.result_type(leaf), jnp.floating) for leaf in leaves):
        raise TypeError(f"workload factory {ref}: params must be a pytree of float arrays")
    if not callable(built.apply_fn):
        raise TypeError(f"workload factory {ref}: apply_fn must be a callable apply_fn(params, inputs)")
    for name in ("dataset", "heldout"):
        data = getattr(built, name)
        if data is not None and (not hasattr(data, "__getitem__") or not hasattr(data, "__len__")):
            raise TypeError(f"workload factory {ref}: {name} must be map-style (__getitem__ and __len__)")
    return built


def split_batch(batch: Any) -> tuple[Any, Any]:
    """A batch's inputs and labels (None where its items carry none), by the rule of
    `JaxInferenceWorkload.dataset`."""
    if isinstance(batch, tuple) and not hasattr(batch, "_fields"):
        if len(batch) == 2:
            return batch[0], batch[1]
        if len(batch) == 1:
            return batch[0], None
    return batch, None


def primary_output(outputs: object) -> jax.Array:
    """The array outputs are compared by: themselves, a mapping's `logits`, or their first array."""
    if isinstance(outputs, Mapping) and "logits" in outputs:
        return outputs["logits"]
    leaves = jax.tree.leaves(outputs)
    if not leaves or not hasattr(leaves[0], "shape"):
        raise TypeError(f"the model's output ({type(outputs).__name__}) holds no array to compare")
    return leaves[0]


class TunedInference(TunedLoop):
    """One inference config applied to `apply_fn` and its `params` on `device` (default: the first
    GPU if JAX has one, else the CPU). `config` is a `TunedConfig` from
    `autotuner.apply.load_config` or a plain mapping of knob values (precision, batch_size,
    accumulation, workers, jit). Call it on a batch of inputs; the outputs are on the device, in
    fp32 (`synchronize` waits for them)."""

    def __init__(
        self,
        config: ExportedConfig | Mapping[str, object],
        apply_fn: Callable[[Any, Any], Any],
        device: str | jax.Device | None = None,
        *,
        params: Any,
    ):
        super().__init__(JAX_INFERENCE, config)
        self.device = resolve_device(device)
        self.jit = JIT.of(self.config) == "on"
        self.compute_dtype = COMPUTE_DTYPES.get(self.precision)
        self.matmul_precision = MATMUL_PRECISION.get(self.precision, STRICT_MATMULS)
        cast = self.compute_dtype

        def forward(params: Any, inputs: Any) -> Any:
            if cast is None:
                return apply_fn(params, inputs)
            return cast_floats(apply_fn(params, cast_floats(inputs, cast)), jnp.float32)

        self.apply_fn = apply_fn
        self.model: Callable[[Any, Any], Any] = on_device(self.device, compiler(self.config).function(forward))
        weights = jax.device_put(params, self.device)
        self.params = cast_floats(weights, cast) if cast is not None else weights

    @contextlib.contextmanager
    def _context(self) -> Iterator[None]:
        with jax.default_matmul_precision(self.matmul_precision), jax.default_device(self.device):
            yield

    def __call__(self, inputs: Any) -> Any:
        """The outputs on a batch of inputs (numpy or JAX arrays; placed on the device first)."""
        with self._context():
            return self.model(self.params, jax.device_put(inputs, self.device))

    @staticmethod
    def synchronize(outputs: Outputs) -> Outputs:
        """`outputs` once the device has computed them."""
        return jax.block_until_ready(outputs)

    def make_loader(self, dataset: MapDataset, *, shuffle: bool = True, seed: int | None = None) -> Loader:
        """A `Loader` of batches of `batch_size` with the config's prefetch threads (each batch placed
        on the device by them), the last partial batch dropped."""
        return Loader(dataset, self.batch_size, shuffle=shuffle, seed=seed, workers=self.workers, device=self.device)
