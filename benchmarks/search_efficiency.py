"""Search efficiency: how many trials each sampler needs to find a near-best config, replayed
against a recorded grid of real trials (a tabular benchmark).

    python benchmarks/search_efficiency.py [--spec studies/bench-mlp.yaml ...] [--record] [--repeats 3] [--seeds 20]

1. The grid (once per spec, or again with `--record`): every config of the spec's space runs as a
   real trial through the search's trial launcher (fork server, one process per trial, the
   spec's trial settings, unsupported configs decided without a process), in a shuffled order
   so that a change in the shared machine's load does not follow the space's order; the fp32
   reference runs twice as it does for a study. The raw trial results, and what
   `autotuner.results.store.record` makes of them (throughput, drift, outcome, feasibility), go to
   `benchmarks/results/grid-<name>.json` with the machine named.
2. The replay (no training): for each sampler and seed, an in-memory Optuna study set up as
   `autotuner search` sets one up (baseline enqueued as trial 0, the sampler built by
   `autotuner.proposals.sampler.make_sampler` from the spec's sampler name, the seed, the space and what
   the device cannot run, OOM rule-outs given up, every trial stored by `autotuner.results.store.record`
   from the table's result, a search trial pruned as the search prunes it, on its recorded windows:
   `_harness.as_pruned`), until a feasible trial reaches `--target` (97%) of the grid's best
   feasible throughput. Trials are counted as `budget.trials` counts them: unsupported configs
   are free. Replayed: the default sampler (what a spec without `sampler` gets: TPE after the
   guided start), random, NSGA-II and GP as a spec naming them gets them, Optuna's TPE with its
   own defaults, and variants of the default (`_contenders`). Writes
   `benchmarks/results/search_efficiency.json`.

Target: the project's default sampler gets there within 15% of the grid's size (the configs that
run) and beats random search, both as a median over the seeds; on a grid of 150 configs or more,
within 5% of its size and in at most a third of random search's trials. Random search's median is
taken exact (`random_median_trials`), not from its replays: over 20 seeds its quartiles span a
factor of five, and a lucky draw of seeds would move the bar. And the pruning rule never stops a
config that reaches the bar (the grid's best among them) in any replay (`pruned_at_bar`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import random
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import optuna
from _harness import (
    RESULTS,
    Trials,
    as_pruned,
    guide_config,
    machine,
    measured_job,
    quartiles,
    result_from_json,
    result_to_json,
    stored,
    with_held,
    write_results,
)
from optuna.samplers import BaseSampler
from optuna.trial import TrialState

from autotuner.config.knobs import config_key
from autotuner.output.formatting import format_config
from autotuner.proposals.guided_start import Unsupported, rule_of_thumb
from autotuner.proposals.sampler import FreshConfigSampler, make_base_sampler, make_sampler
from autotuner.results.evidence import Reference
from autotuner.results.records import TrialRecord
from autotuner.results.store import Yardstick, give_up, record
from autotuner.results.tried import best_feasible, oom_rules_out
from autotuner.search.loop import unsupported_params
from autotuner.spec.job import Job, load_spec
from autotuner.spec.keys import SamplerSettings
from autotuner.study.names import DIRECTIONS
from autotuner.trials.outcomes import Outcome
from autotuner.trials.probe import Environment  # noqa: E402

DEFAULT_SPECS = [
    "studies/bench-mlp.yaml",
    "studies/bench-cnn.yaml",
    "studies/bench-resnet.yaml",
    "studies/bench-gpt-grid.yaml",
    "studies/bench-cnn-grid.yaml",
]
CLOSE_BAR = 0.9
"""A second, looser bar (share of the best throughput), read off the same replays."""
BUDGET_SHARE = 0.15
"""The target: the default sampler reaches the bar within this share of the grid's size."""
LARGE_GRID = 150
"""A grid of at least this many configs that run is held to the large space's target: the bar
within `LARGE_SHARE` of its size, in at most `LARGE_RANDOM_SHARE` of random search's trials."""
LARGE_SHARE = 0.05
LARGE_RANDOM_SHARE = 1 / 3


@dataclass(frozen=True)
class Contender:
    make: Callable[[int, Job, list[dict[str, Any]], Unsupported], FreshConfigSampler]
    """The sampler for a seed, from the job, every config of its space and what the device cannot
    run (the backend's `unsupported_reason` with the grid's capabilities)."""
    guides_start: bool = False
    """The guided start begins at the guides' config (`_harness.guide_config`) instead of the
    sampler's rule of thumb."""


def _as_the_search(name: str) -> Contender:
    """`sampler: {name: <name>}` as `autotuner search` builds it (`autotuner.proposals.sampler.make_sampler`)."""
    return Contender(
        lambda seed, job, configs, unsupported: make_sampler(
            name, seed, job.space, lambda: configs, unsupported, knobs=job.backend.knobs
        )
    )


