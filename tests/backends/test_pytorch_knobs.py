"""The PyTorch knobs beyond precision, batch, workers and compile: what each does to the model,
the optimizer and the loader (through `TunedTraining`, as trials and users apply them), which
device and workload can use which (the probe's capabilities, the space narrowed before the first
trial), and the trial that finds its workload cannot honour one (`unsupported`, with the
reason). Searches over them, and configs exported before they existed, are
tests/e2e/test_pytorch_knobs.py's."""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autotuner.backends.pytorch import PYTORCH, TorchCapabilities
from autotuner.backends.pytorch.apply import (
    TunedTraining,
    enable_checkpointing,
    rebuilt_optimizer,
    repeated_blocks,
    without_checkpointing,
)
from autotuner.backends.pytorch.builtin import Block, cnn, gpt, mlp, resnet
from autotuner.backends.pytorch.probe import environment, workload_capabilities
from autotuner.backends.pytorch.workload import TorchWorkload
from autotuner.config.knobs import needs_as_much_memory
from autotuner.errors import SpecError
from autotuner.output.formatting import format_config
from autotuner.output.report import peak_memory
from autotuner.spec.job import MAX_CONFIGS, parse_spec
from autotuner.trials.outcomes import Unsupported
from tests.support.studies import SMALL_SPEC

FP32 = {"precision": "fp32", "batch_size": 8, "accumulation": 1, "workers": 0, "compile": "none"}
CPU = TorchCapabilities(bf16=True, compile=True, sdpa_flash=True)
GPU = TorchCapabilities(
    accelerator=True, bf16=True, fp16=True, tf32=True, compile=True, cuda_graphs=True, cudnn=True,
    sdpa_flash=True, sdpa_efficient=True, sdpa_cudnn=True,
)  # fmt: skip


def small_gpt() -> TorchWorkload:
    torch.manual_seed(0)
    return gpt(layers=2, dim=32, heads=2, length=16, vocab=64, samples=64)


def train(workload: TorchWorkload, config: dict[str, Any], steps: int = 3) -> tuple[TunedTraining, list[float]]:
    tuned = TunedTraining(
        {**FP32, **config},
        workload.model,
        workload.optimizer(workload.model.parameters()),
        device="cpu",
        checkpoint_blocks=workload.checkpoint_blocks,
    )
    losses = []
    batches = iter(tuned.make_loader(workload.dataset, seed=0))
    for _ in range(steps):
        batch = tuned.to_device(next(batches))
        with tuned.autocast():
            loss = workload.loss(tuned.model, batch)
        tuned.backward(loss)
        tuned.step()
        losses.append(float(loss.detach()))
    return tuned, losses


# ---------------------------------------------------------------- what each knob does


@pytest.mark.parametrize("choice", ["foreach", "fused"])
def test_the_optimizer_is_rebuilt_with_its_flag_and_its_hyperparameters(choice: str) -> None:
    params = [nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(2))]
    given = torch.optim.AdamW([{"params": params[:1]}, {"params": params[1:], "lr": 0.5}], lr=0.01, weight_decay=0.3)
    rebuilt = rebuilt_optimizer(given, choice)
    assert type(rebuilt) is torch.optim.AdamW and rebuilt is not given
    assert rebuilt.defaults[choice] is True and rebuilt.defaults[{"fused": "foreach"}.get(choice, "fused")] is False
    assert [g["lr"] for g in rebuilt.param_groups] == [0.01, 0.5]
    assert [g["weight_decay"] for g in rebuilt.param_groups] == [0.3, 0.3]
    assert [g["params"] for g in rebuilt.param_groups] == [params[:1], params[1:]]
    assert rebuilt_optimizer(given, "as-given") is given


def test_rebuilding_refuses_an_optimizer_that_has_stepped_or_takes_no_flag() -> None:
    param = nn.Parameter(torch.ones(2))
    stepped = torch.optim.AdamW([param])
    param.grad = torch.ones(2)
    stepped.step()
    with pytest.raises(ValueError, match="has not stepped yet"):
        rebuilt_optimizer(stepped, "fused")

    class Plain(torch.optim.Optimizer):
        def __init__(self, params: Any, lr: float = 0.1):
            super().__init__(params, {"lr": lr})

    with pytest.raises(Unsupported, match="optimizer=fused: Plain takes no fused argument"):
        rebuilt_optimizer(Plain([param]), "fused")


