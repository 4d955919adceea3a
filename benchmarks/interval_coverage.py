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
(what `budget.remeasure_width` can ask for), the rounds' ratios and each round's two
throughputs, and how far they spread.
The blocks are checked twice: with the rounds' interval alone (`ratio_interval`) and as a study
states it (`stated_interval`: a session's drift `DRIFT` allowed for). And the drift itself: for
blocks of 5, 10 and 20 consecutive rounds, how far their means stand apart beyond what the rounds'
spread gives them (the log sd sqrt(var(block means) - s^2 / n)), which is what `DRIFT` must cover
on this machine. Writes benchmarks/results/interval_coverage.json (or `--out`), after every round
from the second on (a run stopped part-way keeps its rounds); `--reread FILE`
works the figures out again from the rounds FILE recorded, measuring nothing, and rewrites it.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

from _harness import Trials, machine, measured_job, quartiles, write_results

from autotuner.measurement.interval import DRIFT, LEVEL, geometric_mean, ratio_interval, stated_interval
from autotuner.output.formatting import format_config
from autotuner.spec.job import load_spec
from autotuner.trials.lockstep import measure_together


def coverage(ratios: list[float], n: int, stated: bool = False) -> dict[str, Any]:
    """Cut `ratios` into consecutive blocks of `n`; each block's interval (the rounds' own, or
    with `stated` as a study states it) against the geometric mean of the other rounds."""
    blocks = [ratios[k : k + n] for k in range(0, len(ratios) - n + 1, n)]
    held, widths = [], []
    for k, block in enumerate(blocks):
        interval = stated_interval(block) if stated else ratio_interval(block)
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


def drift(ratios: list[float], n: int) -> float | None:
    """How far the means of consecutive blocks of `n` rounds stand apart beyond what their rounds'
    spread gives them: the log sd sqrt(max(0, var(block means) - s^2 / n)), s the rounds' log sd;
    None with fewer than 3 blocks."""
    logs = [math.log(r) for r in ratios]
    means = [statistics.fmean(logs[k : k + n]) for k in range(0, len(logs) - n + 1, n)]
    if len(means) < 3:
        return None
    return math.sqrt(max(0.0, statistics.variance(means) - statistics.variance(logs) / n))


def analysed(ratios: list[float]) -> dict[str, Any]:
    """What the rounds' `ratios` show: their speedup and spread, each block size's coverage (alone
    and as stated) and the drift between blocks."""
    return {
        "speedup": geometric_mean(ratios),
        # how far one round's ratio strays: the standard deviation of the rounds' log-ratios
        "round_log_sd": statistics.stdev(math.log(r) for r in ratios),
        "coverage": {str(n): coverage(ratios, n) for n in range(2, 7) if len(ratios) >= 2 * n},
        "stated_coverage": {str(n): coverage(ratios, n, stated=True) for n in range(2, 7) if len(ratios) >= 2 * n},
        "drift_allowed": DRIFT,
        "drift": {str(n): drift(ratios, n) for n in (5, 10, 20) if len(ratios) >= 3 * n},
    }


def report(results: dict[str, Any]) -> None:
    for n, found in results["coverage"].items():
        stated = results["stated_coverage"][n]
        print(
            f"{n} rounds: {found['held']} of {found['blocks']} intervals held the speedup "
            f"({found['coverage']:.0%}, nominal {LEVEL:.0%}), as stated {stated['held']} "
            f"({stated['coverage']:.0%}); half-width median {found['half_width']['median']:.1%}, "
            f"as stated {stated['half_width']['median']:.1%}"
        )
    drifts = ", ".join(f"{n} rounds {d:.3f}" for n, d in results["drift"].items() if d is not None)
    print(
        f"speedup {results['speedup']:.3f}x over {len(results['ratios'])} rounds; one round's log sd "
        f"{results['round_log_sd']:.3f}; drift between blocks (log sd) {drifts or 'too few rounds'}, "
        f"allowed for {DRIFT}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", default="studies/quickstart.yaml")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--winner", help="the winner's knobs that differ from the baseline: knob=value,...")
    parser.add_argument("--out", default="interval_coverage.json")
    parser.add_argument("--reread", help="a result file: work its figures out again from its rounds, measuring nothing")
    args = parser.parse_args()
    if args.reread:
        path = Path(args.reread)
        recorded = json.loads(path.read_text())
        recorded.update(analysed(recorded["ratios"]))
        report(recorded)
        path.write_text(json.dumps(recorded, indent=2) + "\n")
        print(f"wrote {path}")
        return
    job = load_spec(Path(args.spec))
    trials = Trials(job)
    base = job.complete(job.baseline)
    knobs: dict[str, Any] = {"precision": "bf16", "batch_size": job.spec.global_batch}
    if args.winner:
        knobs = {k: int(v) if v.isdigit() else v for k, v in (pair.split("=", 1) for pair in args.winner.split(","))}
    winner = job.complete({**job.baseline, **knobs})
    windows = job.spec.budget.remeasure_windows
    ratios: list[float] = []
    throughputs: dict[str, list[float]] = {"winner": [], "baseline": []}
    started = time.perf_counter()

    def recorded() -> dict[str, Any]:
        return {
            "spec": args.spec,
            "machine": machine(trials.environment),
            "job": measured_job(job),
            "configs": {"winner": format_config(winner), "baseline": format_config(base)},
            "windows": windows,
            "level": LEVEL,
            "rounds": len(ratios),
            "wall_s": time.perf_counter() - started,
            "ratios": ratios,
            "throughputs": throughputs,  # each round's median window, samples/s
            **analysed(ratios),
        }

    for round_number in range(1, args.rounds + 1):
        requests = [trials.request(config, windows=windows, drift=False) for config in (winner, base)]
        timeout_s = job.trial_timeout(*(r.config for r in requests))
        results = measure_together(trials.launcher, job.backend.runner, requests, trials.device, timeout_s)
        for result in results:
            assert result.outcome.value == "ok", result.reason
        medians = [r.output.throughput.samples_per_s for r in results]
        ratios.append(medians[0] / medians[1])
        throughputs["winner"].append(medians[0])
        throughputs["baseline"].append(medians[1])
        print(f"round {round_number}/{args.rounds}: {medians[0]:,.0f}/s over {medians[1]:,.0f}/s: {ratios[-1]:.3f}x")
        if len(ratios) >= 2:  # the file as far as it got: a run stopped part-way keeps its rounds
            write_results(args.out, recorded())
    report(recorded())
    print(f"wrote {write_results(args.out, recorded())}")


if __name__ == "__main__":
    main()
