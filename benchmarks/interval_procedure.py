"""How often the winner's interval holds its speedup under the whole re-measurement procedure: a
simulation of the rounds, the stopping rule and the choice of the winner, with log-normal round
noise of known size.

    python benchmarks/interval_procedure.py [--draws 4000] [--seed 0] [--replay [RESULT ...]]

`benchmarks/interval_coverage.py` checks the interval on recorded rounds cut into blocks of a
fixed size: it applies neither the stopping rule nor the choice of the winner. Here each draw is
one re-measurement as `autotuner.search.remeasure` runs it, on simulated rounds: the configs of a
scenario (one config at 2x; three tied at 2x, where choosing the best estimate biases it most;
three close, 2x, 1.94x and 1.88x, where some are dropped on the way) and the baseline; in each
round every config still in contention gets a ratio over the baseline process beside it,
ln(ratio) = ln(true) + e_config - e_baseline, each e normal with sd sigma / sqrt(2) (so one
config's ratios have log sd sigma, and configs of one round share their baseline's draw, as in
lockstep). After each round the real functions decide: the standings and intervals
(`autotuner.results.standings.standing`), who is still in contention (`contenders`, the
baseline's point `baseline_standing` among them), and whether the rounds stop
(`autotuner.search.batch_rounds.settled`), up to `budget.remeasure_runs` rounds; the winner's
interval is then stated as the records state it (`joint_among`,
`autotuner.measurement.interval.ratio_interval`). The draw covers when the winner's stated
interval holds the winner's true speedup.

It also simulates `autotuner apply`'s promise check (`check`): an export of one config
re-measured 5 rounds, checked here where the true speedup is the export's, 5% above it, or 25%
above it, against the export's interval widened by the tolerance, with each look judged at 90%
(what a check that stops at its first decision would claim) or at its `look_level` (the tool's);
the share of each verdict, and of wrong ones (not kept where the export's interval holds the
speedup here, kept where the widened interval does not).

The tool's method (to the cap, the winner stated jointly among the contenders, a session's
drift `DRIFT` allowed for: `stated_interval`) is compared with what it replaced and with three
alternatives, each named in the table: stopping once the leader's interval is within
`budget.remeasure_width` (5%) from the second round on, every interval on its own (the rule
before); no stop on the width, every interval on its own; the tool's without the drift; and no
stop on the width with every config's interval at Sidak's level over all K configs re-measured
(valid whatever is chosen, but wide). Simulated rounds are independent and have no drift, so there
the drift's allowance only widens the interval; replayed in the order measured, it is what keeps
the level. Log sds from 0.01 to 0.1
cover what this project measured: 0.028 between rounds of the quickstart's pair on a 2-core VM
(`interval_coverage.json`), up to 0.05-0.1 on a noisy one. Writes
benchmarks/results/interval_procedure.json.

`--replay` draws each config's rounds from rounds `benchmarks/interval_coverage.py` recorded
(their log-ratio residuals, each file's own), so the noise has real machines' shape, tails
included, in two columns: resampled from them all (independent rounds), and consecutive rounds
of one file from a random start (a machine's phases kept: on a VM whose speed changes over
minutes, rounds next to each other are not independent). The residuals are whole rounds' (the
config's and its baseline's noise together), so configs of one round do not share a baseline
draw there. Writes benchmarks/results/interval_procedure-replay.json.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _harness import write_results

from autotuner.measurement.interval import DRIFT, LEVEL, ratio_interval, stated_interval
from autotuner.results.evidence import Remeasurement
from autotuner.results.promise import TOLERANCE, Promised, Verdict, checked_interval, judge, look_level
from autotuner.results.standings import Standing, baseline_standing, contenders, joint_among, standing
from autotuner.search.batch_rounds import settled

SIGMAS = (0.01, 0.02, 0.028, 0.05, 0.075, 0.1)
SCENARIOS = {"one": (2.0,), "three tied": (2.0, 2.0, 2.0), "three close": (2.0, 1.94, 1.88)}
"""The configs re-measured, by their true speedups."""
BASE = -1
RUNS, WIDTH = 5, 0.05  # budget.remeasure_runs and budget.remeasure_width's defaults


@dataclass(frozen=True)
class Variant:
    name: str
    width_stop: bool = False
    """The rounds stop once the leader's interval is within WIDTH, from the second round on."""
    stated: str = "alone"
    """How the winner's interval is stated: `alone` (its own 90%), `joint` (the tool's: jointly
    among the contenders at the end, `joint_among`), `all` (jointly among every config re-measured)."""
    drift: float = 0.0
    """The session's drift the stated interval allows for (the tool's: `DRIFT`, `stated_interval`)."""


