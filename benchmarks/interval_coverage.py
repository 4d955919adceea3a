"""How often the speedup's interval holds the speedup: many re-measurement rounds of one pair of
configs, cut into studies of a few rounds each.

    python benchmarks/interval_coverage.py [--spec studies/quickstart.yaml] [--rounds 40]
        [--winner precision=fp32,batch_size=256,optimizer=fused] [--out interval_coverage-amd.json]

Measures `--rounds` rounds of the spec's baseline and the quickstart's winner (by default the
usual one where bf16 is fast: bf16, the largest micro-batch, no loader workers; `--winner` sets
the knobs that differ from the baseline, as the winner on this machine has them) exactly as the
study's re-measurement measures a round:
one fresh trial process of each, `budget.remeasure_windows` windows a process, together
(`autotuner.trials.lockstep.measure_together`: in lockstep on a CPU). A round's ratio is the
winner's median window over the baseline's. Then, for n = 2 to 6 rounds, the rounds are cut into
consecutive blocks of n (a study's re-measurement of n rounds each) and each block's interval
(`autotuner.measurement.interval.ratio_interval`, 90%) is checked against the speedup of all the
other rounds (their geometric mean: the speedup on this machine during the run, the block's own
rounds left out so that they do not pull it towards themselves). Coverage is the share of
blocks whose interval holds it; the nominal level is 90%. Also the median half-width at each n
(what `budget.remeasure_width` can ask for), the rounds' ratios and how far they spread.
Writes benchmarks/results/interval_coverage.json (or `--out`).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path
from typing import Any

from _harness import Trials, machine, measured_job, quartiles, write_results

from autotuner.config.knobs import format_config
from autotuner.measurement.interval import LEVEL, geometric_mean, ratio_interval
from autotuner.spec.job import load_spec
from autotuner.trials.lockstep import measure_together


def coverage(ratios: list[float], n: int) -> dict[str, Any]:
    """Cut `ratios` into consecutive blocks of `n`; each block's interval against the geometric
    mean of the other rounds."""
    blocks = [ratios[k : k + n] for k in range(0, len(ratios) - n + 1, n)]
    held, widths = [], []
    for k, block in enumerate(blocks):
        interval = ratio_interval(block)
        assert interval is not None  # n >= 2 positive ratios
        others = ratios[: k * n] + ratios[(k + 1) * n :]
        held.append(interval.contains(geometric_mean(others)))
        widths.append(interval.half_width)
    return {
        "blocks": len(blocks),
        "held": sum(held),
        "coverage": sum(held) / len(blocks),
        "half_width": quartiles(widths),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", default="studies/quickstart.yaml")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--winner", help="the winner's knobs that differ from the baseline: knob=value,...")
    parser.add_argument("--out", default="interval_coverage.json")
    args = parser.parse_args()
    job = load_spec(Path(args.spec))
    trials = Trials(job)
    base = job.complete(job.baseline)
    knobs: dict[str, Any] = {"precision": "bf16", "batch_size": job.spec.global_batch}
    if args.winner:
        knobs = {k: int(v) if v.isdigit() else v for k, v in (pair.split("=", 1) for pair in args.winner.split(","))}
    winner = job.complete({**job.baseline, **knobs})
    windows = job.spec.budget.remeasure_windows
    ratios: list[float] = []
    started = time.perf_counter()
    for round_number in range(1, args.rounds + 1):
        requests = [trials.request(config, windows=windows, drift=False) for config in (winner, base)]
        timeout_s = job.trial_timeout(*(r.config for r in requests))
        results = measure_together(trials.launcher, job.backend.runner, requests, trials.device, timeout_s)
        for result in results:
            assert result.outcome.value == "ok", result.reason
        medians = [r.output.throughput.samples_per_s for r in results]
        ratios.append(medians[0] / medians[1])
        print(f"round {round_number}/{args.rounds}: {medians[0]:,.0f}/s over {medians[1]:,.0f}/s: {ratios[-1]:.3f}x")
    logs = [math.log(r) for r in ratios]
    results: dict[str, Any] = {
        "spec": args.spec,
        "machine": machine(trials.environment),
        "job": measured_job(job),
        "configs": {"winner": format_config(winner), "baseline": format_config(base)},
        "windows": windows,
        "level": LEVEL,
        "rounds": len(ratios),
        "wall_s": time.perf_counter() - started,
        "ratios": ratios,
        "speedup": geometric_mean(ratios),
        # how far one round's ratio strays: the standard deviation of the rounds' log-ratios
        "round_log_sd": statistics.stdev(logs),
        "coverage": {str(n): coverage(ratios, n) for n in range(2, 7) if len(ratios) >= 2 * n},
    }
    for n, found in results["coverage"].items():
        print(
            f"{n} rounds: {found['held']} of {found['blocks']} intervals held the speedup "
            f"({found['coverage']:.0%}, nominal {LEVEL:.0%}); half-width median {found['half_width']['median']:.1%}"
        )
    print(
        f"speedup {results['speedup']:.3f}x over {len(ratios)} rounds; one round's log sd {results['round_log_sd']:.3f}"
    )
    print(f"wrote {write_results(args.out, results)}")


if __name__ == "__main__":
    main()
