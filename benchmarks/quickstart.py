"""A CPU quickstart, measured: wall time, trials, baseline and best throughput, overheads, the
export's speedup with its interval, and whether applying the winner keeps it. PyTorch's by
default; JAX's with `--spec studies/quickstart-jax.yaml`.

    python benchmarks/quickstart.py [--spec studies/quickstart.yaml] [--apply-runs 5] [--out NAME.json]

Runs `autotuner search` on the spec in a fresh temporary folder (so a fresh study), times it,
then reads the study back from its storage, then runs the exported best config `--apply-runs`
times as `autotuner apply` does (default steps: 10x a trial's; each time the baseline beside it,
for as many steps: in lockstep on a CPU; then the promise check's rounds, the two configs
measured as the study's re-measurement measured them, which give apply's own speedup and its 90%
interval). Each apply's verdict on the export's promise: kept, not kept or undecided
(`autotuner.results.applied_run.AppliedRun.verdict`; "agrees" when kept). Last, the run-time check (`--run-s`,
default 60): `autotuner apply --steps N --no-baseline` of the winner in a fresh interpreter, N the
steps the study's throughput says take that long; its "run time:" line (the steps it took, set-up
and warm-up included, against the study's `run_s` for as many) and its whole process's wall time.
Writes benchmarks/results/<name>.json (or `--out`: one file per kind of machine).

Targets: at least 4 of 5 applies keep the export's promise, none "not kept"; on the PyTorch quickstart the export's
interval is at most +-8% (half-width).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna

from autotuner.results.records import baseline, best, records, speedup, speedup_interval, stored_reference


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", default="studies/quickstart.yaml")
    parser.add_argument("--apply-runs", type=int, default=5)
    parser.add_argument("--run-s", type=float, default=60.0, help="the run-time check's length (0: none)")
    parser.add_argument("--out", help="the result file's name in benchmarks/results (default: the spec's name)")
    args = parser.parse_args()
    spec = Path(args.spec).resolve()
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "autotuner", "search", "--spec", str(spec)],
            cwd=folder,
            env={**os.environ, "COLUMNS": "160"},
        )
        wall_s = time.perf_counter() - started
        name = spec.stem
        study = optuna.load_study(study_name=name, storage=f"sqlite:///{folder}/runs/{name}/study.db")
        trials = records(study)
        winner, base = best(trials), baseline(trials)
        ran = [t for t in trials if t.ran]
        startup = [t.metrics["startup_s"] for t in ran if t.metrics.get("startup_s") is not None]
        measured = sum(t.metrics.get("measured_s", 0.0) for t in ran)
        reference = stored_reference(study)
        assert reference is not None  # the search ran it
        results = {
            "spec": str(Path(args.spec)),
            "exit_code": done.returncode,
            "device": study.user_attrs["environment"]["device_name"],
            **{  # the framework the backend runs: torch, or jax and jaxlib
                name: version
                for name, version in study.user_attrs["environment"]["versions"].items()
                if name in ("torch", "jax", "jaxlib")
            },
            "wall_s": wall_s,
            "trials_ran": len(ran),
            "trials_recorded": len(trials),
            "outcomes": {o: sum(t.outcome == o for t in trials) for o in sorted({t.outcome for t in trials})},
            "baseline": {
                "config": base.config,
                "throughput": base.throughput,
                "throughput_runs": base.throughputs,
                "run_spread": base.run_spread,
            }
            if base
            else None,
            "best": {
                "config": winner.config,
                "throughput": winner.throughput,
                "trial_throughput": winner.trial_throughput,
                "throughput_runs": winner.throughputs,
                "run_spread": winner.run_spread,
                "drift": winner.metrics.get("drift"),
                "spread": winner.metrics.get("throughput_spread"),
            }
            if winner
            else None,
            # Two trial processes of one config, as far apart as they came out: each re-measured
            # config's consecutive runs (the trial's, then its re-runs), relative to their mean...
            "remeasured_pair_gaps": [
                abs(a - b) / ((a + b) / 2)
                for t in trials
                if t.remeasured is not None
                for a, b in zip(t.throughputs, t.throughputs[1:], strict=False)
            ],
            # ... and its re-runs alone (on a CPU measured in one lockstep group)
            "rerun_pair_gaps": [
                abs(a - b) / ((a + b) / 2)
                for t in trials
                if t.remeasured is not None
                for a, b in zip(t.throughputs[1:], t.throughputs[2:], strict=False)
            ],
            "speedup": speedup(winner, base) if winner else None,
            "speedup_interval": interval.as_dict() if (interval := winner and speedup_interval(winner)) else None,
            "speedup_rounds": winner.remeasured.speedups if winner and winner.remeasured else [],
            "trial_startup_s_median": statistics.median(startup) if startup else None,
            "trial_wall_s_median": statistics.median(t.metrics["wall_s"] for t in ran) if ran else None,
            "measured_windows_s": measured,
            "reference_noise_floor": reference.noise_floor,
            "reference_wall_s": reference.wall_s,
            "drift_tolerance": study.user_attrs["autotuner"]["max_drift"],
        }
        export = Path(folder) / "runs" / name / "best.yaml"
        if winner and export.exists() and args.apply_runs:
            results["apply"] = _apply(export, spec, args.apply_runs)
        if winner and export.exists() and args.run_s:
            results["run_time"] = _run_time(export, spec, args.run_s)
    out = Path(__file__).parent / "results" / (args.out or f"{name}.json")
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


def _apply(export: Path, spec: Path, runs: int) -> dict[str, object]:
    """`autotuner apply` of the export, `runs` times: its throughput over the study's, and its
    promise check's speedup and interval against the export's."""
    from autotuner.apply import load_config
    from autotuner.results.promise import Verdict
    from autotuner.search.apply_run import apply_config, default_steps
    from autotuner.spec.job import load_spec

    tuned, job = load_config(export), load_spec(spec)
    applied = []
    for number in range(1, runs + 1):
        run = apply_config(tuned, job, note=print)
        applied.append(run)
        verdict = run.verdict.value if run.verdict else None
        print(f"apply {number}/{runs}: {run.checked_speedup}x, interval {run.interval}, promise {verdict}")
    ratios = [run.ratio for run in applied]
    promise = [run.promise_ratio for run in applied if run.promise_ratio is not None]
    agree = [run.verdict is Verdict.KEPT for run in applied]
    return {
        "steps": default_steps(job),
        # what each run really took: the requested steps in windows lengthened to min_window_s
        "steps_run": [run.throughput.steps * run.throughput.windows for run in applied],
        "study_throughput": tuned.throughput,
        "throughputs": [run.samples_per_s for run in applied],
        "ratios": ratios,
        "ratio_median": statistics.median(ratios),
        "within_10_percent": sum(abs(r - 1) <= 0.10 for r in ratios),
        # the last quarter of each run's windows against the first (median): > 0 slower at the end
        "slowdowns": [run.slowdown for run in applied],
        "export_speedup": tuned.speedup,
        "export_interval": tuned.speedup_interval.as_dict() if tuned.speedup_interval else None,
        # The promise check: rounds of both configs measured as the study's re-measurement measured
        # them; each apply's speedup and its interval, at 90% and at the level of the look that decided.
        "rounds": [list(run.rounds) for run in applied],
        "speedups_checked": [run.checked_speedup for run in applied],
        "intervals": [run.interval.as_dict() if run.interval else None for run in applied],
        "checked": [run.checked.as_dict() if run.checked else None for run in applied],
        # what the export promised: its interval (or its speedup) widened by the tolerance
        "promised": [[run.promised.low, run.promised.high] if run.promised else None for run in applied],
        "agree": agree,
        "agreed": sum(bool(a) for a in agree),
        "verdicts": [run.verdict.value if run.verdict else None for run in applied],
        "tolerance": applied[0].tolerance if applied else None,
        "rounds_errors": [run.rounds_error for run in applied if run.rounds_error],
        # The whole run's speedup: the baseline over as many optimizer steps, in lockstep on a CPU.
        "baseline_throughputs": [run.baseline.samples_per_s for run in applied if run.baseline],
        "baseline_steps_run": [run.baseline.steps * run.baseline.windows for run in applied if run.baseline],
        "speedups_delivered": [run.speedup for run in applied],
        "promise_ratios": promise,
    }


def _run_time(export: Path, spec: Path, seconds: float) -> dict[str, object]:
    """`autotuner apply --steps N --no-baseline` from a cold start (a fresh interpreter, as a real
    run starts), N the steps that take `seconds` at the export's throughput: the run's time as
    apply measures it (its steps, set-up and warm-up included) against the study's prediction for
    as many steps, and the process's wall time (interpreter, imports, probe, drift check too)."""
    from autotuner.apply import load_config
    from autotuner.results.run_time import predicted_run_s
    from autotuner.spec.job import load_spec

    tuned, job = load_config(export), load_spec(spec)
    steps = math.ceil(seconds * tuned.throughput / job.spec.global_batch)
    command = [sys.executable, "-m", "autotuner", "apply", str(export), "--spec", str(spec)]
    started = time.perf_counter()
    done = subprocess.run(
        [*command, "--steps", str(steps), "--no-baseline"], capture_output=True, text=True, cwd=export.parents[2]
    )
    wall_s = time.perf_counter() - started
    print(done.stdout, done.stderr, sep="")
    line = re.search(
        r"run time: ([\d,]+) optimizer steps took ([\d.]+) s here.*?\(compile cache (\w+)\); the study predicts "
        r"([\d.]+) s for as many: ratio ([\d.]+)",
        done.stdout,
    )
    if done.returncode != 0 or line is None:
        return {"steps": steps, "error": (done.stdout + done.stderr)[-800:]}
    taken = int(line[1].replace(",", ""))
    return {
        "steps": steps,
        "steps_taken": taken,
        "run_s_here": float(line[2]),
        "compile_cache": line[3],
        "run_s_predicted": float(line[4]),
        "ratio": float(line[2]) / float(line[4]),
        "within_10_percent": abs(float(line[2]) / float(line[4]) - 1) <= 0.10,
        # the whole command, interpreter start to exit, against the study's run_s for the steps asked
        "process_wall_s": wall_s,
        "run_s_predicted_for_steps": predicted_run_s(
            tuned.metrics,
            tuned.throughput,
            job.spec.global_batch,
            steps,
            tuned.machine.framework_start_s or 0.0,
        ),
    }


if __name__ == "__main__":
    main()
