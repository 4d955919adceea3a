"""Real CUDA studies end to end: `autotuner search` through the CLI on cuda:0, every
trial a process from the fork server, read back from the storage as the dashboard reads it.

What they prove on a GPU: every precision (bf16, fp16 with its GradScaler, tf32) and every
`torch.compile` mode with gradient accumulation ends `ok` or `unsupported` with a reason, never
`error` or `crash`; a real CUDA out-of-memory error at a huge batch is recorded `oom` and rules
the larger batches out; NVML's energy counter gives energy per sample and power, and energy can
be the study's third objective; MFU is a fraction for a GPU with a datasheet peak; the JAX
backend runs a study on the GPU; torchao's float8 training runs each of its recipes where the GPU
has fp8 tensor cores; an inference study serves with every GPU knob (quantization,
2:4 sparsity, CUDA graphs, ONNX Runtime's CUDA provider) ok or unsupported; and `--jobs 1` runs
one worker.

Every test is marked `gpu`: tests/conftest.py skips them where torch sees no CUDA GPU. The
studies are small (a two-layer GPT of width 64), so the module takes minutes, most of it the
compile modes' warm-up (max-autotune benchmarks its kernels).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from tests.support.studies import ROOT, load_study, run_cli, write_spec

pytestmark = pytest.mark.gpu

GPT_ARGS = {"vocab": 128, "length": 64, "dim": 64, "layers": 2, "heads": 4, "samples": 256}
TRIAL = {"warmup_steps": 2, "steps": 3, "windows": 3, "min_window_s": 0.5, "drift_steps": 3, "timeout": 900}
"""Windows of half a second: NVML's energy counter must tick over the measured time."""
GLOBAL_BATCH, MICRO_BATCH = 32, 16
"""Every config of these studies accumulates two micro-batches per optimizer step."""
FAILURES = {"error", "crash"}
PRECISIONS = ["fp32", "tf32", "bf16", "fp16"]
COMPILE_MODES = ["none", "default", "reduce-overhead", "max-autotune"]


def _gpt_spec(
    folder: Path,
    name: str,
    space: dict[str, list[Any]],
    baseline: dict[str, Any],
    device: str = "cuda:0",
    **changes: Any,
) -> Path:
    """A study of the small GPT on `device` that runs every config of `space`."""
    return write_spec(
        folder,
        name=name,
        device=device,
        workload="builtin:gpt",
        workload_args=GPT_ARGS,
        global_batch=GLOBAL_BATCH,
        baseline=baseline,
        space=space,
        budget={"trials": math.prod(len(v) for v in space.values())},  # every config of the space
        trial=TRIAL,
        **changes,
    )


def _trials(folder: Path, name: str) -> list[optuna.trial.FrozenTrial]:
    """The study's trials that were decided (ran, or unsupported without running)."""
    return [t for t in load_study(folder, name).get_trials() if "outcome" in t.user_attrs]


def _shown(trial: optuna.trial.FrozenTrial) -> str:
    attrs = trial.user_attrs
    head = f"#{trial.number} {attrs.get('config')}: {attrs.get('outcome')}: {attrs.get('reason')}"
    return f"{head}\n{attrs.get('traceback', '')}"


