"""The knobs of a trial of several processes (DDP's and FSDP2's), on the CPU with gloo and 2
ranks: each acts, and a knob that changes the numerics shows up as drift from the fp32
reference; which knobs a job has and when a value cannot act. How the ranks run is
tests/trials/test_ranks.py's."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from autotuner.backends.pytorch import DDP_KNOBS, FSDP_KNOBS, PYTORCH, TorchCapabilities
from autotuner.backends.pytorch.apply import TunedTraining
from autotuner.errors import SpecError
from autotuner.spec.job import parse_spec
from autotuner.trials.launcher import TrialLauncher
from autotuner.trials.outcomes import Outcome
from tests.support.helpers import FP32, RUNNER
from tests.trials.test_ranks import _drift_request

DDP = {knob.name for knob in DDP_KNOBS}
FSDP = {knob.name for knob in FSDP_KNOBS}


def _heldout(launcher: TrialLauncher, parallel: str | None, processes: int, **knobs: object) -> float:
    trial = _drift_request(parallel, processes)
    result = launcher.call(RUNNER, "run", replace(trial, config={**trial.config, **knobs}), 120)
    assert result.outcome is Outcome.OK, result.reason
    assert result.output is not None
    return result.output.losses.heldout


@pytest.mark.parametrize(
    ("parallel", "knobs"),
    [
        ("ddp", {"bucket_cap_mb": 1, "bucket_view": True}),
        ("ddp", {"static_graph": True}),
        ("fsdp", {"reshard_after_forward": False}),
    ],
)
def test_knobs_that_keep_the_numerics_train_as_one_process(
    launcher: TrialLauncher, parallel: str, knobs: dict[str, object]
) -> None:
    """Bucket size and views, a static graph, keeping the gathered parameters: how the gradients
    travel, not what they are."""
    assert _heldout(launcher, parallel, 2, **knobs) == pytest.approx(_heldout(launcher, None, 1), rel=1e-6)


@pytest.mark.parametrize(
    ("parallel", "knobs"),
    [
        ("ddp", {"comm_hook": "fp16"}),
        ("ddp", {"comm_hook": "powersgd"}),
        ("fsdp", {"param_dtype": "bf16"}),
        ("fsdp", {"reduce_dtype": "bf16"}),
    ],
)
def test_knobs_that_change_the_numerics_show_up_as_drift(
    launcher: TrialLauncher, parallel: str, knobs: dict[str, object]
) -> None:
    """Compressed gradients, bf16 parameters or reductions: the held-out loss after K steps is not
    the fp32 reference's (the same ranks without the knob are, within rounding)."""
    reference = _heldout(launcher, None, 1)
    plain = _heldout(launcher, parallel, 2)
    changed = _heldout(launcher, parallel, 2, **knobs)
    assert plain == pytest.approx(reference, rel=1e-6)
    assert abs(changed - reference) > abs(plain - reference)


def _job(tmp_path: Path, **spec: object):  # type: ignore[no-untyped-def]
    data = {"name": "job", "backend": "pytorch", "workload": "builtin:mlp", "global_batch": 64, **spec}
    return parse_spec(data, str(tmp_path / "spec.yaml"))


def test_a_job_holds_the_knobs_of_its_way_of_training_only(tmp_path: Path) -> None:
    one, ddp = _job(tmp_path), _job(tmp_path, processes=2)
    fsdp = _job(tmp_path, processes=2, parallel="fsdp")
    # a spec that names no space searches its way of training's preset
    assert set(ddp.space["bucket_cap_mb"]) == {5, 25, 100} and set(fsdp.space["offload"]) == {"none", "cpu"}
    assert not (DDP | FSDP) & set(one.baseline)
    assert ddp.parallel == "ddp" and DDP <= set(ddp.baseline) and not FSDP & set(ddp.baseline)
    assert FSDP <= set(fsdp.baseline) and not DDP & set(fsdp.baseline)
    # the micro-batch is per rank: 64 samples a step over 2 ranks
    assert ddp.baseline["batch_size"] == 32 and ddp.complete({"batch_size": 8})["accumulation"] == 4
    assert max(ddp.space["batch_size"]) <= 32


@pytest.mark.parametrize(
    ("spec", "key", "says"),
    [
        ({"parallel": "ddp"}, "parallel", "set processes: 2 or more"),
        ({"processes": 3}, "processes", "global_batch (64) is not a multiple of processes (3)"),
        ({"processes": 2, "parallel": "zero"}, "parallel", "'zero' is not allowed; choose between 'ddp', 'fsdp'"),
        ({"space": {"bucket_cap_mb": [5, 25]}}, "space.bucket_cap_mb", "a knob of parallel: ddp"),
        ({"processes": 2, "space": {"offload": ["cpu"]}}, "space.offload", "a knob of parallel: fsdp"),
        ({"processes": 2, "baseline": {"batch_size": 64}}, "baseline.batch_size", "global_batch / processes"),
    ],
)
def test_a_parallel_spec_that_cannot_run_is_one_clear_line(
    tmp_path: Path, spec: dict[str, object], key: str, says: str
) -> None:
    with pytest.raises(SpecError) as raised:
        _job(tmp_path, **spec)
    assert raised.value.key == key and says in str(raised.value)
    assert "\n" not in str(raised.value)


