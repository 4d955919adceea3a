"""Search efficiency: how many trials each sampler needs to find a near-best config, replayed
against a recorded grid of real trials (a tabular benchmark).

    python benchmarks/search_efficiency.py [--spec studies/bench-mlp.yaml ...] [--record] [--seeds 20]

1. The grid (once per spec, or again with `--record`): every config of the spec's space runs as a
   real trial through the search's trial launcher (fork server, one process per trial, the
   spec's trial settings, unsupported configs decided without a process), in a shuffled order
   so that a change in the shared machine's load does not follow the space's order; the fp32
   reference runs twice as it does for a study. The raw trial results, and what
   `autotuner.study.record` makes of them (throughput, drift, outcome, feasibility), go to
   `benchmarks/results/grid-<name>.json` with the machine named.
2. The replay (no training): for each sampler and seed, an in-memory Optuna study set up as
   `autotuner search` sets one up (baseline enqueued as trial 0, the sampler wrapped in
   `FreshConfigSampler`, OOM rule-outs given up, every trial stored by `autotuner.study.record`
   from the table's result), until a feasible trial reaches `--target` (97%) of the grid's best
   feasible throughput. Trials are counted as `budget.trials` counts them: unsupported configs
   are free. Replayed: the default sampler (what a spec without `sampler` gets), Optuna's TPE
   with its own defaults, GP, random, NSGA-II, and variants of the default (`_contenders`).
   Writes `benchmarks/results/search_efficiency.json`.

Target: the project's default sampler gets there within 15% of the grid's size (the configs that
run) and beats random search, both as a median over the seeds.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
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
    guide_config,
    machine,
    measured_job,
    quartiles,
    result_from_json,
    result_to_json,
    stored,
    write_results,
)
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from autotuner.knobs import config_key, format_config
from autotuner.outcomes import Outcome
from autotuner.sampler import FreshConfigSampler, make_base_sampler, oom_rules_out
from autotuner.spec import Job, SamplerSettings, load_spec
from autotuner.study import DIRECTIONS, TrialRecord, give_up, record
from backends import Capabilities

DEFAULT_SPECS = ["studies/bench-mlp.yaml", "studies/bench-cnn.yaml"]
STARTUP_TRIALS: int = inspect.signature(make_base_sampler).parameters["startup_trials"].default
"""The default sampler's random start-up trials (the baseline counts among them)."""
VARIANT_STARTUP_TRIALS = (2, 3)
CLOSE_BAR = 0.9
"""A second, looser bar (share of the best throughput), read off the same replays."""
BUDGET_SHARE = 0.15
"""The target: the default sampler reaches the bar within this share of the grid's size."""


@dataclass(frozen=True)
class Contender:
    make: Callable[[int], BaseSampler]
    """The wrapped sampler for a seed (FreshConfigSampler wraps it, as in the search)."""
    guide_first: bool = False
    """Enqueue the guides' config (`_harness.guide_config`) right after the baseline."""
    wrap: Callable[[BaseSampler, dict[str, list[Any]], int], BaseSampler] | None = None
    """Wraps the sampler before FreshConfigSampler does (a prototype under evaluation)."""
    throughput_only: bool = False
    """A study with the throughput as its one objective (drift stays a constraint)."""


class _ThroughputOnly:
    """The study as `record` sees it, telling Optuna the throughput alone (`throughput_only`)."""

    def __init__(self, study: optuna.Study):
        self._study = study

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def tell(self, trial: optuna.Trial, values: list[float]) -> FrozenTrial:
        return self._study.tell(trial, values[0])


