"""Datasets a trial reads whole or as a stream: map-style (indexed, with a length) or streamed
(iterable only: a torch `IterableDataset`, a `datasets` streaming dataset, a generator's items).
A stream says its size only by ending; a trial reads it in its order, from its start every epoch,
so every config gets the same items in the same order (`autotuner.trials.training`)."""

from __future__ import annotations

import itertools
from typing import Any, Generic, Protocol, TypeVar


def is_stream(data: object) -> bool:
    """Whether `data` is streamed: iterable with no length or no indexing (a torch
    `IterableDataset`, a `datasets` streaming dataset). A trial reads a stream in its order, from
    its start, every epoch: the same items in the same order for every config."""
    return hasattr(data, "__iter__") and not (hasattr(data, "__len__") and hasattr(data, "__getitem__"))


def prefix(data: Any, count: int) -> list[Any]:
    """The first `count` items of `data` (fewer where it ends sooner), map-style or streamed."""
    if is_stream(data):
        return list(itertools.islice(iter(data), count))
    return [data[i] for i in range(min(count, len(data)))]


Item = TypeVar("Item")
Item_co = TypeVar("Item_co", covariant=True)


class Indexed(Protocol[Item_co]):
    """What `Subset` reads of a dataset: its items by index."""

    def __getitem__(self, index: int, /) -> Item_co: ...


class Subset(Generic[Item]):
    """The items of `dataset` at `indices`, in that order."""

    def __init__(self, dataset: Indexed[Item], indices: list[int]):
        self.dataset, self.indices = dataset, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> Item:
        return self.dataset[self.indices[index]]
