"""The built-in JAX inference workloads (`task: inference`): the training built-ins' models served
on their own data (`autotuner.backends.jax.builtin`), random weights from the trial's seed.

* `mlp`: the MLP classifier; each item is `(features, label)`, so accuracy is reported beside the
  top-1 agreement (with random weights it says nothing of the model: the config is compared with
  fp32).
* `gpt`: the small causal transformer's next-token logits over its token sequences.
"""

from __future__ import annotations

import functools
from typing import Any

from autotuner.backends.builtin_sizes import GptSize
from autotuner.backends.jax.builtin import gpt as gpt_training
from autotuner.backends.jax.builtin import gpt_apply, mlp_apply
from autotuner.backends.jax.builtin import mlp as mlp_training
from autotuner.backends.jax.serving import JaxInferenceWorkload


def mlp(**size: Any) -> JaxInferenceWorkload:
    """The built-in MLP (`autotuner.backends.builtin_sizes.MlpSize`: its `workload_args`) served."""
    trained = mlp_training(**size)
    return JaxInferenceWorkload(
        params=trained.params, apply_fn=mlp_apply, dataset=trained.dataset, heldout=trained.heldout
    )


def gpt(**size: Any) -> JaxInferenceWorkload:
    """The built-in GPT (`autotuner.backends.builtin_sizes.GptSize`: its `workload_args`) served: its
    logits for every position of a sequence; the forward pass's FLOPs a third of training's."""
    trained = gpt_training(**size)
    return JaxInferenceWorkload(
        params=trained.params,
        apply_fn=functools.partial(gpt_apply, heads=GptSize(**size).heads),
        dataset=trained.dataset,
        heldout=trained.heldout,
        tokens_per_sample=trained.tokens_per_sample,
        flops_per_sample=trained.flops_per_sample / 3 if trained.flops_per_sample else None,
    )
