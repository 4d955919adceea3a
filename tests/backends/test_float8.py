"""The `float8` knobs: torchao's float8 training of the linear layers, and under `parallel: fsdp`
its fp8 all-gather and precomputed scales. torchao converts and trains on the CPU (its fp8 matmuls
run there too, slowly), so the conversion, a few steps and FSDP2's fp8 all-gather over one gloo
rank are checked here; where it pays (a GPU of compute capability 8.9 or later) is
tests/e2e/test_gpu.py's."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch

from autotuner.backends.pytorch import PYTORCH, TorchCapabilities
from autotuner.backends.pytorch.apply import TunedTraining
from autotuner.backends.pytorch.knobs.float8 import float8_layer, setup
from autotuner.spec.job import parse_spec
from tests.support.studies import SMALL_SPEC

pytest.importorskip("torchao.float8")

FP32 = {"precision": "fp32", "batch_size": 8, "accumulation": 1, "workers": 0, "compile": "none"}
FP8 = TorchCapabilities(accelerator=True, bf16=True, fp16=True, fp8_training=True)
"""A GPU with fp8 tensor cores and torchao."""


def _model() -> torch.nn.Sequential:
    """Two layers fp8 matmuls take (dimensions multiples of 16) around one they do not (10 outputs)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10), torch.nn.ReLU(), torch.nn.Linear(10, 16)
    )


def _steps(tuned: TunedTraining, count: int) -> list[float]:
    generator = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(count):
        with tuned.autocast():
            loss = tuned.model(torch.randn(8, 32, generator=generator)).square().mean()
        tuned.backward(loss)
        tuned.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_the_linear_layers_fp8_matmuls_take_become_float8_linear_and_train(recipe: str) -> None:
    from torchao.float8.float8_linear import Float8Linear

    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    tuned = TunedTraining({**FP32, "float8": recipe}, model, optimizer, device="cpu")
    converted = [type(layer) is Float8Linear for layer in tuned.module]
    assert converted == [True, False, False, False, False]  # 64 -> 10 and 10 -> 16: not multiples of 16
    assert tuned.module[0].config.round_scales_to_power_of_2 is (recipe == "rowwise")  # the recipe's
    assert tuned.optimizer is optimizer  # the layers keep their parameters
    losses = _steps(tuned, 3)
    assert all(torch.isfinite(torch.tensor(losses)))
    again = TunedTraining({**FP32, "float8": recipe}, model, optimizer, device="cpu")  # a model tuned before
    assert again.module[0] is tuned.module[0]  # kept, not converted twice


def test_none_leaves_the_model_as_it_is() -> None:
    model = _model()
    tuned = TunedTraining({**FP32, "float8": "none"}, model, torch.optim.SGD(model.parameters(), lr=0.01), device="cpu")
    assert all(type(layer) in (torch.nn.Linear, torch.nn.ReLU) for layer in tuned.module)


def test_the_filter_takes_linear_layers_of_multiples_of_16_under_the_model() -> None:
    assert float8_layer(torch.nn.Linear(16, 32), "blocks.0.fc")
    assert not float8_layer(torch.nn.Linear(16, 30), "head")
    assert not float8_layer(torch.nn.Linear(24, 32), "head")
    assert not float8_layer(torch.nn.Linear(16, 32), "")  # the model itself is not swapped
    assert not float8_layer(torch.nn.Conv2d(16, 32, 3), "conv")


def test_it_runs_only_on_a_gpu_with_fp8_tensor_cores_and_torchao() -> None:
    cpu = TorchCapabilities(bf16=True, compile=True)
    for value in ("tensorwise", "rowwise"):
        reason = PYTORCH.irrelevant("float8", value, cpu)
        assert reason == (
            f"float8={value}: fp8 training needs an NVIDIA GPU of compute capability 8.9 or later (Ada, Hopper) "
            "and torchao (pip install torchao)"
        )
        assert PYTORCH.irrelevant("float8", value, FP8) is None
    assert PYTORCH.irrelevant("float8", "none", cpu) is None  # the reference: always
    assert "a knob of parallel: fsdp" in (PYTORCH.irrelevant("float8_all_gather", True, FP8) or "")
    fsdp = TorchCapabilities(**{**FP8.__dict__, "fsdp": True})
    assert PYTORCH.irrelevant("float8_all_gather", True, fsdp) is None
    assert PYTORCH.irrelevant("float8_precompute", True, fsdp) is None
    no_fp8 = TorchCapabilities(fsdp=True)
    assert "compute capability 8.9" in (PYTORCH.irrelevant("float8_precompute", True, no_fp8) or "")


def test_the_probe_of_a_cpu_offers_no_fp8_training() -> None:
    from autotuner.backends.pytorch.probe import environment

    assert environment(torch.device("cpu")).capabilities["fp8_training"] is False


