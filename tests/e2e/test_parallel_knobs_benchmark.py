"""benchmarks/parallel_knobs.py run small on the CPU, so it cannot rot: every DDP and FSDP2 knob
value this device can use runs as a trial of two gloo ranks against its mode's base config, the
rest are listed with the reason, and the knobs that change the numerics show in the loss."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.studies import ROOT


@pytest.mark.slow
def test_the_parallel_knob_benchmark_runs_each_knob_as_a_trial_of_two_ranks(tmp_path: Path) -> None:
    out = tmp_path / "parallel.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "parallel_knobs.py"), "--tiny", "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    data = json.loads(out.read_text())
    ddp, fsdp = data["workloads"]["mlp"]["ddp"], data["workloads"]["mlp"]["fsdp"]
    assert {"base", "bucket_cap_mb=5", "bucket_cap_mb=100", "bucket_view=True", "static_graph=True"} <= set(
        ddp["variants"]
    )
    assert {"base", "reshard_after_forward=False", "param_dtype=bf16", "reduce_dtype=bf16"} <= set(fsdp["variants"])
    assert "offload=cpu" in fsdp["not_run"]  # it moves a GPU's parameters to the host: none here
    for mode in (ddp, fsdp):
        for entry in mode["variants"].values():
            assert entry["samples_per_s"] > 0 and not entry["failed"], entry
        assert mode["variants"]["base"]["ratio"] == 1.0
    # how the gradients travel keeps the loss; compressing them does not
    base = ddp["variants"]["base"]["heldout_loss"]
    assert ddp["variants"]["bucket_view=True"]["heldout_loss"] == pytest.approx(base, rel=1e-6)
    assert ddp["variants"]["comm_hook=powersgd"]["heldout_loss"] != pytest.approx(base, rel=1e-6)
    assert data["device"]
