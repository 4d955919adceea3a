"""What the tuner costs beyond the training it measures.

    python benchmarks/overhead.py [--spec studies/quickstart.yaml] [--grid-spec studies/bench-mlp.yaml] [--runs 20]
                                  [--before REVISION [--pairs N]]

1. Trial process start-up: the fork server against a fresh interpreter (`trial_overhead.py`, run
   in its own interpreter), and the start-up the real study's trials stored.
2. A real study: `autotuner search` on the spec in a fresh folder, timed from the command's
   start to its exit (with `--before`, also autotuner as of that revision on the spec as of it).
   From the storage: the sum of the trials' wall time and of their measured windows (and of
   re-measurement's, which its claims store; older revisions stored none), the reference's
   wall time, and the trials' start and end times, from which the
   search process's own time per trial (asking the sampler, claiming, recording, reading the
   study back, printing) is the gap between one trial's start and the next one's, less the trial
   process's wall time. Also the share of the search's wall time that the measured windows are.
3. Micro-benchmark of the bookkeeping on SQLite: the study set up as the search sets it up
   (`open_storage`, `open_study`, the spec's sampler as `autotuner.search.loop.job_sampler` builds
   it, the baseline enqueued) for the grid spec's job, then for every config of its recorded grid
   (`benchmarks/results/grid-<name>.json`, from `search_efficiency.py`) the time of
   `study.ask` (the sampler's proposal) and of `autotuner.results.store.record` (from the grid's result).

Writes benchmarks/results/overhead.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from _harness import (
    RESULTS,
    ROOT,
    install_revision,
    machine,
    measured_job,
    quartiles,
    result_from_json,
    revision,
    run_search,
    with_held,
    write_results,
)

from autotuner.config.knobs import config_key
from autotuner.results.evidence import Reference
from autotuner.results.records import records, remeasurements, stored_reference
from autotuner.results.store import Yardstick, record
from autotuner.search.loop import job_sampler
from autotuner.spec.job import Job, load_spec
from autotuner.study.storage import open_storage, open_study
from autotuner.trials.probe import Environment  # noqa: E402


def startup(runs: int, folder: Path) -> dict[str, Any]:
    """`trial_overhead.py` in its own interpreter: a trial process re-imports the launching
    script's main module (multiprocessing's rule), so timed from here it would pay this script's
    imports, which `autotuner search` (`python -m autotuner`) does not."""
    out = folder / "startup.json"
    script = Path(__file__).parent / "trial_overhead.py"
    subprocess.run([sys.executable, str(script), "--runs", str(runs), "--out", str(out)], check=True)
    return dict(json.loads(out.read_text()))


def study_overhead(spec: str, folder: Path, python: str = sys.executable) -> dict[str, Any]:
    job = load_spec(spec)
    folder.mkdir(parents=True, exist_ok=True)
    search = run_search(Path(spec), job.name, folder, python=python)
    study = search.study
    trials = records(study)
    frozen = {t.number: t for t in study.get_trials(deepcopy=False)}
    ran = sorted((t for t in trials if t.ran), key=lambda t: t.number)
    trial_wall = sum(float(t.metrics["wall_s"]) for t in ran)
    measured = sum(float(t.metrics.get("measured_s") or 0.0) for t in ran)
    warmup = sum(float(t.metrics.get("warmup_s") or 0.0) for t in ran)
    reference = stored_reference(study)
    assert reference is not None  # the search ran it
    starts = [frozen[t.number].datetime_start for t in ran]
    ends = [frozen[t.number].datetime_complete for t in ran]
    # The search process's own time per trial: from a trial's start to the next one's, less the
    # trial process's wall time (the last trial: to its end).
    gaps = [(b - a).total_seconds() for a, b in zip(starts, starts[1:], strict=False)] + [
        (ends[-1] - starts[-1]).total_seconds()
    ]
    loop = [gap - float(t.metrics["wall_s"]) for gap, t in zip(gaps, ran, strict=True)]
    outside = search.wall_s - trial_wall - reference.wall_s
    # re-measurement's timed windows: None where its claims do not store them (older revisions)
    stored = [r.measured_s for r in remeasurements(study).values() if r.measured_s]
    remeasured = sum(map(sum, stored)) if stored else None
    return {
        "spec": spec,
        "machine": machine(study.user_attrs["environment"]),
        "exit_code": search.exit_code,
        "search_wall_s": search.wall_s,
        "trials_ran": len(ran),
        "trials_wall_s": trial_wall,
        "measured_windows_s": measured,
        "warmup_s": warmup,
        "reference_wall_s": reference.wall_s,
        "wall_over_measured_windows": search.wall_s / measured,
        "remeasured_windows_s": remeasured,
        "wall_over_all_measured_windows": search.wall_s / (measured + remeasured) if remeasured is not None else None,
        "measured_share_of_wall": measured / search.wall_s,
        "outside_trials_per_trial_s": outside / len(ran),
        "loop_per_trial_s": quartiles(loop),
        "before_first_trial_s": (starts[0] - search.started).total_seconds(),
        "after_last_trial_s": (search.ended - ends[-1]).total_seconds(),
        "trial_startup_s": quartiles([float(t.metrics["startup_s"]) for t in ran if t.metrics.get("startup_s")]),
    }


def bookkeeping(job: Job, grid: dict[str, Any], folder: Path) -> dict[str, Any]:
    """`study.ask` and `record` timed on SQLite, over every config of the grid."""
    table = {config_key(e["params"]): e for e in grid["trials"]}
    storage = open_storage(f"sqlite:///{folder}/bookkeeping.db", heartbeat=True)
    study = open_study(storage, job, Environment.from_dict(grid["environment"]))
    sampler = job_sampler(job, job.backend.capabilities(grid["environment"]["capabilities"]))
    study.sampler = sampler
    study.enqueue_trial(job.baseline, user_attrs={"role": "baseline"})
    reference = Reference.from_dict(grid["reference"])
    ask_s, record_s = [], []
    while sampler.fresh_configs(study):
        started = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # as the search: Optuna warns that heartbeats are meant for optimize()
            trial = study.ask(dict(sampler.space))
        asked = time.perf_counter()
        entry = table[config_key(trial.params)]
        record(
            study,
            trial,
            job.complete(trial.params),
            result_from_json(entry),
            role=trial.user_attrs.get("role", "search"),
            against=Yardstick(job, reference, Environment.from_dict(grid["environment"])),
        )
        ask_s.append(asked - started)
        record_s.append(time.perf_counter() - asked)
    first, last = slice(0, 10), slice(-10, None)
    return {
        "storage": "sqlite (file)",
        "sampler": job.sampler.name,
        "trials": len(ask_s),
        "ask_s": quartiles(ask_s),
        "record_s": quartiles(record_s),
        "ask_s_median_first_10": statistics.median(ask_s[first]),
        "ask_s_median_last_10": statistics.median(ask_s[last]),
        "record_s_median_first_10": statistics.median(record_s[first]),
        "record_s_median_last_10": statistics.median(record_s[last]),
    }


def spec_at(revision: str, spec: str, folder: Path) -> str:
    """`spec` as it was at git `revision` (the README's first command then ran that one; a later
    spec may name knobs that revision lacks), written into `folder`; `spec` itself where the
    revision has no such file."""
    shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:{spec}"], capture_output=True, text=True)
    if shown.returncode != 0:
        return spec
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / Path(spec).name
    path.write_text(shown.stdout)
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", default="studies/quickstart.yaml", help="the study whose overhead is measured")
    parser.add_argument("--grid-spec", default="studies/bench-mlp.yaml", help="whose grid the micro-benchmark uses")
    parser.add_argument("--runs", type=int, default=20, help="trial processes started for the start-up figure")
    parser.add_argument(
        "--before", metavar="REVISION", help="also run the study with autotuner as of this git revision, alternately"
    )
    parser.add_argument("--pairs", type=int, default=1, help="with --before: before/now pairs of studies")
    args = parser.parse_args()
    job = load_spec(args.grid_spec)
    grid_path = RESULTS / f"grid-{job.name}.json"
    if not grid_path.exists():
        raise SystemExit(f"{grid_path} is missing: run python benchmarks/search_efficiency.py --spec {args.grid_spec}")
    grid = json.loads(grid_path.read_text())
    if grid["job"] != measured_job(job):
        raise SystemExit(f"{grid_path} was recorded for another version of {args.grid_spec}: record it again")
    grid = with_held(job, grid)  # its entries lack the knobs added since, held at their reference
    with tempfile.TemporaryDirectory() as folder:
        results: dict[str, Any] = {"startup": startup(args.runs, Path(folder))}
        # first: seconds, where a fault would otherwise lose the minutes of studies before it
        results["bookkeeping"] = bookkeeping(job, grid, Path(folder))
        if args.before:
            before = install_revision(args.before, Path(folder) / "before")
            before_spec = spec_at(args.before, args.spec, Path(folder) / "before-spec")
            pairs = [
                (
                    study_overhead(before_spec, Path(folder) / f"b{n}", before),
                    study_overhead(args.spec, Path(folder) / f"a{n}"),
                )
                for n in range(args.pairs)
            ]
            results["before"] = {
                "revision": args.before,
                "spec": f"{args.spec} as of {args.before}" if before_spec != args.spec else args.spec,
                "studies": [b for b, _ in pairs],
            }
            results["studies"] = [a for _, a in pairs]
            results["search_wall_now_over_before"] = statistics.median(
                a["search_wall_s"] / b["search_wall_s"] for b, a in pairs
            )
            results["study"] = pairs[-1][1]
        else:
            results["study"] = study_overhead(args.spec, Path(folder))
    results["machine"] = results["study"]["machine"]
    results["revision"] = revision()
    print(json.dumps(results, indent=2))
    print(write_results("overhead.json", results))


if __name__ == "__main__":
    main()