def test_optimizer_variants_train_the_same_model_alike() -> None:
    _, given = train(small_gpt(), {})
    for choice in ("foreach", "fused"):
        tuned, losses = train(small_gpt(), {"optimizer": choice})
        assert tuned.optimizer.defaults[choice] is True
        assert losses == pytest.approx(given, rel=1e-5)


def test_checkpointing_finds_the_repeated_blocks_and_recomputes_the_same_gradients() -> None:
    assert repeated_blocks(small_gpt().model) == (Block,)
    assert repeated_blocks(mlp().model) == ()  # Linear layers and the Sequential around them only
    grads = []
    for config in ({}, {"checkpointing": "blocks"}):
        workload = small_gpt()
        tuned = TunedTraining({**FP32, **config}, workload.model, workload.optimizer(workload.model.parameters()))
        batch = workload.collate([workload.dataset[i] for i in range(4)])
        workload.loss(tuned.model, batch).backward()
        grads.append([p.grad.clone() for p in workload.model.parameters()])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads, strict=True))
    checkpointed = small_gpt().model
    enable_checkpointing(checkpointed)
    enable_checkpointing(checkpointed)  # twice changes nothing: one wrapper per block
    assert all(getattr(b, "_autotuner_checkpointed", False) for b in checkpointed.modules() if isinstance(b, Block))


def test_the_counted_flops_are_the_models_whether_or_not_the_config_checkpoints() -> None:
    """The forward a checkpointed block runs again in the backward is not counted: both configs
    of the model get its model FLOPs, and the checkpointing is back after the count."""
    from autotuner.backends.pytorch.runner import TRIAL_BACKEND

    counted = {}
    for checkpointing in ("none", "blocks"):
        workload = small_gpt()
        tuned = TunedTraining(
            {**FP32, "checkpointing": checkpointing}, workload.model, workload.optimizer(workload.model.parameters())
        )
        counted[checkpointing] = TRIAL_BACKEND.flops_per_sample(workload, tuned)
        blocks = [b for b in workload.model.modules() if isinstance(b, Block)]
        assert all(isinstance(b.forward, functools.partial) == (checkpointing == "blocks") for b in blocks)
    assert counted["none"] and counted["blocks"] == counted["none"]


def test_a_hugging_face_models_checkpointing_is_off_for_the_count_and_back_after() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=16, vocab_size=64)
    model = transformers.GPT2LMHeadModel(config)
    TunedTraining({**FP32, "checkpointing": "blocks"}, model, torch.optim.AdamW(model.parameters()))
    flag = (
        "is_activation_checkpointing" if hasattr(model, "is_activation_checkpointing") else "is_gradient_checkpointing"
    )
    assert getattr(model, flag)
    with without_checkpointing(model):
        assert not getattr(model, flag)
    assert getattr(model, flag)


def test_checkpointing_a_model_without_blocks_is_unsupported_unless_the_workload_names_them() -> None:
    with pytest.raises(Unsupported, match="checkpointing=blocks: the model repeats no block"):
        enable_checkpointing(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)))
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    enable_checkpointing(model, [nn.Linear])
    assert model[0]._autotuner_checkpointed and model[2]._autotuner_checkpointed


def test_a_hugging_face_model_uses_its_own_checkpointing_and_attention_implementations() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=16, vocab_size=64)
    model = transformers.GPT2LMHeadModel(config)
    TunedTraining(
        {**FP32, "checkpointing": "blocks", "attention": "eager"}, model, torch.optim.AdamW(model.parameters())
    )
    assert model.is_activation_checkpointing
    assert model.config._attn_implementation == "eager"
    TunedTraining({**FP32, "attention": "math"}, model, torch.optim.AdamW(model.parameters()))
    assert model.config._attn_implementation == "sdpa"


