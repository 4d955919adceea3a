"""How often the winner's interval holds its speedup under the whole re-measurement procedure: a
simulation of the rounds, the stopping rule and the choice of the winner, with log-normal round
noise of known size.

    python benchmarks/interval_procedure.py [--draws 4000] [--seed 0] [--replay [RESULT]]

`benchmarks/interval_coverage.py` checks the interval on recorded rounds cut into blocks of a
fixed size: it applies neither the stopping rule nor the choice of the winner. Here each draw is
one re-measurement as `autotuner.search.remeasure` runs it, on simulated rounds: K configs of the
same true speedup (2x: a tie, where choosing the best estimate biases it most) or one config, and
the baseline; in each round every config still in contention gets a ratio over the baseline
process beside it, ln(ratio) = ln(2) + e_config - e_baseline, each e normal with sd
sigma / sqrt(2) (so one config's ratios have log sd sigma, and configs of one round share their
baseline's draw, as in lockstep). After each round the real functions decide: the standings and
intervals (`standing`, `autotuner.measurement.interval.ratio_interval`), who is still in contention
(`contenders`, the baseline's point `baseline_standing` among them), and whether the rounds stop
(`settled`: no config left, or the leader's interval within `budget.remeasure_width` from the
second round on), up to `budget.remeasure_runs` rounds. The winner is the leader at the end; the
draw covers when the winner's stated interval holds its true speedup.

Today's procedure is compared with variants of the stopping rule and the level, each named in
the table (they are candidates, not what the tool does): no stop on the leader's width before
round 3, no stop on the width at all (the rounds stop when no config is left to beat or at the
cap), and that with the level corrected for the choice among the K configs (Bonferroni: each
config's interval at 1 - 0.10 / K). Log sds from 0.01 to 0.1 cover what this project measured:
0.028 between rounds of the quickstart's pair on a 2-core VM (`interval_coverage.json`), up to
0.05-0.1 on a noisy one. Writes benchmarks/results/interval_procedure.json.

`--replay` draws each config's round from the rounds `benchmarks/interval_coverage.py` recorded
(their log-ratio residuals, resampled; one column at their standard deviation), so the noise has
a real machine's shape, tails included; the residuals are whole rounds' (the config's and its
baseline's noise together), so configs of one round do not share a baseline draw there. Writes
benchmarks/results/interval_procedure-replay.json.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _harness import write_results

from autotuner.measurement.interval import LEVEL, Interval, geometric_mean, ratio_interval
from autotuner.search.remeasure import Standing, baseline_standing, contenders, settled

SIGMAS = (0.01, 0.02, 0.028, 0.05, 0.075, 0.1)
CONFIGS = (1, 3)
TRUE = 2.0
BASE = -1
RUNS, WIDTH = 5, 0.05  # budget.remeasure_runs and budget.remeasure_width's defaults


@dataclass(frozen=True)
class Variant:
    name: str
    first_width_stop: int | None
    """The first round after which the leader's width may stop the rounds; None: never."""
    selection: bool = False
    """Each config's interval at 1 - (1 - LEVEL) / K, K the configs re-measured."""


VARIANTS = (
    Variant("today: stop once the leader is within the width, from round 2", 2),
    Variant("width stop from round 3 on", 3),
    Variant("no width stop", None),
    Variant("no width stop, level corrected for the choice among K", None, selection=True),
)