def _search(spec: Path, folder: Path, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    done = run_cli("search", "--spec", str(spec), *args, cwd=folder, timeout=timeout)
    assert done.returncode in (0, 1), done.stdout[-4000:] + done.stderr[-4000:]  # 1: no feasible config
    assert "Traceback" not in done.stderr, done.stderr[-4000:]
    return done


def _ok_or_unsupported(trial: optuna.trial.FrozenTrial) -> None:
    attrs = trial.user_attrs
    assert attrs["outcome"] in ("ok", "unsupported"), _shown(trial)
    if attrs["outcome"] == "unsupported":
        assert attrs["reason"], _shown(trial)


@pytest.fixture(scope="module")
def precisions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One study of every precision, eager, at micro-batch 16 with two accumulation steps."""
    folder = tmp_path_factory.mktemp("precisions")
    space = {"precision": PRECISIONS, "batch_size": [MICRO_BATCH], "workers": [0], "compile": ["none"]}
    baseline = {"precision": "fp32", "batch_size": MICRO_BATCH, "workers": 0, "compile": "none"}
    _search(_gpt_spec(folder, "precisions", space, baseline), folder)
    return folder


@pytest.fixture(scope="module")
def compile_modes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One study of every torch.compile mode, bf16, at micro-batch 16 with two accumulation steps."""
    folder = tmp_path_factory.mktemp("compile")
    space = {"precision": ["bf16"], "batch_size": [MICRO_BATCH], "workers": [0], "compile": COMPILE_MODES}
    baseline = {"precision": "bf16", "batch_size": MICRO_BATCH, "workers": 0, "compile": "none"}
    _search(_gpt_spec(folder, "compile", space, baseline), folder, timeout=3600)
    return folder


def test_a_cuda_study_runs_every_precision_from_the_fork_server(precisions: Path) -> None:
    study = load_study(precisions, "precisions")
    environment = study.user_attrs["environment"]
    assert environment["device"] == "cuda:0" and environment["capabilities"]["accelerator"] is True
    trials = _trials(precisions, "precisions")
    by_precision = {t.user_attrs["config"]["precision"]: t for t in trials}
    assert set(by_precision) == set(PRECISIONS)
    for trial in trials:
        _ok_or_unsupported(trial)
        assert trial.user_attrs["config"]["accumulation"] == GLOBAL_BATCH // MICRO_BATCH
    assert by_precision["fp32"].user_attrs["outcome"] == "ok", _shown(by_precision["fp32"])
    for trial in trials:
        if trial.user_attrs["outcome"] == "ok":  # a process from the fork server starts in milliseconds
            assert 0 <= trial.user_attrs["startup_s"] < 5, _shown(trial)
            assert trial.user_attrs["peak_memory_mb"] > 0
    capabilities = environment["capabilities"]
    for precision in ("bf16", "tf32"):
        expected = "ok" if capabilities[precision] else "unsupported"
        assert by_precision[precision].user_attrs["outcome"] == expected, _shown(by_precision[precision])
    assert (precisions / "runs" / "precisions" / "best.yaml").exists()


def test_fp16_trains_through_the_grad_scaler_with_a_finite_drift(precisions: Path) -> None:
    fp16 = next(t for t in _trials(precisions, "precisions") if t.user_attrs["config"]["precision"] == "fp16")
    assert fp16.user_attrs["outcome"] == "ok", _shown(fp16)
    drift = fp16.user_attrs["drift"]
    assert drift != "inf" and math.isfinite(float(drift)), _shown(fp16)
    assert fp16.values is not None and math.isfinite(fp16.values[1])


def _ok_trials(precisions: Path, needs: str, why: str) -> list[optuna.trial.FrozenTrial]:
    """The precision study's `ok` trials (at least one); the test is skipped where its environment
    lacks `needs` (`why`)."""
    environment = load_study(precisions, "precisions").user_attrs["environment"]
    if not environment.get(needs):
        pytest.skip(f"{why} on {environment['device_name']!r}")
    ok = [t for t in _trials(precisions, "precisions") if t.user_attrs["outcome"] == "ok"]
    assert ok
    return ok


def test_mfu_is_a_fraction_of_a_known_gpus_peak(precisions: Path) -> None:
    for trial in _ok_trials(precisions, "peak_flops", "no datasheet peak (autotuner/measurement/hardware.py)"):
        mfu = trial.user_attrs.get("mfu")
        assert mfu is not None and 0 < mfu < 1, _shown(trial)
        assert trial.user_attrs["tflops"] > 0 and trial.user_attrs["tokens_per_s"] > 0


def test_nvml_gives_energy_per_sample_and_power(precisions: Path) -> None:
    for trial in _ok_trials(precisions, "energy_counter", "NVML reads no energy counter"):
        assert trial.user_attrs.get("energy_j_per_sample", 0) > 0, _shown(trial)
        assert trial.user_attrs.get("power_w_mean", 0) > 0, _shown(trial)


def test_energy_per_sample_can_be_the_third_objective(tmp_path: Path) -> None:
    space = {"precision": ["fp32", "bf16"], "batch_size": [MICRO_BATCH], "workers": [0], "compile": ["none"]}
    baseline = {"precision": "fp32", "batch_size": MICRO_BATCH, "workers": 0, "compile": "none"}
    spec = _gpt_spec(tmp_path, "energy", space, baseline, objective={"energy": True})
    done = run_cli("search", "--spec", str(spec), cwd=tmp_path, timeout=900)
    if done.returncode == 2 and "objective.energy" in done.stderr:
        pytest.skip(f"this GPU has no energy counter NVML reads: {done.stderr.strip()}")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    study = load_study(tmp_path, "energy")
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE", "MINIMIZE"]
    assert study.metric_names == ["throughput", "drift", "energy_j_per_sample"]
    ok = [t for t in study.get_trials() if t.user_attrs.get("outcome") == "ok"]
    assert ok
    for trial in ok:
        assert 0 < trial.values[2] < math.inf and trial.values[2] == trial.user_attrs["energy_j_per_sample"]
    assert (tmp_path / "runs" / "energy" / "best.yaml").exists()


def test_every_compile_mode_with_accumulation_ends_ok_or_unsupported(compile_modes: Path) -> None:
    trials = _trials(compile_modes, "compile")
    by_mode = {t.user_attrs["config"]["compile"]: t for t in trials}
    assert set(by_mode) == set(COMPILE_MODES)
    for trial in trials:
        assert trial.user_attrs["config"]["accumulation"] == GLOBAL_BATCH // MICRO_BATCH > 1
        assert trial.user_attrs["outcome"] not in FAILURES, _shown(trial)
        _ok_or_unsupported(trial)
    capabilities = load_study(compile_modes, "compile").user_attrs["environment"]["capabilities"]
    if capabilities["bf16"] and capabilities["compile"] and capabilities["cuda_graphs"]:  # Ampere+, Triton
        for mode, trial in by_mode.items():
            assert trial.user_attrs["outcome"] == "ok", f"{mode}: {_shown(trial)}"
            assert math.isfinite(float(trial.user_attrs["drift"])), _shown(trial)


# ---------------------------------------------------------------- fp8 training


def test_float8_training_of_the_gpt_runs_where_the_gpu_has_fp8_tensor_cores(tmp_path: Path) -> None:
    """The small GPT in bf16 under torch.compile, its linear layers in fp8 by each of torchao's
    recipes: on a GPU of compute capability 8.9 or later (and torchao) each config ends ok with a
    finite drift; elsewhere float8 is dropped from the space before any trial."""
    recipes = ["none", "tensorwise", "rowwise"]
    space = {"precision": ["bf16"], "batch_size": [MICRO_BATCH], "workers": [0], "compile": ["default"]}
    baseline = {"precision": "bf16", "batch_size": MICRO_BATCH, "workers": 0, "compile": "default"}
    _search(_gpt_spec(tmp_path, "float8", {**space, "float8": recipes}, baseline), tmp_path)
    trials = _trials(tmp_path, "float8")
    capabilities = load_study(tmp_path, "float8").user_attrs["environment"]["capabilities"]
    by_recipe = {t.user_attrs["config"].get("float8", "none"): t for t in trials}
    if not capabilities.get("fp8_training"):
        assert set(by_recipe) == {"none"}, [_shown(t) for t in trials]
        return
    assert set(by_recipe) == set(recipes)
    for recipe, trial in by_recipe.items():
        assert trial.user_attrs["outcome"] == "ok", f"{recipe}: {_shown(trial)}"
        assert math.isfinite(float(trial.user_attrs["drift"])), _shown(trial)


# ---------------------------------------------------------------- out of memory

WIDE = 2**20
"""Features of the hungry workload's hidden layer: each sample keeps 4 MiB activations (fp32)
alive per layer output for the backward pass, so 32,768 samples ask for hundreds of GiB."""


def hungry(samples: int = 32768, features: int = 32, width: int = WIDE) -> Any:
    """A workload whose activation memory grows with the micro-batch: one very wide hidden layer."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from autotuner.backends.pytorch.workload import TorchWorkload

    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(samples + 256, features, generator=generator)
    labels = torch.randint(10, (samples + 256,), generator=generator)
    return TorchWorkload(
        model=nn.Sequential(nn.Linear(features, width), nn.GELU(), nn.Linear(width, 10)),
        dataset=torch.utils.data.TensorDataset(inputs[:samples], labels[:samples]),
        heldout=torch.utils.data.TensorDataset(inputs[samples:], labels[samples:]),
        loss_fn=F.cross_entropy,
        optimizer=lambda params: torch.optim.SGD(params, lr=1e-3),
    )


def test_a_cuda_out_of_memory_is_recorded_oom_and_rules_larger_batches_out(tmp_path: Path) -> None:
    batches = [256, 1024, 32768]
    spec = write_spec(
        tmp_path,
        name="hungry",
        device="cuda:0",
        workload="tests.e2e.test_gpu:hungry",
        workload_args={},
        global_batch=32768,
        baseline={"precision": "fp32", "batch_size": 256, "workers": 0, "compile": "none"},
        space={"precision": ["fp32"], "batch_size": batches, "workers": [0], "compile": ["none"]},
        budget={"trials": len(batches)},
        trial={"warmup_steps": 1, "steps": 1, "windows": 1, "min_window_s": 0, "drift_steps": 1, "timeout": 900},
    )
    done = _search(spec, tmp_path)
    trials = _trials(tmp_path, "hungry")
    assert not [t for t in trials if t.user_attrs["outcome"] in FAILURES], [_shown(t) for t in trials]
    ooms = [t for t in trials if t.user_attrs["outcome"] == "oom"]
    assert ooms, [_shown(t) for t in trials]
    first = min(ooms, key=lambda t: t.number)
    oom_batch = first.user_attrs["config"]["batch_size"]
    assert oom_batch >= 1024 and "memory" in first.user_attrs["reason"].lower(), _shown(first)
    assert first.user_attrs["feasible"] is False
    later_larger = [t for t in trials if t.number > first.number and t.user_attrs["config"]["batch_size"] >= oom_batch]
    assert later_larger == [], "a batch an out-of-memory trial had ruled out was run"
    by_batch = {t.user_attrs["config"]["batch_size"]: t for t in trials}
    assert by_batch[256].user_attrs["outcome"] == "ok", _shown(by_batch[256])
    assert "every config of the space has been tried" in done.stdout or len(trials) == len(batches)


# ---------------------------------------------------------------- JAX, --jobs


def _jax_sees_a_gpu() -> bool:
    """Asked in a fresh process: JAX's GPU client would otherwise live in this one (and hold memory)."""
    probe = "import jax, sys; sys.exit(0 if jax.devices('gpu') else 1)"
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=300, env=env)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def test_a_jax_study_runs_on_the_gpu(tmp_path: Path) -> None:
    if not _jax_sees_a_gpu():
        pytest.skip("JAX has no GPU backend here (a CUDA jaxlib is `pip install 'jax[cuda13]'`)")
    space = {"precision": ["fp32", "tf32", "bf16"], "batch_size": [MICRO_BATCH], "workers": [0], "jit": ["off", "on"]}
    held = {"remat": ["none"], "donate": ["off"], "xla_flags": ["default"]}  # the jax preset would search them
    spec = write_spec(
        tmp_path,
        name="jax-gpu",
        backend="jax",
        device="cuda:0",
        workload="builtin:gpt",
        workload_args=GPT_ARGS,
        global_batch=GLOBAL_BATCH,
        baseline={"precision": "fp32", "batch_size": MICRO_BATCH, "workers": 0, "jit": "off"},
        space={**space, **held},
        budget={"trials": 6},
        trial=TRIAL,
    )
    _search(spec, tmp_path)
    study = load_study(tmp_path, "jax-gpu")
    environment = study.user_attrs["environment"]
    assert environment["device"] == "cuda:0" and environment["versions"]["jax"]
    trials = _trials(tmp_path, "jax-gpu")
    assert {(t.user_attrs["config"]["precision"], t.user_attrs["config"]["jit"]) for t in trials} == {
        (p, j) for p in space["precision"] for j in space["jit"]
    }
    for trial in trials:
        _ok_or_unsupported(trial)
    jitted = [t for t in trials if t.user_attrs["config"]["jit"] == "on" and t.user_attrs["outcome"] == "ok"]
    assert jitted, [_shown(t) for t in trials]
    if environment.get("peak_flops"):
        for trial in jitted:
            assert 0 < trial.user_attrs["mfu"] < 1, _shown(trial)
    if environment.get("energy_counter"):
        for trial in jitted:
            assert trial.user_attrs["energy_j_per_sample"] > 0, _shown(trial)


