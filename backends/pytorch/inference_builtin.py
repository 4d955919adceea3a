"""The built-in inference workload: a small transformer encoder that classifies token sequences
(`builtin:encoder` with `task: inference`), random weights from the trial's seed, synthetic tokens.

Its attention is `scaled_dot_product_attention` (so the `attention` knob applies) and its layers
are `Linear` (what quantization replaces); each item is `(tokens, label)`, the label a fixed
function of the tokens, so the accuracy is reported beside the top-1 agreement. With random
weights the accuracy says nothing of the model; what is compared is the config against fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autotuner.backends.pytorch.workload import InferenceWorkload


class Block(nn.Module):
    """Pre-norm self-attention and MLP."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=-1)
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, length, width)
        x = x + self.out(attended)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class EncoderClassifier(nn.Module):
    def __init__(self, vocab: int, width: int, heads: int, layers: int, length: int, classes: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.randn(length, width) * 0.02)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))


class Sequences(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """`size` token sequences of `length`, each from its own seeded generator (the same item for
    the same index in every process), labelled by their token sum modulo `classes`."""

    def __init__(self, size: int, length: int, vocab: int, classes: int, offset: int = 0):
        self.size, self.length, self.vocab, self.classes, self.offset = size, length, vocab, classes, offset

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        generator = torch.Generator().manual_seed(50_000 + self.offset + index)
        tokens = torch.randint(self.vocab, (self.length,), generator=generator)
        return tokens, int(tokens.sum()) % self.classes


def encoder(
    width: int = 256,
    heads: int = 4,
    layers: int = 4,
    length: int = 64,
    vocab: int = 4000,
    classes: int = 8,
    samples: int = 2048,
) -> InferenceWorkload:
    """The encoder classifier and its inputs: `samples` sequences to serve, 256 held out."""
    model = EncoderClassifier(vocab, width, heads, layers, length, classes)
    return InferenceWorkload(
        model=model,
        dataset=Sequences(samples, length, vocab, classes),
        heldout=Sequences(256, length, vocab, classes, offset=samples),
        tokens_per_sample=length,
        # the forward pass's matmuls: 2 FLOPs a multiply-add, per token (embedding lookups aside)
        flops_per_sample=2 * length * (layers * (12 * width * width + 2 * length * width)) + 2 * width * classes,
    )