def draw(
    rng: random.Random,
    sigma: float,
    configs: int,
    variant: Variant,
    residuals: list[float] | None = None,
) -> tuple[bool, float, int] | None:
    """One re-measurement: whether the winner's interval holds its speedup, its half-width, and
    the rounds it ran; None when the winner has no interval (the baseline led, or one round).
    With `residuals`, each config's round is a recorded round's log-ratio residual drawn at
    random (`sigma` unused), so the noise has the recorded rounds' shape, tails included."""
    level = 1 - (1 - LEVEL) / configs if variant.selection else LEVEL
    interval: Callable[[list[float]], Interval | None] = lambda ratios: ratio_interval(ratios, level)  # noqa: E731
    ratios: dict[int, list[float]] = {k: [] for k in range(configs)}
    alive, still = list(range(configs)), list(range(configs))
    standings: dict[int, Standing] = {}
    spread = sigma / math.sqrt(2)
    for round_number in range(1, RUNS + 1):
        base = rng.gauss(0.0, spread)
        for k in alive:
            noise = rng.choice(residuals) if residuals else rng.gauss(0.0, spread) - base
            ratios[k].append(math.exp(math.log(TRUE) + noise))
        standings = {k: Standing(geometric_mean(ratios[k]), interval(ratios[k])) for k in alive}
        standings[BASE] = baseline_standing(round_number)
        still = contenders(standings)
        alive = [k for k in alive if k in still]
        lead = standings[still[0]].interval
        width = WIDTH if variant.first_width_stop is not None and round_number >= variant.first_width_stop else 0.0
        if settled(bool(alive), lead, round_number, width):
            break
    winner = still[0]
    stated = standings[winner].interval if winner != BASE else None
    if stated is None:
        return None
    return stated.contains(TRUE), stated.half_width, stated.rounds


def recorded_residuals(path: Path) -> list[float]:
    """The log-ratio residuals (each round's log-ratio less their mean) of the rounds
    `benchmarks/interval_coverage.py` recorded (its result file at `path`)."""
    logs = [math.log(r) for r in json.loads(path.read_text())["ratios"]]
    mean = statistics.fmean(logs)
    return [value - mean for value in logs]


def run(draws: int, seed: int, residuals: list[float] | None = None) -> list[dict[str, Any]]:
    """Every variant, number of configs and log sd; with `residuals`, one column of replayed
    rounds instead (its sigma the residuals' standard deviation)."""
    rows = []
    sigmas = (statistics.stdev(residuals),) if residuals else SIGMAS
    for variant in VARIANTS:
        for configs in CONFIGS:
            for sigma in sigmas:
                rng = random.Random(f"{seed}-{sigma}-{configs}")  # the same draws for every variant
                results = [
                    r for r in (draw(rng, sigma, configs, variant, residuals) for _ in range(draws)) if r is not None
                ]
                held = sum(covered for covered, _, _ in results)
                rows.append(
                    {
                        "variant": variant.name,
                        "configs": configs,
                        "sigma": sigma,
                        "draws": len(results),
                        "coverage": held / len(results),
                        "coverage_95": 1.96 * math.sqrt(held / len(results) * (1 - held / len(results)) / len(results)),
                        "median_half_width": statistics.median(w for _, w, _ in results),
                        "mean_rounds": statistics.fmean(n for _, _, n in results),
                    }
                )
                print(
                    f"{variant.name[:44]:44s} K={configs} sigma={sigma:<5} coverage {rows[-1]['coverage']:.1%} "
                    f"+-{rows[-1]['coverage_95']:.1%}  half-width {rows[-1]['median_half_width']:.1%}  "
                    f"rounds {rows[-1]['mean_rounds']:.1f}"
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--draws", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--replay",
        nargs="?",
        const="results/interval_coverage.json",
        help="draw each round from the rounds benchmarks/interval_coverage.py recorded (its result file; "
        "default results/interval_coverage.json) instead of normal noise",
    )
    args = parser.parse_args()
    residuals = recorded_residuals(Path(__file__).parent / args.replay) if args.replay else None
    rows = run(args.draws, args.seed, residuals)
    write_results(
        "interval_procedure-replay.json" if residuals else "interval_procedure.json",
        {
            "replayed": args.replay,
            "replayed_rounds": len(residuals) if residuals else None,
            "level": LEVEL,
            "true_speedup": TRUE,
            "remeasure_runs": RUNS,
            "remeasure_width": WIDTH,
            "draws_per_row": args.draws,
            "seed": args.seed,
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()
