"""benchmarks/knobs.py run dry on the CPU, so it cannot rot where no GPU is: each knob value a
workload can use is built through TunedTraining, trained and timed against the base config; the
ones it cannot use are listed with the reason, as the search would drop them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.studies import ROOT


def test_the_knob_benchmark_measures_what_each_workload_can_use_and_says_why_not_the_rest(tmp_path: Path) -> None:
    out = tmp_path / "knobs.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "knobs.py"), "--tiny", "--rounds", "1", "--steps", "1"]
    result = subprocess.run(
        [*command, "--only", "gpt", "cnn", "--out", str(out)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    gpt, cnn = data["workloads"]["gpt"], data["workloads"]["cnn"]
    assert {"base", "optimizer=fused", "checkpointing=blocks", "attention=math", "attention=flash"} <= set(
        gpt["variants"]
    )
    assert (
        "memory_format=channels_last" in gpt["skipped"]
        and "no 2-D convolutions" in gpt["skipped"]["memory_format=channels_last"]
    )
    assert "memory_format=channels_last" in cnn["variants"] and "attention=math" in cnn["skipped"]
    for entry in (*gpt["variants"].values(), *cnn["variants"].values()):
        assert entry["samples_per_s"] > 0 and len(entry["rates"]) == 1 and entry["loss"] > 0
    assert gpt["variants"]["base"]["vs_base"] == 1.0
    assert data["device"] and data["command"].startswith("python benchmarks/knobs.py")