TOOL = Variant("the tool's: to the cap, jointly among the contenders, drift allowed", stated="joint", drift=DRIFT)
VARIANTS = (
    Variant("before: stop once within the width, alone", width_stop=True),
    Variant("to the cap, alone"),
    Variant("to the cap, jointly among the contenders", stated="joint"),
    TOOL,
    Variant("to the cap, jointly among all K", stated="all"),
)


def draw(
    rng: random.Random,
    sigma: float,
    trues: tuple[float, ...],
    variant: Variant,
    recorded: list[list[float]] | None = None,
    in_order: bool = False,
) -> tuple[bool, float, int] | None:
    """One re-measurement of configs of these `trues` speedups: whether the winner's stated
    interval holds its true speedup, its half-width, and the rounds it ran; None when the winner
    has no interval (the baseline led, or one round). With `recorded` (each file's log-ratio
    residuals, in the order measured), each config's rounds are recorded ones (`sigma` unused):
    drawn at random from them all, or with `in_order` consecutive ones of one file from a random
    start, so that a machine's phases (rounds that are not independent) carry into them."""
    found = {k: Remeasurement() for k in range(len(trues))}
    alive, still = list(found), list(found)
    spread = sigma / math.sqrt(2)
    pooled = [value for rounds in recorded or [] for value in rounds]
    runs = {}
    if recorded and in_order:
        for k in found:
            rounds = rng.choices(recorded, weights=[len(r) for r in recorded])[0]
            start = rng.randrange(len(rounds) - RUNS + 1)
            runs[k] = rounds[start : start + RUNS]
    for round_number in range(1, RUNS + 1):
        base = rng.gauss(0.0, spread)
        for k in alive:
            if runs:
                noise = runs[k][round_number - 1]
            else:
                noise = rng.choice(pooled) if pooled else rng.gauss(0.0, spread) - base
            found[k].speedups.append(math.exp(math.log(trues[k]) + noise))
        standings: dict[int, Standing] = {k: standing(found[k]) for k in alive}
        standings[BASE] = baseline_standing(round_number)
        still = contenders(standings)
        alive = [k for k in alive if k in still]
        lead = standings[still[0]].interval
        if settled(bool(alive)) or (
            variant.width_stop and round_number >= 2 and lead is not None and lead.half_width <= WIDTH
        ):
            break
    winner = still[0]
    if winner == BASE:
        return None
    among = {"alone": 1, "joint": joint_among(found)[winner], "all": len(trues)}[variant.stated]
    stated = ratio_interval(found[winner].speedups, among=among, drift=variant.drift)
    if stated is None:
        return None
    return stated.contains(trues[winner]), stated.half_width, stated.rounds


def recorded_residuals(paths: list[Path]) -> list[list[float]]:
    """The log-ratio residuals (each round's log-ratio less the mean of its file's), in the order
    measured, of the rounds `benchmarks/interval_coverage.py` recorded in each result file of
    `paths`."""
    found = []
    for path in paths:
        logs = [math.log(r) for r in json.loads(path.read_text())["ratios"]]
        mean = statistics.fmean(logs)
        found.append([value - mean for value in logs])
    return found


def run(draws: int, seed: int, recorded: list[list[float]] | None = None) -> list[dict[str, Any]]:
    """Every variant, scenario and log sd; with `recorded`, two columns of replayed rounds instead
    (resampled, and in the order measured), their sigma the residuals' standard deviation."""
    rows = []
    pooled = [value for rounds in recorded or [] for value in rounds]
    columns = (
        [(statistics.stdev(pooled), False), (statistics.stdev(pooled), True)]
        if recorded
        else [(sigma, False) for sigma in SIGMAS]
    )
    for variant in VARIANTS:
        for scenario, trues in SCENARIOS.items():
            for sigma, in_order in columns:
                rng = random.Random(f"{seed}-{sigma}-{scenario}-{in_order}")  # the same draws for every variant
                results = [r for r in (draw(rng, sigma, trues, variant, recorded, in_order) for _ in range(draws)) if r]
                held = sum(covered for covered, _, _ in results)
                rows.append(
                    {
                        "variant": variant.name,
                        "scenario": scenario,
                        "trues": list(trues),
                        "sigma": sigma,
                        "replay": ("in order" if in_order else "resampled") if recorded else None,
                        "draws": len(results),
                        "coverage": held / len(results),
                        "coverage_95": 1.96 * math.sqrt(held / len(results) * (1 - held / len(results)) / len(results)),
                        "median_half_width": statistics.median(w for _, w, _ in results),
                        "mean_rounds": statistics.fmean(n for _, _, n in results),
                    }
                )
                print(
                    f"{variant.name[:40]:40s} {scenario:11s} sigma={sigma:<6.4f} {rows[-1]['replay'] or ''} "
                    f"coverage {rows[-1]['coverage']:.1%} +-{rows[-1]['coverage_95']:.1%}  "
                    f"half-width {rows[-1]['median_half_width']:.1%}  rounds {rows[-1]['mean_rounds']:.1f}"
                )
    return rows


