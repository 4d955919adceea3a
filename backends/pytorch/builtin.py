"""Built-in PyTorch workloads on synthetic data (nothing is downloaded).

* `mlp`: a multi-layer perceptron (GELU) learning a random teacher's labels.
* `cnn`: a small convolutional network on 32x32 images that the dataset renders and augments
  on the CPU per sample (crop, flip, blur, normalize), so data-loader workers matter.
* `resnet`: a small ResNet (residual `BasicBlock`s) on the same images, with its training FLOPs
  per sample known: a model whose memory format and activation checkpointing matter.
* `gpt`: a small causal transformer on token sequences from a fixed random Markov chain, with
  its training FLOPs per token known.

Every dataset item depends only on its index and the workload's seed, so any number of loader
workers in any process yields the same data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from autotuner.backends.builtin_sizes import GptSize, MlpSize
from autotuner.backends.pytorch.workload import TorchWorkload

HELDOUT = 256


def _adamw(lr: float):
    return lambda params: torch.optim.AdamW(params, lr=lr)


# ---------------------------------------------------------------- mlp


def mlp(**size: Any) -> TorchWorkload:
    """The built-in MLP (`autotuner.backends.builtin_sizes.MlpSize`: its `workload_args`).

    GELU, not ReLU: behind ReLUs that output 0 for every sample of a batch, weights get an exactly
    zero gradient, and AdamW's moments of those decay geometrically (x0.9 per step) into subnormal
    floats after ~800 steps, which Intel CPUs compute slowly: on a Xeon the bf16 step then ran
    26-34% slower, long after the short trials that measured it. GELU's gradient is never exactly zero.
    """
    shape = MlpSize(**size)
    generator = torch.Generator().manual_seed(1234)
    inputs = torch.randn(shape.samples + HELDOUT, shape.features, generator=generator)
    teacher = torch.randn(shape.features, shape.classes, generator=generator)
    labels = (inputs @ teacher).argmax(dim=1)
    inputs = inputs * shape.input_scale
    layers: list[nn.Module] = []
    width = shape.features
    for _ in range(shape.depth):
        layers += [nn.Linear(width, shape.hidden), nn.GELU()]
        width = shape.hidden
    layers.append(nn.Linear(width, shape.classes))
    return TorchWorkload(
        model=nn.Sequential(*layers),
        dataset=torch.utils.data.TensorDataset(inputs[: shape.samples], labels[: shape.samples]),
        heldout=torch.utils.data.TensorDataset(inputs[shape.samples :], labels[shape.samples :]),
        loss_fn=F.cross_entropy,
        optimizer=_adamw(shape.lr),
    )


# ---------------------------------------------------------------- cnn


class RenderedImages(torch.utils.data.Dataset):
    """Images of class-dependent stripes in noise, rendered and augmented per item on the CPU."""

    def __init__(self, samples: int, size: int, classes: int, offset: int = 0):
        self.samples, self.size, self.classes, self.offset = samples, size, classes, offset
        self.blur = torch.tensor([1.0, 4.0, 6.0, 4.0, 1.0]) / 16.0

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self.samples:
            raise IndexError(index)
        rng = torch.Generator().manual_seed(10_000 + self.offset + index)
        label = int(torch.randint(self.classes, (1,), generator=rng))
        canvas = self.size + 8
        ys, xs = torch.meshgrid(torch.arange(canvas), torch.arange(canvas), indexing="ij")
        angle = math.pi * label / self.classes
        stripes = torch.sin((xs * math.cos(angle) + ys * math.sin(angle)) * (0.3 + 0.05 * label))
        image = stripes.expand(3, canvas, canvas) + 0.5 * torch.randn(3, canvas, canvas, generator=rng)
        top, left = (int(v) for v in torch.randint(9, (2,), generator=rng))
        image = image[:, top : top + self.size, left : left + self.size]
        if torch.rand(1, generator=rng) < 0.5:
            image = image.flip(-1)
        kernel = self.blur
        image = F.conv1d(image.reshape(-1, 1, self.size), kernel.view(1, 1, -1), padding=2).reshape(
            3, self.size, self.size
        )
        image = F.conv1d(image.transpose(1, 2).reshape(-1, 1, self.size), kernel.view(1, 1, -1), padding=2)
        image = image.reshape(3, self.size, self.size).transpose(1, 2)
        image = (image - image.mean()) / (image.std() + 1e-5)
        return image.contiguous(), torch.tensor(label)


def cnn(size: int = 32, classes: int = 10, width: int = 32, samples: int = 4096, lr: float = 1e-3) -> TorchWorkload:
    def block(cin: int, cout: int, stride: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    model = nn.Sequential(
        block(3, width, 1),
        block(width, 2 * width, 2),
        block(2 * width, 2 * width, 1),
        block(2 * width, 4 * width, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * width, classes),
    )
    return TorchWorkload(
        model=model,
        dataset=RenderedImages(samples, size, classes),
        heldout=RenderedImages(HELDOUT, size, classes, offset=samples),
        loss_fn=F.cross_entropy,
        optimizer=_adamw(lr),
    )


# ---------------------------------------------------------------- resnet


NORM_GROUPS = 8
"""The groups of each of the ResNet's `nn.GroupNorm`s (fewer where its channels do not divide by 8)."""