class IncumbentNeighbours(BaseSampler):
    """A prototype under evaluation, not the engine's sampler: once `startup` trials are complete,
    every other proposal is an untried config one knob away from the fastest feasible trial so
    far (at random among them); the others are the wrapped sampler's."""

    def __init__(self, base: BaseSampler, space: dict[str, list[Any]], seed: int, startup: int = STARTUP_TRIALS):
        self.base, self.space, self.startup = base, space, startup
        self._rng = random.Random(seed)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
        return self.base.infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, Any]) -> dict[str, Any]:
        done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        feasible = [t for t in done if t.user_attrs.get("feasible")]
        if len(done) >= self.startup and len(done) % 2 == 0 and feasible:
            incumbent = max(feasible, key=lambda t: t.values[0]).params
            tried = {config_key(t.params) for t in study.get_trials(deepcopy=False)}
            neighbours = [
                {**incumbent, knob: value}
                for knob, values in self.space.items()
                for value in values
                if value != incumbent[knob]
            ]
            fresh = [n for n in neighbours if config_key(n) not in tried]
            if fresh:
                return self._rng.choice(fresh)
        return self.base.sample_relative(study, trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, name: str, distribution: Any) -> Any:
        return self.base.sample_independent(study, trial, name, distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.base.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Any) -> None:
        self.base.after_trial(study, trial, state, values)


def _contenders() -> dict[str, Contender]:
    """Every sampler replayed, by label. The variants change one thing in the default (fewer
    random start-up trials, the guides' config tried right after the baseline, the throughput as
    the only objective) and the prototypes add a proposal rule the engine lacks, to see what it
    would take to meet the target."""
    default = SamplerSettings().name  # what a spec without a `sampler` key gets
    contenders = {
        f"default ({default})": Contender(lambda seed: make_base_sampler(default, seed)),
        "tpe (Optuna's defaults)": Contender(lambda seed: optuna.samplers.TPESampler(seed=seed)),
        "random": Contender(lambda seed: make_base_sampler("random", seed)),
        "nsga2": Contender(lambda seed: make_base_sampler("nsga2", seed)),
    }
    gp = all(importlib.util.find_spec(m) for m in ("torch", "scipy"))  # GPSampler needs both
    if gp:
        contenders["gp"] = Contender(lambda seed: make_base_sampler("gp", seed))
    for n in VARIANT_STARTUP_TRIALS:
        contenders[f"variant: {default}, {n} start-up trials"] = Contender(
            lambda seed, n=n: make_base_sampler(default, seed, startup_trials=n)
        )
    contenders[f"variant: {default}, the guides' config second"] = Contender(
        lambda seed: make_base_sampler(default, seed), guide_first=True
    )
    contenders["variant: random, the guides' config second"] = Contender(
        lambda seed: make_base_sampler("random", seed), guide_first=True
    )
    contenders[f"variant: {default}, throughput as the only objective"] = Contender(
        lambda seed: make_base_sampler(default, seed), throughput_only=True
    )
    contenders[f"prototype: {default}, every other trial a neighbour of the best"] = Contender(
        lambda seed: make_base_sampler(default, seed), wrap=IncumbentNeighbours
    )
    contenders[f"prototype: {default}, neighbours of the best, the guides' config second"] = Contender(
        lambda seed: make_base_sampler(default, seed), guide_first=True, wrap=IncumbentNeighbours
    )
    return contenders


# ---------------------------------------------------------------- recording the grid


