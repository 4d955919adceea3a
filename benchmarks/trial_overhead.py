"""Per-trial process start-up overhead: the fork server against starting a fresh interpreter.

    python benchmarks/trial_overhead.py [--runs 20] [--out benchmarks/results/trial_overhead.json]

A trial process comes from a fork server that has torch and the PyTorch runner imported. This
measures the time from asking for a process to its first line of trial code running (the
`startup_s` every trial stores), and for comparison the time a fresh `python` takes to import
the same runner (what a spawn-per-trial design pays). Writes benchmarks/results/trial_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from autotuner.trials.launcher import TrialLauncher

RUNNER = "autotuner.backends.pytorch.runner"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "trial_overhead.json")
    args = parser.parse_args()
    results = measure_startup(args.runs)
    out = args.out
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


def measure_startup(runs: int) -> dict[str, object]:
    """Trial process start-up from the fork server, and a fresh interpreter's import, `runs` times."""
    launcher = TrialLauncher([RUNNER])
    started = time.perf_counter()
    launcher.call("json", "loads", "{}", 120)  # starts the fork server (imports torch once)
    server_start_s = time.perf_counter() - started
    probed = launcher.call(
        RUNNER, "probe", {"device": "cpu", "workload": "autotuner.backends.pytorch.builtin:mlp"}, 120
    )
    fork_startup, fork_roundtrip = [], []
    for _ in range(runs):
        result = launcher.call("json", "loads", "{}", 60)
        assert result.outcome.value == "ok", result.reason
        fork_startup.append(result.startup_s)
        fork_roundtrip.append(result.wall_s)
    fresh = []
    for _ in range(max(3, runs // 4)):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", f"import {RUNNER}"], check=True)
        fresh.append(time.perf_counter() - started)
    return {
        "machine": f"{probed.output.get('device_name')}, torch {probed.output.get('versions', {}).get('torch')}",
        "runs": runs,
        "fork_server_start_s": server_start_s,
        "fork_startup_s_median": statistics.median(fork_startup),
        "fork_startup_s_max": max(fork_startup),
        "fork_roundtrip_s_median": statistics.median(fork_roundtrip),
        "fresh_interpreter_import_s_median": statistics.median(fresh),
        "ratio_fresh_over_fork": statistics.median(fresh) / statistics.median(fork_roundtrip),
    }


if __name__ == "__main__":
    main()
