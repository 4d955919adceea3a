"""benchmarks/gpu.py's own functions: the figures its apply part reads from what `autotuner apply`
prints on a GPU, and a command stopped at its part's time limit. Its parts run dry end to end in
tests/e2e/test_gpu_benchmark*.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from tests.support.benchmarks import GPU_PY
from tests.support.studies import ROOT


def _import_gpu_py() -> ModuleType:
    """benchmarks/gpu.py as a module (its folder on the path while it imports its harness)."""
    path = list(sys.path)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("benchmarks_gpu", GPU_PY)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path[:] = path


def test_apply_figures_are_read_as_a_gpu_prints_them() -> None:
    """On a GPU the baseline runs after the config, not in lockstep: the same lines, read alike."""
    gpu = _import_gpu_py()
    output = """runs/gpu-gpt/best.yaml: precision=bf16 batch=64x1 workers=2 compile=default (trial #5 of gpu-gpt)
ran 120 optimizer steps of 64 samples (24 windows of 5, after 31.20 s of warm-up) on cuda:0 (NVIDIA H100 80GB HBM3)
throughput: 612 samples/s here (spread 0.4%), 608 samples/s in the study (spread 0.3%): ratio 1.01
speedup: 10.21x here (over the baseline precision=fp32 batch=8x8 workers=0 compile=none, 60 samples/s, \
run here for 120 optimizer steps in 40 windows of 3, after it), 10.02x in the export: ratio 1.02
held-out loss after 3 steps: 4.1 here, 4.1 in the study (identical)"""
    assert gpu.parse_apply(output) == {
        "steps_run": 120,
        "samples_per_step": 64,
        "device": "cuda:0",
        "device_name": "NVIDIA H100 80GB HBM3",
        "throughput_here": 612.0,
        "throughput_study": 608.0,
        "throughput_ratio": 1.01,
        "speedup_delivered": 10.21,
        "baseline_throughput_here": 60.0,
        "baseline_steps_run": 120,
        "export_speedup_printed": 10.02,
        "promise_ratio_printed": 1.02,
    }


def test_a_command_past_the_parts_time_limit_is_interrupted(tmp_path: Path) -> None:
    gpu = _import_gpu_py()
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    ran = gpu.run_command(sleeper, tmp_path, gpu.time.monotonic() + 1, tmp_path / "log")
    assert ran["stopped_at_time_limit"] is True and ran["killed"] is False
    assert ran["exit_code"] != 0 and ran["wall_s"] < 30
