"""A JAX model written with Flax: a `flax.linen` classifier, its parameters from `init`, its loss
through `apply`, trained with optax.

    autotuner search --spec examples/jax/flax.yaml           # from the repository's root
    autotuner search --spec examples/jax/flax-serving.yaml   # the same model, served

A Flax module is the forward pass of a pure function of its parameters, which is what the JAX
backend takes: `make_workload` hands it `variables["params"]` and a loss that calls
`module.apply`; `make_serving` hands it the same parameters and `apply`. Under bf16 the backend
calls both with bf16 copies of the parameters and of the batch's floats; the loss is reduced
from fp32 logits. Needs `pip install flax`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

from autotuner.backends.jax.serving import JaxInferenceWorkload
from autotuner.backends.jax.workload import ArrayDataset, JaxWorkload

CLASSES = 10


class Classifier(nn.Module):
    hidden: int
    depth: int

    @nn.compact
    def __call__(self, inputs: jax.Array) -> jax.Array:
        x = inputs
        for _ in range(self.depth):
            x = nn.gelu(nn.Dense(self.hidden)(nn.LayerNorm()(x)))
        return nn.Dense(CLASSES)(x)


def _build(features: int, hidden: int, depth: int, samples: int) -> tuple[Classifier, Any, ArrayDataset, ArrayDataset]:
    """The module, its fp32 parameters (from the trial's seed) and the training and held-out data."""
    module = Classifier(hidden=hidden, depth=depth)
    params = module.init(jax.random.key(np.random.randint(2**31)), jnp.zeros((1, features)))["params"]
    data = np.random.default_rng(0)  # the same data in every trial, whatever its seed
    inputs = data.standard_normal((samples + 256, features), dtype=np.float32)
    labels = (inputs[:, :CLASSES].argmax(axis=1)).astype(np.int32)  # a rule the model can learn
    return (
        module,
        params,
        ArrayDataset(inputs[:samples], labels[:samples]),
        ArrayDataset(inputs[samples:], labels[samples:]),
    )


def make_workload(features: int = 64, hidden: int = 256, depth: int = 3, samples: int = 4096) -> JaxWorkload:
    module, params, dataset, heldout = _build(features, hidden, depth, samples)

    def loss_fn(params: Any, batch: tuple[jax.Array, jax.Array]) -> jax.Array:
        inputs, labels = batch
        logits = module.apply({"params": params}, inputs)
        return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean()

    return JaxWorkload(params=params, loss_fn=loss_fn, optimizer=optax.adamw(1e-3), dataset=dataset, heldout=heldout)


def make_serving(features: int = 64, hidden: int = 256, depth: int = 3, samples: int = 4096) -> JaxInferenceWorkload:
    module, params, dataset, heldout = _build(features, hidden, depth, samples)

    def apply_fn(params: Any, inputs: jax.Array) -> jax.Array:
        return module.apply({"params": params}, inputs)

    return JaxInferenceWorkload(params=params, apply_fn=apply_fn, dataset=dataset, heldout=heldout)
