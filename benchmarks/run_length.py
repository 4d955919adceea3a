"""The run length decides whether compiling pays: one study of eager against `torch.compile`,
ranked for runs of many lengths.

    python benchmarks/run_length.py [--workload-args '{"dim": 64, ...}'] [--mode default]

A fresh `autotuner search` of two configs of the built-in GPT on the CPU, the same in all but
`compile` (`none`, the baseline, and `--mode`), each a real trial: its set-up, its warm-up (where
the compile happens, from the study's empty compile cache: cold) and its pace. Then the study's
trials are ranked by `autotuner.results.run_time.RunPlan` for runs of 10 to 10^6 optimizer steps, as
`run: {steps: N}` in a spec would rank them, and the break-even run length is computed from the
two trials: the steps after which the compiled config's faster steps have paid for its longer
warm-up. Writes benchmarks/results/run_length.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import yaml
from _harness import machine, revision, run_search, write_results

from autotuner.results.records import TrialRecord, records
from autotuner.results.run_time import RunPlan

GLOBAL_BATCH = 16
WORKLOAD_ARGS = {"vocab": 256, "length": 32, "dim": 32, "layers": 4, "heads": 2, "samples": 512}
"""A GPT small enough that the framework's per-operator cost is much of a step, which compiling
removes: on a 2-core AMD EPYC, torch.compile's steps were 13% faster; with dim 64 and length 64,
1%, and with dim 128 and length 256, 2% (within the noise: no run length would pick it honestly)."""
LENGTHS = [10, 100, 1_000, 10_000, 100_000, 1_000_000]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload-args", type=json.loads, default=WORKLOAD_ARGS)
    parser.add_argument("--mode", default="default", help="the compile mode against eager (default: default)")
    args = parser.parse_args()
    spec = {
        "name": "run-length",
        "backend": "pytorch",
        "workload": "builtin:gpt",
        "workload_args": args.workload_args,
        "device": "cpu",
        "global_batch": GLOBAL_BATCH,
        "baseline": {"precision": "fp32", "batch_size": GLOBAL_BATCH, "workers": 0, "compile": "none"},
        "space": {"precision": ["fp32"], "batch_size": [GLOBAL_BATCH], "workers": [0], "compile": ["none", args.mode]},
        "budget": {"trials": 2, "remeasure_top": 2},
        "trial": {"warmup_steps": 3, "steps": 10, "windows": 5, "drift_steps": 3, "prune_after": 0, "timeout": 900},
        "profile": {"steps": 0},
    }
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "run-length.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        search = run_search(path, "run-length", Path(folder))
        trials = records(search.study)
        environment = search.study.user_attrs.get("environment") or {}
    ok = {t.config["compile"]: t for t in trials if t.outcome == "ok"}
    if set(ok) != {"none", args.mode}:
        raise SystemExit(f"run_length: the two trials did not both end ok: {[(t.config, t.outcome) for t in trials]}")
    eager, compiled = ok["none"], ok[args.mode]

    def before_s(t: TrialRecord) -> float:
        return float(t.metrics.get("setup_s") or 0.0) + float(t.metrics.get("warmup_s") or 0.0)

    step_s = {name: GLOBAL_BATCH / t.throughput for name, t in ok.items()}
    saved_per_step = step_s["none"] - step_s[args.mode]
    extra_s = before_s(compiled) - before_s(eager)
    warmup_steps = int(eager.metrics.get("warmup_steps") or 0)
    break_even = warmup_steps + extra_s / saved_per_step if saved_per_step > 0 else None
    ranked = []
    for steps in LENGTHS:
        plan = RunPlan(global_batch=GLOBAL_BATCH, steps=steps)
        run_s = {name: plan.run_s(t, steps) for name, t in ok.items()}
        ranked.append({"steps": steps, "run_s": run_s, "picks": min(run_s, key=lambda n: run_s[n] or 0.0)})
    results = {
        "benchmark": "benchmarks/run_length.py",
        "revision": revision(),
        "machine": machine(environment),
        "workload": "builtin:gpt",
        "workload_args": args.workload_args,
        "global_batch": GLOBAL_BATCH,
        "mode": args.mode,
        "search_wall_s": search.wall_s,
        "trials": {
            name: {
                "number": t.number,
                "throughput": t.throughput,
                "remeasured": t.remeasured is not None,
                "setup_s": t.metrics.get("setup_s"),
                "warmup_s": t.metrics.get("warmup_s"),
                "warmup_steps": t.metrics.get("warmup_steps"),
                "compile_cache": t.metrics.get("compile_cache"),
                "step_s": step_s[name],
            }
            for name, t in ok.items()
        },
        "compiled_speedup_per_step": step_s["none"] / step_s[args.mode],
        "extra_warmup_s": extra_s,
        "break_even_steps": break_even,
        "ranked": ranked,
    }
    print(json.dumps(results, indent=2))
    write_results("run_length.json", results)


if __name__ == "__main__":
    main()
