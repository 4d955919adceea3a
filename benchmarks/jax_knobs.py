"""The JAX knobs remat, donate and xla_flags, each against the same base config, measured as
trials are.

    python benchmarks/jax_knobs.py [--device cuda:0] [--workload-args '{"layers": 8}'] [--repeats 2]
                                   [--configs donate=on,remat=full]

The base config is jit on with the whole global batch at once (bf16 on a GPU, fp32 on a CPU);
every other run changes one knob of it: each `remat` policy, `donate: on`, each XLA flag bundle.
Each is one real trial (a process from the fork server, warm-up, calibration, windows of at least
`--min-window-s`, median and spread, then the drift phase), in rounds that run every config once
(`--repeats` rounds), so a machine whose speed drifts moves them all alike. Reports throughput,
peak memory and the held-out loss after the drift steps; a value the probe says the device
cannot honour is listed with the reason instead (`Backend.unsupported_reason`). Writes
benchmarks/results/jax_knobs.json, or `--out`.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from autotuner.backends.jax import JAX, REMAT, XLA_FLAG_BUNDLES
from autotuner.trials.launcher import TrialLauncher
from autotuner.trials.request import (
    ProbeRequest,  # noqa: E402
    TrialRequest,
)


def _configs(precision: str, global_batch: int) -> dict[str, dict[str, Any]]:
    base = {
        "precision": precision,
        "batch_size": global_batch,
        "accumulation": 1,
        "workers": 0,
        "jit": "on",
        "remat": "none",
        "donate": "off",
        "xla_flags": "default",
    }
    configs = {"base": base, "donate=on": {**base, "donate": "on"}}
    configs |= {f"remat={v}": {**base, "remat": v} for v in REMAT.choices or () if v != "none"}
    configs |= {f"xla_flags={v}": {**base, "xla_flags": v} for v in XLA_FLAG_BUNDLES if v != "default"}
    return configs


def _trial(launcher: TrialLauncher, config: dict[str, Any], args: Any) -> dict[str, Any]:
    request = TrialRequest(
        workload=JAX.resolve_workload(f"builtin:{args.workload}"),
        workload_args=json.loads(args.workload_args),
        device=args.device,
        config=config,
        global_batch=args.global_batch,
        seed=0,
        warmup_steps=args.warmup_steps,
        steps=args.steps,
        windows=args.windows,
        drift_steps=args.drift_steps,
        heldout_batch=args.global_batch,
        min_window_s=args.min_window_s,
    )
    result = launcher.call(JAX.runner, "run", request, args.timeout)
    output = result.output
    if output is None or output.throughput is None:
        return {"outcome": str(result.outcome), "reason": result.reason}
    return {
        "outcome": "ok",
        "samples_per_s": output.throughput.samples_per_s,
        "spread": output.throughput.spread,
        "warmup_s": output.throughput.warmup_s,
        "peak_memory_mb": output.peak_memory_mb,
        "heldout_loss": output.losses.heldout,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workload", default="gpt")
    parser.add_argument("--workload-args", default="{}")
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--drift-steps", type=int, default=3)
    parser.add_argument("--min-window-s", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--configs", default="", help="comma-separated names (base, donate=on, ...); default: all")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "jax_knobs.json"))
    args = parser.parse_args()
    launcher = TrialLauncher([JAX.runner])
    workload = JAX.resolve_workload(f"builtin:{args.workload}")
    environment = JAX.probe(launcher, ProbeRequest(args.device, workload))
    capabilities = JAX.capabilities(environment.capabilities)
    precision = "bf16" if capabilities.accelerator and capabilities.bf16 else "fp32"
    configs = _configs(precision, args.global_batch)
    if args.configs:
        configs = {name: configs[name] for name in ["base", *args.configs.split(",")] if name in configs}
    skipped = {name: JAX.unsupported_reason(c, capabilities) for name, c in configs.items()}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, why in skipped.items() if why is None}
    for _ in range(args.repeats):
        for name in runs:
            runs[name].append(_trial(launcher, configs[name], args))
            print(json.dumps({name: runs[name][-1]}), flush=True)
    base = statistics.median(r["samples_per_s"] for r in runs["base"] if r["outcome"] == "ok")
    summary = {}
    for name, measured in runs.items():
        ok = [r for r in measured if r["outcome"] == "ok"]
        if not ok:
            summary[name] = measured[-1]
            continue
        rate = statistics.median(r["samples_per_s"] for r in ok)
        summary[name] = {
            "samples_per_s": rate,
            "vs_base": rate / base,
            "peak_memory_mb": max(r["peak_memory_mb"] for r in ok),
            "heldout_loss": ok[-1]["heldout_loss"],
        }
    results = {
        "device": environment.device_name,
        "versions": dict(environment.versions),
        "capabilities": dict(environment.capabilities),
        "settings": {k: v for k, v in vars(args).items() if k not in ("timeout", "out")},
        "precision": precision,
        "runs": runs,
        "summary": summary,
        "unsupported": {name: why for name, why in skipped.items() if why},
    }
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({"summary": summary, "unsupported": results["unsupported"]}, indent=2))


if __name__ == "__main__":
    main()
