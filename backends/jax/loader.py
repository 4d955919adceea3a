"""Micro-batches of a map-style dataset for a JAX loop, each gathered into one batch
(`autotuner.backends.jax.workload.collate`) and put on the device (or split between the devices)
ahead of the step by host threads: the loader of `autotuner.backends.jax.apply.TunedTraining` and
of `autotuner.backends.jax.serving.TunedInference`."""

from __future__ import annotations

import collections
import weakref
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import jax
import numpy as np
from jax.sharding import Sharding

from autotuner.backends.jax.workload import MapDataset, collate

PREFETCH_PER_WORKER = 2
"""Micro-batches each prefetch thread keeps in flight (DataLoader's prefetch_factor)."""


class Loader:
    """Micro-batches of a map-style dataset; each iteration is one epoch (reshuffled from `seed`,
    as a DataLoader with a seeded generator), the last partial micro-batch dropped. With
    `workers` > 0, that many host threads gather the next micro-batches and put them on `device`
    (a device, or a sharding: data parallel's split batch) ahead of the step (PREFETCH_PER_WORKER
    each); with 0, batches are gathered when asked for and come as numpy arrays
    (`TunedTraining.to_device` places them). The order of the items does not depend on
    `batch_size`, so an optimizer step takes the same items at any micro-batch and on any number
    of devices."""

    def __init__(
        self,
        dataset: MapDataset,
        batch_size: int,
        *,
        shuffle: bool,
        seed: int | None,
        workers: int,
        device: jax.Device | Sharding,
    ):
        self.dataset, self.batch_size, self.shuffle, self.drop_last = dataset, batch_size, shuffle, True
        self.workers, self.device = workers, device
        self._rng = np.random.default_rng(seed)
        self._pool: ThreadPoolExecutor | None = None
        if workers > 0:  # kept across epochs (DataLoader's persistent workers), ended with the loader
            self._pool = ThreadPoolExecutor(workers, thread_name_prefix="autotuner-prefetch")
            weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)

    def __len__(self) -> int:
        return len(self.dataset) // self.batch_size

    def _batches(self) -> list[np.ndarray]:
        count = len(self) * self.batch_size
        order = self._rng.permutation(len(self.dataset))[:count] if self.shuffle else np.arange(count)
        return list(order.reshape(len(self), self.batch_size))

    def _placed(self, indices: np.ndarray) -> Any:
        return jax.device_put(collate(self.dataset, indices), self.device)

    def __iter__(self) -> Iterator[Any]:
        batches = self._batches()
        pool = self._pool
        if pool is None:
            for indices in batches:
                yield collate(self.dataset, indices)
            return
        pending: collections.deque[Future[Any]] = collections.deque()
        upcoming = iter(batches)

        def prefetch() -> None:
            indices = next(upcoming, None)
            if indices is not None:
                pending.append(pool.submit(self._placed, indices))

        try:
            for _ in range(PREFETCH_PER_WORKER * self.workers):
                prefetch()
            while pending:
                batch = pending.popleft().result()
                prefetch()  # refill before handing the batch over
                yield batch
        finally:
            for future in pending:  # an epoch left early: drop what was prefetched for it
                future.cancel()