def record_grid(job: Job, repeats: int) -> dict[str, Any]:
    trials = Trials(job)
    print(f"{job.name}: recording the grid on {machine(trials.environment)}", flush=True)
    started = time.perf_counter()
    reference = trials.reference()
    configs = list(job.configs())
    runs: dict[Any, list[dict[str, Any]]] = {config_key(p): [] for p in configs}
    shuffle = random.Random(0)
    for sweep in range(repeats):
        shuffle.shuffle(configs)  # each sweep in another order: the machine's load does not follow the space
        for i, params in enumerate(configs):
            config = job.complete(params)
            load = os.getloadavg()[0]
            result = trials.run(config)
            runs[config_key(params)].append({"load_1m": load, **result_to_json(result)})
            rate = result.result.get("throughput", {}).get("samples_per_s", 0.0)
            shown = f"{format_config(config)}: {result.outcome} {rate:,.0f}/s"
            print(f"  sweep {sweep + 1}, {i + 1}/{len(configs)} {shown}", flush=True)
    entries = []
    for params in job.configs():
        kept = runs[config_key(params)]
        rates = [r["result"].get("throughput", {}).get("samples_per_s", 0.0) for r in kept]
        median = sorted(range(len(kept)), key=lambda i: rates[i])[(len(kept) - 1) // 2]  # the lower median run
        entries.append({"params": params, "config": job.complete(params), **kept[median], "sweeps": rates})
    grid = {
        "spec": job.source,
        "job": measured_job(job),
        "machine": machine(trials.environment),
        "environment": trials.environment,
        "recorded_at": datetime.now().isoformat(timespec="seconds"),
        "repeats": repeats,
        "record_wall_s": time.perf_counter() - started,
        "space": job.space,
        "baseline": job.baseline,
        "reference": reference,
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
    """Every grid entry as `autotuner.study.record` stores it, by config."""
    return {
        config_key(e["params"]): stored(job, e["config"], result_from_json(e), grid["reference"], grid["environment"])
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
    second: dict[str, Any] | None = None,
) -> list[float]:
    """The best feasible throughput after each trial that ran (trials counted as the budget counts
    them), until one reaches `bar`; `second`: params enqueued after the baseline."""
    configs = list(job.configs())
    base = contender.make(seed)
    if contender.wrap is not None:
        base = contender.wrap(base, job.space, seed)
    sampler = FreshConfigSampler(base, job.space, lambda: configs, seed)
    study = optuna.create_study(directions=DIRECTIONS[:1] if contender.throughput_only else DIRECTIONS, sampler=sampler)
    study.enqueue_trial(job.baseline, user_attrs={"role": "baseline"})  # as Coordinator.enqueue_baseline
    if second is not None and second != job.baseline:
        study.enqueue_trial(second)
    curve: list[float] = []
    while sampler.fresh_configs(study) or study.get_trials(states=(TrialState.WAITING,)):
        trial = study.ask(dict(sampler.space))
        ruled_out = oom_rules_out(trial.params, study.get_trials(deepcopy=False))
        if ruled_out is not None:
            give_up(study, trial, f"trial {ruled_out.number} ran out of memory", ruled_out_by=ruled_out.number)
            continue
        config = job.complete(trial.params)
        entry = table[config_key(trial.params)]
        done = record(
            _ThroughputOnly(study) if contender.throughput_only else study,  # type: ignore[arg-type]
            trial,
            job,
            config,
            result_from_json(entry),
            role=trial.user_attrs.get("role", "search"),
            reference=grid["reference"],
            environment=grid["environment"],
        )
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


def evaluate(job: Job, grid: dict[str, Any], seeds: int, target: float) -> dict[str, Any]:
    recorded = tabulate(job, grid)
    table = {config_key(e["params"]): e for e in grid["trials"]}
    feasible = [r for r in recorded.values() if r.feasible]
    runs = [r for r in recorded.values() if r.outcome != Outcome.UNSUPPORTED.value]
    top = max(feasible, key=lambda r: r.throughput)
    bar = target * top.throughput
    good = [r for r in feasible if r.throughput >= bar]
    size = len(runs)
    baseline = recorded[config_key({k: job.baseline[k] for k in job.space})]
    # Random search without repetition, baseline first: 1 + the mean position of the first of
    # `good` among the other configs.
    random_expected = 1.0 if baseline.feasible and baseline.throughput >= bar else 1 + size / (len(good) + 1)
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
        "budget_share": BUDGET_SHARE,
        "budget_trials": BUDGET_SHARE * size,
        "samplers": {},
    }
    guide = guide_config(job, Capabilities.from_dict(grid["environment"]["capabilities"]), grid["environment"])
    results["guides_config"] = guide
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # GPSampler warns of every single-value knob
    for label, contender in _contenders().items():
        curves, started = [], time.perf_counter()
        second = _in_space(job, guide) if contender.guide_first else None
        for seed in range(seeds):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                curves.append(replay(job, grid, table, contender, seed, bar, second))
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
            "seeds_within_budget": sum(n <= BUDGET_SHARE * size for n in needed),
            "trials_to_close_bar_median": statistics.median(close),
            "replay_s_per_seed": spent / seeds,
        }
        print(f"  {label}: median {stats['median']:g} trials ({stats['median'] / size:.0%} of {size})", flush=True)
    default = next(v for k, v in results["samplers"].items() if k.startswith("default"))
    random_search = results["samplers"]["random"]
    results["target"] = {
        "within_budget": default["trials_median"] <= BUDGET_SHARE * size,
        "beats_random": default["trials_median"] < random_search["trials_median"],
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