def test_an_inference_study_serves_on_the_gpu_with_every_knob_ok_or_unsupported(tmp_path: Path) -> None:
    """The built-in encoder served on cuda:0: precisions, torchao's quantizations (fp8 where the GPU
    has it), 2:4 sparsity, CUDA graphs and ONNX Runtime's CUDA provider each end ok or unsupported
    with a reason, and what ran has its latency and drift."""
    space = {
        "precision": ["fp32", "tf32", "bf16", "fp16"],
        "batch_size": [8, 32],
        "quantization": ["none", "int8-weight-only", "int8-dynamic", "fp8"],
        "sparsity": ["none", "2:4"],
        "compile": ["none", "reduce-overhead"],
        "runtime": ["pytorch", "onnxruntime-cuda"],
        "threads": [0],
    }
    spec = write_spec(
        tmp_path,
        name="served-gpu",
        task="inference",
        device="cuda:0",
        workload="builtin:encoder",
        workload_args={"width": 128, "heads": 4, "layers": 2, "length": 64, "vocab": 1000, "samples": 1024},
        global_batch=32,
        baseline={"precision": "fp32", "batch_size": 8},
        space=space,
        objective={"max_drift": 0.5, "max_latency_ms": 1000},  # 2:4 pruning of random weights drifts far
        budget={"trials": 12, "remeasure_top": 1, "remeasure_runs": 2},
        trial={**TRIAL, "prune_after": 0},
        sampler={"name": "random", "seed": 0},
    )
    _search(spec, tmp_path)
    trials = _trials(tmp_path, "served-gpu")
    for trial in trials:
        _ok_or_unsupported(trial)
    ran = [t for t in trials if t.user_attrs["outcome"] == "ok"]
    assert len(ran) >= 6, [_shown(t) for t in trials]
    for trial in ran:
        attrs = trial.user_attrs
        assert 0 < attrs["latency_p50_ms"] <= attrs["latency_p99_ms"], _shown(trial)
        assert attrs["drift"] is not None and attrs["top1_agreement"] is not None, _shown(trial)
    assert any(t.user_attrs["config"]["precision"] in ("bf16", "fp16") for t in ran), [_shown(t) for t in trials]


