"""Measurement fidelity: the same config measured in separate trials, how far apart they come out.

    python benchmarks/fidelity.py [--spec studies/quickstart.yaml] [--runs 6]

Runs the spec's baseline and the quickstart's usual winner (bf16, the largest micro-batch, no
loader workers), every run a real trial as the search launches it (fork server, one process per
trial, the spec's trial settings), in the two ways the autotuner measures:

- **one after another**: `--runs` trials of each config, interleaved, as a search's trials run
  (and as re-measurement and apply run on a GPU). Two trials apart: consecutive runs of a config.
- **in lockstep**: `--runs` groups, each two trials of each config alive at once and measured in
  turns, window by window (`autotuner.trials.lockstep.run_in_lockstep`), as re-measurement and apply
  run on a CPU, with `budget.remeasure_windows` windows each. Two trials apart: the two trials of a
  config in one group. The same processes are also summarized over their first `trial.windows`
  windows and their first half, so what more windows buy is compared within one run.

For each config it reports every process's median throughput, the median and largest gap between
two trials (|a - b| / mean), and the spread (max - min) / median over all runs; and how far the
winner's speedup over the baseline moves from one run (or group) to the next, which is what an
export and a later `autotuner apply` can differ by. The machine's CPU steal time and load are
recorded beside them, and so is the machine's own floor: fixed kernels (`FLOORS`, no autotuner
code) timed in their own process over the same windows between the sequential trials; how far
apart their runs come out is how far the machine drifts between two trials. Two kernels, a
compute-bound and a memory-bound matmul, since a shared VM's memory bandwidth can move while its
compute holds.
Writes benchmarks/results/fidelity.json.

Target: two trials of one config differ by at most 3% in median throughput on the
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

from autotuner.config.knobs import Config
from autotuner.measurement.timing import relative_spread
from autotuner.output.formatting import format_config
from autotuner.spec.job import load_spec
from autotuner.trials.lockstep import run_in_lockstep

FLOORS = {"machine floor, compute": (512, 512, 512), "machine floor, memory": (16, 1024, 2304)}
"""The machine's floor: an (m x k) @ (k x n) matmul timed like a trial (windows of at least
`min_window_s`), in a process of its own, with nothing of the autotuner's in it. How far apart two
of its runs come out is how far the machine itself drifts between two trials; no measurement of a
config can do better. The compute kernel's operands fit a core's cache; the memory kernel reads
9 MiB of weights per 16-row product, as the baseline's micro-batches do."""
FLOOR_KERNEL = """
import json, statistics, sys, time
import torch
windows, min_window_s, m, k, n = int(sys.argv[1]), float(sys.argv[2]), *map(int, sys.argv[3:])
a, b = torch.randn(m, k), torch.randn(k, n)
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


def _floor(windows: int, min_window_s: float, shape: tuple[int, int, int]) -> dict[str, float]:
    """One run of a floor kernel: its median rate (matmuls/s) over `windows` windows, and their spread."""
    done = subprocess.run(
        [sys.executable, "-c", FLOOR_KERNEL, str(windows), str(min_window_s or 0.5), *map(str, shape)],
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


def _gap(a: float, b: float) -> float:
    """How far apart two measurements are: |a - b| / mean."""
    return abs(a - b) / ((a + b) / 2)


def _gaps(values: list[float]) -> list[float]:
    return [_gap(a, b) for a, b in pairwise(values)]


def _one_after_another(
    trials: Trials, configs: dict[str, Config], runs: int, windows: int
) -> dict[str, list[dict[str, Any]]]:
    """`runs` trials of each config, `windows` windows each, interleaved, and a run of each floor
    kernel over as many windows after each round."""
    settings = trials.job.spec.trial
    found: dict[str, list[dict[str, Any]]] = {name: [] for name in [*configs, *FLOORS]}
    for run in range(runs):
        for name, config in configs.items():
            result = trials.run(config, trials.request(config, windows=windows))
            assert result.outcome.value == "ok", (name, result.reason)
            found[name].append(result.output.throughput.as_dict())
        for name, shape in FLOORS.items():
            floor = _floor(windows, settings.min_window_s, shape)
            found[name].append({"samples_per_s": floor["median"], "spread": floor["spread"]})
        latest = ", ".join(f"{name} {values[-1]['samples_per_s']:,.0f}/s" for name, values in found.items())
        print(f"one after another: run {run + 1}/{runs}: {latest}")
    return found


def _in_lockstep(
    trials: Trials, configs: dict[str, Config], runs: int, windows: int
) -> dict[str, list[dict[str, Any]]]:
    """`runs` groups of two trials of each config, `windows` windows each, measured in turns."""
    job = trials.job
    found: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    members = [name for _ in range(2) for name in configs]
    for run in range(runs):
        requests = [trials.request(configs[name], windows=windows) for name in members]
        timeout_s = job.trial_timeout(*(r.config for r in requests))
        results = run_in_lockstep(trials.launcher, job.backend.runner, "run", requests, timeout_s)
        for name, result in zip(members, results, strict=True):
            assert result.outcome.value == "ok", (name, result.reason)
            found[name].append(result.output.throughput.as_dict())
        latest = ", ".join(
            name + " " + " / ".join(f"{t['samples_per_s']:,.0f}" for t in values[-2:]) + "/s"
            for name, values in found.items()
        )
        print(f"in lockstep, {windows} windows: group {run + 1}/{runs}: {latest}")
    return found


def _first(throughput: dict[str, Any], windows: int) -> dict[str, Any]:
    """A process's throughput over its first `windows` windows: median, spread and the windows."""
    rates = throughput["window_samples_per_s"][:windows]
    return {"samples_per_s": statistics.median(rates), "spread": relative_spread(rates), "window_samples_per_s": rates}


