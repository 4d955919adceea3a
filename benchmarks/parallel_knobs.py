"""What each DDP and FSDP2 knob does to a trial of two ranks on this machine, one at a time.

    python benchmarks/parallel_knobs.py [--device cpu] [--rounds 3] [--tiny] [--out FILE]

For each workload (the built-in mlp, which is the quickstart's job, and the built-in gpt) and each way of
training together (`parallel: ddp`, `parallel: fsdp`): the base config (fp32, the global batch
split between the two ranks in one micro-batch each, no compile, no loader workers, every
parallel knob at its reference value) and the same config with one parallel knob changed, for
each of its values this device can use (`PyTorchBackend.unsupported_reason` with the probe's
capabilities; the others, such as FSDP's CPU offload on a CPU, are listed with the reason). Each
variant runs as a real trial of two ranks (gloo on the CPU, NCCL on GPUs) through the search's
trial launcher and the job's trial settings, so it is measured exactly as a search measures it;
in each of `--rounds` rounds every variant runs once, in an order shuffled per round, so a
drifting machine touches them all alike. Reported per variant: the median samples/s over the
rounds, its ratio to its mode's base, and the held-out loss after the drift steps (a knob that
changes the numerics, such as compressed gradients, shows there).

Writes `benchmarks/results/parallel_knobs-<cpu|gpu>.json` (`--out` to choose), naming the device.
`--tiny`: one round of small workloads (tests/e2e/test_parallel_knobs_benchmark.py runs it).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotuner.backends.pytorch import PARALLEL_KNOBS, PYTORCH  # noqa: E402
from autotuner.spec.job import Job, parse_spec  # noqa: E402
from autotuner.trials.launcher import TrialLauncher  # noqa: E402
from autotuner.trials.outcomes import Outcome  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
WORKLOADS: dict[str, tuple[dict[str, Any], int]] = {
    "mlp": ({}, 256),
    "gpt": ({"layers": 2, "dim": 128, "heads": 4, "length": 64, "vocab": 512, "samples": 1024}, 32),
}
TINY: dict[str, tuple[dict[str, Any], int]] = {
    "mlp": ({"features": 16, "hidden": 32, "depth": 2, "samples": 256}, 32),
}


def job(workload: str, args: dict[str, Any], global_batch: int, parallel: str, device: str, tiny: bool) -> Job:
    """The job of two ranks each variant is a config of: the base in its baseline."""
    trial = {"warmup_steps": 2, "steps": 4, "windows": 3, "drift_steps": 3, "timeout": 300}
    spec = {
        "name": f"parallel-{workload}-{parallel}",
        "backend": "pytorch",
        "workload": f"builtin:{workload}",
        "workload_args": args,
        "device": device,
        "global_batch": global_batch,
        "processes": 2,
        "parallel": parallel,
        "baseline": {"precision": "fp32", "batch_size": global_batch // 2, "workers": 0, "compile": "none"},
        "trial": {**trial, "min_window_s": 0.1} if tiny else {**trial, "min_window_s": 1.0},
    }
    return parse_spec(spec, "benchmarks/parallel_knobs.py")


def variants(the_job: Job, capabilities: Any) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The base (`{}`) and each other value of each knob of the job's `parallel`, by name; and the
    values this device cannot use, with the backend's reason."""
    found: dict[str, dict[str, Any]] = {"base": {}}
    refused: dict[str, str] = {}
    for knob in PARALLEL_KNOBS[the_job.spec.parallel or ""]:
        for value in knob.choices or the_job.space.get(knob.name, ()):  # an integer knob: its preset's
            if value == the_job.baseline[knob.name]:
                continue
            name = f"{knob.name}={value}"
            reason = PYTORCH.unsupported_reason(the_job.complete({**the_job.baseline, knob.name: value}), capabilities)
            if reason:
                refused[name] = reason
            else:
                found[name] = {knob.name: value}
    return found, refused


def measure(launcher: TrialLauncher, the_job: Job, knobs: dict[str, Any], device: str) -> dict[str, Any]:
    """One trial of the job's baseline with `knobs` changed: its throughput and held-out loss."""
    config = the_job.complete({**the_job.baseline, **knobs})
    request = the_job.trial_request(config, device)
    result = launcher.call(PYTORCH.runner, "run", request, the_job.trial_timeout(config))
    if result.outcome is not Outcome.OK or result.output is None or result.output.throughput is None:
        return {"outcome": result.outcome.value, "reason": result.reason}
    return {
        "outcome": "ok",
        "samples_per_s": result.output.throughput.samples_per_s,
        "spread": result.output.throughput.spread,
        "heldout_loss": result.output.losses.heldout,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="one round of a small mlp: seconds")
    parser.add_argument("--out", help="the result file (default benchmarks/results/parallel_knobs-<cpu|gpu>.json)")
    parser.add_argument("--seed", type=int, default=0, help="the rounds' order")
    args = parser.parse_args(argv)
    rounds = 1 if args.tiny else args.rounds
    launcher = TrialLauncher([PYTORCH.runner])
    order = random.Random(args.seed)
    results: dict[str, Any] = {"rounds": rounds, "workloads": {}}
    for workload, (workload_args, global_batch) in (TINY if args.tiny else WORKLOADS).items():
        for parallel in ("ddp", "fsdp"):
            the_job = job(workload, workload_args, global_batch, parallel, args.device, args.tiny)
            environment = the_job.probe(launcher, args.device)
            results.setdefault("device", environment.device_name)
            results.setdefault("versions", dict(environment.versions))
            found, refused = variants(the_job, PYTORCH.capabilities(environment.capabilities))
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in found}
            for _ in range(rounds):
                names = list(found)
                order.shuffle(names)
                for name in names:
                    runs[name].append(measure(launcher, the_job, found[name], args.device))
                    print(f"{workload} {parallel} {name}: {json.dumps(runs[name][-1])}", flush=True)
            results["workloads"].setdefault(workload, {})[parallel] = summary(runs, refused, global_batch)
    out = Path(args.out) if args.out else RESULTS / f"parallel_knobs-{'gpu' if args.device != 'cpu' else 'cpu'}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(out)
    return 0


def summary(runs: dict[str, list[dict[str, Any]]], refused: dict[str, str], global_batch: int) -> dict[str, Any]:
    """Each variant's median samples/s over its rounds, its ratio to the base's, its held-out loss."""
    rates = {name: [r["samples_per_s"] for r in measured if r["outcome"] == "ok"] for name, measured in runs.items()}
    base = statistics.median(rates["base"]) if rates["base"] else None
    out: dict[str, Any] = {"global_batch": global_batch, "variants": {}, "not_run": refused}
    for name, measured in runs.items():
        median = statistics.median(rates[name]) if rates[name] else None
        losses = [r["heldout_loss"] for r in measured if r["outcome"] == "ok"]
        out["variants"][name] = {
            "samples_per_s": median,
            "ratio": median / base if median and base else None,
            "rounds": rates[name],
            "heldout_loss": losses[0] if losses else None,
            "failed": [r for r in measured if r["outcome"] != "ok"],
        }
    return out


if __name__ == "__main__":
    raise SystemExit(main())
