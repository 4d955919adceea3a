"""JAX workloads that misbehave on purpose, for the backend contract tests.

Each factory builds a real `JaxWorkload` (a tiny MLP on a small `ArrayDataset`, the same data as
`tests.support.faulty_workloads`' PyTorch one in shape) whose loss misbehaves when it runs, or a factory
that fails by itself. They are imported by path (`tests.support.faulty_jax_workloads:NAME`) in trial
processes, exactly as a user's workload would be.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from autotuner.backends.jax.workload import ArrayDataset, JaxWorkload

FEATURES = 8
CLASSES = 3
BEYOND_ANY_HOST = 2**42
"""Elements (16 TiB of float32) no machine this runs on can allocate: XLA's allocator refuses."""


def _loss(params: dict[str, jax.Array], batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    inputs, labels = batch
    hidden = jax.nn.relu(inputs @ params["w1"] + params["b1"])
    logits = hidden @ params["w2"] + params["b2"]
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean()


def _workload(loss_fn: Callable[[Any, Any], jax.Array] = _loss, samples: int = 64) -> JaxWorkload:
    data = np.random.default_rng(0)
    inputs = data.standard_normal((samples, FEATURES), dtype=np.float32)
    labels = data.integers(CLASSES, size=samples).astype(np.int32)
    init = np.random.default_rng(np.random.randint(2**31))
    params = {
        "w1": (init.standard_normal((FEATURES, 16)) / np.sqrt(FEATURES)).astype(np.float32),
        "b1": np.zeros(16, np.float32),
        "w2": (init.standard_normal((16, CLASSES)) / 4.0).astype(np.float32),
        "b2": np.zeros(CLASSES, np.float32),
    }
    return JaxWorkload(
        params=params,
        loss_fn=loss_fn,
        optimizer=optax.sgd(0.1),
        dataset=ArrayDataset(inputs, labels),
        heldout=ArrayDataset(inputs[:16], labels[:16]),
    )


def ok(samples: int = 64) -> JaxWorkload:
    """A healthy tiny workload."""
    return _workload(samples=samples)


def oom(samples: int = 64) -> JaxWorkload:
    """Its loss asks XLA for more memory than the host has: the real RESOURCE_EXHAUSTED error."""

    def loss_fn(params: dict[str, jax.Array], batch: tuple[jax.Array, jax.Array]) -> jax.Array:
        return _loss(params, batch) + jnp.zeros(BEYOND_ANY_HOST, jnp.float32).sum()

    return _workload(loss_fn, samples)


def nan(samples: int = 64) -> JaxWorkload:
    def loss_fn(params: dict[str, jax.Array], batch: tuple[jax.Array, jax.Array]) -> jax.Array:
        return _loss(params, batch) * jnp.nan

    return _workload(loss_fn, samples)


def wrong_features(samples: int = 64) -> JaxWorkload:
    """Its first layer expects one feature more than the items have: the loss fails on any batch."""
    workload = _workload(samples=samples)
    workload.params["w1"] = np.zeros((FEATURES + 1, 16), np.float32)
    return workload


def per_sample_loss(samples: int = 64) -> JaxWorkload:
    """Its loss_fn forgets the mean: a loss per sample, not a scalar."""

    def loss_fn(params: dict[str, jax.Array], batch: tuple[jax.Array, jax.Array]) -> jax.Array:
        inputs, labels = batch
        logits = jax.nn.relu(inputs @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels)

    return _workload(loss_fn, samples)


def raises_in_factory(samples: int = 64) -> JaxWorkload:
    raise ValueError(f"the factory refuses to build (samples={samples})")


def wrong_return(samples: int = 64) -> Any:
    return "not a workload"