def _windows(throughputs: list[dict[str, Any]]) -> list[float]:
    return [rate for t in throughputs for rate in t["window_samples_per_s"]]


def _summary(
    found: dict[str, list[dict[str, Any]]], lockstep: bool, windows: int, measured: dict[str, Any]
) -> dict[str, Any]:
    """How far apart two trials of each config came out, and the winner's speedup per run or group."""
    summaries = {}
    for name, runs in found.items():
        values = [t["samples_per_s"] for t in runs]
        # two trials: consecutive runs, or in lockstep the two of one group
        gaps = [_gap(a, b) for a, b in zip(values[::2], values[1::2], strict=False)] if lockstep else _gaps(values)
        summaries[name] = {
            "throughputs": values,
            "window_spread_median": statistics.median(t["spread"] for t in runs),
            "trial_gap": quartiles(gaps),
            "trial_gap_max": max(gaps),
            "spread_all_runs": (max(values) - min(values)) / statistics.median(values),
        }
    # the winner's speedup per run (in lockstep, per group: over the windows of its two trials of each)
    per = 2 if lockstep else 1
    speedups = [
        statistics.median(_windows(found["winner"][k : k + per]))
        / statistics.median(_windows(found["baseline"][k : k + per]))
        for k in range(0, len(found["winner"]), per)
    ]
    wall = measured["wall_s"]
    return {
        "windows": windows,
        "wall_s": wall,
        "steal_share": measured["steal_s"] / (wall * (os.cpu_count() or 1)),
        "load_1m": measured["load_1m"],
        "configs": summaries,
        "speedup_runs": speedups,
        "speedup_gap": quartiles(_gaps(speedups)),
        "speedup_gap_max": max(_gaps(speedups)),
    }


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
    remeasure = job.spec.budget.remeasure_windows
    results: dict[str, Any] = {
        "spec": args.spec,
        "machine": machine(trials.environment),
        "job": measured_job(job),
        "runs": args.runs,
        "configs": {name: format_config(config) for name, config in configs.items()},
        "modes": {},
    }
    for lockstep in (False, True):
        windows = remeasure if lockstep else settings.windows
        steal, clock, load = _steal_ticks(), time.perf_counter(), os.getloadavg()[0]
        found = (_in_lockstep if lockstep else _one_after_another)(trials, configs, args.runs, windows)
        measured = {
            "wall_s": time.perf_counter() - clock,
            "steal_s": (_steal_ticks() - steal) / os.sysconf("SC_CLK_TCK"),
            "load_1m": [load, os.getloadavg()[0]],
        }
        if not lockstep:
            results["modes"]["one after another"] = _summary(found, False, windows, measured)
            continue
        # the same processes over their first windows: what more windows buy, within one run
        for first in sorted({min(settings.windows, remeasure), max(remeasure // 2, 1), remeasure}):
            mode = f"in lockstep, {first} windows" + (" (re-measurement)" if first == remeasure else "")
            prefix = {name: [_first(t, first) for t in runs] for name, runs in found.items()}
            results["modes"][mode] = _summary(prefix, True, first, measured)
    for mode, summary in results["modes"].items():
        for name, config in summary["configs"].items():
            gap = config["trial_gap"]
            print(
                f"  {mode}: {name}: two trials apart by {gap['median']:.1%} median, {config['trial_gap_max']:.1%} at "
                f"most; spread over all runs {config['spread_all_runs']:.1%}"
            )
        shown = ", ".join(f"{s:.2f}x" for s in summary["speedup_runs"])
        print(f"  {mode}: speedup {shown}: runs apart by {summary['speedup_gap']['median']:.1%} median")
    path = write_results("fidelity.json", results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
