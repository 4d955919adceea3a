"""Measurement fidelity: the same config measured in separate trials, how far apart they come out.

    python benchmarks/fidelity.py [--spec studies/quickstart.yaml] [--runs 6]

Runs the spec's baseline and the quickstart's usual winner (bf16, the largest micro-batch, no
loader workers) `--runs` times each, interleaved, every run a real trial as the search launches
it (fork server, one process per trial), once with the spec's trial settings and once per
variant in `VARIANTS` (more or longer windows). For each config and setting it reports every
process's median throughput and how far apart two trials of the same config are: the median and
the largest gap between consecutive runs (two separate trials, as the search's re-measurement
and a user's apply see them) and the spread (max - min) / median over all runs. The machine's
CPU steal time and load during the runs are recorded beside them, and so is the machine's own floor:
a fixed kernel (a 512x512 fp32 matmul, no autotuner code) timed in its own process over the same
windows, between the trials; how far apart its runs come out is how far the machine drifts.
Writes benchmarks/results/fidelity.json.

Target (issue 6): two trials of one config differ by at most 3% in median throughput on the
quickstart.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

from _harness import Trials, machine, measured_job, quartiles, write_results

from autotuner.knobs import format_config
from autotuner.spec import load_spec

VARIANTS: dict[str, dict[str, Any]] = {
    "spec": {},
    "windows x2": {"windows_factor": 2},
    "min_window_s x2": {"min_window_factor": 2},
    "windows x4": {"windows_factor": 4},
}


FLOOR = "machine floor"
FLOOR_KERNEL = """
import json, statistics, sys, time
import torch
windows, min_window_s = int(sys.argv[1]), float(sys.argv[2])
a, b = torch.randn(512, 512), torch.randn(512, 512)
for _ in range(50):
    a @ b
rates = []
for _ in range(windows):
    start, count = time.perf_counter(), 0
    while (elapsed := time.perf_counter() - start) < min_window_s:
        a @ b
        count += 1
    rates.append(count / elapsed)
middle = statistics.median(rates)
print(json.dumps({"median": middle, "spread": (max(rates) - min(rates)) / middle}))
"""
"""The machine's floor: a fixed matmul timed like a trial (windows of at least `min_window_s`), in a
process of its own, with nothing of the autotuner's in it. How far apart two of its runs come out
is how far the machine itself drifts between two trials; no measurement of a config can do better."""


def _floor(windows: int, min_window_s: float) -> dict[str, float]:
    """One run of the floor kernel: its median rate (matmuls/s) over `windows` windows, and their spread."""
    done = subprocess.run(
        [sys.executable, "-c", FLOOR_KERNEL, str(windows), str(min_window_s or 0.5)],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(done.stdout))


def _steal_ticks() -> int:
    """CPU time stolen from this VM by its host, in clock ticks since boot (0 where not reported)."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()
    return int(fields[8]) if len(fields) > 8 else 0


def _gaps(values: list[float]) -> list[float]:
    return [abs(a - b) / ((a + b) / 2) for a, b in pairwise(values)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", default="studies/quickstart.yaml")
    parser.add_argument("--runs", type=int, default=6)
    args = parser.parse_args()
    job = load_spec(Path(args.spec))
    trials = Trials(job)
    base = job.complete(job.baseline)
    winner = job.complete({**job.baseline, "precision": "bf16", "batch_size": job.spec.global_batch})
    configs = {"baseline": base, "winner": winner}
    settings = job.spec.trial
    results: dict[str, Any] = {
        "spec": args.spec,
        "machine": machine(trials.environment),
        "job": measured_job(job),
        "runs": args.runs,
        "configs": {name: format_config(config) for name, config in configs.items()},
        "variants": {},
    }
    for variant, change in VARIANTS.items():
        windows = settings.windows * change.get("windows_factor", 1)
        min_window_s = settings.min_window_s * change.get("min_window_factor", 1)
        found: dict[str, list[float]] = {name: [] for name in [*configs, FLOOR]}
        window_spreads: dict[str, list[float]] = {name: [] for name in found}
        steal, clock, load = _steal_ticks(), time.perf_counter(), os.getloadavg()[0]
        loads = [load]
        for run in range(args.runs):
            for name, config in configs.items():  # interleaved: the machine's drift falls on both
                request = trials.request(config, windows=windows, min_window_s=min_window_s)
                result = trials.run(config, request)
                assert result.outcome.value == "ok", (variant, name, result.reason)
                found[name].append(result.result["throughput"]["samples_per_s"])
                window_spreads[name].append(result.result["throughput"]["spread"])
                loads.append(os.getloadavg()[0])
            floor = _floor(windows, min_window_s)
            found[FLOOR].append(floor["median"])
            window_spreads[FLOOR].append(floor["spread"])
            latest = ", ".join(f"{name} {values[-1]:,.0f}/s" for name, values in found.items())
            print(f"{variant}: run {run + 1}/{args.runs}: {latest}")
        wall = time.perf_counter() - clock
        stolen = (_steal_ticks() - steal) / os.sysconf("SC_CLK_TCK")
        results["variants"][variant] = {
            "windows": windows,
            "min_window_s": min_window_s,
            "wall_s": wall,
            "steal_share": stolen / (wall * (os.cpu_count() or 1)),
            "load_1m_median": statistics.median(loads),
            "configs": {
                name: {
                    "throughputs": values,
                    "window_spread_median": statistics.median(window_spreads[name]),
                    "consecutive_gap": quartiles(_gaps(values)),
                    "consecutive_gap_max": max(_gaps(values)),
                    "spread_all_runs": (max(values) - min(values)) / statistics.median(values),
                }
                for name, values in found.items()
            },
            "speedup_runs": [w / b for w, b in zip(found["winner"], found["baseline"], strict=True)],
        }
        speedups = results["variants"][variant]["speedup_runs"]
        results["variants"][variant]["speedup_gap"] = quartiles(_gaps(speedups))
        for name, summary in results["variants"][variant]["configs"].items():
            gap = summary["consecutive_gap"]
            print(
                f"  {name}: two trials apart by {gap['median']:.1%} median, {summary['consecutive_gap_max']:.1%} at "
                f"most; spread over {args.runs} runs {summary['spread_all_runs']:.1%}"
            )
    path = write_results("fidelity.json", results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