def _wrapped(base: Callable[[int], BaseSampler]) -> Contender:
    """An Optuna sampler in `FreshConfigSampler`, with no guided start."""
    return Contender(
        lambda seed, job, configs, unsupported: FreshConfigSampler(
            base(seed), job.space, lambda: configs, seed, unsupported=unsupported, knobs=job.backend.knobs
        )
    )


def _contenders() -> dict[str, Contender]:
    """Every sampler replayed, by label: the default and the other `sampler.name` values as the
    search builds them, Optuna's TPE with its own defaults, and variants that change one thing in
    the default (no guided start; the guides' config as the start)."""
    default = SamplerSettings().name  # what a spec without a `sampler` key gets
    contenders = {
        f"default ({default})": _as_the_search(default),
        "tpe (Optuna's defaults)": _wrapped(lambda seed: optuna.samplers.TPESampler(seed=seed)),
        "random": _as_the_search("random"),
        "nsga2": _as_the_search("nsga2"),
    }
    if all(importlib.util.find_spec(m) for m in ("torch", "scipy")):  # GPSampler needs both
        contenders["gp"] = _as_the_search("gp")
    contenders[f"variant: {default} without the guided start"] = _wrapped(lambda seed: make_base_sampler(default, seed))
    contenders[f"variant: {default}, the guides' config (a loader worker per core) as the start"] = Contender(
        _as_the_search(default).make, guides_start=True
    )
    return contenders


# ---------------------------------------------------------------- recording the grid


