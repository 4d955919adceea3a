"""A vision transformer as it is: ViT built from a config (random weights, no download) on a
map-style dataset of images, each drawn from its index alone.

    autotuner search --spec examples/huggingface/vit.yaml           # from the repository's root
    autotuner search --spec examples/huggingface/vit-serving.yaml   # the same model, served

Items are dicts (`pixel_values`, `labels`), batched by torch's default collate and passed as
`model(**batch)`; the loss is the one the model computes. The same factory serves.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import ViTConfig, ViTForImageClassification

from autotuner.backends.pytorch.workload import TorchWorkload

CLASSES = 10


class Images(torch.utils.data.Dataset[dict[str, Any]]):
    """`count` images from index `start` on: a class's pattern plus noise, the same for the same
    index in every process (a generator seeded by the index, no shared random state)."""

    def __init__(self, count: int, size: int, start: int = 0):
        self.count, self.size, self.start = count, size, start
        patterns = torch.Generator().manual_seed(0)
        self.patterns = torch.randn(CLASSES, 3, size, size, generator=patterns)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < self.count:
            raise IndexError(index)
        generator = torch.Generator().manual_seed(self.start + index)
        label = int(torch.randint(CLASSES, (1,), generator=generator))
        noise = torch.randn(3, self.size, self.size, generator=generator)
        return {"pixel_values": self.patterns[label] + noise, "labels": label}


def make_workload(
    layers: int = 4, width: int = 128, heads: int = 4, image: int = 32, patch: int = 4, samples: int = 2048
) -> TorchWorkload:
    config = ViTConfig(
        image_size=image,
        patch_size=patch,
        num_channels=3,
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * width,
        num_labels=CLASSES,
    )
    return TorchWorkload(
        model=ViTForImageClassification(config),
        dataset=Images(samples, image),
        heldout=Images(256, image, start=samples),
        optimizer=lambda params: torch.optim.AdamW(params, lr=3e-4),
    )
