"""The tuner against what people do instead, for each built-in workload, in one run.

    python benchmarks/alternatives.py [--workload mlp --workload cnn ...] [--rounds 3]

For each workload (its spec: studies/bench-<workload>.yaml, with the knobs it holds at one value
for its recorded grid released to the preset's values: `RELEASED`), four configs, each measured as a
real trial (the search's trial launcher and settings) with its drift against the study's fp32
reference:

* baseline: the spec's baseline (fp32 eager, a small micro-batch, no loader workers);
* batch-size finder: fp32 and the baseline's other knobs at the largest micro-batch that fits,
  found as the finders do it, each probe a real trial process that takes a few optimizer steps
  at that batch and either fits or runs out of memory: Lightning's `scale_batch_size` "power"
  mode (start at 2, double until an OOM, keep the last size that fit) and Accelerate's
  `find_executable_batch_size` (start high, here at the global batch, and halve on an OOM).
  The micro-batch cannot pass the global batch (accumulation >= 1), which plays the part of
  Lightning's dataset-length cap;
* rule of thumb, as the optimization guides put it: bf16 (fp16 where bf16 is not supported),
  the finder's batch, one loader worker per core, `torch.compile` on (where it can build);
* tuned: the best config of a real `autotuner search` on the spec with the default sampler and
  the default budget (`budget.trials` 30: the spec's own budget sizes its recorded grid's
  replays, not a user's study), in a fresh folder, its wall time measured.

The four are then measured again side by side (`--rounds` times, in turn) so their ratios over
the baseline come from one stretch of the machine's load; the search's own figures are kept
too. torch.compile's cache starts empty (a fresh TORCHINDUCTOR_CACHE_DIR and a fresh study
folder), but the four are measured with the study's compile cache, which the search's trials
fill: a graph the search compiled starts warm in the first round. Writes
benchmarks/results/alternatives.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from _harness import SearchRun, Trials, guide_config, machine, run_search, stored, write_results

from autotuner.config.knobs import Config, config_key
from autotuner.output.formatting import format_config
from autotuner.results.records import baseline, best, records, stored_reference
from autotuner.spec.job import load_spec
from autotuner.trials.outcomes import Outcome

SPECS = {
    "mlp": "studies/bench-mlp.yaml",
    "cnn": "studies/bench-cnn.yaml",
    "gpt": "studies/bench-gpt.yaml",
    "resnet": "studies/bench-resnet.yaml",
}
RELEASED = ("compile", "memory_format", "optimizer", "checkpointing", "attention", "prefetch_factor")
"""Knobs the benchmark specs hold at one value for their recorded grids; the search here searches
them (the preset's values), as a user's study of the `pytorch-cpu` preset would. `torch.compile`
among them: the rule of thumb compiles, and a search kept from it could lose to the rule by the
compile's gain alone."""
PROBE_STEPS = 3
"""Optimizer steps a finder's probe takes at one batch size (Lightning's `steps_per_trial`)."""
LIGHTNING_INIT = 2
"""Lightning's `init_val`: the first batch size its power mode tries."""
LIGHTNING_MAX_TRIALS = 25


class Finder:
    """Batch sizes probed for fit: one real trial process each, fp32 with the baseline's other knobs."""

    def __init__(self, trials: Trials):
        self.trials = trials
        self.probes: list[dict[str, Any]] = []

    def config(self, batch: int) -> Config:
        job = self.trials.job
        return job.complete({**job.baseline, "precision": "fp32", "batch_size": batch})

    def fits(self, batch: int) -> bool:
        """`PROBE_STEPS` optimizer steps at micro-batch `batch` (no accumulation): True when they
        ran, False on an out-of-memory error; any other failure ends the finder, as it does theirs."""
        config = {**self.config(batch), "accumulation": 1}
        request = self.trials.request(config, global_batch=batch, drift_steps=PROBE_STEPS, measure=False)
        result = self.trials.run(config, request)
        self.probes.append({"batch_size": batch, "outcome": result.outcome.value, "wall_s": result.wall_s})
        if result.outcome not in (Outcome.OK, Outcome.OOM):
            raise RuntimeError(f"batch-size probe at {batch}: {result.outcome}: {result.reason}")
        return result.outcome is Outcome.OK

    def lightning_power(self) -> int:
        """`Tuner.scale_batch_size(mode="power")`: double until an OOM, then keep the last fit."""
        limit = self.trials.job.spec.global_batch
        size, any_success = LIGHTNING_INIT, False
        for _ in range(LIGHTNING_MAX_TRIALS):
            if self.fits(size):
                any_success = True
                if size * 2 > limit or limit % (size * 2):  # Lightning: "unchanged" at the dataset's length
                    break
                size *= 2
            else:
                size //= 2
                if any_success:
                    break
        return size

    def accelerate(self) -> int:
        """`find_executable_batch_size`: from a high start (the global batch), halve on each OOM."""
        size = self.trials.job.spec.global_batch
        while size > 0:
            if self.fits(size):
                return size
            size //= 2
        raise RuntimeError("no executable batch size found, reached zero")


def compare(
    name: str,
    spec: str,
    rounds: int,
    folder: Path,
    search_args: Sequence[str] = (),
    guide_compile: bool = True,
) -> dict[str, Any]:
    """The four configs of `spec`'s job, measured. `search_args` are passed on to `autotuner search`
    (e.g. `--timeout`); `guide_compile` False leaves `torch.compile` out of the rule of thumb
    (benchmarks/gpu.py's CPU dry run, where a compile costs more than the rest together)."""
    job = load_spec(spec)
    print(f"\n== {name}: autotuner search --spec {spec} {' '.join(search_args)}".rstrip(), flush=True)
    search: SearchRun = run_search(Path(spec), job.name, folder, *search_args)
    study_trials = records(search.study)
    winner, study_baseline = best(study_trials), baseline(study_trials)
    reference = stored_reference(search.study)
    assert reference is not None  # the search ran it

    trials = Trials(job)
    environment = trials.environment
    finder = Finder(trials)
    started = time.perf_counter()
    lightning = finder.lightning_power()
    lightning_s, lightning_probes = time.perf_counter() - started, list(finder.probes)
    finder.probes.clear()
    started = time.perf_counter()
    accelerate = finder.accelerate()
    accelerate_s, accelerate_probes = time.perf_counter() - started, list(finder.probes)

    configs: dict[str, Config] = {
        "baseline": job.complete(job.baseline),
        "finder (Lightning power)": finder.config(lightning),
        "finder (Accelerate)": finder.config(accelerate),
        "rule of thumb": guide_config(job, trials.capabilities, environment, lightning)
        | ({} if guide_compile else {"compile": "none"}),
        "tuned": dict(winner.config) if winner else job.complete(job.baseline),
    }
    measured: dict[tuple[Any, ...], list[Any]] = {config_key(c): [] for c in configs.values()}
    for round_ in range(rounds):
        for label, config in configs.items():
            key = config_key(config)
            if len(measured[key]) > round_:
                continue  # the same config under another label (the two finders often agree)
            print(f"  {name} round {round_ + 1}: {label}: {format_config(config)}", flush=True)
            measured[key].append(stored(job, config, trials.run(config), reference, environment))

    def summary(config: Config) -> dict[str, Any]:
        runs = measured[config_key(config)]
        ok = [r for r in runs if r.outcome == Outcome.OK.value]
        return {
            "config": config,
            "outcomes": [r.outcome for r in runs],
            "throughput": statistics.median(r.throughput for r in ok) if ok else 0.0,
            "throughputs": [r.throughput for r in runs],
            "drift": max((r.drift for r in runs), default=None),
            "feasible": all(r.feasible for r in runs),
            "reason": next((r.reason for r in runs if r.reason), ""),
            "warmups_s": [float(r.metrics.get("warmup_s") or 0.0) for r in runs],
        }

    rows = {label: summary(config) for label, config in configs.items()}
    base = rows["baseline"]["throughput"]
    for row in rows.values():
        row["over_baseline"] = row["throughput"] / base if base else None
    return {
        "spec": spec,
        "machine": machine(environment),
        "global_batch": job.spec.global_batch,
        "drift_tolerance": job.spec.objective.max_drift,
        "reference_noise_floor": reference.noise_floor,
        "configs": rows,
        "finders": {
            "lightning_power": {"batch_size": lightning, "probes": lightning_probes, "wall_s": lightning_s},
            "accelerate": {"batch_size": accelerate, "probes": accelerate_probes, "wall_s": accelerate_s},
            "any_oom": any(p["outcome"] == Outcome.OOM.value for p in lightning_probes + accelerate_probes),
        },
        "search": {
            "exit_code": search.exit_code,
            "wall_s": search.wall_s,
            "trials_ran": sum(t.ran for t in study_trials),
            "space_size": job.space.size,
            "best_config": winner.config if winner else None,
            "best_throughput": winner.throughput if winner else None,
            "baseline_throughput": study_baseline.throughput if study_baseline else None,
            "speedup_in_study": winner.throughput / study_baseline.throughput
            if winner and study_baseline and study_baseline.throughput
            else None,
        },
    }


def released(spec: str, folder: Path) -> str:
    """`spec` with its single-valued `RELEASED` knobs dropped from its space and its budget dropped
    (the default's), written to `folder`."""
    data = yaml.safe_load(Path(spec).read_text())
    data.pop("budget", None)
    space = data["space"]
    for knob in RELEASED:
        if isinstance(space.get(knob), list) and len(space[knob]) == 1:
            del space[knob]
    path = folder / Path(spec).name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", action="append", choices=list(SPECS), help="default: all four")
    parser.add_argument("--rounds", type=int, default=3, help="measurements of each config, in turn (default 3)")
    args = parser.parse_args()
    started = time.perf_counter()
    workloads = {}
    with tempfile.TemporaryDirectory() as folder:
        # A cold torch.compile cache, as a first run has.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(folder) / "inductor-cache")
        for name in args.workload or list(SPECS):
            workloads[name] = compare(name, released(SPECS[name], Path(folder)), args.rounds, Path(folder))
            workloads[name] |= {"spec": SPECS[name], "released": list(RELEASED)}
    results = {
        "machine": next(iter(workloads.values()))["machine"],
        "rounds": args.rounds,
        "wall_s": time.perf_counter() - started,
        "workloads": workloads,
    }
    print(write_results("alternatives.json", results))
    for name, data in workloads.items():
        for label, row in data["configs"].items():
            ratio = row["over_baseline"] or 0.0
            print(f"{name:>4} {label:<26} {row['throughput']:>10,.0f}/s {ratio:5.2f}x drift {row['drift']:.2e}")


if __name__ == "__main__":
    main()
