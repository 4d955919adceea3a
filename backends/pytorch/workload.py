"""What a PyTorch workload factory returns, and how its batches reach the model.

A factory is a function named in the spec by import path (`package.module:function`); it is
called in every trial process with the spec's `workload_args` as keyword arguments, after the
random seeds are fixed, and returns a `TorchWorkload`:

    from autotuner.backends.pytorch.workload import TorchWorkload

    def my_job(hidden: int = 512) -> TorchWorkload:
        return TorchWorkload(
            model=MyModel(hidden),                 # built on the CPU; the backend moves it
            dataset=MyDataset(),                   # map-style: dataset[i] -> (inputs, target)
            loss_fn=torch.nn.functional.cross_entropy,   # loss_fn(model(inputs), target)
            optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        )

Items and collated batches may be tensors or nested dicts, lists, tuples, namedtuples and
dataclasses of tensors. A batch reaches the model by one rule (`call_model`):

* a mapping (`{"input_ids": ..., "labels": ...}`) is passed as keyword arguments: `model(**batch)`;
* a plain tuple or list of two, `(inputs, target)`, passes its inputs: `model(inputs)`;
* anything else (a tensor, a namedtuple, a dataclass, a longer sequence) is passed whole: `model(batch)`.

The loss (`TorchWorkload.loss`) is `loss_fn(output, target)` when the workload has a `loss_fn`,
the target being the pair's second item, or the whole batch otherwise; without one, it is the
output's `.loss` or `["loss"]`, where Hugging Face models put it when the batch holds `labels`.
A workload whose step fits none of these gives `train_step(model, batch) -> loss` instead: it is
called with the batch on the device, under the config's autocast, and the backend takes the
backward pass and the optimizer step from there.

The backend owns everything the knobs change: the device, autocast and the gradient scaler,
torch.compile, the DataLoader (batch size, workers, pinning) and gradient accumulation.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from autotuner.trials.streams import prefix

T = TypeVar("T")
R = TypeVar("R")


class NoLoss(ValueError):
    """The model's output carries no loss, and the workload gives no `loss_fn` or `train_step`."""


def call_model(model: Callable[..., object], batch: Any) -> tuple[object, Any]:
    """The model's output on `batch` (a user's batch), and the target a `loss_fn` is given (the
    batch, or a part of it), by the rule of the module docstring."""
    if isinstance(batch, Mapping):
        return model(**batch), batch
    if isinstance(batch, (tuple, list)) and not hasattr(batch, "_fields") and len(batch) == 2:
        inputs, target = batch
        return model(inputs), target
    return model(batch), batch


def output_loss(output: object) -> torch.Tensor:
    """The loss a model's output carries: its `.loss`, or its `["loss"]` (Hugging Face's
    `ModelOutput` has both; its `.loss` is None when the batch held no labels)."""
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, Mapping):
        loss = output.get("loss")
    if not isinstance(loss, torch.Tensor):
        raise NoLoss(
            f"the model's output ({type(output).__name__}) carries no loss (no .loss or ['loss'] tensor), "
            "and the workload gives no loss_fn or train_step"
        )
    return loss


@dataclass(kw_only=True)
class TorchWorkload:
    model: torch.nn.Module
    dataset: torch.utils.data.Dataset[object] | Iterable[object]
    """Map-style, with a length; each item is what `collate_fn` batches (see the module docstring).
    Must give the same item for the same index in every process (per-index randomness only), so
    drift compares like with like. Or streamed (no length: a torch `IterableDataset`, a `datasets`
    streaming dataset, any iterable of items), which must give the same items in the same order
    each time it is iterated: it is read in its order (no shuffling), from its start every epoch;
    loader workers each read it and keep every N-th micro-batch of it (`Stream`), so together they
    load each item once and in order; drift and the held-out loss use its first items."""
    optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
    """A factory: the backend builds a fresh optimizer for each phase of a trial."""
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None
    """`loss_fn(output, target)`; None: the loss is the one the model's output carries."""
    train_step: Callable[[torch.nn.Module, Any], torch.Tensor] | None = None
    """`train_step(model, batch) -> loss`, the forward and the loss of a micro-batch, for a step
    the model call and `loss_fn` cannot express; `loss_fn` is then not used."""
    collate_fn: Callable[[list[Any]], Any] | None = None
    """What batches a list of items, in every loader; None: torch's `default_collate`."""
    heldout: torch.utils.data.Dataset[object] | Iterable[object] | None = None
    """The fixed batch drift is measured on; default: the dataset's last 256 items (a stream's
    first 256). Of a streamed held-out set, its first 256 items."""
    tokens_per_sample: int | None = None
    """Set it to get tokens/s as well as samples/s."""
    flops_per_sample: float | None = None
    """The model's training FLOPs (forward and backward) per sample, without what a config
    recomputes (checkpointing, remat); with it, MFU is reported on GPUs. None: counted."""
    checkpoint_blocks: tuple[type[torch.nn.Module], ...] | None = None
    """The module types `checkpointing: blocks` checkpoints; None: a Hugging Face model's own
    gradient checkpointing, or else the largest module type the model repeats."""

    def collate(self, items: list[Any]) -> Any:
        """`items` batched as the workload's loaders batch them."""
        return (self.collate_fn or torch.utils.data.default_collate)(items)

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        """The loss of `model` (the module, or what the config compiled of it) on `batch`, already on
        its device (see the module docstring)."""
        if self.train_step is not None:
            return self.train_step(model, batch)
        output, target = call_model(model, batch)
        if self.loss_fn is not None:
            return self.loss_fn(output, target)
        return output_loss(output)