APPLY_RATIOS = (1.0, 1.05, 1.25)
"""The true speedup here over the export's true speedup, in the promise check's simulation: the
same, 5% above (the promise holds where the export's interval holds it), 25% above (beyond any
interval of these noises widened by the tolerance)."""


def check(rng: random.Random, sigma: float, ratio: float, per_look: bool) -> tuple[Verdict, bool]:
    """One `autotuner apply` promise check of an export of one config re-measured `RUNS` rounds
    at 2x, here at 2x `ratio`: a round at a time, judged from the second on (`checked_interval`,
    `judge` against the export's interval widened by the default tolerance, `Promised`), stopping
    at the first decision, `RUNS` rounds at most; each look at its `look_level` (`per_look`, the
    tool's) or every look at LEVEL. Returns the verdict and whether it is wrong: "not kept" where
    the true speedup here lies within the export's interval (the promise held), "kept" where it
    lies outside the interval widened by the tolerance (it did not); between the two, either is right."""
    export = stated_interval([math.exp(math.log(2.0) + rng.gauss(0.0, sigma)) for _ in range(RUNS)])
    promised = Promised.of(export, None, TOLERANCE)
    assert export is not None and promised is not None
    true = 2.0 * ratio
    here: list[float] = []
    verdict = Verdict.UNDECIDED
    for rounds in range(1, RUNS + 1):
        here.append(math.exp(math.log(true) + rng.gauss(0.0, sigma)))
        if rounds < 2:
            continue
        level = look_level(rounds, RUNS) if per_look else LEVEL
        checked = checked_interval(here, export, level)
        assert checked is not None
        verdict = judge(checked, promised)
        if verdict is not Verdict.UNDECIDED:
            break
    wrong = (verdict is Verdict.NOT_KEPT and export.contains(true)) or (
        verdict is Verdict.KEPT and not promised.low <= true <= promised.high
    )
    return verdict, wrong


def run_checks(draws: int, seed: int) -> list[dict[str, Any]]:
    """The promise check's verdicts, each look at LEVEL and at its `look_level`, for every ratio
    and log sd: the share of each verdict, and the share that is wrong."""
    rows = []
    for per_look in (False, True):
        for ratio in APPLY_RATIOS:
            for sigma in SIGMAS:
                rng = random.Random(f"{seed}-check-{sigma}-{ratio}")
                checks = [check(rng, sigma, ratio, per_look) for _ in range(draws)]
                verdicts = [verdict for verdict, _ in checks]
                share = {v.value: verdicts.count(v) / draws for v in Verdict}
                wrong = sum(w for _, w in checks) / draws
                rows.append(
                    {
                        "looks": "each at its look_level" if per_look else f"each at {LEVEL:.0%}",
                        "ratio": ratio,
                        "sigma": sigma,
                        "draws": draws,
                        "tolerance": TOLERANCE,
                        **share,
                        "wrong": wrong,
                    }
                )
                print(
                    f"apply, {rows[-1]['looks']:22s} ratio {ratio:<4} sigma={sigma:<5} kept {share['kept']:.1%} "
                    f"not kept {share['not kept']:.1%} undecided {share['undecided']:.1%}  wrong {wrong:.1%}"
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--draws", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--replay",
        nargs="*",
        help="draw each round from the rounds benchmarks/interval_coverage.py recorded (its result files; "
        "default every results/interval_coverage*.json) instead of normal noise",
    )
    args = parser.parse_args()
    here = Path(__file__).parent
    if args.replay is not None:
        files = [here / f for f in args.replay] or sorted((here / "results").glob("interval_coverage*.json"))
        args.replay = [str(f.relative_to(here)) for f in files]
    residuals = recorded_residuals([here / f for f in args.replay]) if args.replay is not None else None
    rows = run(args.draws, args.seed, residuals)
    checks = run_checks(args.draws, args.seed) if residuals is None else None
    write_results(
        "interval_procedure-replay.json" if residuals else "interval_procedure.json",
        {
            "replayed": args.replay,
            "replayed_rounds": sum(map(len, residuals)) if residuals else None,
            "level": LEVEL,
            "scenarios": {name: list(trues) for name, trues in SCENARIOS.items()},
            "remeasure_runs": RUNS,
            "remeasure_width": WIDTH,
            "draws_per_row": args.draws,
            "seed": args.seed,
            "rows": rows,
            "apply_checks": checks,
        },
    )


if __name__ == "__main__":
    main()
