"""Batches as users write them (dicts for a model's keyword arguments, namedtuples, their own
collate function) and the loss where the model puts it or the workload's own step, as
`TunedTraining` handles them. Such jobs searched, and the shapes the probe refuses, are
tests/e2e/test_user_batches.py's."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, NamedTuple

import pytest
import torch
from torch import nn

from autotuner.backends.pytorch.apply import TunedTraining
from autotuner.backends.pytorch.workload import NoLoss, TorchWorkload, call_model, output_loss
from tests.support.study_workloads import KeywordClassifier, keyword_batches, pad

FP32 = {"precision": "fp32", "batch_size": 4, "accumulation": 1, "workers": 0, "compile": "none"}


# ---------------------------------------------------------------- to_device on nested batches


class Pair(NamedTuple):
    inputs: torch.Tensor
    extra: list[Any]


@dataclass
class Record:
    ids: torch.Tensor
    meta: dict[str, Any]
    name: str = "record"


def _moves(monkeypatch: pytest.MonkeyPatch) -> list[tuple[torch.device, bool]]:
    """Make `Tensor.to` record its device and non_blocking and return a tensor marked `moved`."""
    calls: list[tuple[torch.device, bool]] = []

    def to(self: torch.Tensor, device: torch.device, non_blocking: bool = False) -> torch.Tensor:
        calls.append((device, non_blocking))
        moved = self.clone()
        moved.moved = True  # type: ignore[attr-defined]
        return moved

    monkeypatch.setattr(torch.Tensor, "to", to)
    return calls


def test_to_device_moves_every_tensor_of_a_nested_batch_and_keeps_its_types(monkeypatch: pytest.MonkeyPatch) -> None:
    training = TunedTraining(FP32, nn.Linear(2, 2), torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1), device="cpu")
    batch = {
        "pair": Pair(torch.ones(2), [torch.zeros(1), "text", 3]),
        "record": Record(torch.arange(3), {"nested": (torch.ones(1), None)}),
        "ordered": OrderedDict(a=torch.ones(1)),
        "label": "unchanged",
    }
    calls = _moves(monkeypatch)
    moved = training.to_device(batch)
    assert len(calls) == 5 and all(device == torch.device("cpu") and not nb for device, nb in calls)
    assert type(moved) is dict and moved["label"] == "unchanged"
    pair = moved["pair"]
    assert isinstance(pair, Pair) and pair.inputs.moved and pair.extra[0].moved and pair.extra[1:] == ["text", 3]
    record = moved["record"]
    assert isinstance(record, Record) and record.ids.moved and record.name == "record"
    assert record.meta["nested"][0].moved and record.meta["nested"][1] is None
    assert type(record.meta["nested"]) is tuple
    assert isinstance(moved["ordered"], OrderedDict) and moved["ordered"]["a"].moved
    assert batch["record"].ids is not record.ids, "the batch passed in is left as it was"


def test_to_device_is_non_blocking_on_a_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    training = TunedTraining(FP32, nn.Linear(2, 2), torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1), device="cpu")
    training.device, training._non_blocking = torch.device("cuda", 0), True  # what the constructor sets on a GPU
    calls = _moves(monkeypatch)
    training.to_device([{"x": torch.ones(1)}, (torch.ones(1),)])
    assert calls == [(torch.device("cuda", 0), True)] * 2


# ---------------------------------------------------------------- the model-call rule and the loss


class _Echo(nn.Module):
    def forward(self, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return args, kwargs


def test_a_mapping_is_passed_as_keyword_arguments_a_pair_as_inputs_and_target_anything_else_whole() -> None:
    x, y = torch.ones(2), torch.zeros(2)
    assert call_model(_Echo(), {"input_ids": x, "labels": y}) == (
        ((), {"input_ids": x, "labels": y}),
        {"input_ids": x, "labels": y},
    )
    assert call_model(_Echo(), (x, y)) == (((x,), {}), y)
    assert call_model(_Echo(), [x, y]) == (((x,), {}), y)
    pair = Pair(x, [])
    assert call_model(_Echo(), pair) == (((pair,), {}), pair), "a namedtuple is passed whole"
    triple = (x, y, x)
    assert call_model(_Echo(), triple) == (((triple,), {}), triple)
    assert call_model(_Echo(), x) == (((x,), {}), x)


def test_the_loss_is_the_outputs_own_unless_the_workload_gives_a_loss_fn_or_a_train_step() -> None:
    loss = torch.tensor(2.0)
    assert output_loss(type("Out", (), {"loss": loss})()) is loss
    assert output_loss({"loss": loss, "logits": None}) is loss
    with pytest.raises(NoLoss, match=r"the model's output \(Tensor\) carries no loss"):
        output_loss(torch.ones(1))
    with pytest.raises(NoLoss, match=r"carries no loss"):
        output_loss({"logits": torch.ones(1), "loss": None})

    model = KeywordClassifier()
    items = [
        {"tokens": torch.tensor([1, 2, 3][:n]), "labels": torch.tensor(n % 3), "source": "synthetic"} for n in (2, 3)
    ]
    batch = pad(items)
    workload = TorchWorkload(model=model, dataset=[], optimizer=torch.optim.SGD, collate_fn=pad)
    assert workload.collate(items).keys() == batch.keys()
    assert torch.equal(workload.loss(model, batch), model(**batch).loss)
    with_fn = TorchWorkload(
        model=model, dataset=[], optimizer=torch.optim.SGD, loss_fn=lambda out, b: out.logits.sum() + b["labels"].sum()
    )
    assert torch.equal(with_fn.loss(model, batch), model(**batch).logits.sum() + batch["labels"].sum())
    own = TorchWorkload(model=model, dataset=[], optimizer=torch.optim.SGD, train_step=lambda m, b: torch.tensor(7.0))
    assert float(own.loss(model, batch)) == 7.0


def test_tuned_training_batches_its_loaders_with_the_workloads_collate_function() -> None:
    workload = keyword_batches(samples=8)
    optimizer = workload.optimizer(workload.model.parameters())
    tuned = TunedTraining(
        FP32, workload.model, optimizer, workload.dataset, device="cpu", collate_fn=workload.collate_fn
    )
    assert tuned.loader is not None
    for batch in [*tuned.loader, *tuned.make_loader(workload.dataset, shuffle=False)]:
        batch = tuned.to_device(batch)
        assert set(batch) == {"input_ids", "attention_mask", "labels", "source"} and len(batch["source"]) == 4
        with tuned.autocast():
            loss = workload.loss(tuned.model, batch)
        tuned.backward(loss)
        assert tuned.step()