def test_search_with_one_job_runs_one_worker_on_the_first_gpu(tmp_path: Path) -> None:
    space = {"precision": ["fp32", "bf16"], "batch_size": [MICRO_BATCH], "workers": [0], "compile": ["none"]}
    baseline = {"precision": "fp32", "batch_size": MICRO_BATCH, "workers": 0, "compile": "none"}
    spec = _gpt_spec(tmp_path, "one-job", space, baseline, device="auto")
    done = run_cli("search", "--spec", str(spec), "--jobs", "1", cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    environment = load_study(tmp_path, "one-job").user_attrs["environment"]
    assert environment["device"] == "cuda:0"
    assert all(t.user_attrs["outcome"] == "ok" for t in _trials(tmp_path, "one-job"))
    export = yaml.safe_load((tmp_path / "runs" / "one-job" / "best.yaml").read_text())
    assert export["environment"]["device"] == "cuda:0"
    # one worker per GPU, and no more than there are
    count = int(environment["device_count"])
    refused = run_cli("search", "--spec", str(spec), "--jobs", str(count + 1), cwd=tmp_path, timeout=300)
    assert refused.returncode == 2 and f"only {count} are visible" in refused.stderr, refused.stderr


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(_cuda_count() < 2, reason="needs two CUDA GPUs")
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_a_study_of_two_ranks_on_two_gpus(tmp_path: Path, parallel: str) -> None:
    """The small GPT as two ranks over NCCL, one GPU each: every config of its parallel knobs ends
    ok or unsupported with a reason, and the export carries the ranks."""
    knobs = (
        {"comm_hook": ["none", "bf16", "powersgd"], "bucket_cap_mb": [5, 25]}
        if parallel == "ddp"
        else {"reshard_after_forward": [True, False], "param_dtype": ["fp32", "bf16"], "offload": ["none", "cpu"]}
    )
    space = {"precision": ["bf16"], "batch_size": [MICRO_BATCH // 2], "workers": [0], "compile": ["none"], **knobs}
    baseline = {"precision": "bf16", "batch_size": MICRO_BATCH // 2, "workers": 0, "compile": "none"}
    spec = _gpt_spec(tmp_path, parallel, space, baseline, processes=2, parallel=parallel)
    _search(spec, tmp_path)
    trials = _trials(tmp_path, parallel)
    for trial in trials:
        _ok_or_unsupported(trial)
    assert any(t.user_attrs["outcome"] == "ok" for t in trials)
    export = yaml.safe_load((tmp_path / "runs" / parallel / "best.yaml").read_text())
    assert export["spec"]["processes"] == 2 and export["spec"]["parallel"] == parallel
