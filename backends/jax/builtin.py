"""Built-in JAX workloads on synthetic data (nothing is downloaded), the twins of the PyTorch ones.

* `mlp`: a multi-layer perceptron (GELU) learning a random teacher's labels.
* `gpt`: a small causal transformer on token sequences from a fixed random Markov chain, with
  its training FLOPs per token known.

Same shapes, sizes, initialisations (PyTorch's defaults) and optimizer (AdamW with PyTorch's
weight decay) as `autotuner.backends.pytorch.builtin`; the data follow the same recipe from the same
seeds, drawn with numpy's generator instead of torch's. Parameters are drawn from the trial's
seed (the runner seeds `numpy.random`), on the host: no device work and nothing to compile
before the trial starts.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from autotuner.backends.builtin_sizes import GptSize, MlpSize
from autotuner.backends.jax.workload import ArrayDataset, JaxWorkload, remat_block

HELDOUT = 256
ADAMW_WEIGHT_DECAY = 0.01
"""torch.optim.AdamW's default (optax.adamw's is 1e-4): the same optimizer as the PyTorch twins."""
LAYER_NORM_EPS = 1e-5


def _init_rng() -> np.random.Generator:
    """Parameters from the trial's seed (the runner seeds numpy.random before the factory)."""
    return np.random.default_rng(np.random.randint(2**31))


def _linear(rng: np.random.Generator, fan_in: int, fan_out: int) -> dict[str, np.ndarray]:
    """nn.Linear's default initialisation: weight and bias uniform in +-1/sqrt(fan_in)."""
    bound = 1.0 / math.sqrt(fan_in)
    return {
        "w": rng.uniform(-bound, bound, (fan_in, fan_out)).astype(np.float32),
        "b": rng.uniform(-bound, bound, (fan_out,)).astype(np.float32),
    }


