"""The inference study against the obvious alternatives, in one run.

    python benchmarks/inference.py [--spec studies/inference-cpu.yaml] [--rounds 3]

Runs `autotuner search` on the inference spec in a fresh folder (its wall time measured), then
measures five configs side by side, each a real inference trial (the search's launcher and trial
settings: throughput, a batch's p50 and p99 latency, output drift and top-1 agreement against the
fp32 model):

* baseline: the spec's baseline (fp32 eager, the user's batch);
* `torch.compile` alone: the baseline compiled (default mode);
* bf16 alone: the baseline under bf16 autocast;
* ONNX Runtime defaults: the baseline's batch on ONNX Runtime's CPU provider, default threads;
* tuned: the study's best feasible config.

The five run `--rounds` times in lockstep groups (on a CPU: window by window, so the machine's
load falls on all of them alike), their throughput over the baseline's taken per round, medians
reported. An alternative whose library is missing, or that the device cannot run, is reported as
unsupported with the reason. Writes benchmarks/results/inference.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import Trials, machine, run_search, write_results

from autotuner.config.knobs import Config
from autotuner.output.formatting import format_config
from autotuner.results.records import best, records
from autotuner.spec.job import load_spec
from autotuner.trials.lockstep import measure_together
from autotuner.trials.outcomes import Outcome


def alternatives(baseline: Config, winner: Config) -> dict[str, Config]:
    return {
        "baseline": baseline,
        "torch.compile alone": {**baseline, "compile": "default"},
        "bf16 alone": {**baseline, "precision": "bf16"},
        "ONNX Runtime defaults": {**baseline, "runtime": "onnxruntime-cpu", "threads": 0},
        "tuned": winner,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", default="studies/inference-cpu.yaml")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    spec = Path(args.spec)
    job = load_spec(spec)
    with tempfile.TemporaryDirectory() as folder:
        searched = run_search(spec, job.name, Path(folder))
        trials = records(searched.study)
        winner = best(trials)
        assert winner is not None, "the search found no feasible config"
        trials_run = sum(t.ran for t in trials)
        search = {"wall_s": searched.wall_s, "trials_ran": trials_run, "exit_code": searched.exit_code}
    runner = Trials(job)
    configs = alternatives(job.complete(job.baseline), dict(winner.config))
    unsupported = {
        name: reason
        for name, config in configs.items()
        if (reason := job.backend.unsupported_reason(config, runner.capabilities))
    }
    measured = [name for name in configs if name not in unsupported]
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in measured}
    started = time.perf_counter()
    for number in range(1, args.rounds + 1):
        requests = [runner.request(configs[name]) for name in measured]
        timeout = job.trial_timeout(*(configs[name] for name in measured))
        results = measure_together(runner.launcher, job.backend.runner, requests, runner.device, timeout)
        base = results[measured.index("baseline")]
        assert base.outcome is Outcome.OK and base.output and base.output.throughput, base.reason
        for name, result in zip(measured, results, strict=True):
            output = result.output
            if result.outcome is not Outcome.OK or output is None or output.throughput is None:
                rounds[name].append({"outcome": result.outcome.value, "reason": result.reason})
                continue
            assert output.latency is not None and output.output_drift is not None
            rounds[name].append(
                {
                    "throughput": output.throughput.samples_per_s,
                    "over_baseline": output.throughput.samples_per_s / base.output.throughput.samples_per_s,
                    "latency_p50_ms": output.latency.p50_ms,
                    "latency_p99_ms": output.latency.p99_ms,
                    **dataclasses.asdict(output.output_drift),
                }
            )
        shown = ", ".join(f"{n} {r[-1].get('over_baseline', 0):.2f}x" for n, r in rounds.items())
        print(f"round {number}/{args.rounds}: {shown}")
    summary = {}
    for name, found in rounds.items():
        ok = [r for r in found if "throughput" in r]
        summary[name] = {
            "config": format_config(configs[name]),
            "rounds_ok": len(ok),
            **(
                {
                    key: statistics.median(r[key] for r in ok)
                    for key in ("throughput", "over_baseline", "latency_p50_ms", "latency_p99_ms", "relative_error")
                }
                if ok
                else {"error": found[-1].get("reason")}
            ),
            "top1_agreement": ok[-1]["top1_agreement"] if ok else None,
        }
    results_file = write_results(
        "inference.json",
        {
            "spec": str(spec),
            "machine": machine(runner.environment),
            "search": search,
            "max_drift": job.spec.objective.max_drift,
            "max_latency_ms": job.spec.objective.max_latency_ms,
            "rounds": args.rounds,
            "measured_s": time.perf_counter() - started,
            "configs": summary,
            "unsupported": {
                name: {"config": format_config(configs[name]), "reason": r} for name, r in unsupported.items()
            },
            "per_round": rounds,
        },
    )
    for name, row in summary.items():
        print(f"{name}: {row}")
    print(f"wrote {results_file}")


if __name__ == "__main__":
    main()
