"""The CUDA path, checked on the CPU: what a GPU would do is driven through the same code with
real exception types, mocked device properties and flags recorded by the workload.

NVML and MFU are tested in tests/measurement/test_telemetry.py and tests/measurement/test_hardware.py, a JAX trial on a
GPU machine in tests/backends/test_jax_gpu_env.py.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import autotuner.backends.pytorch.apply as torch_apply
import autotuner.backends.pytorch.knobs.compile as compile_knob
import autotuner.backends.pytorch.probe as torch_probe
import autotuner.backends.pytorch.process as torch_process
import autotuner.backends.pytorch.runner as torch_runner
from autotuner.backends.pytorch.apply import TunedTraining
from autotuner.backends.pytorch.runner import TRIAL_BACKEND
from autotuner.errors import SpecError
from autotuner.results.records import TrialRecord
from autotuner.results.store import trial_metrics
from autotuner.spec.job import TRIAL_TIMEOUT_S, load_spec
from autotuner.study.storage import check_trial_limits
from autotuner.trials import lockstep
from autotuner.trials.launcher import TrialLauncher, TrialResult
from autotuner.trials.outcomes import Outcome
from autotuner.trials.probe import Environment
from autotuner.trials.request import ProbeRequest
from autotuner.trials.trial_output import Losses, TrialOutput
from tests.support.helpers import ROOT, RUNNER, reference, request
from tests.support.studies import SMALL_SPEC

CONFIG = {"precision": "fp32", "batch_size": 4, "accumulation": 4, "workers": 0, "compile": "none"}


def _forwards(folder: Path) -> list[list[str]]:
    return [line.split() for line in (folder / "forwards").read_text().splitlines()]


# ---------------------------------------------------------------- 1. CUDA graphs and accumulation


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))


def _train(training: TunedTraining, steps: int) -> list[int]:
    """`steps` optimizer steps as a user's loop takes them; the `.grad` storages seen after each
    micro-batch's backward."""
    generator = torch.Generator().manual_seed(1)
    pointers = []
    for _ in range(steps * training.accumulation):
        x = torch.randn(training.batch_size, 8, generator=generator)
        y = torch.randint(3, (training.batch_size,), generator=generator)
        with training.autocast():
            loss = torch.nn.functional.cross_entropy(training.model(x), y)
        training.backward(loss)
        pointers += [p.grad.data_ptr() for p in training.model.parameters()]
        training.step()
    return pointers


def test_only_cuda_graph_modes_on_a_gpu_use_cuda_graphs() -> None:
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert torch_apply.uses_cuda_graphs("reduce-overhead", cuda) and torch_apply.uses_cuda_graphs("max-autotune", cuda)
    assert not torch_apply.uses_cuda_graphs("default", cuda) and not torch_apply.uses_cuda_graphs("none", cuda)
    assert not torch_apply.uses_cuda_graphs("max-autotune", cpu)