@pytest.mark.parametrize(
    ("knobs", "reason"),
    [
        ({"float8": "tensorwise", "precision": "fp16"}, "float8=tensorwise with precision=fp16: torchao's"),
        ({"float8": "rowwise", "float8_all_gather": True}, "float8_all_gather=true with float8=rowwise"),
        ({"float8": "none", "float8_all_gather": True}, "float8_all_gather=true with float8=none"),
        ({"float8": "tensorwise", "float8_precompute": True}, "float8_precompute=true without float8_all_gather"),
        ({"float8": "tensorwise", "float8_all_gather": True, "float8_precompute": True}, None),
        ({"float8": "rowwise", "precision": "bf16"}, None),
        ({"float8": "tensorwise", "precision": "tf32"}, None),
    ],
)
def test_what_cannot_run_together(knobs: dict[str, object], reason: str | None) -> None:
    caps = TorchCapabilities(**{**FP8.__dict__, "fsdp": True, "tf32": True})
    config = {**PYTORCH.config_params(FP32), **knobs}
    found = PYTORCH.unsupported_reason(config, caps)
    assert found == reason if reason is None else (found or "").startswith(reason)


def test_a_cpu_spec_that_asks_for_float8_drops_it_with_its_reason() -> None:
    spec = {**SMALL_SPEC, "space": {**SMALL_SPEC["space"], "float8": ["none", "tensorwise", "rowwise"]}}
    job = parse_spec(copy.deepcopy(spec), "spec.yaml")
    narrowed, dropped = job.narrow(TorchCapabilities(bf16=True, compile=True))
    assert narrowed.space["float8"] == ("none",)
    assert set(dropped["float8"]) == {"tensorwise", "rowwise"}
    assert all("compute capability 8.9" in why and "\n" not in why for why in dropped["float8"].values())


@pytest.fixture
def optimizer_hooks_restored() -> Iterator[None]:
    from torch.optim import optimizer

    saved = dict(optimizer._global_optimizer_post_hooks)
    yield
    optimizer._global_optimizer_post_hooks.clear()
    optimizer._global_optimizer_post_hooks.update(saved)


@pytest.mark.usefixtures("optimizer_hooks_restored")
def test_an_export_converts_the_model_and_precomputes_the_scales_after_each_step() -> None:
    from torch.optim import optimizer as optimizers
    from torchao.float8.float8_linear import Float8Linear

    assert setup({"float8": "none"}) == []
    model = _model()
    exec("\n".join(setup({"float8": "rowwise"})), {"torch": torch, "model": model})
    assert [type(layer) is Float8Linear for layer in model][:3] == [True, False, False]
    lines = setup({"float8": "tensorwise", "float8_all_gather": True, "float8_precompute": True})
    assert any("all_gather=True" in line and "float8_all_gather" in line for line in lines)
    hooks = len(optimizers._global_optimizer_post_hooks)
    model = _model()
    exec("\n".join(lines), {"torch": torch, "model": model})
    assert model[0].config.enable_fsdp_float8_all_gather is True
    assert len(optimizers._global_optimizer_post_hooks) == hooks + 1


@pytest.mark.parametrize("precompute", [False, True])
def test_fsdp2_gathers_the_fp8_weights_and_precomputes_their_scales(one_rank: None, precompute: bool) -> None:
    """One gloo rank: the weights become torchao's fp8-gathered tensors under FSDP2's DTensors, the
    optimizer steps those, and with precomputed scales each step leaves every weight's scale."""
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    model = _model()
    knobs = {"float8": "tensorwise", "float8_all_gather": True, "float8_precompute": precompute}
    tuned = TunedTraining({**FP32, **knobs}, model, torch.optim.SGD(model.parameters(), lr=0.01), parallel="fsdp")
    weight = tuned.module[0].weight
    assert isinstance(weight._local_tensor, WeightWithDynamicFloat8CastTensor)
    stepped = {id(p) for group in tuned.optimizer.param_groups for p in group["params"]}
    assert stepped == {id(p) for p in tuned.module.parameters()}
    assert weight._local_tensor._precomputed_scale is None
    _steps(tuned, 2)
    assert (weight._local_tensor._precomputed_scale is not None) is precompute
    tuned.finish()


def test_lightnings_fsdp1_export_converts_the_layers_and_says_why_it_gathers_no_fp8() -> None:
    from autotuner.backends.pytorch.integrations import lightning as lightning_export
    from tests.backends.integrations.test_parallel_exports import tuned

    knobs = {"float8": "tensorwise", "float8_all_gather": True, "float8_precompute": True}
    lines = lightning_export.setup_code(tuned("fsdp", **knobs))
    assert any(line.startswith('float8_training(model, "tensorwise")') for line in lines)
    assert lines[-1].startswith("# float8_all_gather, float8_precompute: FSDP2's;")
    assert not any("precompute_float8_dynamic_scale_for_fsdp" in line for line in lines)