def record_grid(job: Job, repeats: int) -> dict[str, Any]:
    trials = Trials(job)
    print(f"{job.name}: recording the grid on {machine(trials.environment)}", flush=True)
    started = time.perf_counter()
    reference = trials.reference()
    configs = list(job.space.points())
    runs: dict[Any, list[dict[str, Any]]] = {config_key(p): [] for p in configs}
    shuffle = random.Random(0)
    for sweep in range(repeats):
        shuffle.shuffle(configs)  # each sweep in another order: the machine's load does not follow the space
        for i, params in enumerate(configs):
            config = job.complete(params)
            load = os.getloadavg()[0]
            result = trials.run(config)
            runs[config_key(params)].append({"load_1m": load, **result_to_json(result)})
            measured = result.output.throughput if result.output is not None else None
            rate = measured.samples_per_s if measured is not None else 0.0
            shown = f"{format_config(config)}: {result.outcome} {rate:,.0f}/s"
            print(f"  sweep {sweep + 1}, {i + 1}/{len(configs)} {shown}", flush=True)
    entries = []
    for params in job.space.points():
        kept = runs[config_key(params)]
        rates = [r["result"].get("throughput", {}).get("samples_per_s", 0.0) for r in kept]
        median = sorted(range(len(kept)), key=lambda i: rates[i])[(len(kept) - 1) // 2]  # the lower median run
        entries.append({"params": params, "config": job.complete(params), **kept[median], "sweeps": rates})
    grid = {
        "spec": job.source,
        "job": measured_job(job),
        "machine": machine(trials.environment),
        "environment": trials.environment.as_dict(),
        "recorded_at": datetime.now().isoformat(timespec="seconds"),
        "repeats": repeats,
        "record_wall_s": time.perf_counter() - started,
        "space": {k: list(v) for k, v in job.space.items()},
        "baseline": job.baseline,
        "reference": reference.as_dict(),
        "trials": entries,
    }
    recorded = tabulate(job, grid)
    for entry in entries:
        stored_as = recorded[config_key(entry["params"])]
        entry["recorded"] = {
            "outcome": stored_as.outcome,
            "feasible": stored_as.feasible,
            "throughput": stored_as.throughput,
            "drift": stored_as.metrics.get("drift"),
            "reason": stored_as.reason,
        }
    return grid


def tabulate(job: Job, grid: dict[str, Any]) -> dict[tuple[tuple[str, Any], ...], TrialRecord]:
    """Every grid entry as `autotuner.results.store.record` stores it, by config."""
    reference = Reference.from_dict(grid["reference"])
    return {
        config_key(e["params"]): stored(job, e["config"], result_from_json(e), reference, grid["environment"])
        for e in grid["trials"]
    }


# ---------------------------------------------------------------- replaying samplers


def replay(
    job: Job,
    grid: dict[str, Any],
    table: dict[Any, dict[str, Any]],
    contender: Contender,
    seed: int,
    bar: float,
    start: dict[str, Any] | None = None,
    warm: list[dict[str, Any]] | None = None,
    pruned: list[dict[str, Any]] | None = None,
) -> list[float]:
    """The best feasible throughput after each trial that ran (trials counted as the budget counts
    them), until one reaches `bar`; `start`: the guided start's config instead of the rule of thumb;
    `warm`: configs enqueued after the baseline, as `autotuner search --warm-start` enqueues an
    earlier study's (`autotuner.search.warm_start`). Each search trial is pruned as the search
    would prune it against the best feasible throughput before it (`_harness.as_pruned`, on the
    grid's recorded windows), and stored pruned with its bound; `pruned` collects the configs that
    were."""
    configs = list(job.space.points())
    unsupported = unsupported_params(job, job.backend.capabilities(grid["environment"]["capabilities"]))
    sampler = contender.make(seed, job, configs, unsupported)
    if start is not None and sampler.rule is not None:
        sampler.rule = start
    study = optuna.create_study(directions=DIRECTIONS, sampler=sampler)
    study.enqueue_trial(
        job.baseline, user_attrs={"role": "baseline"}
    )  # as autotuner.workers.coordination.enqueue_baseline
    for params in warm or []:
        study.enqueue_trial(params)
    reference = Reference.from_dict(grid["reference"])
    curve: list[float] = []
    while sampler.fresh_configs(study) or study.get_trials(states=(TrialState.WAITING,)):
        trial = study.ask(dict(sampler.space))
        ruled_out = oom_rules_out(trial.params, study.get_trials(deepcopy=False), job.backend.knobs)
        if ruled_out is not None:
            give_up(study, trial, f"trial {ruled_out.number} ran out of memory", ruled_out_by=ruled_out.number)
            continue
        config = job.complete(trial.params)
        entry = table[config_key(trial.params)]
        role = trial.user_attrs.get("role", "search")
        result = result_from_json(entry)
        if role == "search":  # as `autotuner.search.dispatch` prunes a search trial
            result = as_pruned(job, result, best_feasible(study.get_trials(deepcopy=False)))
        done = record(
            study,
            trial,
            config,
            result,
            role=role,
            against=Yardstick(job, reference, Environment.from_dict(grid["environment"])),
        )
        if done.outcome == Outcome.PRUNED.value and pruned is not None:
            pruned.append(dict(trial.params))
        if done.ran:
            curve.append(max(curve[-1] if curve else 0.0, done.throughput if done.feasible else 0.0))
            if curve[-1] >= bar:
                break
    return curve


def _in_space(job: Job, config: dict[str, Any]) -> dict[str, Any]:
    """`config` as a point of the space: a value the space lacks becomes the largest one below it
    (numbers) or the baseline's."""
    point = {}
    for knob, values in job.space.items():
        value = config[knob]
        if value not in values:
            below = [v for v in values if isinstance(v, int) and isinstance(value, int) and v <= value]
            value = max(below) if below else job.baseline[knob]
        point[knob] = value
    return point


def random_median_trials(others: int, good: int) -> float:
    """Random search without repetition after the baseline: the median number of trials until one of
    `good` configs comes up among the grid's `others` (every config that runs but the baseline),
    exactly. The first good config's position in a random order is past `k` with probability
    C(others - k, good) / C(others, good); the median is the least `k` where that is at most one
    half, plus the baseline's trial."""
    total = math.comb(others, good)
    return 1.0 + next(k for k in range(others + 1) if 2 * math.comb(others - k, good) <= total)


def evaluate(job: Job, grid: dict[str, Any], seeds: int, target: float) -> dict[str, Any]:
    recorded = tabulate(job, grid)
    table = {config_key(e["params"]): e for e in grid["trials"]}
    feasible = [r for r in recorded.values() if r.feasible]
    runs = [r for r in recorded.values() if r.outcome != Outcome.UNSUPPORTED.value]
    top = max(feasible, key=lambda r: r.throughput)
    bar = target * top.throughput
    good = [r for r in feasible if r.throughput >= bar]
    at_bar = {config_key({k: r.config[k] for k in job.space}) for r in good}
    size = len(runs)
    large = size >= LARGE_GRID
    share = LARGE_SHARE if large else BUDGET_SHARE
    baseline = recorded[config_key({k: job.baseline[k] for k in job.space})]
    # Random search without repetition, baseline first: 1 + the mean position of the first of
    # `good` among the other configs.
    baseline_good = baseline.feasible and baseline.throughput >= bar
    random_expected = 1.0 if baseline_good else 1 + size / (len(good) + 1)
    random_median = 1.0 if baseline_good else random_median_trials(size - 1, len(good))
    results: dict[str, Any] = {
        "grid_configs": len(recorded),
        "grid_configs_run": size,
        "outcomes": {
            o: sum(r.outcome == o for r in recorded.values()) for o in sorted({r.outcome for r in recorded.values()})
        },
        "feasible": len(feasible),
        "best": {"config": top.config, "throughput": top.throughput, "drift": top.metrics.get("drift")},
        "baseline_throughput": baseline.throughput,
        "best_over_baseline": top.throughput / baseline.throughput if baseline.throughput else None,
        "bar": bar,
        "configs_at_bar": len(good),
        "close_bar_share": CLOSE_BAR,
        "configs_at_close_bar": sum(r.throughput >= CLOSE_BAR * top.throughput for r in feasible),
        "random_expected_trials": random_expected,
        "random_median_trials": random_median,
        "budget_share": share,
        "budget_trials": share * size,
        "random_share": LARGE_RANDOM_SHARE if large else None,
        "samplers": {},
    }
    capabilities = job.backend.capabilities(grid["environment"]["capabilities"])
    guide = guide_config(job, capabilities, grid["environment"])
    results["guides_config"] = guide
    results["rule_of_thumb"] = rule_of_thumb(job.space, unsupported_params(job, capabilities))
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # GPSampler warns of every single-value knob
    for label, contender in _contenders().items():
        curves, started, pruned = [], time.perf_counter(), []  # type: ignore[var-annotated]
        start = _in_space(job, guide) if contender.guides_start else None
        for seed in range(seeds):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                curves.append(replay(job, grid, table, contender, seed, bar, start, pruned=pruned))
        spent = time.perf_counter() - started
        needed = [len(curve) for curve in curves]
        stats = quartiles([float(n) for n in needed])
        # A looser bar, read off the same runs: how soon each gets close.
        close = [next(i + 1 for i, v in enumerate(c) if v >= CLOSE_BAR * top.throughput) for c in curves]
        results["samplers"][label] = {
            "trials_needed": needed,
            **{f"trials_{k}": v for k, v in stats.items()},
            "trials_mean": statistics.mean(needed),
            "median_share_of_grid": stats["median"] / size,
            "seeds_within_budget": sum(n <= share * size for n in needed),
            "trials_to_close_bar_median": statistics.median(close),
            "pruned_per_seed": len(pruned) / seeds,
            # the rule must never stop the configs that reach the bar (the eventual winner among them)
            "pruned_at_bar": sum(config_key(p) in at_bar for p in pruned),
            "replay_s_per_seed": spent / seeds,
        }
        print(f"  {label}: median {stats['median']:g} trials ({stats['median'] / size:.0%} of {size})", flush=True)
    default = next(v for k, v in results["samplers"].items() if k.startswith("default"))
    results["target"] = {
        "never_prunes_the_best": all(v["pruned_at_bar"] == 0 for v in results["samplers"].values()),
        "within_budget": default["trials_median"] <= share * size,
        "beats_random": (
            default["trials_median"] <= LARGE_RANDOM_SHARE * random_median
            if large
            else default["trials_median"] < random_median
        ),
    }
    results["target"]["holds"] = all(results["target"].values())
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", action="append", help=f"job spec (repeatable; default: {', '.join(DEFAULT_SPECS)})")
    parser.add_argument("--record", action="store_true", help="record the grids again even if they exist")
    parser.add_argument(
        "--repeats", type=int, default=3, help="sweeps of the grid when recording (each config keeps its median run)"
    )
    parser.add_argument("--seeds", type=int, default=20, help="replays per sampler (default 20)")
    parser.add_argument("--target", type=float, default=0.97, help="share of the best throughput to reach")
    args = parser.parse_args()
    out: dict[str, Any] = {"target": args.target, "seeds": args.seeds, "grids": {}}
    for spec in args.spec or DEFAULT_SPECS:
        job = load_spec(spec)
        path = RESULTS / f"grid-{job.name}.json"
        if args.record or not path.exists():
            write_results(path.name, record_grid(job, args.repeats))
        grid = json.loads(path.read_text())
        if grid["job"] != measured_job(job):
            raise SystemExit(f"{path} was recorded for another version of {spec}; run again with --record")
        grid = with_held(job, grid)
        print(f"{job.name}: replaying {len(grid['trials'])} configs, {args.seeds} seeds per sampler", flush=True)
        out["grids"][job.name] = {
            "spec": spec,
            "grid_file": str(path.relative_to(RESULTS.parent.parent)),
            "machine": grid["machine"],
            "recorded_at": grid["recorded_at"],
            "record_wall_s": grid["record_wall_s"],
            "repeats": grid["repeats"],
            "load_1m_median": statistics.median(e["load_1m"] for e in grid["trials"]),
            **evaluate(job, grid, args.seeds, args.target),
        }
    path = write_results("search_efficiency.json", out)
    print(path)


if __name__ == "__main__":
    main()
