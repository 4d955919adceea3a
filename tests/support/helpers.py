"""Shared helpers for the trial, drift, spec and sampler tests.

Importing this module puts the repository root on `sys.path` so that `tests.support.faulty_workloads`
imports by path in trial processes too: the fork server copies this process's `sys.path` when it
starts, and every trial process is forked from it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from autotuner.trials.probe import Environment

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from autotuner.backends.pytorch import PARALLEL_KNOBS, PYTORCH  # noqa: E402
from autotuner.measurement.timing import Throughput  # noqa: E402
from autotuner.results.evidence import Reference  # noqa: E402
from autotuner.trials.request import TrialRequest  # noqa: E402
from autotuner.trials.trial_output import Losses, TrialOutput  # noqa: E402

RUNNER = "autotuner.backends.pytorch.runner"
FAULTY = "tests.support.faulty_workloads"

FP32 = {"precision": "fp32", "batch_size": 8, "accumulation": 1, "workers": 0, "compile": "none"}

EXPORTED: dict[str, Any] = {
    "version": 1,
    "params": {"precision": "bf16", "batch_size": 8, "accumulation": 2, "workers": 1, "compile": "none"},
    "metrics": {"throughput": 1234.5, "throughput_spread": 0.1, "drift": 0.0002, "heldout_loss": 2.25},
    "baseline": {
        "params": {"precision": "fp32", "batch_size": 4, "accumulation": 4, "workers": 0, "compile": "none"},
        "throughput": 500.0,
        "outcome": "ok",
    },
    "speedup": 2.469,
    "drift": {"tolerance": 0.01, "reference_noise_floor": 0.0},
    "environment": {"backend": "pytorch", "device": "cpu", "fingerprint": "0123456789abcdef"},
    "spec": {"path": "job.yaml", "identity": "fedcba9876543210", "workload": "builtin:mlp", "global_batch": 16},
    "study": {"name": "job", "storage": "sqlite:///runs/job/study.db", "trial": 4, "trials_ran": 9},
}
"""An export's data as `autotuner export` writes it: a bf16 config, 2.469x over its fp32 baseline."""

SMALL_MLP = {"features": 16, "hidden": 32, "depth": 2, "samples": 128}
"""Arguments that make the built-in mlp small enough for a trial in about a second on a CPU."""

HELD = {
    knob.name: [knob.reference]
    for knob in PYTORCH.knobs.values()
    if knob.quiet and not any(knob in family for family in PARALLEL_KNOBS.values())
}
"""A PyTorch space's knobs beyond the first four (every quiet one of one process), held at their
reference values: a test whose space is precision, batch, workers and compile adds these (a
preset would search them)."""


def small_request(
    workload: str,
    config: dict[str, Any],
    workload_args: dict[str, Any] | None = None,
    *,
    measure: bool = True,
    heldout_batch: int = 8,
) -> TrialRequest:
    """A small trial request: global batch 8 (accumulation derived from the config's micro-batch),
    1 warm-up step, 2 windows of 2 steps, 2 drift steps; the held-out loss in chunks of
    `heldout_batch` (a search's baseline micro-batch: the same for every trial it compares)."""
    config = {**config, "accumulation": 8 // config["batch_size"]}
    return TrialRequest(
        workload=workload,
        workload_args=dict(workload_args or {}),
        device="cpu",
        config=config,
        global_batch=8,
        seed=0,
        warmup_steps=1,
        steps=2,
        windows=2,
        drift_steps=2,
        heldout_batch=heldout_batch,
        measure=measure,
    )


def request(
    workload: str, workload_args: dict[str, Any] | None = None, *, measure: bool = True, **config: Any
) -> TrialRequest:
    """`small_request` for the PyTorch fp32 config with `config`'s changes; a bare function name is
    one of `tests.support.faulty_workloads`."""
    path = workload if ":" in workload else f"{FAULTY}:{workload}"
    return small_request(path, {**FP32, **config}, workload_args, measure=measure)


def measured(
    samples_per_s: float, heldout: float, trajectory: list[float], spread: float = 0.01, **fields: Any
) -> TrialOutput:
    """What a trial process sends back for a trial measured at `samples_per_s` (one window) whose
    drift phase gave these losses; `fields`: the output's others (telemetry, ...)."""
    throughput = Throughput(
        samples_per_s=samples_per_s,
        spread=spread,
        window_samples_per_s=[samples_per_s],
        warmup_s=0.1,
        measured_s=1.0,
        steps=2,
        windows=1,
        samples_per_step=8,
    )
    return TrialOutput(Losses(heldout, trajectory), throughput=throughput, **fields)


def reference(heldout: float, trajectory: list[float], config: dict[str, Any] | None = None) -> Reference:
    """A study's fp32 reference with these losses, its two runs identical (noise floor 0)."""
    return Reference(
        config=dict(config or FP32),
        heldout=heldout,
        trajectory=trajectory,
        noise_floor=0.0,
        noise_floor_trajectory=0.0,
        runs_heldout=[heldout, heldout],
        wall_s=1.0,
    )


def preloaded(arg: object) -> dict[str, bool]:
    """Run in a trial process (as `TrialLauncher.call("tests.support.helpers", "preloaded", ...)`): what the
    fork server had imported before this trial started. This module itself imports no framework."""
    return {name: name in sys.modules for name in ("autotuner.backends.pytorch.runner", "torch", "torch._dynamo")}


def cuda_state(arg: object) -> dict[str, object]:
    """Run in a trial process: whether it inherited the fork server's NVML-based CUDA check and
    whether CUDA is initialised in it before the trial's code touches anything."""
    import os

    import torch

    return {"nvml_check": os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"), "initialized": torch.cuda.is_initialized()}


def _stat(pid: int) -> tuple[str, int, str] | None:
    """(state, parent pid, start time) of a process, or None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), fields[19]


OTHER_MACHINE = Environment(
    backend="pytorch",
    device="cuda:0",
    device_name="NVIDIA H100 80GB HBM3",
    driver="550.54.15",
    versions={"python": "3.11.7", "torch": "2.3.0", "cuda": "12.1", "cudnn": 8902},
    capabilities={"accelerator": True, "bf16": True, "fp16": True, "tf32": True},
)


MEMORY_LIMIT_MB = 1024


ALLOCATE_MB = 1536
"""The `allocate` fault asks for this much (never touched): granted without a limit, refused with it."""


TINY_MLP = {"features": 16, "hidden": 32, "depth": 2, "samples": 64}


CPU_BUNDLE = "cpu-onednn"


def assert_measured_as_one(result: Any, trial: TrialRequest) -> None:
    """`result` of `trial` (several ranks or devices) ended ok with one throughput: global samples
    per step, every window measured, a peak memory."""
    from autotuner.trials.outcomes import Outcome

    assert result.outcome is Outcome.OK, result.reason
    assert result.output is not None and result.output.throughput is not None
    throughput = result.output.throughput
    assert throughput.samples_per_step == trial.global_batch and throughput.samples_per_s > 0
    assert len(throughput.window_samples_per_s) == trial.windows
    assert result.output.peak_memory_mb and result.output.peak_memory_mb > 0
