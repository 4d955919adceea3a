"""Exports to the trainers users have: the arguments built by
`autotuner.backends.pytorch.integrations`, taken by the real `TrainingArguments`, Lightning
`Trainer` and `DataLoader`, and `Accelerator`."""

from __future__ import annotations

import ast
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from autotuner.backends.pytorch import PARALLEL_KNOBS, PYTORCH
from autotuner.backends.pytorch.integrations import TRAINERS, loader_arguments, snippet
from autotuner.backends.pytorch.integrations import accelerate as accelerate_export
from autotuner.backends.pytorch.integrations import lightning as lightning_export
from autotuner.backends.pytorch.integrations import transformers as transformers_export
from autotuner.backends.pytorch.knobs.attention import SDPA_FLAGS, sdpa_code
from autotuner.cli import main
from autotuner.errors import SpecError
from autotuner.export.reader import TunedConfig, parse_config
from tests.support.studies import ROOT


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


NEW_KNOBS = {
    "memory_format": "channels_last",
    "optimizer": "fused",
    "checkpointing": "blocks",
    "attention": "math",
    "pin_memory": True,
    "prefetch_factor": 4,
    "cudnn_benchmark": True,
    "memory_budget": 0.5,
    "float8": "tensorwise",
}
"""Every knob added after the first five, off its reference value."""
CONFIGS = [
    tuned(),
    tuned(precision="fp32", batch_size=64, accumulation=1, workers=0, compile="none"),
    tuned(precision="fp16", batch_size=8, accumulation=8, workers=1, compile="max-autotune", device="cuda:0"),
    tuned(precision="fp16", compile="none", device="cuda:0", **NEW_KNOBS),
]
IDS = ["bf16-default", "fp32-none", "fp16-max-autotune-cuda", "fp16-new-knobs-cuda"]


def pinned(config: TunedConfig) -> bool:
    """Whether the config's loader pins memory: the knob, on a CUDA device only."""
    return bool(config.params["pin_memory"]) and config.environment["device"].startswith("cuda")


@pytest.fixture
def flags_restored() -> Iterator[None]:
    """The process-wide flags setup code sets (cuDNN, SDPA kernels, TF32), as they were before the test."""
    cuda = torch.backends.cuda
    kernels = [
        cuda.flash_sdp_enabled(),
        cuda.mem_efficient_sdp_enabled(),
        cuda.math_sdp_enabled(),
        cuda.cudnn_sdp_enabled(),
    ]
    saved = torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()
    yield
    for enable, on in zip(
        (cuda.enable_flash_sdp, cuda.enable_mem_efficient_sdp, cuda.enable_math_sdp, cuda.enable_cudnn_sdp),
        kernels,
        strict=True,
    ):
        enable(on)
    torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32 = saved[:2]
    torch.set_float32_matmul_precision(saved[2])


# ------------------------------------------------------------------ Hugging Face Trainer


@pytest.mark.filterwarnings("ignore:the Trainer's arguments have no place")
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
    assert applied.dataloader_pin_memory == pinned(config)
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