def test_under_cuda_graphs_accumulation_adds_into_gradients_that_stay_put(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA-graph replay writes into the same buffers each time: gradients must be tensors of
    their own, allocated once and added into, and each forward must start a new graph step. The
    updates are the same as with gradients set to None between steps (the eager path)."""
    marks: list[int] = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    eager_model = _model()
    eager = TunedTraining(CONFIG, eager_model, torch.optim.AdamW(eager_model.parameters(), lr=1e-2), device="cpu")
    _train(eager, steps=3)

    monkeypatch.setattr(compile_knob, "uses_cuda_graphs", lambda mode, device: True)
    graphed_model = _model()
    optimizer = torch.optim.AdamW(graphed_model.parameters(), lr=1e-2)
    graphed = TunedTraining(CONFIG, graphed_model, optimizer, device="cpu")
    allocated = [p.grad.data_ptr() for p in graphed_model.parameters()]  # before any backward
    pointers = _train(graphed, steps=3)

    assert set(pointers) == set(allocated)  # never replaced, neither by backward nor by zero_grad
    assert len(marks) == 3 * CONFIG["accumulation"]  # one graph step per forward
    for ours, theirs in zip(graphed_model.parameters(), eager_model.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs)


def test_without_accumulation_cuda_graphs_keep_set_to_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """One micro-batch per step: the gradient is used before the next replay, so nothing is kept."""
    monkeypatch.setattr(torch_apply, "uses_cuda_graphs", lambda mode, device: True)
    model = _model()
    single = {**CONFIG, "batch_size": 16, "accumulation": 1}
    training = TunedTraining(single, model, torch.optim.SGD(model.parameters()))
    assert all(p.grad is None for p in model.parameters())
    _train(training, steps=1)
    assert all(p.grad is None for p in model.parameters())


# ---------------------------------------------------------------- 3. held-out loss in strict fp32


def test_a_tf32_trial_evaluates_its_heldout_loss_in_strict_fp32(launcher: TrialLauncher, tmp_path: Path) -> None:
    result = launcher.call(RUNNER, "run", request("records_forwards", {"folder": str(tmp_path)}, precision="tf32"), 60)
    assert result.outcome is Outcome.OK, result.reason
    forwards = _forwards(tmp_path)
    training = [f for f in forwards if f[4] == "True"]
    evaluation = [f for f in forwards if f[4] == "False"]
    assert training and all(f[1:4] == ["high", "True", "True"] for f in training)  # the config's TF32
    assert evaluation and all(f[1:4] == ["highest", "False", "False"] for f in evaluation)


def test_strict_fp32_restores_the_configs_flags() -> None:
    torch_apply.set_matmul_precision("tf32")
    try:
        with torch_apply.strict_fp32():
            assert torch.get_float32_matmul_precision() == "highest"
            assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        assert torch.get_float32_matmul_precision() == "high" and torch.backends.cuda.matmul.allow_tf32
    finally:
        torch_apply.set_matmul_precision("fp32")


# ---------------------------------------------------------------- 4. FLOPs counted on two samples


def test_flops_are_counted_on_two_samples_and_a_failure_there_is_not_a_failed_trial(
    launcher: TrialLauncher, tmp_path: Path
) -> None:
    """The trial: 1 warm-up step and 2 windows of 2 steps at micro-batch 8 (forwards 1-5), then the
    FLOP count (forward 6)."""
    counted = tmp_path / "counted"
    counted.mkdir()
    result = launcher.call(RUNNER, "run", request("records_forwards", {"folder": str(counted)}), 60)
    assert result.outcome is Outcome.OK, result.reason
    assert [int(f[0]) for f in _forwards(counted)[:6]] == [8, 8, 8, 8, 8, 2]
    assert result.output.flops_per_sample > 0

    failing = tmp_path / "failing"
    failing.mkdir()
    result = launcher.call(RUNNER, "run", request("records_forwards", {"folder": str(failing), "oom_at": 6}), 60)
    assert result.outcome is Outcome.OK, result.reason  # not `oom`: that would rule out larger batches
    assert result.output.flops_per_sample is None
    assert result.output.throughput.samples_per_s > 0 and result.output.losses.trajectory


# ---------------------------------------------------------------- 5. initial weights on the host


def test_the_initial_weights_are_kept_in_host_memory_apart_from_the_model() -> None:
    model = _model()
    copy = torch_runner._host_copy(model)
    assert all(t.device.type == "cpu" for t in copy.values())
    for name, tensor in model.state_dict().items():
        assert copy[name].data_ptr() != tensor.data_ptr()
        torch.testing.assert_close(copy[name], tensor)


# ---------------------------------------------------------------- 6. peak memory


def test_peak_gpu_memory_is_the_reserved_peak_reset_after_the_warmup(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    fake = {
        "synchronize": lambda device=None: calls.append("synchronize"),
        "empty_cache": lambda: calls.append("empty_cache"),
        "reset_peak_memory_stats": lambda device=None: calls.append("reset"),
        "max_memory_reserved": lambda device=None: 3 * 2**30,
        "max_memory_allocated": lambda device=None: 1 * 2**30,
    }
    for name, function in fake.items():
        monkeypatch.setattr(torch.cuda, name, function)
    cuda = torch.device("cuda", 0)
    assert TRIAL_BACKEND.peak_memory_mb(cuda) == 3 * 1024  # what the process took, not what tensors use
    TRIAL_BACKEND.after_warmup(cuda, lambda: calls.append("step"))
    assert calls == ["synchronize", "empty_cache", "reset", "step", "synchronize"]


def test_measure_throughput_calls_after_warmup_between_the_warmup_and_the_first_window() -> None:
    from autotuner.measurement.measured_phase import measure_throughput
    from autotuner.measurement.timing import Measuring, WindowTimer

    events: list[str] = []
    measure_throughput(
        WindowTimer(
            lambda: events.append("step"),
            lambda: None,
            after_warmup=lambda step: events.append("after_warmup"),
            after_window=lambda: events.append("window"),
        ),
        Measuring(warmup_steps=2, steps=1, windows=2, samples_per_step=1),
    )
    assert events == ["step", "step", "after_warmup", "step", "window", "step", "window"]


# ---------------------------------------------------------------- 7. OOM classification


def test_ooms_are_oom_however_torch_wraps_them() -> None:
    from torch._dynamo.exc import BackendCompilerFailed
    from torch._inductor.exc import InductorError

    classify = TRIAL_BACKEND.classify_exception
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    try:
        try:
            raise oom
        except torch.OutOfMemoryError as inner:
            raise RuntimeError("compiling failed") from inner
    except RuntimeError as chained:
        assert classify(chained) == "oom"
    assert classify(BackendCompilerFailed(None, oom, None)) == "oom"
    assert classify(InductorError(oom, None)) == "oom"
    assert classify(torch.AcceleratorError("CUDA error: out of memory")) == "oom"
    assert classify(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate")) == "oom"
    assert classify(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried")) == "oom"
    assert classify(BackendCompilerFailed(None, ValueError("a bug"), None)) is None
    assert classify(RuntimeError("CUDA error: an illegal memory access was encountered")) is None


def test_oom_classification_works_on_a_torch_without_torch_out_of_memory_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch before 2.5 has only torch.cuda.OutOfMemoryError: any failure must not become a crash."""
    monkeypatch.delattr(torch, "OutOfMemoryError")
    assert TRIAL_BACKEND.classify_exception(torch.cuda.OutOfMemoryError("CUDA out of memory")) == "oom"
    assert TRIAL_BACKEND.classify_exception(ValueError("user code")) is None


# ---------------------------------------------------------------- 8. the fork server never starts CUDA


@pytest.mark.slow
def test_preloading_the_runners_touches_no_cuda_entry_point() -> None:
    """In a fresh interpreter whose CUDA entry points raise, the fork server's preloads import
    and leave CUDA availability to NVML."""
    script = """
import os, sys
import torch
def refuse(*args, **kwargs):
    raise AssertionError("CUDA was initialised while preloading")
for name in ("_cuda_init", "_cuda_getDeviceCount"):  # a CUDA build's (a CPU build has none)
    if hasattr(torch._C, name):
        setattr(torch._C, name, refuse)
torch.cuda.init = refuse
torch.cuda._lazy_init = refuse
import jax._src.xla_bridge as xla_bridge
xla_bridge.backends = refuse
import autotuner.trials._forkserver, autotuner.backends.pytorch.runner, autotuner.backends.jax.runner
assert os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == "1", os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")
assert not torch.cuda.is_initialized()
print("clean")
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_NVML_BASED_CUDA_CHECK"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "clean" in done.stdout, done.stderr[-2000:]


def test_trial_processes_inherit_the_nvml_based_cuda_check(launcher: TrialLauncher) -> None:
    result = launcher.call("tests.support.helpers", "cuda_state", None, 60)
    assert result.outcome is Outcome.OK, result.reason
    assert result.output == {"nvml_check": "1", "initialized": False}


# ---------------------------------------------------------------- 12. bf16 by the device's compute capability


@pytest.mark.parametrize(("major", "bf16"), [(7, False), (8, True), (9, True)])
def test_bf16_and_tf32_are_decided_by_the_requested_devices_compute_capability(
    monkeypatch: pytest.MonkeyPatch, major: int, bf16: bool
) -> None:
    """A V100 (7.0) beside an A100: is_bf16_supported() says yes for emulation, and asks about cuda:0."""
    asked: list[Any] = []

    def properties(device: Any) -> Any:
        asked.append(torch.device(device))
        return types.SimpleNamespace(name="NVIDIA Test GPU", major=major, minor=0, total_memory=16 * 2**30)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    for name in ("has_energy_counter", "cuda_uuid"):
        monkeypatch.setattr(torch_probe, name, lambda *a, **k: None)
    monkeypatch.setattr(torch_probe, "nvml_driver", lambda: "test")
    probed = TRIAL_BACKEND.probe(ProbeRequest("cuda:1", "autotuner.backends.pytorch.builtin:mlp"))
    assert asked and all(device == torch.device("cuda", 1) for device in asked)
    capabilities = probed.environment.capabilities
    assert capabilities["bf16"] is bf16 and capabilities["tf32"] is bf16


# ---------------------------------------------------------------- 13. fp16's skipped steps


def test_fp16_steps_the_scaler_skips_are_counted() -> None:
    """Inputs of 50 make the fp16 weight gradients overflow at the scaler's initial 2^16: it skips
    those steps and halves its scale until the gradients fit."""
    model = _model()
    fp16 = {**CONFIG, "precision": "fp16", "batch_size": 16, "accumulation": 1}
    training = TunedTraining(fp16, model, torch.optim.SGD(model.parameters(), lr=1e-3), device="cpu")
    scales = [training.scaler.get_scale()]
    for _ in range(12):
        x = torch.full((16, 8), 50.0)
        with training.autocast():
            loss = torch.nn.functional.cross_entropy(model(x), torch.zeros(16, dtype=torch.long))
        training.backward(loss)
        training.step()
        scales.append(training.scaler.get_scale())
    backoffs = sum(after < before for before, after in zip(scales, scales[1:], strict=False))
    assert backoffs > 0 and training.skipped_steps == backoffs
    fp32 = TunedTraining({**fp16, "precision": "fp32"}, model, torch.optim.SGD(model.parameters()), device="cpu")
    assert fp32.skipped_steps == 0


def test_skipped_drift_steps_are_stored_and_shown_with_the_drift() -> None:
    from autotuner.output.charts import trial_drift_text

    result = TrialResult(Outcome.OK, output=TrialOutput(Losses(1.02, [2.0, 1.5], skipped_steps=2)))
    metrics = trial_metrics(result, reference(1.0, [2.0, 1.5]), {"precision": "fp16"}, {})
    assert metrics["drift_skipped_steps"] == 2
    record = TrialRecord(1, "COMPLETE", {}, {}, "search", "ok", "", True, metrics)
    assert trial_drift_text(record) == "2.000% (2 of the drift steps skipped by fp16 loss scaling)"


# ---------------------------------------------------------------- 14. sequential re-measurement order


def test_sequential_rounds_are_each_shuffled() -> None:
    order = lockstep.sequential_order(12, rounds=3)
    rounds = [order[0:4], order[4:8], order[8:12]]
    assert [sorted(r) for r in rounds] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert not all(r[-1] == max(r) for r in rounds)  # the baseline, last of each round as given, is not always last
    assert lockstep.sequential_order(12, rounds=3) == order  # seeded


def test_measure_together_one_after_another_runs_each_round_shuffled_and_answers_in_order(tmp_path: Path) -> None:
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(SMALL_SPEC))
    job = load_spec(path)

    class Recording:
        def __init__(self) -> None:
            self.ran: list[int] = []

        def call(self, runner: str, function: str, arg: Any, timeout_s: float) -> TrialResult:
            self.ran.append(arg.seed)
            return TrialResult(Outcome.OK, output={"seed": arg.seed})

    base = job.trial_request(job.complete({}), "cuda:0")
    requests = [dataclasses.replace(base, seed=i) for i in range(9)]
    recording = Recording()
    results = lockstep.measure_together(recording, job.backend.runner, requests, "cuda:0", 60.0, rounds=3)  # type: ignore[arg-type]
    assert [r.output["seed"] for r in results] == list(range(9))
    assert recording.ran == lockstep.sequential_order(9, 3) and recording.ran != list(range(9))


# ---------------------------------------------------------------- 15. compile cache and timeouts


def _job(tmp_path: Path, **changes: Any) -> Any:
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump({**SMALL_SPEC, **changes}))
    return load_spec(path)


def test_each_study_compiles_into_its_own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    job = _job(tmp_path)
    request_ = job.trial_request(job.complete({}), "cpu")
    assert request_.compile_cache == str(tmp_path / "runs" / "small" / "compile-cache")


def test_each_precision_compiles_into_a_folder_of_its_own_in_the_studys_cache() -> None:
    """No precision can use another's graphs, and a torch whose AOTAutograd cache keys no autocast
    dtype would serve an fp16 trial bf16's (`tests/e2e/test_compile_cache.py`)."""
    folders = {
        p: torch_process.inductor_cache("/study/compile-cache", {"precision": p}) for p in ("fp32", "bf16", "fp16")
    }
    assert folders["bf16"] == "/study/compile-cache/pytorch-bf16" and len(set(folders.values())) == 3
    assert torch_process.inductor_cache("/study/compile-cache", None) == "/study/compile-cache"


@pytest.mark.slow
def test_a_trials_compile_is_recorded_cold_then_warm_in_its_studys_cache(
    launcher: TrialLauncher, tmp_path: Path
) -> None:
    """Two trials of `compile: default` with one study's cache: the first compiles, the second
    finds every graph there; nothing lands in the machine-wide cache of the user."""
    cache = tmp_path / "cache"
    compiled = dataclasses.replace(request("ok", compile="default"), compile_cache=str(cache))
    first = launcher.call(RUNNER, "run", compiled, 300)
    assert first.outcome is Outcome.OK, first.reason
    assert first.output.compile_cache == "cold" and any(cache.iterdir())
    second = launcher.call(RUNNER, "run", compiled, 300)
    assert second.outcome is Outcome.OK, second.reason
    assert second.output.compile_cache == "warm"
    eager_request = dataclasses.replace(compiled, config={**compiled.config, "compile": "none"})
    eager = launcher.call(RUNNER, "run", eager_request, 60)
    assert eager.output.compile_cache is None


def test_the_default_trial_timeout_grows_with_the_compile_mode(tmp_path: Path) -> None:
    job = _job(tmp_path, trial={k: v for k, v in SMALL_SPEC["trial"].items() if k != "timeout"})
    none = job.complete({"compile": "none"})
    autotune = job.complete({"compile": "max-autotune"})
    assert job.trial_timeout() == job.trial_timeout(none) == TRIAL_TIMEOUT_S
    assert job.trial_timeout(autotune) == job.trial_timeout(none, autotune) == 4 * TRIAL_TIMEOUT_S
    assert job.trial_timeout(job.complete({"compile": "reduce-overhead"})) == 2 * TRIAL_TIMEOUT_S
    explicit = _job(tmp_path, trial={**SMALL_SPEC["trial"], "timeout": 77})
    assert explicit.trial_timeout(autotune) == 77


# ---------------------------------------------------------------- 16. trial.max_memory_mb on a GPU


def test_a_host_memory_limit_is_refused_on_a_gpu_and_kept_on_a_cpu(tmp_path: Path) -> None:
    job = _job(tmp_path, trial={**SMALL_SPEC["trial"], "max_memory_mb": 4096})
    check_trial_limits(job, Environment("pytorch", "cpu", "CPU", "test", {}, {"accelerator": False}))
    with pytest.raises(SpecError) as refused:
        check_trial_limits(job, Environment("pytorch", "cuda:0", "GPU", "test", {}, {"accelerator": True}))
    assert "trial.max_memory_mb" in str(refused.value) and "objective.max_memory_mb" in str(refused.value)
    check_trial_limits(_job(tmp_path), Environment("pytorch", "cuda:0", "GPU", "test", {}, {"accelerator": True}))
