"""What the built-in workloads (`builtin:mlp`, `builtin:gpt`) are in every backend: their sizes.

The PyTorch and JAX factories build the same model from the same size (a spec's `workload_args`
are its fields), so a study of one backend and of the other tune the same job.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GptSize:
    """The built-in GPT's size and training set; every field is a `workload_args` key."""

    vocab: int = 512
    length: int = 128
    """Tokens per sample (the context)."""
    dim: int = 128
    layers: int = 2
    heads: int = 4
    samples: int = 2048
    """Training samples; the held-out ones come after them."""
    lr: float = 1e-3

    def flops_per_sample(self, weights: int) -> float:
        """Training FLOPs per sample, forward and backward, of a model with `weights` parameters
        outside the token and position embeddings (a tied head counts: it is a real matmul per
        token): 6N per token for the weights plus 12*L*d*T for attention (Kaplan et al. 2020, as
        PaLM's appendix B and nanoGPT's estimate_mfu use it)."""
        per_token = 6.0 * weights + 12.0 * self.layers * self.dim * self.length
        return per_token * self.length


@dataclass(frozen=True)
class MlpSize:
    """The built-in MLP's size and training set (a teacher's labels of Gaussian inputs); every
    field is a `workload_args` key."""

    features: int = 256
    hidden: int = 1024
    depth: int = 3
    """Hidden layers."""
    classes: int = 10
    samples: int = 8192
    """Training samples; the held-out ones come after them."""
    input_scale: float = 1.0
    """Multiplies the inputs: a large one makes activations overflow float16 and the loss diverge."""
    lr: float = 1e-3