def tiny_gpt2() -> Any:
    """A Hugging Face model as the Trainer takes one: GPT-2, a few thousand weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=16, n_head=2, n_positions=8, vocab_size=32, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def test_training_arguments_hold_the_loader_checkpointing_and_fused_knobs(tmp_path: Path) -> None:
    import dataclasses

    from transformers import TrainingArguments

    config = CONFIGS[IDS.index("fp16-new-knobs-cuda")]
    with pytest.warns(UserWarning, match="no place for part of this config; run: torch.backends.cudnn.benchmark"):
        arguments = transformers_export.training_arguments(config)
    fields = {field.name for field in dataclasses.fields(TrainingArguments)}
    # the name this transformers reads: a copy made with only the deprecated one keeps checkpointing off
    name = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    assert {key: arguments[key] for key in (name, f"{name}_kwargs", "optim")} == {
        name: True,
        f"{name}_kwargs": {"use_reentrant": False},  # as TunedTraining checkpoints
        "optim": "adamw_torch_fused",
    }
    assert (arguments["dataloader_pin_memory"], arguments["dataloader_prefetch_factor"]) == (True, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # no deprecated argument
        built = TrainingArguments(output_dir=str(tmp_path), **arguments)
    assert getattr(built, name) is True and built.optim == "adamw_torch_fused"
    assert (built.dataloader_pin_memory, built.dataloader_prefetch_factor) == (True, 4)
    on_cpu = transformers_export.training_arguments(tuned(compile="none", pin_memory=True, prefetch_factor=4))
    assert on_cpu["dataloader_pin_memory"] is False and on_cpu["dataloader_prefetch_factor"] == 4
    assert "dataloader_prefetch_factor" not in transformers_export.training_arguments(tuned(workers=0))


@pytest.mark.parametrize(("device", "choice"), [("cpu", "fused"), ("cuda:0", "foreach"), ("cpu", "foreach")])
def test_the_trainers_adamw_takes_the_optimizer_flag(device: str, choice: str, tmp_path: Path) -> None:
    from transformers import Trainer, TrainingArguments

    config = tuned(device=device, precision="fp32", compile="none", optimizer=choice)
    arguments = {**transformers_export._training_arguments(config, 1), "use_cpu": True}  # this machine's CPU
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], **arguments)
    setup = transformers_export.setup_code(config)
    namespace: dict[str, Any] = {"torch": torch, "args": args}
    exec("\n".join(setup), namespace)
    extra = {"optimizer_cls_and_kwargs": namespace["foreach_adamw"]} if "foreach_adamw" in namespace else {}
    optimizer = Trainer(model=tiny_gpt2(), args=args, **extra).create_optimizer()
    assert isinstance(optimizer, torch.optim.AdamW)
    flags = optimizer.defaults["foreach"], optimizer.defaults["fused"]
    if choice == "fused":
        assert (args.optim, flags, setup) == ("adamw_torch_fused", (None, True), [])
    elif device == "cpu":  # off a GPU torch's AdamW loops unless told: the setup line tells it
        assert flags == (True, None)  # optimizer_cls_and_kwargs overrides args.optim
        with pytest.warns(UserWarning, match="foreach_adamw = "):
            transformers_export.training_arguments(config)
    else:  # torch's AdamW takes its foreach path for GPU parameters by default
        assert (args.optim, flags, setup) == ("adamw_torch", (None, None), [])


@pytest.mark.usefixtures("flags_restored")
@pytest.mark.parametrize("attention", ["math", "eager"])
def test_hf_setup_code_sets_the_flags_and_the_models_attention(attention: str) -> None:
    from transformers import TrainingArguments

    config = tuned(device="cuda:0", precision="fp16", compile="none", attention=attention, cudnn_benchmark=True)
    setup = transformers_export.setup_code(config)
    model = tiny_gpt2()
    model.set_attn_implementation("sdpa" if attention == "eager" else "eager")  # the other one: it must switch
    exec("\n".join(setup), {"torch": torch, "model": model})
    assert model.config._attn_implementation == ("eager" if attention == "eager" else "sdpa")
    assert torch.backends.cudnn.benchmark is True
    if attention == "math":
        assert not torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
    with pytest.warns(UserWarning, match="set_attn_implementation"):
        transformers_export.apply(TrainingArguments(output_dir="trainer-output", report_to=[]), config)


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


class ConvBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(images))


class ConvBlocks(torch.nn.Module):
    """Convolutions in repeated blocks: the network a LightningModule holds."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.Sequential(ConvBlock(), ConvBlock())
        self.head = torch.nn.Linear(4, 2)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(images).mean(dim=(2, 3)))