def as_workload(built: object, ref: str) -> TorchWorkload:
    """Check what a factory returned; a 4-tuple (model, dataset, loss_fn, optimizer) is accepted."""
    if isinstance(built, tuple) and len(built) == 4:
        model, dataset, loss_fn, optimizer = built
        built = TorchWorkload(model=model, dataset=dataset, loss_fn=loss_fn, optimizer=optimizer)
    if not isinstance(built, TorchWorkload):
        raise TypeError(f"workload factory {ref} returned {type(built).__name__}, expected a TorchWorkload")
    if not isinstance(built.model, torch.nn.Module):
        raise TypeError(f"workload factory {ref}: model is {type(built.model).__name__}, not a torch.nn.Module")
    for name in ("dataset", "heldout"):
        data = getattr(built, name)
        if data is None or (hasattr(data, "__getitem__") and hasattr(data, "__len__")):
            continue
        if not hasattr(data, "__iter__"):
            raise TypeError(
                f"workload factory {ref}: {name} must be map-style (__getitem__ and __len__) or a stream (__iter__)"
            )
        setattr(built, name, Stream(data))
    if not callable(built.optimizer):
        raise TypeError(f"workload factory {ref}: optimizer must be a callable")
    for name in ("loss_fn", "train_step", "collate_fn"):
        if getattr(built, name) is not None and not callable(getattr(built, name)):
            raise TypeError(f"workload factory {ref}: {name} must be a callable or None")
    return built


class Stream(torch.utils.data.IterableDataset[object]):
    """A streamed dataset (`TorchWorkload.dataset`) as every loader of a trial reads it: whole, in
    its order; in `shard`, the share of one rank and one loader worker."""

    def __init__(self, items: Iterable[object]):
        self.items: Iterable[object] = items.items if isinstance(items, Stream) else items

    def __iter__(self) -> Iterator[object]:
        return iter(self.items)

    def shard(self, rank: int, ranks: int, micro_batch: int) -> StreamShard:
        return StreamShard(self.items, rank, ranks, micro_batch)