def test_an_attention_backend_computes_the_models_attention_and_one_that_cannot_is_unsupported() -> None:
    _, default = train(small_gpt(), {})
    for backend in ("math", "flash"):  # the two a CPU has
        _, losses = train(small_gpt(), {"attention": backend})
        assert losses == pytest.approx(default, rel=1e-4)
    with pytest.raises(Unsupported, match="attention=eager: only Hugging Face models"):
        train(small_gpt(), {"attention": "eager"})

    class DropoutAttention(nn.Module):  # the CPU's flash kernel takes no dropout
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q = x.view(x.shape[0], 1, -1, 4)
            return F.scaled_dot_product_attention(q, q, q, dropout_p=0.5).flatten(1)

    tuned = TunedTraining(
        {**FP32, "attention": "flash"}, DropoutAttention(), torch.optim.SGD([nn.Parameter(torch.ones(1))])
    )
    with pytest.raises(Unsupported, match="attention=flash: its kernel cannot compute this model's attention"):
        with tuned.autocast():
            tuned.model(torch.randn(2, 8))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_checkpointed_block_is_recomputed_with_the_attention_backend_it_ran_with(precision: str) -> None:
    """The backward pass recomputes a checkpointed block's forward: with the default kernel choice
    there, not the config's, the recomputed block saves other tensors than the forward did, which
    torch refuses (CheckpointError), and the gradients would be another kernel's."""
    _, default = train(small_gpt(), {"precision": precision})
    _, losses = train(small_gpt(), {"precision": precision, "attention": "math", "checkpointing": "blocks"})
    assert losses == pytest.approx(default, rel=1e-2 if precision == "bf16" else 1e-4)


