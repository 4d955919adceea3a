"""Warm start: how many trials a study needs to reach 97% of a grid's best when it starts from a
related study's best configs (`autotuner search --warm-start`), against a cold start, replayed
against recorded grids of real trials (a tabular benchmark, as `search_efficiency.py`).

    python benchmarks/warm_start.py [--seeds 20] [--record]

For each pair (target grid, source grid): the source grid's trials, as the store recorded them,
are the earlier study; `autotuner.search.warm_start.warm_configs` takes its best configs (within
15% of its best, a third of the target spec's budget at most, those the target's space and
device can take), and the target grid is replayed with the default sampler, cold and with those
configs enqueued after the baseline, over `--seeds` seeds. The pairs: the built-in MLP at two
sizes (`bench-mlp` and `bench-mlp-small`, each warm-started from the other: another version of
the job), and the CNN warm-started from the MLP (another job: the warm start may mislead).
`bench-mlp-small`'s grid is recorded when its file is missing (`--record`: again), minutes.
Writes `benchmarks/results/warm_start.json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import warnings
from typing import Any

import optuna
from _harness import RESULTS, measured_job, quartiles, with_held, write_results
from search_efficiency import _contenders, record_grid, replay, tabulate

from autotuner.config.knobs import config_key
from autotuner.search.loop import unsupported_params
from autotuner.search.warm_start import warm_configs
from autotuner.spec.job import Job, load_spec

PAIRS = (
    ("studies/bench-mlp-small.yaml", "studies/bench-mlp.yaml", "another size of the job"),
    ("studies/bench-mlp.yaml", "studies/bench-mlp-small.yaml", "another size of the job"),
    ("studies/bench-cnn.yaml", "studies/bench-mlp.yaml", "another job"),
)
TARGET = 0.97


def load_grid(spec: str, record: bool, repeats: int) -> tuple[Job, dict[str, Any]]:
    job = load_spec(spec)
    path = RESULTS / f"grid-{job.name}.json"
    if record or not path.exists():
        write_results(path.name, record_grid(job, repeats))
    grid = json.loads(path.read_text())
    if grid["job"] != measured_job(job):
        raise SystemExit(f"{path} was recorded for another version of {spec}; record it again")
    return job, with_held(job, grid)


def compare(target: str, source: str, relation: str, seeds: int, record: bool, repeats: int) -> dict[str, Any]:
    job, grid = load_grid(target, record and target.endswith("small.yaml"), repeats)
    source_job, source_grid = load_grid(source, record and source.endswith("small.yaml"), repeats)
    recorded = tabulate(job, grid)
    table = {config_key(e["params"]): e for e in grid["trials"]}
    feasible = [r for r in recorded.values() if r.feasible]
    size = sum(r.outcome != "unsupported" for r in recorded.values())
    top = max(feasible, key=lambda r: r.throughput)
    bar = TARGET * top.throughput
    unsupported = unsupported_params(job, job.backend.capabilities(grid["environment"]["capabilities"]))
    earlier = [dataclasses.replace(t, number=n) for n, t in enumerate(tabulate(source_job, source_grid).values())]
    baseline_key = config_key({k: job.baseline[k] for k in job.space if k != "accumulation"})
    warm = warm_configs(earlier, source_job.name, job, unsupported, job.spec.budget.trials, {baseline_key})
    warm_params = [params for _, params in warm.configs]
    contender = next(c for label, c in _contenders().items() if label.startswith("default"))
    result: dict[str, Any] = {
        "target": job.name,
        "source": source_job.name,
        "relation": relation,
        "grid_configs_run": size,
        "bar": bar,
        "best": {"config": top.config, "throughput": top.throughput},
        "warm_configs": [{"config": p, "throughput_here": recorded[config_key(p)].throughput} for p in warm_params],
        "dropped": warm.dropped,
    }
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    for label, configs in (("cold", None), ("warm", warm_params)):
        needed = []
        for seed in range(seeds):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                needed.append(len(replay(job, grid, table, contender, seed, bar, warm=configs)))
        stats = quartiles([float(n) for n in needed])
        result[label] = {
            "trials_needed": needed,
            **{f"trials_{k}": v for k, v in stats.items()},
            "trials_mean": statistics.mean(needed),
        }
        print(
            f"{job.name} from {source_job.name} ({relation}), {label}: median {stats['median']:g} trials "
            f"(p25-p75 {stats['p25']:g}-{stats['p75']:g}) of {size}",
            flush=True,
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--record", action="store_true", help="record bench-mlp-small's grid again")
    parser.add_argument("--repeats", type=int, default=3, help="sweeps of a grid when recording")
    args = parser.parse_args()
    pairs = [compare(t, s, relation, args.seeds, args.record, args.repeats) for t, s, relation in PAIRS]
    print(write_results("warm_start.json", {"target": TARGET, "seeds": args.seeds, "pairs": pairs}))


if __name__ == "__main__":
    main()
