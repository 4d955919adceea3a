"""The `memory_budget` knob: torch.compile's activation memory budget, a real number in [0, 1]."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch._functorch.config

from autotuner.backends.pytorch import PYTORCH, TorchCapabilities
from autotuner.backends.pytorch.apply import TunedTraining
from autotuner.backends.pytorch.knobs.memory_budget import MEMORY_BUDGET, setup
from autotuner.config.knobs import needs_as_much_memory
from autotuner.proposals.guided_start import rule_of_thumb

CONFIG = {"precision": "fp32", "batch_size": 8, "accumulation": 2, "workers": 0, "compile": "default"}


@pytest.fixture
def budget_restored() -> Iterator[None]:
    saved = torch._functorch.config.activation_memory_budget
    yield
    torch._functorch.config.activation_memory_budget = saved


def test_its_values_are_real_numbers_from_0_to_1() -> None:
    assert MEMORY_BUDGET.check(0.5) is None and MEMORY_BUDGET.check(0) is None and MEMORY_BUDGET.check(1) is None
    assert MEMORY_BUDGET.check(1.5) == "must be a number <= 1, got 1.5"
    assert MEMORY_BUDGET.check(-0.1) == "must be a number >= 0, got -0.1"
    assert MEMORY_BUDGET.check("half") == "must be a number >= 0, got 'half'"
    assert MEMORY_BUDGET.check(True) is not None
    assert MEMORY_BUDGET.values_text() == "numbers from 0 to 1"
    # a smaller budget keeps less: a budget that ran out of memory rules out the larger ones
    assert needs_as_much_memory({"memory_budget": 0.5}, {"memory_budget": 0.2}, PYTORCH.knobs)
    assert not needs_as_much_memory({"memory_budget": 0.2}, {"memory_budget": 0.5}, PYTORCH.knobs)


def test_it_runs_only_where_torch_compile_partitions_a_graph() -> None:
    compiles = TorchCapabilities(compile=True)
    assert PYTORCH.irrelevant("memory_budget", 0.5, TorchCapabilities()).startswith("memory_budget=0.5: torch.compile")
    assert PYTORCH.irrelevant("memory_budget", 0.5, compiles) is None
    assert PYTORCH.irrelevant("memory_budget", 1.0, TorchCapabilities()) is None  # the reference: always
    config = {**PYTORCH.config_params({**CONFIG, "compile": "none"}), "memory_budget": 0.5}
    assert PYTORCH.unsupported_reason(config, compiles) == (
        "memory_budget=0.5 with compile=none: only torch.compile's partitioner recomputes activations"
    )
    assert PYTORCH.unsupported_reason({**config, "compile": "default"}, compiles) is None


def test_the_rule_of_thumb_leaves_a_budget_at_its_reference() -> None:
    space = {"precision": ["fp32", "bf16"], "batch_size": [8, 16], "memory_budget": [0.2, 0.5, 1.0]}
    assert rule_of_thumb(space)["memory_budget"] == 1.0


def test_an_export_sets_it_where_a_trainer_cannot() -> None:
    assert setup({"memory_budget": 1.0}) == []
    lines = setup({"memory_budget": 0.5})
    namespace: dict[str, object] = {}
    saved = torch._functorch.config.activation_memory_budget
    try:
        exec("\n".join(lines), namespace)
        assert torch._functorch.config.activation_memory_budget == 0.5
    finally:
        torch._functorch.config.activation_memory_budget = saved


@pytest.mark.slow
@pytest.mark.usefixtures("budget_restored")
def test_a_compiled_model_under_a_budget_trains_as_it_does_without() -> None:
    """Recomputing activations computes the same values again: the losses agree with the default
    budget's to the rounding of a recompiled graph; the budget is set for the process."""
    if PYTORCH.irrelevant("compile", "default", TorchCapabilities(compile=True)) is not None:
        pytest.skip("torch.compile cannot build kernels here")
    losses = {}
    for budget in (1.0, 0.2):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
        training = TunedTraining(
            {**CONFIG, "memory_budget": budget}, model, torch.optim.SGD(model.parameters(), lr=0.1), device="cpu"
        )
        assert torch._functorch.config.activation_memory_budget == budget
        generator = torch.Generator().manual_seed(1)
        run = []
        for _ in range(4 * training.accumulation):
            x, y = torch.randn(8, 16, generator=generator), torch.randint(4, (8,), generator=generator)
            with training.autocast():
                loss = torch.nn.functional.cross_entropy(training.model(x), y)
            training.backward(loss)
            training.step()
            run.append(loss.item())
        losses[budget] = run
        torch._dynamo.reset()
    assert losses[0.2] == pytest.approx(losses[1.0], rel=1e-5)
