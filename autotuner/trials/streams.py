"""Datasets a trial reads whole or as a stream: map-style (indexed, with a length) or streamed
(iterable only: a torch `IterableDataset`, a `datasets` streaming dataset, a generator's items).
A stream says its size only by ending; a trial reads it in its order, from its start every epoch,
so every config gets the same items in the same order (`autotuner.trials.training`)."""

from __future__ import annotations

import itertools
from typing import Any


def is_stream(data: Any) -> bool:
    """Whether `data` is streamed: iterable with no length or no indexing (a torch
    `IterableDataset`, a `datasets` streaming dataset). A trial reads a stream in its order, from
    its start, every epoch: the same items in the same order for every config."""
    return hasattr(data, "__iter__") and not (hasattr(data, "__len__") and hasattr(data, "__getitem__"))


def prefix(data: Any, count: int) -> list[Any]:
    """The first `count` items of `data` (fewer where it ends sooner), map-style or streamed."""
    if is_stream(data):
        return list(itertools.islice(iter(data), count))
    return [data[i] for i in range(min(count, len(data)))]
