"""jit on against jit off for the JAX built-ins, measured as trials are.

    python benchmarks/jax_jit.py [--device cpu]

For each built-in JAX workload (default sizes) at two batchings of its global batch (a small
micro-batch with accumulation, and the whole batch at once), runs the fp32 config with `jit: off`
and with `jit: on`, each as one real trial (a process from the fork server, warm-up, a
calibration window, windows of at least `--min-window-s`, median and spread), and reports the
throughputs, the warm-up (where the compilation goes) and the ratio on/off. Writes
benchmarks/results/jax_jit.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from autotuner.backends.jax import JAX
from autotuner.trials.launcher import TrialLauncher
from autotuner.trials.request import (
    ProbeRequest,  # noqa: E402
    TrialRequest,
)

BATCHINGS = {
    # workload: (global batch, [micro-batches])
    "mlp": (256, [16, 256]),
    "gpt": (64, [8, 64]),
}


def _trial(launcher: TrialLauncher, workload: str, global_batch: int, micro: int, jit: str, args: Any) -> dict:
    config = {"precision": "fp32", "batch_size": micro, "accumulation": global_batch // micro, "workers": 0, "jit": jit}
    request = TrialRequest(
        workload=JAX.resolve_workload(f"builtin:{workload}"),
        workload_args={},
        device=args.device,
        config=config,
        global_batch=global_batch,
        seed=0,
        warmup_steps=args.warmup_steps,
        steps=args.steps,
        windows=args.windows,
        drift_steps=1,
        heldout_batch=micro,
        min_window_s=args.min_window_s,
    )
    result = launcher.call(JAX.runner, "run", request, args.timeout)
    output = result.output
    if output is None or output.throughput is None:
        raise SystemExit(f"{workload} {config}: {result.outcome}: {result.reason}")
    throughput = output.throughput
    tokens = output.tokens_per_sample
    return {
        "workload": workload,
        "global_batch": global_batch,
        "micro_batch": micro,
        "accumulation": global_batch // micro,
        "jit": jit,
        "samples_per_s": throughput.samples_per_s,
        "tokens_per_s": throughput.samples_per_s * tokens if tokens else None,
        "spread": throughput.spread,
        "window_samples_per_s": throughput.window_samples_per_s,
        "warmup_s": throughput.warmup_s,
        "trial_wall_s": result.wall_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--min-window-s", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    launcher = TrialLauncher([JAX.runner])
    environment = JAX.probe(launcher, ProbeRequest(args.device, "autotuner.backends.jax.builtin:mlp"))
    runs = []
    for workload, (global_batch, micros) in BATCHINGS.items():
        for micro in micros:
            for jit in ("off", "on"):
                runs.append(_trial(launcher, workload, global_batch, micro, jit, args))
                print(json.dumps(runs[-1]), flush=True)
    speedups = {}
    for off, on in zip(runs[::2], runs[1::2], strict=True):
        key = f"{off['workload']} {off['micro_batch']}x{off['accumulation']}"
        speedups[key] = on["samples_per_s"] / off["samples_per_s"]
    results = {
        "device": environment.device_name,
        "versions": dict(environment.versions),
        "settings": {k: v for k, v in vars(args).items() if k != "timeout"},
        "runs": runs,
        "jit_speedup": speedups,
    }
    out = Path(__file__).parent / "results" / "jax_jit.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({"jit_speedup": speedups}, indent=2))


if __name__ == "__main__":
    main()