@pytest.mark.usefixtures("flags_restored")
def test_lightning_takes_the_new_knobs_as_arguments_and_setup_code() -> None:
    from lightning import LightningModule, Trainer

    config = tuned(precision="fp32", compile="none", **NEW_KNOBS)
    with pytest.warns(UserWarning, match="enable_checkpointing"):
        arguments = lightning_export.trainer_arguments(config)
    assert arguments == {"precision": "32-true", "accumulate_grad_batches": 4, "benchmark": True}
    torch.backends.cudnn.benchmark = False
    Trainer(
        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False, **arguments
    )
    assert torch.backends.cudnn.benchmark is True  # Lightning sets it
    setup = lightning_export.setup_code(config)
    assert setup[0] == "from autotuner.backends.pytorch.apply import float8_training, enable_checkpointing"
    assert setup[-1] == "# optimizer=fused: build the optimizer in configure_optimizers with fused=True"
    assert not any("cudnn.benchmark" in line for line in setup)  # the Trainer's argument holds it

    class Module(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = ConvBlocks()

    module = Module()
    namespace = {"torch": torch, "model": module}
    exec("\n".join(setup), namespace)
    assert namespace["model"] is module
    assert module.net.blocks[0].conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert all(block._autotuner_checkpointed for block in module.net.blocks)  # the repeated block type, found inside
    assert torch.backends.cuda.math_sdp_enabled() and not torch.backends.cuda.flash_sdp_enabled()
    module.net(torch.randn(2, 4, 8, 8)).sum().backward()  # checkpointed blocks still train
    assert module.net.blocks[0].conv.weight.grad is not None


def _check_loader(arguments: dict[str, Any], config: TunedConfig) -> None:
    loader = DataLoader(TensorDataset(torch.zeros(64, 2)), **arguments)
    assert loader.batch_size == config.params["batch_size"]
    assert loader.num_workers == config.params["workers"]
    assert loader.persistent_workers == (config.params["workers"] > 0)
    assert loader.pin_memory == pinned(config)
    assert loader.prefetch_factor == (config.params["prefetch_factor"] if config.params["workers"] else None)


# ------------------------------------------------------------------ Accelerate


@pytest.fixture
def fresh_accelerate() -> Iterator[None]:
    from accelerate.state import AcceleratorState

    yield
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.mark.usefixtures("fresh_accelerate")
@pytest.mark.filterwarnings("ignore:the Accelerator has no argument")
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


@pytest.mark.usefixtures("fresh_accelerate", "flags_restored")
def test_accelerate_setup_code_rebuilds_the_optimizer_and_prepares_the_model() -> None:
    from accelerate import Accelerator

    config = tuned(precision="fp32", compile="none", **{**NEW_KNOBS, "optimizer": "foreach"})
    with pytest.warns(UserWarning, match="rebuilt_optimizer"):
        arguments = accelerate_export.accelerator_arguments(config)
    setup = accelerate_export.setup_code(config)
    imports = "from autotuner.backends.pytorch.apply import float8_training, enable_checkpointing, rebuilt_optimizer"
    assert setup[0] == imports
    model = ConvBlocks()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    namespace = {"torch": torch, "model": model, "optimizer": optimizer}
    exec("\n".join(setup), namespace)
    rebuilt = namespace["optimizer"]
    assert type(rebuilt) is torch.optim.AdamW and rebuilt.defaults["foreach"] is True
    assert (rebuilt.defaults["lr"], rebuilt.defaults["weight_decay"]) == (1e-3, 0.05)  # its hyperparameters kept
    assert torch.backends.cudnn.benchmark is True and torch.backends.cuda.math_sdp_enabled()
    assert all(block._autotuner_checkpointed for block in model.blocks)
    accelerator = Accelerator(cpu=True, **arguments)
    loader = DataLoader(TensorDataset(torch.randn(32, 4, 8, 8)), **accelerate_export.dataloader_arguments(config))
    model, rebuilt, loader = accelerator.prepare(model, rebuilt, loader)
    (images,) = next(iter(loader))
    accelerator.backward(model(images).sum())
    rebuilt.step()  # the prepared optimizer is the rebuilt one


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


@pytest.mark.filterwarnings("ignore:the Trainer's arguments have no place")
@pytest.mark.parametrize(
    "config", [*CONFIGS, tuned(precision="tf32", compile="none"), tuned(optimizer="foreach", attention="eager")]
)
def test_snippets_are_python_holding_the_arguments(config: TunedConfig) -> None:
    code = {fmt: snippet(fmt, config) for fmt in TRAINERS}
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


# ------------------------------------------------------------------ shared: the loader, the SDPA kernel, old configs


def test_loader_arguments_pin_and_prefetch_as_the_study_did() -> None:
    config = tuned(device="cuda:0", workers=2, pin_memory=True, prefetch_factor=4)
    arguments = loader_arguments(config)
    assert arguments == {
        "batch_size": 16,
        "num_workers": 2,
        "pin_memory": True,
        "persistent_workers": True,
        "prefetch_factor": 4,
    }
    _check_loader(arguments, config)
    assert loader_arguments(tuned(pin_memory=True))["pin_memory"] is False  # pinned memory only speeds copies to a GPU
    assert "prefetch_factor" not in loader_arguments(tuned(workers=0, prefetch_factor=4))  # DataLoader refuses it
    assert "prefetch_factor" not in loader_arguments(tuned(workers=2, prefetch_factor=2))  # DataLoader's default
    # A CUDA config exported before the knob existed pins, as its study's loader did (parse_config).
    old = tuned(device="cuda:0")
    assert old.params["pin_memory"] is True and loader_arguments(old)["pin_memory"] is True


@pytest.mark.usefixtures("flags_restored")
@pytest.mark.parametrize("attention", sorted(SDPA_FLAGS))
def test_sdpa_code_sets_the_flags_sdpa_kernel_sets_in_the_study(attention: str) -> None:
    from torch.nn.attention import sdpa_kernel

    from autotuner.backends.pytorch.knobs.attention import kernel

    cuda = torch.backends.cuda

    def kernels() -> tuple[bool, ...]:
        return (
            cuda.flash_sdp_enabled(),
            cuda.mem_efficient_sdp_enabled(),
            cuda.math_sdp_enabled(),
            cuda.cudnn_sdp_enabled(),
        )

    with sdpa_kernel([kernel(attention)]):  # what TunedTraining runs each forward in
        inside = kernels()
    exec("\n".join(sdpa_code(attention)), {"torch": torch})
    assert kernels() == inside and sum(inside) == 1
    assert sdpa_code("default") == sdpa_code("eager") == []


@pytest.mark.parametrize("config", CONFIGS[:3], ids=IDS[:3])
def test_a_config_exported_before_the_new_knobs_exports_as_before(config: TunedConfig) -> None:
    # tuned() writes params with the first five knobs only, as exports were before the others existed
    old = {"precision", "batch_size", "accumulation", "workers", "compile"}
    parallel = {knob.name for knobs in PARALLEL_KNOBS.values() for knob in knobs}
    assert set(config.params) - old == set(NEW_KNOBS) | parallel  # filled in at their reference values
    hf = {"bf16", "fp16", "tf32", "per_device_train_batch_size", "gradient_accumulation_steps"}
    hf |= {"dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers", "torch_compile"}
    arguments = transformers_export.training_arguments(config)
    assert set(arguments) - hf <= {"torch_compile_mode", "use_cpu"}
    assert transformers_export.setup_code(config) == []
    assert set(lightning_export._trainer_arguments(config, 1)) == {"precision", "accumulate_grad_batches"}
    assert set(loader_arguments(config)) == {"batch_size", "num_workers", "pin_memory", "persistent_workers"}
    tf32 = config.params["precision"] == "tf32"
    compiled = config.params["compile"] != "none"
    assert len(lightning_export.setup_code(config)) == 2 * tf32 + compiled
    assert len(accelerate_export.setup_code(config)) == 2 * tf32
    assert "import torch" not in snippet("hf-trainer", config)


def test_an_old_cpu_configs_snippets_are_unchanged() -> None:
    config = tuned(precision="bf16", compile="default")  # as exported before the new knobs
    code = {fmt: snippet(fmt, config).split("\n", 4)[4] for fmt in OLD_SNIPPETS}  # after the header
    assert code == OLD_SNIPPETS


OLD_SNIPPETS = {
    "hf-trainer": """# autotuner.backends.pytorch.integrations.transformers.apply(args, config) divides it by args.world_size.
from transformers import TrainingArguments

tuned = {
    'bf16': True,
    'fp16': False,
    'tf32': False,
    'per_device_train_batch_size': 16,
    'gradient_accumulation_steps': 4,
    'dataloader_num_workers': 2,
    'dataloader_pin_memory': False,
    'dataloader_persistent_workers': True,
    'torch_compile': True,
    'torch_compile_mode': 'default',
    'use_cpu': True,
}
args = TrainingArguments(output_dir="trainer-output", **tuned)  # your own arguments beside them
""",  # noqa: E501 (the path of `apply` in its first line)
    "lightning": """import torch
from lightning import Trainer
from torch.utils.data import DataLoader

trainer_arguments = {
    'precision': 'bf16-mixed',
    'accumulate_grad_batches': 4,
}
loader_arguments = {
    'batch_size': 16,
    'num_workers': 2,
    'pin_memory': False,
    'persistent_workers': True,
}
model = torch.compile(model, mode="default")  # the LightningModule, before fit
trainer = Trainer(**trainer_arguments)  # your own arguments beside them
loader = DataLoader(dataset, shuffle=True, **loader_arguments)  # your dataset
trainer.fit(model, loader)  # your LightningModule
""",
    "accelerate": """from accelerate import Accelerator
from accelerate.utils import TorchDynamoPlugin
from torch.utils.data import DataLoader

accelerator_arguments = {
    'mixed_precision': 'bf16',
    'gradient_accumulation_steps': 4,
    'dynamo_plugin': TorchDynamoPlugin(backend="inductor", mode="default"),
}
loader_arguments = {
    'batch_size': 16,
    'num_workers': 2,
    'pin_memory': False,
    'persistent_workers': True,
}
accelerator = Accelerator(**accelerator_arguments)  # your own arguments beside them
loader = DataLoader(dataset, shuffle=True, **loader_arguments)  # your dataset
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)  # your model and optimizer
""",
}
"""What `autotuner export --format` printed for that config before the new knobs (after its header)."""


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
        "import sys, autotuner.cli, autotuner.backends.pytorch.integrations\n"
        "autotuner.cli.build_parser()\n"
        "print([m for m in ('transformers', 'lightning', 'accelerate') if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_former_import_path_imports_the_same_modules() -> None:
    """Scripts written against `autotuner.integrations`, the path the guides gave before the formats
    moved into their backend, import the same functions."""
    import autotuner.backends.pytorch.integrations as formats
    from autotuner.integrations import FORMATS
    from autotuner.integrations.lightning import trainer_arguments
    from autotuner.integrations.transformers import apply

    assert FORMATS is formats.FORMATS and apply is transformers_export.apply
    assert trainer_arguments is lightning_export.trainer_arguments


def test_every_knob_of_one_process_is_written_by_every_format() -> None:
    """A knob a format's arguments cannot hold is a setup line or a comment there, never dropped:
    every snippet names every knob of a config that moves them all off their reference values."""
    one_process = {
        knob.name
        for knob in PYTORCH.knobs.values()
        if knob.quiet and not any(knob in family for family in PARALLEL_KNOBS.values())
    }
    assert set(NEW_KNOBS) == one_process  # a new knob is added here, off its reference value
    for device in ("cpu", "cuda:0"):
        config = tuned(precision="bf16", compile="default", device=device, **NEW_KNOBS)
        for fmt in TRAINERS:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the trainers' arguments warn of what they cannot hold
                text = snippet(fmt, config)
            assert [knob for knob in NEW_KNOBS if knob not in text] == [], (fmt, device)
