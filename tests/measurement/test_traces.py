"""Operators ranked by self time, from a Chrome trace as torch.profiler and jax.profiler write it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from autotuner.measurement.traces import OUTSIDE_OPERATORS, read_trace, top_operators


def span(name: str, ts: float, dur: float, tid: int = 1, pid: int = 1, cat: str = "cpu_op") -> dict[str, object]:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "cat": cat}


def test_self_time_is_the_duration_less_the_children_on_the_same_lane_per_step() -> None:
    events = [
        span("PyTorch Profiler (0)", 0, 1000, cat="user_annotation"),
        span("aten::linear", 100, 400),  # its child aten::addmm takes 300 of its 400
        span("aten::addmm", 150, 300),
        span("aten::relu", 600, 100),
        span("aten::relu", 800, 100),
        span("autograd::AddmmBackward0", 0, 250, tid=2),  # another thread: not a child of anything above
        span("<module>", 0, 1000, cat="python_function"),  # a Python frame: left out
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}},
    ]
    where, total_ms, ops = top_operators(events, steps=2)
    assert where == "host"
    by_name = {op.name: op for op in ops}
    assert by_name["aten::addmm"].self_ms == pytest.approx(0.15)  # 300 us over 2 steps
    assert by_name["aten::linear"].self_ms == pytest.approx(0.05)
    assert by_name["aten::relu"].self_ms == pytest.approx(0.1) and by_name["aten::relu"].calls == 1
    assert by_name["autograd::AddmmBackward0"].self_ms == pytest.approx(0.125)
    assert by_name[OUTSIDE_OPERATORS].self_ms == pytest.approx(0.2)  # 1000 - 400 - 200 on its lane
    assert "<module>" not in by_name
    assert total_ms == pytest.approx((1000 + 250) / 1000 / 2)
    assert [op.name for op in ops][0] == OUTSIDE_OPERATORS and sum(op.share for op in ops) == pytest.approx(1.0)


def test_a_device_in_the_trace_ranks_its_kernels_alone() -> None:
    torch_gpu = [
        span("aten::mm", 0, 500),
        span("cudaLaunchKernel", 10, 20, cat="cuda_runtime"),
        span("sm90_xmma_gemm", 40, 300, pid=0, tid=7, cat="kernel"),
        span("Memcpy HtoD", 400, 50, pid=0, tid=7, cat="gpu_memcpy"),
    ]
    where, total_ms, ops = top_operators(torch_gpu, steps=1)
    assert where == "device" and [op.name for op in ops] == ["sm90_xmma_gemm", "Memcpy HtoD"]
    assert total_ms == pytest.approx(0.35)
    jax_gpu = [
        {"ph": "M", "name": "process_name", "pid": 3, "args": {"name": "/device:GPU:0"}},
        span("fusion.12", 0, 80, pid=3, tid=1, cat=None),  # type: ignore[arg-type]
        span("$train.py:10 step", 0, 500, pid=2),  # a Python frame of JAX's: left out
        span("PjitFunction(step)", 0, 400, pid=2),
    ]
    where, _, ops = top_operators(jax_gpu, steps=1)
    assert where == "device" and [op.name for op in ops] == ["fusion.12"]


def test_a_gzipped_trace_reads_as_a_plain_one(tmp_path: Path) -> None:
    events = [span("aten::add", 0, 10)]
    (tmp_path / "trace.json").write_text(json.dumps({"traceEvents": events}))
    with gzip.open(tmp_path / "trace.json.gz", "wt") as f:
        json.dump(events, f)  # a bare list is a Chrome trace too
    assert read_trace(tmp_path / "trace.json") == read_trace(tmp_path / "trace.json.gz") == events