class StreamShard(torch.utils.data.IterableDataset[object]):
    """One rank's share of a stream, split between its loader workers without duplicates: rank r of
    R takes every R-th item from its r-th on (as `DistributedSampler` takes a map-style dataset's
    in order), and worker k of W of that share's micro-batches the k-th, (k+W)-th, ...: a
    DataLoader hands the workers' batches out in turn, so the loader yields the share's
    micro-batches in the stream's order, each item once. Every worker reads the whole stream and
    skips what is not its own; it reads it as the main process would (`_whole`), so a stream
    that shards itself between a loader's workers (a `datasets` streaming dataset, a torch
    `IterableDataset` that reads `get_worker_info()`) gives each worker the whole of it too."""

    def __init__(self, items: Iterable[object], rank: int, ranks: int, micro_batch: int):
        self.items, self.rank, self.ranks, self.micro_batch = items, rank, ranks, micro_batch

    def __iter__(self) -> Iterator[object]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        share = itertools.islice(_whole(self.items), self.rank, None, self.ranks)
        for index, item in enumerate(share):
            if (index // self.micro_batch) % workers == worker:
                yield item


def _whole(items: Iterable[T]) -> Iterator[T]:
    """`items` read as outside any loader worker: torch's worker info hidden while the stream's own
    code runs (it asks `get_worker_info()` when its iterator starts, or at any item)."""
    from torch.utils.data._utils import worker  # get_worker_info() reads this module's global

    def hidden(step: Callable[[], R]) -> R:
        info, worker._worker_info = worker._worker_info, None
        try:
            return step()
        finally:
            worker._worker_info = info

    iterator = hidden(lambda: iter(items))
    while True:
        try:
            yield hidden(lambda: next(iterator))
        except StopIteration:
            return


def first_batch_problem(
    workload: TorchWorkload | InferenceWorkload, count: int, run: Callable[[Any], object] | None = None
) -> str | None:
    """What fails, in a few words, when the dataset's first `count` items are read, batched by the
    workload's collate function and the model's loss computed on them (or `run` called with the
    batch), without gradients, where the model was built (the probe's check); None when nothing
    does."""
    try:
        items = prefix(workload.dataset, count)
    except Exception as exc:
        return f"the dataset's first items cannot be read: {type(exc).__name__}: {exc}"
    try:
        batch = workload.collate(items)
    except Exception as exc:
        return f"the collate function cannot batch the dataset's first {count} items: {type(exc).__name__}: {exc}"
    try:
        with torch.no_grad():
            run(batch) if run is not None else workload.loss(workload.model, batch)
    except NoLoss as exc:
        return str(exc)
    except Exception as exc:
        return f"the model fails on the first batch: {type(exc).__name__}: {exc}"
    return None


@dataclass(kw_only=True)
class InferenceWorkload:
    """What a factory returns for `task: inference`: a model to serve and the inputs it serves
    (a training factory's `TorchWorkload` is accepted too: its model and data, its optimizer and
    loss left unused).

        def my_classifier() -> InferenceWorkload:
            return InferenceWorkload(model=build_model(), dataset=MyInputs())   # items: inputs, or (inputs, label)

    A batch reaches the model by the rule of the module docstring; a mapping's `labels` are left
    out of the call (they are what accuracy is measured against)."""

    model: torch.nn.Module
    dataset: torch.utils.data.Dataset[object]
    """Map-style, with a length: the inputs a trial serves, one item each (inputs, or an
    `(inputs, label)` pair, or a mapping that may hold `labels`). The same item for the same
    index in every process."""
    heldout: torch.utils.data.Dataset[object] | None = None
    """The inputs drift is measured on; default: the dataset's last items (256 at most)."""
    collate_fn: Callable[[list[Any]], Any] | None = None
    """What batches a list of items; None: torch's `default_collate`."""
    drift_fn: Callable[[torch.Tensor, torch.Tensor], float] | None = None
    """`drift_fn(outputs, reference) -> float`: a drift of your own in place of the relative error
    of the outputs (both the model's primary output over the held-out items, in float64)."""
    tokens_per_sample: int | None = None
    """Set it to get tokens/s as well as samples/s."""
    flops_per_sample: float | None = None
    """The forward pass's FLOPs per sample, for MFU where the device's peak is known."""
    checkpoint_blocks: tuple[type[torch.nn.Module], ...] | None = None
    """Unused in inference; here so that the probe reads either workload alike."""

    def collate(self, items: list[Any]) -> Any:
        """`items` batched as the trial's loaders batch them."""
        return (self.collate_fn or torch.utils.data.default_collate)(items)

    def forward(self, model: torch.nn.Module, batch: Any) -> object:
        """The model's output on `batch` (the module docstring's rule, a mapping's labels left out)."""
        if isinstance(batch, Mapping):
            return model(**{k: v for k, v in batch.items() if k != "labels"})
        return call_model(model, batch)[0]

    def loss(self, model: torch.nn.Module, batch: Any) -> object:
        """The forward pass (what the probe's checks call a workload's loss)."""
        return self.forward(model, batch)

    def optimizer(self, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        """None is trained: a plain SGD, for the probe's optimizer checks only."""
        return torch.optim.SGD(list(params), lr=0.0)


def as_inference_workload(built: object, ref: str) -> InferenceWorkload:
    """Check what a factory returned for `task: inference`: an `InferenceWorkload`, a training
    `TorchWorkload` (its model, data and collate function) or a pair (model, dataset)."""
    if isinstance(built, TorchWorkload):
        built = InferenceWorkload(
            model=built.model,
            dataset=built.dataset,  # type: ignore[arg-type]  # a stream is refused below
            heldout=built.heldout,  # type: ignore[arg-type]
            collate_fn=built.collate_fn,
            tokens_per_sample=built.tokens_per_sample,
        )
    elif isinstance(built, tuple) and len(built) == 2:
        built = InferenceWorkload(model=built[0], dataset=built[1])
    if not isinstance(built, InferenceWorkload):
        raise TypeError(f"workload factory {ref} returned {type(built).__name__}, expected an InferenceWorkload")
    if not isinstance(built.model, torch.nn.Module):
        raise TypeError(f"workload factory {ref}: model is {type(built.model).__name__}, not a torch.nn.Module")
    for name, data in (("dataset", built.dataset), ("heldout", built.heldout)):
        if data is not None and not (hasattr(data, "__getitem__") and hasattr(data, "__len__")):
            raise TypeError(
                f"workload factory {ref}: {name} must be map-style (__getitem__ and __len__): task: inference "
                "serves every config the same items in whole batches of its own size"
            )
    for name in ("collate_fn", "drift_fn"):
        if getattr(built, name) is not None and not callable(getattr(built, name)):
            raise TypeError(f"workload factory {ref}: {name} must be a callable or None")
    return built