def _cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean cross-entropy, in fp32 whatever the compute dtype (as PyTorch's autocast does)."""
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean()


# ---------------------------------------------------------------- mlp


def mlp_apply(params: list[dict[str, jax.Array]], inputs: jax.Array) -> jax.Array:
    x = inputs
    for layer in params[:-1]:
        x = jax.nn.gelu(x @ layer["w"] + layer["b"], approximate=False)  # torch's nn.GELU
    return x @ params[-1]["w"] + params[-1]["b"]


def mlp_loss(params: list[dict[str, jax.Array]], batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    inputs, labels = batch
    return _cross_entropy(mlp_apply(params, inputs), labels)


def mlp(**size: Any) -> JaxWorkload:
    """The built-in MLP (`autotuner.backends.builtin_sizes.MlpSize`: its `workload_args`)."""
    shape = MlpSize(**size)
    data = np.random.default_rng(1234)
    inputs = data.standard_normal((shape.samples + HELDOUT, shape.features), dtype=np.float32)
    teacher = data.standard_normal((shape.features, shape.classes), dtype=np.float32)
    labels = (inputs @ teacher).argmax(axis=1).astype(np.int32)
    inputs = inputs * np.float32(shape.input_scale)
    rng = _init_rng()
    widths = [shape.features] + [shape.hidden] * shape.depth + [shape.classes]
    training, heldout = slice(None, shape.samples), slice(shape.samples, None)
    return JaxWorkload(
        params=[_linear(rng, fan_in, fan_out) for fan_in, fan_out in zip(widths, widths[1:], strict=False)],
        loss_fn=mlp_loss,
        optimizer=optax.adamw(shape.lr, weight_decay=ADAMW_WEIGHT_DECAY),
        dataset=ArrayDataset(inputs[training], labels[training]),
        heldout=ArrayDataset(inputs[heldout], labels[heldout]),
    )


# ---------------------------------------------------------------- gpt


def _layer_norm(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    """Statistics in fp32, as PyTorch's autocast runs layer_norm."""
    x32 = x.astype(jnp.float32)
    mean = x32.mean(axis=-1, keepdims=True)
    var = ((x32 - mean) ** 2).mean(axis=-1, keepdims=True)
    return ((x32 - mean) * jax.lax.rsqrt(var + LAYER_NORM_EPS)).astype(x.dtype) * p["scale"] + p["bias"]


def _attention(p: dict[str, Any], x: jax.Array, heads: int) -> jax.Array:
    batch, length, dim = x.shape
    qkv = x @ p["qkv"]["w"] + p["qkv"]["b"]
    q, k, v = (t.reshape(batch, length, heads, dim // heads).transpose(0, 2, 1, 3) for t in jnp.split(qkv, 3, axis=-1))
    scores = (q @ k.transpose(0, 1, 3, 2)).astype(jnp.float32) / math.sqrt(dim // heads)
    causal = jnp.tril(jnp.ones((length, length), dtype=bool))
    weights = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1).astype(x.dtype)
    y = (weights @ v).transpose(0, 2, 1, 3).reshape(batch, length, dim)
    return y @ p["proj"]["w"] + p["proj"]["b"]


def _layer(p: dict[str, Any], x: jax.Array, heads: int) -> jax.Array:
    x = x + _attention(p, _layer_norm(p["ln1"], x), heads)
    hidden = jax.nn.gelu(_layer_norm(p["ln2"], x) @ p["fc"]["w"] + p["fc"]["b"], approximate=False)
    return x + hidden @ p["out"]["w"] + p["out"]["b"]


_block = remat_block(_layer, static_argnums=(2,))
"""One transformer layer, where the `remat` knob checkpoints (the head count is no array)."""


def gpt_apply(params: dict[str, Any], tokens: jax.Array, heads: int) -> jax.Array:
    x = params["token"][tokens] + params["position"][: tokens.shape[1]]
    for block in params["blocks"]:
        x = _block(block, x, heads)
    return _layer_norm(params["ln"], x) @ params["token"].T  # the head is tied to the embedding, as in GPT-2


def _gpt_params(rng: np.random.Generator, vocab: int, length: int, dim: int, layers: int) -> dict[str, Any]:
    """GPT-2's initialisation: N(0, 0.02) weights, zero biases, unit layer-norm scales."""

    def normal(*shape: int) -> np.ndarray:
        return (0.02 * rng.standard_normal(shape)).astype(np.float32)

    def linear(fan_in: int, fan_out: int) -> dict[str, np.ndarray]:
        return {"w": normal(fan_in, fan_out), "b": np.zeros(fan_out, np.float32)}

    def norm() -> dict[str, np.ndarray]:
        return {"scale": np.ones(dim, np.float32), "bias": np.zeros(dim, np.float32)}

    return {
        "token": normal(vocab, dim),
        "position": normal(length, dim),
        "blocks": [
            {
                "ln1": norm(),
                "qkv": linear(dim, 3 * dim),
                "proj": linear(dim, dim),
                "ln2": norm(),
                "fc": linear(dim, 4 * dim),
                "out": linear(4 * dim, dim),
            }
            for _ in range(layers)
        ],
        "ln": norm(),
    }


def _markov_tokens(count: int, length: int, vocab: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((vocab, vocab)) * 3.0
    transition = np.exp(logits - logits.max(axis=1, keepdims=True))
    cumulative = np.cumsum(transition / transition.sum(axis=1, keepdims=True), axis=1)
    tokens = np.empty((count, length + 1), dtype=np.int32)
    tokens[:, 0] = rng.integers(vocab, size=count)
    for t in range(length):  # inverse-CDF sampling of each sequence's next token
        drawn = rng.random(count)[:, None]
        tokens[:, t + 1] = np.minimum((cumulative[tokens[:, t]] < drawn).sum(axis=1), vocab - 1)
    return tokens


def gpt(**size: Any) -> JaxWorkload:
    """The built-in GPT (`autotuner.backends.builtin_sizes.GptSize`: its `workload_args`), as the PyTorch
    backend's: the same shapes, a tied head."""
    shape = GptSize(**size)
    tokens = _markov_tokens(shape.samples + HELDOUT, shape.length, shape.vocab, seed=4321)
    inputs, targets = np.ascontiguousarray(tokens[:, :-1]), np.ascontiguousarray(tokens[:, 1:])
    params = _gpt_params(_init_rng(), shape.vocab, shape.length, shape.dim, shape.layers)
    sizes = {name: sum(leaf.size for leaf in jax.tree.leaves(params[name])) for name in params}
    # The tied head (the token embedding, used again) is a real matmul per token.
    weights = sum(sizes.values()) - sizes["position"]

    def loss_fn(params: dict[str, Any], batch: tuple[jax.Array, jax.Array]) -> jax.Array:
        inputs, targets = batch
        return _cross_entropy(gpt_apply(params, inputs, shape.heads), targets)

    training, heldout = slice(None, shape.samples), slice(shape.samples, None)
    return JaxWorkload(
        params=params,
        loss_fn=loss_fn,
        optimizer=optax.adamw(shape.lr, weight_decay=ADAMW_WEIGHT_DECAY),
        dataset=ArrayDataset(inputs[training], targets[training]),
        heldout=ArrayDataset(inputs[heldout], targets[heldout]),
        tokens_per_sample=shape.length,
        flops_per_sample=shape.flops_per_sample(weights),
    )
