"""Streamed datasets of each kind autotuner reads: a torch `IterableDataset`, one that shards
itself between a loader's workers (it reads `get_worker_info()`), a Hugging Face `datasets`
streaming dataset, and a plain iterable of items. Each gives the same items in the same order
every time it is iterated, which is all a stream must do.

    autotuner search --spec examples/streams.yaml      # from the repository's root

The model is a small classifier called as `model(**batch)` on dict items; `kind` picks the stream.
`datasets` is needed for `kind: datasets` only (`pip install datasets`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from autotuner.backends.pytorch.workload import TorchWorkload

KINDS = ("iterable", "sharding", "datasets", "generator")
CLASSES = 10


def item(index: int, features: int) -> dict[str, Any]:
    """The stream's `index`-th item, drawn from its position alone."""
    inputs = np.random.default_rng(index).standard_normal(features, dtype=np.float32)
    return {"inputs": torch.from_numpy(inputs), "label": int(inputs[:CLASSES].argmax())}


class Items(torch.utils.data.IterableDataset[dict[str, Any]]):
    """A torch `IterableDataset`: the items from `start` on, in order."""

    def __init__(self, count: int, features: int, start: int = 0):
        self.count, self.features, self.start = count, features, start

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (item(self.start + i, self.features) for i in range(self.count))


class ShardedItems(Items):
    """A torch `IterableDataset` that splits itself between a DataLoader's workers, as the guides
    write them: worker k of W yields items k, k+W, ... (all of them outside a loader)."""

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return (item(self.start + i, self.features) for i in range(worker, self.count, workers))


class Generated:
    """Any iterable of items, no torch class: a generator each time it is iterated."""

    def __init__(self, count: int, features: int, start: int = 0):
        self.count, self.features, self.start = count, features, start

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(self.count):
            yield item(self.start + i, self.features)


def hugging_face_stream(count: int, features: int, start: int = 0, shards: int = 4) -> Any:
    """A `datasets` streaming dataset (`IterableDataset.from_generator`, nothing downloaded) of
    `shards` shards in order, which a DataLoader's workers would share out between them."""
    import datasets

    bounds = np.linspace(start, start + count, shards + 1).astype(int)

    def generate(ranges: list[tuple[int, int]]) -> Iterator[dict[str, Any]]:
        for low, high in ranges:
            for index in range(low, high):
                row = item(index, features)
                yield {"inputs": row["inputs"].numpy(), "label": row["label"]}

    ranges = [(int(low), int(high)) for low, high in zip(bounds[:-1], bounds[1:], strict=True)]
    return datasets.IterableDataset.from_generator(generate, gen_kwargs={"ranges": ranges}).with_format("torch")


class Classifier(torch.nn.Module):
    def __init__(self, features: int, hidden: int):
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(features, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, CLASSES)
        )

    def forward(self, inputs: torch.Tensor, label: torch.Tensor | None = None) -> torch.Tensor:
        return self.layers(inputs)


def make_workload(kind: str = "iterable", features: int = 64, hidden: int = 256, samples: int = 4096) -> TorchWorkload:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    stream: Any = {
        "iterable": Items,
        "sharding": ShardedItems,
        "datasets": hugging_face_stream,
        "generator": Generated,
    }[kind]
    return TorchWorkload(
        model=Classifier(features, hidden),
        dataset=stream(samples, features),
        heldout=stream(256, features, start=samples),
        loss_fn=lambda logits, batch: torch.nn.functional.cross_entropy(logits, batch["label"]),
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
    )
