"""A Hugging Face model as a user has it (the example factory: GPT-2 from a config, a dataset of
dicts, the loss the model computes): the gradient checkpointing its factory turns on trains as
without it. Its study end to end is tests/e2e/test_huggingface.py's."""

from __future__ import annotations

import pytest
import torch

from autotuner.backends.pytorch.apply import TunedTraining

pytest.importorskip("transformers")


def test_gradient_checkpointing_the_factory_turns_on_trains_as_without_it() -> None:
    """A model the factory left with gradient checkpointing on is trained that way by
    `TunedTraining` (as a trial trains it), to the same weights: it recomputes, it changes nothing."""
    from examples.huggingface.gpt2 import make_workload

    weights = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        workload = make_workload(
            layers=2, width=32, heads=2, vocab=64, length=16, samples=32, checkpointing=checkpointing
        )
        config = {"precision": "fp32", "batch_size": 8, "accumulation": 2, "workers": 0, "compile": "none"}
        training = TunedTraining(
            config, workload.model, workload.optimizer(workload.model.parameters()), workload.dataset
        )
        workload.model.train()
        for batch in training.loader:
            loss = workload.model(**training.to_device(batch)).loss
            training.backward(loss)
            training.step()
        assert workload.model.is_activation_checkpointing == checkpointing
        weights.append(torch.cat([p.detach().flatten() for p in workload.model.parameters()]))
    torch.testing.assert_close(weights[1], weights[0])