def test_channels_last_converts_the_convolutions_and_the_image_batches_only() -> None:
    workload = cnn(samples=32, width=4)
    tuned, _ = train(workload, {"memory_format": "channels_last"}, steps=1)
    conv = next(m for m in workload.model.modules() if isinstance(m, nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last) and not conv.weight.is_contiguous()
    images, labels = tuned.to_device(workload.collate([workload.dataset[i] for i in range(2)]))
    assert images.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous()
    assert labels.is_contiguous()


def test_the_loader_prefetches_what_the_config_says_and_pins_only_for_a_gpu() -> None:
    workload = mlp(samples=256)
    config = {**FP32, "workers": 2, "prefetch_factor": 4, "pin_memory": True}
    loader = TunedTraining(config, workload.model, workload.optimizer(workload.model.parameters())).make_loader(
        workload.dataset
    )
    assert loader.prefetch_factor == 4 and loader.num_workers == 2
    assert loader.pin_memory is False  # on the CPU nothing is copied to a device


def test_a_config_of_the_first_knobs_only_means_every_other_at_its_reference() -> None:
    workload = small_gpt()
    tuned = TunedTraining(FP32, workload.model, workload.optimizer(workload.model.parameters()))
    assert {k: tuned.config[k] for k in ("memory_format", "optimizer", "checkpointing", "attention")} == {
        "memory_format": "contiguous",
        "optimizer": "as-given",
        "checkpointing": "none",
        "attention": "default",
    }
    assert format_config(tuned.config) == "precision=fp32 batch=8x1 workers=0 compile=none"
    assert format_config({**tuned.config, "optimizer": "fused"}).endswith("compile=none optimizer=fused")


# ---------------------------------------------------------------- which device and workload can use which


def test_the_probe_reports_what_each_built_in_offers_the_knobs() -> None:
    cpu = torch.device("cpu")
    found = {name: workload_capabilities(make(), cpu, 2) for name, make in (("gpt", small_gpt), ("mlp", mlp))}
    found["cnn"] = workload_capabilities(cnn(samples=8, width=4), cpu, 2)
    found["resnet"] = workload_capabilities(resnet(samples=8), cpu, 2)
    assert found["gpt"] | {"foreach_optimizer": 0, "fused_optimizer": 0} == {
        "convolutions": False, "sdpa": True, "hf_attention": False, "checkpoint_blocks": True,
        "foreach_optimizer": 0, "fused_optimizer": 0,
    }  # fmt: skip
    assert not any(found["mlp"][k] for k in ("convolutions", "sdpa", "hf_attention", "checkpoint_blocks"))
    assert found["cnn"]["convolutions"] and not found["cnn"]["checkpoint_blocks"]  # its blocks are Sequentials
    assert found["resnet"]["convolutions"] and found["resnet"]["checkpoint_blocks"]
    assert all(f["foreach_optimizer"] and f["fused_optimizer"] for f in found.values())  # AdamW, fused on a CPU too


def reason(config: dict[str, Any], caps: TorchCapabilities) -> str | None:
    return PYTORCH.unsupported_reason({**{k: v.reference for k, v in PYTORCH.knobs.items()}, **FP32, **config}, caps)


def test_what_a_device_or_a_workload_cannot_use_is_refused_with_the_reason() -> None:
    conv, attention = (
        TorchCapabilities(**{**CPU.__dict__, **extra})
        for extra in ({"convolutions": True}, {"sdpa": True, "checkpoint_blocks": True, "fused_optimizer": True})
    )
    assert reason({"pin_memory": True}, CPU) == "pin_memory=True: pinned host memory only speeds copies to a GPU"
    assert "there is no GPU with cuDNN" in reason({"cudnn_benchmark": True}, conv)
    assert reason({"memory_format": "channels_last"}, conv) is None
    sharded = TorchCapabilities(**{**conv.__dict__, "fsdp": True})  # a ViT's patch embedding under FSDP2
    assert "FSDP2 shards contiguous parameters only" in reason({"memory_format": "channels_last"}, sharded)
    assert "no 2-D convolutions" in reason({"memory_format": "channels_last"}, attention)
    assert reason({"attention": "flash"}, attention) is None and reason({"attention": "math"}, attention) is None
    assert "no efficient attention kernel" in reason({"attention": "efficient"}, attention)
    assert "calls no scaled_dot_product_attention" in reason({"attention": "math"}, conv)
    assert reason({"checkpointing": "blocks"}, attention) is None
    assert "repeats no block" in reason({"checkpointing": "blocks"}, conv) or "no repeated blocks" in reason(
        {"checkpointing": "blocks"}, conv
    )
    assert "takes no fused=True" in reason({"optimizer": "fused"}, conv)
    assert "only loader workers prefetch" in reason({"prefetch_factor": 4}, CPU)
    assert reason({"prefetch_factor": 4, "workers": 2}, CPU) is None
    gpu = TorchCapabilities(**{**GPU.__dict__, "sdpa": True, "convolutions": True})
    assert "bf16 or fp16 only" in reason({"attention": "flash"}, gpu)
    assert reason({"attention": "flash", "precision": "bf16"}, gpu) is None
    assert reason({"attention": "efficient"}, gpu) is None
    assert reason({"pin_memory": True, "cudnn_benchmark": True}, gpu) is None


def test_the_space_is_narrowed_to_what_the_device_and_workload_can_use_the_baseline_kept() -> None:
    spec = {
        **SMALL_SPEC,
        "space": {"preset": "pytorch-cpu"},
        "baseline": {**SMALL_SPEC["baseline"], "optimizer": "fused"},
    }
    job = parse_spec(copy.deepcopy(spec), "spec.yaml")
    declared = dict(job.space)
    narrowed, dropped = job.narrow(
        TorchCapabilities(**{**CPU.__dict__, "fused_optimizer": False, "foreach_optimizer": True})
    )
    assert dropped["memory_format"] == {
        "channels_last": "memory_format=channels_last: the model has no 2-D convolutions"
    }
    assert set(dropped["attention"]) == {"flash", "math"} and set(dropped["checkpointing"]) == {"blocks"}
    assert narrowed.space["optimizer"] == ("as-given", "foreach", "fused")  # fused: the baseline's own value stays
    assert narrowed.space["prefetch_factor"] == (2, 4)  # they matter with workers: refused per config
    assert narrowed.declared_space == declared  # what the study's identity hashes is the declared space
    assert job.space == declared and narrowed.identity() == job.identity()  # a new job: the parsed one as it was


def test_a_space_the_device_cannot_narrow_below_the_limit_is_refused_in_one_line() -> None:
    spec = {**SMALL_SPEC, "global_batch": 720720, "baseline": {**SMALL_SPEC["baseline"], "batch_size": 16}}
    spec["space"] = {
        "preset": "pytorch-cpu",
        "batch_size": [d for d in range(1, 200) if 720720 % d == 0],
        "workers": list(range(40)),
    }
    job = parse_spec(copy.deepcopy(spec), "spec.yaml")  # fewer than a million: declared, it is accepted
    everything = TorchCapabilities(
        **{**GPU.__dict__, **{k: True for k in ("convolutions", "sdpa", "checkpoint_blocks")}}
    )
    with pytest.raises(SpecError, match=f"this device and workload can run; at most {MAX_CONFIGS:,}"):
        job.narrow(TorchCapabilities(**{**everything.__dict__, "fused_optimizer": True, "foreach_optimizer": True}))
    parse_spec(copy.deepcopy(spec), "spec.yaml").narrow(CPU)  # a bare CPU drops most of it


def test_adding_a_knob_held_at_its_reference_keeps_a_studys_identity() -> None:
    spec = {**SMALL_SPEC, "space": {**SMALL_SPEC["space"], "preset": "pytorch-cpu"}}
    plain = parse_spec(copy.deepcopy(spec), "spec.yaml")
    pinned = parse_spec(copy.deepcopy({**spec, "space": {**spec["space"], "pin_memory": [False]}}), "spec.yaml")
    assert plain.identity() == pinned.identity()
    searched = parse_spec(copy.deepcopy({**spec, "space": {**spec["space"], "optimizer": ["as-given"]}}), "spec.yaml")
    assert searched.identity() != plain.identity()  # the preset searched it; holding it is another study


# ---------------------------------------------------------------- memory


def test_checkpointing_ranks_below_none_in_memory_so_an_oom_leaves_the_checkpointed_batch() -> None:
    first = {k: v.reference for k, v in PYTORCH.knobs.items()} | {"batch_size": 512, "accumulation": 1}
    oom = {**first, "checkpointing": "none"}
    assert not needs_as_much_memory({**oom, "checkpointing": "blocks"}, oom, PYTORCH.knobs)  # still tried
    assert needs_as_much_memory({**oom, "batch_size": 1024}, oom, PYTORCH.knobs)
    assert needs_as_much_memory(oom, {**oom, "checkpointing": "blocks", "batch_size": 256}, PYTORCH.knobs)


def test_peak_memory_is_reported_as_a_share_of_the_devices_memory() -> None:
    assert peak_memory(1024, 8192) == "1,024 MiB (12% of 8,192)"
    assert peak_memory(5, None) == "5 MiB" and peak_memory(None, 8192) == "-"
    assert (environment(torch.device("cpu")).memory_mb or 0) > 0  # a CPU trial's peak is the host's


def test_a_hugging_face_model_under_ddp_is_tuned_again_on_its_wrapper_as_it_was_at_first(one_rank: None) -> None:
    """The drift phase tunes the trial's model again, DDP's and compile's wrappers around it: its
    attention and checkpointing are still the Hugging Face model's own, applied once."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=16, vocab_size=64)
    model = transformers.GPT2LMHeadModel(config)
    knobs = {**FP32, "checkpointing": "blocks", "attention": "eager"}
    first = TunedTraining(knobs, model, torch.optim.AdamW(model.parameters()), parallel="ddp")
    again = TunedTraining(knobs, first.model, torch.optim.AdamW(model.parameters()), parallel="ddp")
    assert again.module is model and again._ddp is first._ddp  # wrapped once
    assert model.config._attn_implementation == "eager" and model.is_activation_checkpointing
    assert not any(isinstance(m.forward, functools.partial) for m in model.modules())  # not checkpointed twice


@pytest.mark.skipif(torch.version.cuda is not None, reason="a CUDA build of torch loads torchao's CUDA kernels")
def test_torchaos_cuda_kernels_a_cpu_build_cannot_load_are_no_warning_in_a_trial(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A trial process on a CPU build of torch: torchao's "Failed to load" of its CUDA extensions
    is not a warning of the trial's (its log's `warned:` line); torchao's other warnings are."""
    import logging

    from autotuner.backends.pytorch.runner import TRIAL_BACKEND

    TRIAL_BACKEND.configure_process("cpu", None)
    TRIAL_BACKEND.configure_process("cpu", None)  # once per process is enough, twice does no harm
    torchao = logging.getLogger("torchao")
    with caplog.at_level(logging.WARNING, logger="torchao"):
        torchao.warning("Failed to load /venv/lib/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so: Could not load")
        torchao.warning("Warning: Detected no triton, on systems without Triton certain kernels will not work")
    assert [r.getMessage()[:26] for r in caplog.records] == ["Warning: Detected no trito"]
    assert len(torchao.filters) == 1


def test_torchs_deprecation_of_the_enums_torchao_registers_is_no_warning_in_a_trial(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """torch's warning that `register_constant()` on an Enum is deprecated, which importing torchao
    logs in every trial process, is not the trial's; the same warning of a job's own enum is."""
    import enum
    import logging

    from autotuner.backends.pytorch.runner import TRIAL_BACKEND

    class Torchaos(str, enum.Enum):  # as torchao's are: an Enum with an __eq__ of its own
        A = "a"

    class Jobs(str, enum.Enum):
        A = "a"

    Torchaos.__module__ = "torchao.quantization.quantize_.common"
    TRIAL_BACKEND.configure_process("cpu", None)
    with caplog.at_level(logging.WARNING, logger="torch.utils._pytree"):
        torch.utils._pytree.register_constant(Torchaos)
        torch.utils._pytree.register_constant(Jobs)
    assert [r.args[0] for r in caplog.records if r.name == "torch.utils._pytree"] == [Jobs]