def test_which_values_cannot_act_and_why() -> None:
    cpu_ddp = TorchCapabilities(ddp=True, bf16=True)
    gpu_fsdp = TorchCapabilities(accelerator=True, fsdp=True, bf16=True)
    assert PYTORCH.irrelevant("bucket_cap_mb", 5, cpu_ddp) is None
    assert "a knob of parallel: fsdp" in (PYTORCH.irrelevant("offload", "cpu", cpu_ddp) or "")
    assert "CUDA and NCCL" in (PYTORCH.irrelevant("comm_hook", "bf16", cpu_ddp) or "")
    assert "host memory already" in (PYTORCH.irrelevant("offload", "cpu", TorchCapabilities(fsdp=True)) or "")
    assert PYTORCH.irrelevant("offload", "cpu", gpu_fsdp) is None
    config = {"precision": "fp16", "param_dtype": "bf16"}
    assert "autocast" in (PYTORCH.unsupported_reason(config, gpu_fsdp) or "")
    static = {"static_graph": True, "accumulation": 2}
    assert "no_sync" in (PYTORCH.unsupported_reason(static, cpu_ddp) or "")
    assert PYTORCH.unsupported_reason({**static, "accumulation": 1}, cpu_ddp) is None


WORKLOADS = {
    "mlp": {},
    "cnn": {"convolutions": True},
    "resnet": {"convolutions": True, "checkpoint_blocks": True},
    "gpt": {"sdpa": True, "checkpoint_blocks": True},
}
"""What the probe finds of each built-in model (the knobs it offers)."""


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_the_presets_of_a_parallel_job_fit_the_sampler_on_a_gpu(tmp_path: Path, parallel: str, workload: str) -> None:
    """On a GPU that has every kernel, each built-in's space of the ddp or fsdp preset, every
    micro-batch dividing its share of the global batch, narrows to what the sampler can list
    (`Job.narrow` refuses more)."""
    job = _job(tmp_path, workload=f"builtin:{workload}", global_batch=8192, processes=8, parallel=parallel)
    device = {name: True for name in ("accelerator", "bf16", "fp16", "tf32", "compile", "cuda_graphs", "cudnn")}
    kernels = {name: True for name in ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "foreach_optimizer")}
    offered = {**device, **kernels, "fused_optimizer": True, parallel: True, **WORKLOADS[workload]}
    narrowed, _ = job.narrow(TorchCapabilities(**offered))
    assert len(narrowed.space["batch_size"]) == 8


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


ONE = {**FP32, "batch_size": 4}


@pytest.mark.parametrize(
    ("knobs", "hook"),
    [
        ({"bucket_cap_mb": 5, "bucket_view": True, "static_graph": True, "comm_hook": "fp16"}, "fp16_compress_hook"),
        ({"bucket_cap_mb": 100, "bucket_view": False, "static_graph": False, "comm_hook": "powersgd"}, "powerSGD_hook"),
        ({"bucket_cap_mb": 25, "bucket_view": False, "static_graph": False, "comm_hook": "none"}, None),
    ],
)
def test_each_ddp_knob_reaches_distributed_data_parallel(
    one_rank: None, knobs: dict[str, object], hook: str | None
) -> None:
    """What the wrapper was given, not only that training is unchanged: a knob never passed on
    would train the same too."""
    model = _mlp()
    tuned = TunedTraining({**ONE, **knobs}, model, torch.optim.SGD(model.parameters(), lr=0.1), parallel="ddp")
    ddp = tuned._ddp
    assert ddp.bucket_bytes_cap == int(knobs["bucket_cap_mb"]) * 1024 * 1024  # type: ignore[call-overload]
    assert ddp.gradient_as_bucket_view is knobs["bucket_view"]
    assert ddp.static_graph is knobs["static_graph"]
    assert [h.__name__ for h, _ in ddp._comm_hooks] == ([hook] if hook else [])


@pytest.mark.parametrize(
    "knobs",
    [
        {"reshard_after_forward": True, "param_dtype": "bf16", "reduce_dtype": "fp32", "offload": "none"},
        {"reshard_after_forward": False, "param_dtype": "fp32", "reduce_dtype": "bf16", "offload": "none"},
    ],
)
def test_each_fsdp_knob_reaches_fully_shard(one_rank: None, knobs: dict[str, object]) -> None:
    """As DDP's: what FSDP2 was given. (`offload: cpu` moves a GPU's parameters: not on a CPU.)"""
    from torch.distributed.fsdp import CPUOffloadPolicy

    model = _mlp()
    tuned = TunedTraining({**ONE, **knobs}, model, torch.optim.SGD(model.parameters(), lr=0.1), parallel="fsdp")
    group = tuned.module._get_fsdp_state()._fsdp_param_group  # FSDP2's own record of its arguments
    dtypes = {"bf16": torch.bfloat16, "fp32": None}  # None: the parameters' own dtype
    assert (group.post_forward_mesh_info is not None) is knobs["reshard_after_forward"]
    assert group.mp_policy.param_dtype == dtypes[knobs["param_dtype"]]  # type: ignore[index]
    assert group.mp_policy.reduce_dtype == dtypes[knobs["reduce_dtype"]]  # type: ignore[index]
    assert isinstance(group.offload_policy, CPUOffloadPolicy) is (knobs["offload"] == "cpu")
