"""Exports to the trainers users have: the arguments built by `autotuner.integrations`, taken
by the real `TrainingArguments`, Lightning `Trainer` and `DataLoader`, and `Accelerator`."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from autotuner.apply import TunedConfig, parse_config
from autotuner.cli import main
from autotuner.errors import SpecError
from autotuner.integrations import FORMATS, snippet
from autotuner.integrations import accelerate as accelerate_export
from autotuner.integrations import lightning as lightning_export
from autotuner.integrations import transformers as transformers_export
from tests.conftest import ROOT


def tuned(device: str = "cpu", backend: str = "pytorch", **params: Any) -> TunedConfig:
    """An exported config as `autotuner export` writes it, global batch 64."""
    knobs = {"precision": "bf16", "batch_size": 16, "accumulation": 4, "workers": 2, "compile": "default", **params}
    data = {
        "version": 1,
        "params": knobs,
        "metrics": {"throughput": 1000.0},
        "baseline": {"params": None, "throughput": 250.0},
        "speedup": 4.0,
        "environment": {"backend": backend, "fingerprint": "f" * 16, "device": device},
        "spec": {"identity": "i" * 16, "global_batch": knobs["batch_size"] * knobs["accumulation"]},
        "study": {"name": "small", "trial": 7},
    }
    if backend == "jax":
        data["params"] = {k: v for k, v in knobs.items() if k != "compile"} | {"jit": "on"}
    return parse_config(data, "best.yaml")


CONFIGS = [
    tuned(),
    tuned(precision="fp32", batch_size=64, accumulation=1, workers=0, compile="none"),
    tuned(precision="fp16", batch_size=8, accumulation=8, workers=1, compile="max-autotune", device="cuda:0"),
]
IDS = ["bf16-default", "fp32-none", "fp16-max-autotune-cuda"]


# ------------------------------------------------------------------ Hugging Face Trainer


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_training_arguments_take_every_tuned_value(config: TunedConfig, tmp_path: Path) -> None:
    from transformers import TrainingArguments

    # The real object takes bf16 and fp16 without a GPU, not tf32 (below). With use_cpu=True it
    # turns pinned memory off itself, so a config tuned on CUDA is applied without it.
    use_cpu = not config.environment["device"].startswith("cuda")
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=use_cpu, learning_rate=3e-4, dataloader_drop_last=True)
    applied = transformers_export.apply(args, config)
    expected = transformers_export.training_arguments(config)
    for key, value in expected.items():
        assert getattr(applied, key) == value, key
    params = config.params
    assert applied.per_device_train_batch_size == params["batch_size"]
    assert applied.gradient_accumulation_steps * applied.world_size == params["accumulation"]  # the global batch
    assert (applied.bf16, applied.fp16, applied.tf32) == (
        params["precision"] == "bf16",
        params["precision"] == "fp16",
        False,  # strict fp32 matmuls, as the study ran every precision but tf32
    )
    assert applied.torch_compile == (params["compile"] != "none")
    assert applied.dataloader_num_workers == params["workers"]
    assert applied.dataloader_persistent_workers == (params["workers"] > 0)
    assert applied.dataloader_pin_memory == config.environment["device"].startswith("cuda")
    assert (applied.learning_rate, applied.dataloader_drop_last, applied.output_dir) == (3e-4, True, str(tmp_path))
    assert args.per_device_train_batch_size == 8  # a copy: the arguments passed in are unchanged


def test_the_snippets_arguments_build_a_cpu_bf16_config(tmp_path: Path) -> None:
    from transformers import TrainingArguments

    # what best.hf-trainer.py runs; without use_cpu, TrainingArguments refuses bf16 on a machine without a GPU
    arguments = transformers_export.training_arguments(tuned(precision="bf16", compile="none"))
    built = TrainingArguments(output_dir=str(tmp_path), **arguments)
    assert built.use_cpu is True and built.bf16 is True
    assert "use_cpu" not in transformers_export.training_arguments(tuned(device="cuda:0"))


def test_training_arguments_for_tf32() -> None:
    # TrainingArguments(tf32=True) needs an Ampere GPU (ValueError on this CPU): checked as arguments.
    arguments = transformers_export.training_arguments(tuned(precision="tf32", compile="reduce-overhead"))
    assert arguments["tf32"] is True and arguments["bf16"] is False and arguments["fp16"] is False
    assert arguments["torch_compile"] is True and arguments["torch_compile_mode"] == "reduce-overhead"


def test_the_global_batch_is_kept_over_processes() -> None:
    config = tuned(batch_size=16, accumulation=4)
    assert transformers_export.training_arguments(config, world_size=2)["gradient_accumulation_steps"] == 2
    assert lightning_export._trainer_arguments(config, 4)["accumulate_grad_batches"] == 1
    with pytest.raises(SpecError, match="global batch 64 .* cannot be kept over 3 processes"):
        accelerate_export.accelerator_arguments(config, world_size=3)


def test_a_config_of_another_backend_is_refused() -> None:
    with pytest.raises(SpecError, match="jax backend; trainer exports are for PyTorch"):
        transformers_export.training_arguments(tuned(backend="jax"))


# ------------------------------------------------------------------ Lightning


@pytest.mark.parametrize("config", CONFIGS[:2], ids=IDS[:2])
def test_lightning_trainer_and_loader_take_every_tuned_value(config: TunedConfig) -> None:
    from lightning import Trainer

    arguments = lightning_export._trainer_arguments(config, 1)
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **arguments,
    )
    assert trainer.precision == {"bf16": "bf16-mixed", "fp32": "32-true"}[config.params["precision"]]
    assert trainer.accumulate_grad_batches == config.params["accumulation"]
    _check_loader(lightning_export.dataloader_arguments(config), config)


def test_lightning_fp16_and_what_its_trainer_cannot_hold() -> None:
    # Lightning turns 16-mixed into bf16-mixed on a CPU: fp16 is checked as arguments.
    config = tuned(precision="fp16", compile="none")
    assert lightning_export.trainer_arguments(config) == {"precision": "16-mixed", "accumulate_grad_batches": 4}
    compiled = tuned(precision="tf32", compile="max-autotune")
    with pytest.warns(UserWarning, match="set_float32_matmul_precision"):
        assert lightning_export.trainer_arguments(compiled)["precision"] == "32-true"
    namespace = {"torch": torch, "model": torch.nn.Linear(2, 2)}
    saved = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    try:
        exec("\n".join(lightning_export.setup_code(compiled)), namespace)
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.cudnn.allow_tf32 = saved[1]
    assert isinstance(namespace["model"], torch._dynamo.eval_frame.OptimizedModule)  # compiled on first call


def _check_loader(arguments: dict[str, Any], config: TunedConfig) -> None:
    loader = DataLoader(TensorDataset(torch.zeros(64, 2)), **arguments)
    assert loader.batch_size == config.params["batch_size"]
    assert loader.num_workers == config.params["workers"]
    assert loader.persistent_workers == (config.params["workers"] > 0)
    assert loader.pin_memory == config.environment["device"].startswith("cuda")


# ------------------------------------------------------------------ Accelerate


@pytest.fixture
def fresh_accelerate() -> Iterator[None]:
    from accelerate.state import AcceleratorState

    yield
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.mark.usefixtures("fresh_accelerate")
@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_accelerator_takes_every_tuned_value(config: TunedConfig) -> None:
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True, **accelerate_export.accelerator_arguments(config))
    params = config.params
    assert accelerator.mixed_precision == {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}[params["precision"]]
    assert accelerator.gradient_accumulation_steps == params["accumulation"]
    plugin = accelerator.state.dynamo_plugin
    if params["compile"] == "none":
        assert plugin.backend.value == "NO"
    else:
        assert (plugin.backend.value, plugin.mode) == ("INDUCTOR", params["compile"])
    _check_loader(accelerate_export.dataloader_arguments(config), config)


def test_accelerate_tf32_is_said() -> None:
    with pytest.warns(UserWarning, match="set_float32_matmul_precision"):
        arguments = accelerate_export.accelerator_arguments(tuned(precision="tf32", compile="none"))
    assert arguments == {"mixed_precision": "no", "gradient_accumulation_steps": 4}


# ------------------------------------------------------------------ the printed code


def literals(code: str) -> dict[str, Any]:
    """The dict literals a snippet assigns, by name (a call inside one is kept as its source)."""
    found = {}
    for node in ast.parse(code).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            values = {}
            for key, value in zip(node.value.keys, node.value.values, strict=True):
                assert isinstance(key, ast.Constant)
                is_call = isinstance(value, ast.Call)
                values[key.value] = ast.unparse(value) if is_call else ast.literal_eval(value)
            found[node.targets[0].id] = values  # type: ignore[attr-defined]
    return found


@pytest.mark.parametrize("config", [*CONFIGS, tuned(precision="tf32", compile="none")])
def test_snippets_are_python_holding_the_arguments(config: TunedConfig) -> None:
    code = {fmt: snippet(fmt, config) for fmt in FORMATS}
    for fmt, text in code.items():
        compile(text, f"best.{fmt}.py", "exec")
        assert f"--format {fmt}" in text.splitlines()[0]
    assert literals(code["hf-trainer"]) == {"tuned": transformers_export.training_arguments(config)}
    assert literals(code["lightning"]) == {
        "trainer_arguments": lightning_export._trainer_arguments(config, 1),
        "loader_arguments": lightning_export.dataloader_arguments(config),
    }
    accelerate = literals(code["accelerate"])
    mode = config.params["compile"]
    plugin = {"dynamo_plugin": f"TorchDynamoPlugin(backend='inductor', mode='{mode}')"} if mode != "none" else {}
    assert accelerate["accelerator_arguments"] == {**accelerate_export._arguments(config, 1), **plugin}
    assert accelerate["loader_arguments"] == accelerate_export.dataloader_arguments(config)
    for fmt in ("lightning", "accelerate"):
        tf32 = 'torch.set_float32_matmul_precision("high")' in code[fmt]
        assert tf32 == (config.params["precision"] == "tf32"), fmt
    assert (f'torch.compile(model, mode="{mode}")' in code["lightning"]) == (mode != "none")


# ------------------------------------------------------------------ libraries


def test_a_missing_library_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    assert main(["export", "--spec", "job.yaml", "--format", "hf-trainer"]) == 2
    err = capsys.readouterr().err
    assert err == "autotuner: error: --format hf-trainer: transformers is not installed: pip install 'autotuner[hf]'\n"


def test_importing_autotuner_and_its_cli_imports_no_trainer() -> None:
    code = (
        "import sys, autotuner.cli, autotuner.integrations\n"
        "autotuner.cli.build_parser()\n"
        "print([m for m in ('transformers', 'lightning', 'accelerate') if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