def _group_norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(math.gcd(NORM_GROUPS, channels), channels)


class BasicBlock(nn.Module):
    """ResNet's basic block (He et al. 2016): conv3x3-norm-ReLU-conv3x3-norm plus the shortcut,
    then ReLU. The shortcut is the input itself, or a strided 1x1 conv-norm where the block halves
    the resolution or changes the width. No `nn.Sequential` inside (nor around the blocks): the
    block is the model's only repeated module type above single layers, the one activation
    checkpointing of the largest repeated submodule type finds.

    The norm is GroupNorm (Wu and He 2018), not BatchNorm: a BatchNorm step depends on the
    micro-batch (its statistics, and running statistics updated at every micro-batch's forward,
    twice where checkpointing recomputes it), so every micro-batch but the reference's drifted
    2.6-3.4% after two steps at a global batch of 128 and no larger micro-batch could be tuned;
    GroupNorm's drift there is 3e-6."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.norm1 = _group_norm(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.norm2 = _group_norm(cout)
        self.projects = stride != 1 or cin != cout
        if self.projects:
            self.projection = nn.Conv2d(cin, cout, 1, stride, bias=False)
            self.projection_norm = _group_norm(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.norm2(self.conv2(F.relu(self.norm1(self.conv1(x)))))
        shortcut = self.projection_norm(self.projection(x)) if self.projects else x
        return F.relu(out + shortcut)


class ResNet(nn.Module):
    """A stem conv3x3-norm-ReLU at full resolution (CIFAR-style: no 7x7 conv, no max-pool),
    stages of `BasicBlock`s (each stage after the first halves the resolution and doubles the
    width), global average pooling and a linear head."""

    def __init__(self, width: int, blocks: Sequence[int], classes: int):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.stem_norm = _group_norm(width)
        self.blocks = nn.ModuleList()
        cin = width
        for stage, count in enumerate(blocks):
            cout = width * 2**stage
            for index in range(count):
                self.blocks.append(BasicBlock(cin, cout, 2 if stage > 0 and index == 0 else 1))
                cin = cout
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem_norm(self.stem(x)))
        for block in self.blocks:
            x = block(x)
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def _resnet_flops_per_sample(model: ResNet, size: int) -> float:
    """Training FLOPs per sample of `model` on `size`x`size` images, as `torch.utils.flop_counter`
    counts them: 2 per multiply-add of every convolution and of the head, forward; twice that
    backward (the input's gradient and the weight's), except the stem's input, which needs no
    gradient. Normalization, activations and pooling are not counted."""
    forward, stem = 0.0, 0.0
    resolution = size
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            if module.stride[0] > 1 and module.kernel_size[0] == 3:
                resolution = (resolution - 1) // module.stride[0] + 1  # the block's first conv downsamples
            ks = module.kernel_size[0] * module.kernel_size[1]
            flops = 2.0 * module.in_channels * module.out_channels * ks * resolution * resolution
            forward += flops
            if module is model.stem:
                stem = flops
        elif isinstance(module, nn.Linear):
            forward += 2.0 * module.in_features * module.out_features
    return 3.0 * forward - stem


def resnet(
    size: int = 32,
    classes: int = 10,
    width: int = 16,
    blocks: Sequence[int] = (2, 2, 2, 2),
    samples: int = 4096,
    lr: float = 1e-3,
) -> TorchWorkload:
    """A small ResNet (`ResNet`: ResNet-18's [2, 2, 2, 2] stages at a quarter of its width by
    default) on the `cnn`'s rendered images: `size`x`size` pixels, `classes` classes, `samples`
    training images. `width`: the stem's channels, doubled at each stage; `blocks`: `BasicBlock`s
    per stage."""
    model = ResNet(width, blocks, classes)
    return TorchWorkload(
        model=model,
        dataset=RenderedImages(samples, size, classes),
        heldout=RenderedImages(HELDOUT, size, classes, offset=samples),
        loss_fn=F.cross_entropy,
        optimizer=_adamw(lr),
        flops_per_sample=_resnet_flops_per_sample(model, size),
    )


# ---------------------------------------------------------------- gpt


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        q, k, v = self.qkv(x).split(dim, dim=2)
        q, k, v = (t.view(batch, length, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, length, dim))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, length: int, dim: int, layers: int, heads: int):
        super().__init__()
        self.token = nn.Embedding(vocab, dim)
        self.position = nn.Embedding(length, dim)
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(layers)))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.token.weight  # tied, as in GPT-2
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # GPT-2's initialisation: small normal weights keep the tied logits near zero at the start.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token(tokens) + self.position(positions)
        return self.head(self.ln(self.blocks(x)))


def _markov_tokens(count: int, length: int, vocab: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(vocab, vocab, generator=generator) * 3.0
    cumulative = torch.softmax(logits, dim=1).cumsum(dim=1)
    tokens = torch.empty(count, length + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(vocab, (count,), generator=generator)
    # Inverse-CDF sampling: ~30x faster than torch.multinomial per position, which took 14 s for
    # 2,048 sequences of 512 tokens, in every trial process that builds the workload.
    uniform = torch.rand(length, count, 1, generator=generator)
    for t in range(length):
        drawn = torch.searchsorted(cumulative[tokens[:, t]], uniform[t])
        tokens[:, t + 1] = drawn.squeeze(1).clamp_(max=vocab - 1)  # a rounding-short last cumsum
    return tokens


def _lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def gpt(**size: Any) -> TorchWorkload:
    """The built-in GPT (`autotuner.backends.builtin_sizes.GptSize`: its `workload_args`)."""
    shape = GptSize(**size)
    tokens = _markov_tokens(shape.samples + HELDOUT, shape.length, shape.vocab, seed=4321)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    model = GPT(shape.vocab, shape.length, shape.dim, shape.layers, shape.heads)
    embeddings = model.token.weight.numel() + model.position.weight.numel()
    # The tied head is a real matmul per token even though its weight is the embedding's.
    weights = sum(p.numel() for p in model.parameters()) - embeddings + model.head.weight.numel()
    return TorchWorkload(
        model=model,
        dataset=torch.utils.data.TensorDataset(inputs[: shape.samples], targets[: shape.samples]),
        heldout=torch.utils.data.TensorDataset(inputs[shape.samples :], targets[shape.samples :]),
        loss_fn=_lm_loss,
        optimizer=_adamw(shape.lr),
        tokens_per_sample=shape.length,
        flops_per_sample=shape.flops_per_sample(weights),
    )
