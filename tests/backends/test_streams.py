"""Streamed datasets in the PyTorch backend: loader workers read a stream once and in its order,
ranks take their share, and a factory's stream is accepted where a non-iterable is refused."""

from __future__ import annotations

import pytest
import torch

from autotuner.backends.pytorch.apply import TunedTraining
from autotuner.backends.pytorch.workload import Stream, as_workload
from tests.support.study_workloads import TokenStream, streamed_gpt

GPT = {"vocab": 64, "length": 16, "dim": 32, "layers": 1, "heads": 2, "samples": 512}


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_loader_workers_read_a_stream_once_and_in_its_order(workers: int) -> None:
    items = torch.arange(100)
    stream = TokenStream(items, items)
    config = {"precision": "fp32", "batch_size": 4, "accumulation": 1, "workers": workers, "compile": "none"}
    tuned = TunedTraining(config, torch.nn.Linear(1, 1), torch.optim.SGD, device="cpu")
    loader = tuned.make_loader(stream, seed=0)
    for _ in range(2):  # every epoch: the stream again, from its start
        read = torch.cat([inputs for inputs, _ in loader])
        assert read.tolist() == list(range(100))


def test_a_rank_takes_every_nth_item_of_the_stream() -> None:
    shards = [list(Stream(range(20)).shard(rank, 2, 4)) for rank in range(2)]
    assert shards == [list(range(0, 20, 2)), list(range(1, 20, 2))]


def test_a_streamed_workload_is_accepted_and_a_non_iterable_refused() -> None:
    workload = as_workload(streamed_gpt(**GPT), "tests.support.study_workloads:streamed_gpt")
    assert isinstance(workload.dataset, Stream)
    bad = streamed_gpt(**GPT)
    bad.dataset = object()  # type: ignore[assignment]
    with pytest.raises(TypeError, match="map-style .* or a stream"):
        as_workload(bad, "x:y")


class WorkerShardedStream(torch.utils.data.IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """A stream that shards itself between a DataLoader's workers, as torch's documentation writes
    one and as a Hugging Face `datasets` streaming dataset does: worker k of W yields items k, k+W, ..."""

    def __init__(self, count: int):
        self.count = count

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = torch.utils.data.get_worker_info()
        start, step = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(start, self.count, step):
            yield torch.tensor([i]), torch.tensor(i)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_stream_that_shards_itself_between_workers_is_still_read_once_and_in_its_order(workers: int) -> None:
    config = {"precision": "fp32", "batch_size": 4, "accumulation": 1, "workers": workers, "compile": "none"}
    tuned = TunedTraining(config, torch.nn.Linear(1, 1), torch.optim.SGD, device="cpu")
    loader = tuned.make_loader(WorkerShardedStream(40), seed=0)
    read = torch.cat([inputs for inputs, _ in loader]).flatten()
    assert read.tolist() == list(range(40))
