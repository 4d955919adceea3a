"""One command on one GPU: the GPU benchmarks, each part within 9 minutes on one H100.

    python benchmarks/gpu.py [--part study|apply|alternatives|jax|all] [--device cuda:0] [--tiny] [--out DIR] [--force]
    python benchmarks/gpu.py --lease OUT | --lease-more OUT [--device cuda:0] [--tiny] [--work DIR]

Parts (`all`: the four, in this order; on a GPU run them one command each, since a lent machine
may stop a command at 10 minutes):

* `study`: `autotuner search` of `studies/gpu-gpt.yaml` (GPT-2 small's shape, the full `pytorch`
  preset, energy per sample as a third objective) in a fresh study: the device and environment
  (the study's `environment` attr), the best config, tuned over baseline, the tuned MFU and tokens/s,
  energy per sample, every trial's outcome. Writes `gpu-study.json`.
* `apply`: `autotuner apply` of that study's winner (`runs/gpu-gpt/best.yaml` in the work
  folder: run `study` first, with the same `--work`), the baseline run after it, then its promise
  check's rounds: the speedup here with its interval against the export's (the promise: they
  agree). Writes `gpu-apply.json`.
* `alternatives`: the tuned config against the alternatives (`benchmarks/alternatives.py`:
  baseline, rule of thumb, the Lightning and Accelerate batch-size finders, tuned) on `gpt` (the
  `study` part's study when the work folder holds it: its search resumes and stops at once) and
  `cnn` (`studies/gpu-cnn.yaml`).
  `--workload gpt` or `--workload cnn` runs one (the other's finished entry in the file is kept).
  Writes `gpu-alternatives.json`.
* `jax`: `autotuner search` of `studies/gpu-gpt-jax.yaml` (the JAX twin of the GPT, the full `jax`
  preset). Writes `gpu-jax.json`.

`--lease OUT` is one command for a lent GPU (at most 8 minutes, `LEASES`): the parts `study`
(`--timeout 70`, then re-measurement and the profile), `apply` (`--steps 20`), `jax` (its reference
and two trials) and `tests` (`pytest -m gpu` of the quick tests), each step within its budget (its
command interrupted, then killed; the step recorded so, the next one run all the same), their
files, `lease.json` (the plan and what each step did) and the logs' tails into OUT. `--lease-more
OUT` runs what it leaves out: the full JAX study, the out-of-memory trial and the compile modes with
accumulation (`tests`). A dry run's budgets are seconds (`Step.tiny_budget_s`).

Every part runs the real CLI (`python -m autotuner ...` as subprocesses, their output shown and
kept in `<work>/logs/`) or the benchmark harness, reads the study back from its storage and
writes `gpu-<part>.json`, with the device named and the commands and their wall times, into
`<work>/logs/` and into the results folder: `benchmarks/results/` for a GPU run, `--out` to
choose. A part has `--budget-s` seconds (default 540): a search still running then is interrupted
as Ctrl-C interrupts it (everything finished is kept and the best is exported), and the part
writes what it got; a part that fails writes what it got and the error.
`python benchmarks/tables.py` renders the files of benchmarks/results/ into benchmarks/README.md.

The committed results are evidence no run may lose silently (`replacement_refused`): a result
file is replaced only by a run on the device it names (its `device_name`), or with `--force`; a
dry run never replaces a GPU run's file, even with `--force`. A refused part's file stays in
`<work>/logs/` only, and the script exits 1 saying so.

`--tiny` shrinks the workloads, spaces and budgets to seconds; with `--device cpu` it runs on a
CPU end to end (tests/e2e/test_gpu_benchmark.py runs it so it cannot rot): configs a CPU cannot run
(tf32, CUDA graphs) are recorded unsupported, energy (which needs NVML's counter) is turned off
and the json says so, and the rule of thumb leaves `torch.compile` out (a CPU compile costs more
than the rest of the dry run). A dry run (`--tiny`, or any run on `--device cpu`) writes its
files into `<work>/results/` (`--out` to choose) and never into benchmarks/results/: the script
refuses that folder for it before running anything.

Installing autotuner and the GPU packages on a GPU machine: benchmarks/README.md, "Installing on a GPU machine".
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

import optuna
import yaml
from _harness import RESULTS, machine, write_results

from autotuner.output.formatting import percent, times
from autotuner.results.records import baseline, best, records, speedup, stored_reference

ROOT = Path(__file__).resolve().parents[1]

PARTS = ("study", "apply", "alternatives", "jax")
"""What `--part all` runs, in this order (apply uses the study's export)."""
SPECS = {"gpt": "studies/gpu-gpt.yaml", "cnn": "studies/gpu-cnn.yaml", "jax": "studies/gpu-gpt-jax.yaml"}
PART_BUDGET_S = 540.0
"""Nine minutes a part: a lent GPU machine may stop one command at ten."""
WRITE_RESERVE_S = 30.0
"""What a part keeps, after its last command, to read the study back and write its file."""
INTERRUPT_GRACE_S = 45.0
"""How long a search interrupted at the time limit has to record its trial and export the best."""
ALTERNATIVES_SEARCH_S = {"gpt": 150.0, "cnn": 90.0}
"""Seconds of trials (`autotuner search --timeout`) the alternatives part gives each search: the
gpt study of the `study` part, resumed, has spent more and stops at once."""
ALTERNATIVES_MIN_LEFT_S = {"gpt": 300.0, "cnn": 300.0}
"""A workload of the alternatives part starts only with this much of the part's time left (its
finders and measurements cannot be interrupted part-way, as a search can): otherwise the file
says to run it alone (`--workload`)."""

TINY_WORKLOAD_ARGS: dict[str, dict[str, Any]] = {
    "builtin:gpt": {"vocab": 32, "length": 16, "dim": 16, "layers": 1, "heads": 2, "samples": 64},
    "builtin:cnn": {"size": 8, "width": 4, "classes": 4, "samples": 64},
}
TINY_SPACE: dict[str, dict[str, Any]] = {
    # tf32 and reduce-overhead (CUDA graphs) are there for a CPU to record as unsupported
    "pytorch": {
        "preset": "pytorch",
        "precision": ["fp32", "bf16", "tf32"],
        "batch_size": [4, 16],
        "workers": [0],
        "compile": ["none", "reduce-overhead"],
    },
    "jax": {
        "preset": "jax",
        "precision": ["fp32", "bf16", "tf32"],
        "batch_size": [4, 16],
        "workers": [0],
        "jit": ["off", "on"],
    },
}
TINY_TRIAL = {
    "warmup_steps": 1,
    "steps": 2,
    "windows": 2,
    "min_window_s": 0.0,
    "drift_steps": 2,
    "timeout": 120,
    "quiet_wait": 0,  # a dry run's figures are not evidence: a contended trial is run again at once
}
TINY_BUDGET = {"trials": 3, "remeasure_top": 0}
TINY_GLOBAL_BATCH, TINY_BASELINE_BATCH = 16, 4

TARGETS = {"speedup": 3.0, "speedup_stretch": 5.0, "mfu": 0.45, "mfu_stretch": 0.50, "promise": 0.05}
"""What the GPU run is to reach on one H100: the tuned gpt's speedup over its baseline (and the
stretch), the tuned gpt's MFU (and the stretch), and `autotuner apply` within 5% of the export's speedup."""


JAX_CUDA_INSTALL = "pip install 'jax[cuda13]', or 'jax[cuda12]' where the driver is CUDA 12"
"""How to get a JAX that sees the GPU: the GPU machines this project uses carry jax 0.11.2 with
the CUDA 13 plugin (`jax-cuda13-plugin`, `jax-cuda13-pjrt`)."""


class PartError(Exception):
    """A part cannot go on: its file records this message as the error."""


# ------------------------------------------------------------------ running commands


class Deadline:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "160", **(extra or {})}


def run_command(
    command: list[str],
    cwd: Path,
    until: float,
    log: Path,
    env: dict[str, str] | None = None,
    grace: float = INTERRUPT_GRACE_S,
) -> dict[str, Any]:
    """Run `command` in `cwd`, its output shown and written to `log`; at `until` (time.monotonic)
    interrupt it as Ctrl-C does (the CLI keeps what is finished, records the running trial and
    exports the best), and kill it if it is still there `grace` seconds later."""
    log.parent.mkdir(parents=True, exist_ok=True)
    shown = shlex.join(["python", *command[1:]] if command[0] == sys.executable else command)
    print(f"\n$ (cd {cwd} && {shown})", flush=True)
    tail: collections.deque[str] = collections.deque(maxlen=60)
    started = time.perf_counter()
    stopped = killed = False
    with log.open("w") as sink:
        process = subprocess.Popen(
            command,
            cwd=cwd,
            env=env or _env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            # A script started in the background (`nohup ... &`) inherits SIGINT ignored, and a
            # Python started so installs no KeyboardInterrupt handler: the interrupt below would
            # do nothing and the command be killed, losing its export. Restore the default.
            preexec_fn=functools.partial(signal.signal, signal.SIGINT, signal.SIG_DFL),
        )

        def relay() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                sink.write(line)
                tail.append(line)

        reader = threading.Thread(target=relay, daemon=True)
        reader.start()
        try:
            process.wait(timeout=max(1.0, until - time.monotonic()))
        except subprocess.TimeoutExpired:
            stopped = True
            print(f"\n[gpu.py] the part's time limit: interrupting {command[3] if len(command) > 3 else shown}")
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                killed = True
                process.kill()
                process.wait()
        except BaseException:
            process.kill()
            process.wait()
            raise
        finally:
            reader.join(timeout=10)
    return {
        "command": shown,
        "cwd": str(cwd),
        "exit_code": process.returncode,
        "wall_s": time.perf_counter() - started,
        "stopped_at_time_limit": stopped,
        "killed": killed,
        "log": str(log),
        "output_tail": "".join(tail)[-4000:],
    }


# ------------------------------------------------------------------ specs


class Context:
    """What every part shares: the arguments, the folders, the part's deadline."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.tiny: bool = args.tiny
        self.device: str | None = args.device
        self.force: bool = args.force
        default_work = Path(tempfile.gettempdir()) / ("autotuner-gpu-tiny" if args.tiny else "autotuner-gpu")
        self.work = Path(args.work).resolve() if args.work else default_work
        self.out = Path(args.out).resolve() if args.out else self.work / "results" if self.dry else RESULTS.resolve()
        self.refused: dict[str, str] = {}
        """Part -> why its file was not written into `out` (the result files there are kept)."""
        self.budget_s: float = args.budget_s
        self.deadline = Deadline(self.budget_s)
        self.write_reserve_s, self.grace_s = WRITE_RESERVE_S, INTERRUPT_GRACE_S
        self.extra_args: dict[str, list[str]] = {}
        """Part -> arguments added to its command (the lease's shorter searches, the tests' selection)."""

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"

    @property
    def dry(self) -> bool:
        """A dry run (`--tiny`) or a CPU run: its files are no evidence of a GPU."""
        return self.tiny or self.on_cpu

    def spec(self, key: str) -> tuple[Path, dict[str, Any], list[str]]:
        """The spec `SPECS[key]` as this run uses it (the device, `--tiny`'s sizes, energy off on a
        CPU), written to `<work>/specs/`; its data; what was changed, in words."""
        source = ROOT / SPECS[key]
        data = yaml.safe_load(source.read_text())
        changes = []
        if self.device:
            data["device"] = self.device
        if self.tiny:
            data["workload_args"] = dict(TINY_WORKLOAD_ARGS[data["workload"]])
            data["global_batch"] = TINY_GLOBAL_BATCH
            data["baseline"] = {**data["baseline"], "batch_size": TINY_BASELINE_BATCH}
            data["space"] = dict(TINY_SPACE[data["backend"]])
            data["budget"] = dict(TINY_BUDGET)
            data["trial"] = dict(TINY_TRIAL)
            changes.append("--tiny: workload, global batch, space, budget and trial settings shrunk to seconds")
        if (data.get("objective") or {}).get("energy") and self.on_cpu:
            data["objective"] = {**data["objective"], "energy": False}
            changes.append("objective.energy turned off: a CPU has no NVML energy counter (the search refuses it)")
        path = self.work / "specs" / source.name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {SPECS[key]} as benchmarks/gpu.py ran it\n" + yaml.safe_dump(data, sort_keys=False))
        return path, data, changes

    def search(self, spec: Path) -> list[str]:
        return [sys.executable, "-m", "autotuner", "search", "--spec", str(spec)]

    def until(self) -> float:
        """When a command of this part must stop (the part's deadline less the time to write up)."""
        return self.deadline.end - self.write_reserve_s - self.grace_s

    def run(self, command: list[str], log: str, env: dict[str, str] | None = None) -> dict[str, Any]:
        """`run_command` within this part's deadline, its log `<work>/logs/<log>`."""
        return run_command(command, self.work, self.until(), self.work / "logs" / log, env, self.grace_s)


def study_files(work: Path, name: str) -> list[Path]:
    folder = work / "runs" / name
    return [folder / "study.db", folder / "best.yaml", folder / "compile-cache"]


def fresh_study(work: Path, name: str) -> None:
    """Remove what an earlier run left of study `name` in the work folder (the database, the
    export, the compile cache): the part measures a first run."""
    for path in study_files(work, name):
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def load_study(work: Path, name: str) -> optuna.Study:
    database = work / "runs" / name / "study.db"
    if not database.exists():
        raise PartError(f"no study database at {database}: the search stopped before it began (see its output)")
    return optuna.load_study(study_name=name, storage=f"sqlite:///{database}")


def _number(value: Any) -> float | None:
    if value in (None, "inf", "-inf"):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


FIGURES = (
    "tokens_per_s",
    "tflops",
    "mfu",
    "energy_j_per_sample",
    "power_w_mean",
    "gpu_util_mean",
    "peak_memory_mb",
    "warmup_s",
    "throughput_spread",
)


def trial_figures(trial: Any) -> dict[str, Any]:
    """What a stored trial (`autotuner.results.records.TrialRecord`) says of itself, for the result file."""
    metrics = trial.metrics
    return {
        "trial": trial.number,
        "role": trial.role,
        "config": trial.config,
        "outcome": trial.outcome,
        "reason": (trial.reason or "")[:300],
        "feasible": trial.feasible,
        "throughput": trial.throughput,
        "trial_throughput": trial.trial_throughput,
        "remeasured": trial.remeasured is not None,
        "drift": metrics.get("drift"),
        **{key: metrics.get(key) for key in FIGURES},
        "compile_cache": metrics.get("compile_cache"),
    }


def study_summary(work: Path, name: str, energy: bool) -> dict[str, Any]:
    """The study `name` of the work folder, read from its storage and its export."""
    study = load_study(work, name)
    trials = records(study)
    winner, base = best(trials), baseline(trials)
    environment = study.user_attrs.get("environment") or {}
    reference = stored_reference(study)
    export_path = work / "runs" / name / "best.yaml"
    export = yaml.safe_load(export_path.read_text()) if export_path.exists() else None
    ok = [t for t in trials if t.outcome == "ok"]
    energies = [(e, t) for t in trials if t.feasible and (e := _number(t.metrics.get("energy_j_per_sample")))]
    lowest = min(energies, key=lambda pair: pair[0], default=None)
    gain = speedup(winner, base) if winner else None
    return {
        "device": environment.get("device"),
        "device_name": environment.get("device_name"),
        "machine": machine(environment),
        "environment": environment,
        "drift_tolerance": (study.user_attrs.get("autotuner") or {}).get("max_drift"),
        "reference_noise_floor": reference.noise_floor if reference else None,
        "trials_ran": sum(t.ran for t in trials),
        "trials_recorded": len(trials),
        "outcomes": {o: sum(t.outcome == o for t in trials) for o in sorted({t.outcome for t in trials})},
        "objectives": len(study.directions),
        "baseline": trial_figures(base) if base else None,
        "best": trial_figures(winner) if winner else None,
        "speedup": gain,
        "mfu": _number(winner.metrics.get("mfu")) if winner else None,
        "tokens_per_s": _number(winner.metrics.get("tokens_per_s")) if winner else None,
        "energy": {
            "objective": energy,
            "best_j_per_sample": _number(winner.metrics.get("energy_j_per_sample")) if winner else None,
            "baseline_j_per_sample": _number(base.metrics.get("energy_j_per_sample")) if base else None,
            "lowest_j_per_sample": lowest[0] if lowest else None,
            "lowest_trial": lowest[1].number if lowest else None,
            "lowest_config": lowest[1].config if lowest else None,
            "measured_trials": sum(_number(t.metrics.get("energy_j_per_sample")) is not None for t in ok),
        },
        "export": {
            "path": str(export_path),
            "params": export.get("params"),
            "speedup": export.get("speedup"),
            "run": export.get("run"),
            # the run's time, cost and energy (kWh, from NVML's energy counter), best then baseline
            "run_figures": {
                side: {k: (figures or {}).get(k) for k in ("run_s", "run_cost", "run_energy_kwh")}
                for side, figures in (("best", export.get("metrics")), ("baseline", export.get("baseline")))
            },
        }
        if export
        else None,
        "trials": [trial_figures(t) for t in trials],
    }


# ------------------------------------------------------------------ the parts


def part_study(ctx: Context, result: dict[str, Any]) -> None:
    spec, data, changes = ctx.spec("gpt")
    result.update(spec=SPECS["gpt"], spec_used=data, changes=changes)
    energy = bool((data.get("objective") or {}).get("energy"))
    fresh_study(ctx.work, data["name"])
    result["commands"].append(ctx.run(ctx.search(spec) + ctx.extra_args.get("study", []), "study.log"))
    result.update(study_summary(ctx.work, data["name"], energy))
    result["targets"] = {  # TARGETS, for one H100
        name: {"bar": bar, "stretch": stretch, "value": value, "met": None if value is None else value >= bar}
        for name, bar, stretch, value in (
            ("speedup", TARGETS["speedup"], TARGETS["speedup_stretch"], result["speedup"]),
            ("mfu", TARGETS["mfu"], TARGETS["mfu_stretch"], result["mfu"]),
        )
    }


def part_jax(ctx: Context, result: dict[str, Any]) -> None:
    spec, data, changes = ctx.spec("jax")
    result.update(spec=SPECS["jax"], spec_used=data, changes=changes)
    extra = {}
    arguments = list(ctx.extra_args.get("jax", []))
    if ctx.tiny:  # op-by-op (jit off) compiles every primitive in every process: pay it once
        extra = {
            "JAX_COMPILATION_CACHE_DIR": os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(ctx.work / "jax-cache"),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
        }
        changes.append("--tiny: JAX's persistent compilation cache on (<work>/jax-cache, or the caller's)")
        if "--no-profile" not in arguments:  # the op-by-op baseline's profile alone took 14 s on a CPU
            arguments.append("--no-profile")
            changes.append("--tiny: no profile")
        if "--trials" not in arguments:  # the op-by-op baseline and the rule of thumb beside it
            arguments += ["--trials", "2"]
            changes.append("--tiny: 2 trials")
    fresh_study(ctx.work, data["name"])
    command = ctx.run(ctx.search(spec) + arguments, "jax.log", _env(extra))
    result["commands"].append(command)
    result.update(study_summary(ctx.work, data["name"], False))


NUMBER = r"([\d,]+(?:\.\d+)?)"
APPLY_LINES = {
    "ran": re.compile(r"^ran (\d+) optimizer steps of (\d+) samples .* on (\S+) \((.*)\)$"),
    "throughput": re.compile(
        rf"^throughput: {NUMBER} samples/s here .*?, {NUMBER} samples/s in the study.*: ratio ([\d.]+)$"
    ),
    "speedup": re.compile(
        rf"^speedup: ([\d.]+)x here \(over the baseline .*, {NUMBER} samples/s, run here for (\d+) optimizer "
        rf"steps .*\), ([\d.]+)x in the export: ratio ([\d.]+)$"
    ),
    "promise": re.compile(
        r"^promise: ([\d.]+)x(?:, 90% interval ([\d.]+)-([\d.]+)x)? here \((\d+) rounds? .*?"
        r": (kept|not kept|undecided) \(here "
    ),
}


def parse_apply(output: str) -> dict[str, Any]:
    """The figures `autotuner apply` prints (`autotuner.output.apply_console.print_applied`)."""
    found: dict[str, Any] = {}
    for line in output.splitlines():
        line = line.strip()
        if m := APPLY_LINES["ran"].match(line):
            found.update(steps_run=int(m[1]), samples_per_step=int(m[2]), device=m[3], device_name=m[4])
        elif m := APPLY_LINES["throughput"].match(line):
            found.update(
                throughput_here=float(m[1].replace(",", "")),
                throughput_study=float(m[2].replace(",", "")),
                throughput_ratio=float(m[3]),
            )
        elif m := APPLY_LINES["speedup"].match(line):
            found.update(
                speedup_delivered=float(m[1]),
                baseline_throughput_here=float(m[2].replace(",", "")),
                baseline_steps_run=int(m[3]),
                export_speedup_printed=float(m[4]),
                promise_ratio_printed=float(m[5]),
            )
        elif m := APPLY_LINES["promise"].match(line):
            found.update(
                speedup_checked=float(m[1]),
                interval_checked=[float(m[2]), float(m[3])] if m[2] else None,
                rounds_checked=int(m[4]),
                promise_verdict=m[5],
                promise_agrees=m[5] == "kept",
            )
    return found


def part_apply(ctx: Context, result: dict[str, Any]) -> None:
    spec, data, changes = ctx.spec("gpt")  # as the study part wrote it: the export is tuned for this job
    result.update(spec=SPECS["gpt"], spec_used=data, changes=changes)
    export_path = ctx.work / "runs" / data["name"] / "best.yaml"
    if not export_path.exists():
        raise PartError(f"no export at {export_path}: run `--part study` first, with the same --work")
    export = yaml.safe_load(export_path.read_text())
    environment = export.get("environment") or {}
    result.update(
        device_name=environment.get("device_name"),
        machine=machine(environment),
        environment=environment,
        export={
            "path": str(export_path),
            "params": export.get("params"),
            "speedup": export.get("speedup"),
            "speedup_interval": export.get("speedup_interval"),
        },
    )
    command = [sys.executable, "-m", "autotuner", "apply", str(export_path), "--spec", str(spec)]
    if ctx.args.apply_steps:
        command += ["--steps", str(ctx.args.apply_steps)]
    command += ctx.extra_args.get("apply", [])
    run = ctx.run(command, "apply.log")
    output = (ctx.work / "logs" / "apply.log").read_text()
    applied = parse_apply(output)
    verdicts = {"kept": 0, "not kept": 1, "undecided": 3}  # apply's exit code is its promise's verdict
    verdict_code = verdicts.get(applied.get("promise_verdict", "kept"))
    run["accepted_exit_codes"] = [verdict_code]  # a promise not kept is a measurement, not a failure
    result["commands"].append(run)
    result["apply"] = applied
    result["device"] = applied.get("device")
    if run["exit_code"] != verdict_code:
        raise PartError(f"autotuner apply exited {run['exit_code']}: {run['output_tail'][-600:]}")
    delivered, promised = applied.get("speedup_delivered"), _number(export.get("speedup"))
    if delivered is None or not promised:
        raise PartError("autotuner apply printed no speedup over the baseline (see its output)")
    result["promise"] = {
        "export_speedup": promised,
        "export_interval": export.get("speedup_interval"),
        "speedup_delivered": delivered,
        "ratio": delivered / promised,
        "within_5_percent": abs(delivered / promised - 1) <= TARGETS["promise"],
        # the promise check's rounds: the speedup here with its interval, and whether it agrees
        "speedup_checked": applied.get("speedup_checked"),
        "interval_checked": applied.get("interval_checked"),
        "rounds_checked": applied.get("rounds_checked"),
        "verdict": applied.get("promise_verdict"),
        "agrees": applied.get("promise_agrees"),
    }


@contextlib.contextmanager
def working_directory(folder: Path) -> Iterator[None]:
    """The harness's trial requests name the study's compile cache relative to the working
    directory (`runs/<name>/compile-cache`): the work folder's, as the searches run there."""
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def part_alternatives(ctx: Context, result: dict[str, Any], write: Callable[[], None]) -> None:
    import alternatives  # the harness's trial launcher imports nothing heavy until used

    names = ctx.args.workload or ["gpt", "cnn"]
    previous = _previous(ctx.out / "gpu-alternatives.json", ctx.tiny)
    workloads: dict[str, Any] = {k: v for k, v in previous.items() if k not in names}
    result.update(rounds=ctx.args.rounds, workloads=workloads, specs={n: SPECS[n] for n in names}, changes=[])
    # the rule of thumb's compile would cost a CPU more than the whole dry run
    guide_compile = not (ctx.tiny and ctx.on_cpu)
    if not guide_compile:
        result["changes"].append("--tiny on a CPU: the rule of thumb without torch.compile")
    for name in names:
        needed = 0.0 if ctx.tiny else ALTERNATIVES_MIN_LEFT_S[name]
        if ctx.deadline.left() < needed:
            workloads[name] = {
                "error": f"skipped: {ctx.deadline.left():.0f} s of the part's time left, it needs about {needed:.0f}; "
                f"run `python benchmarks/gpu.py --part alternatives --workload {name}` (the file keeps the others)"
            }
            write()
            continue
        spec, data, changes = ctx.spec(name)
        result["changes"] += [f"{name}: {change}" for change in changes]
        if name != "gpt" or not _same_job(ctx.work, data["name"], spec):
            fresh_study(ctx.work, data["name"])  # gpt's: the study part's, when it is of this job
        resumed = (ctx.work / "runs" / data["name"] / "study.db").exists()
        search_args = [] if ctx.tiny else ["--timeout", f"{ALTERNATIVES_SEARCH_S[name]:g}"]
        started = time.perf_counter()
        try:
            with working_directory(ctx.work):
                entry = alternatives.compare(
                    name, str(spec), ctx.args.rounds, ctx.work, search_args, guide_compile=guide_compile
                )
            entry["search"]["resumed"] = resumed  # the study part's study: its wall time is the study's
            entry["search"]["args"] = search_args
            entry["spec"], entry["spec_used"] = SPECS[name], data
            if entry["search"]["exit_code"] not in (0, 130):  # 130: stopped at its --timeout's trial, or Ctrl-C
                entry["error"] = f"autotuner search exited {entry['search']['exit_code']} (see its output above)"
        except Exception as exc:
            entry = {"error": _error(exc)}
        entry["wall_s"] = time.perf_counter() - started
        workloads[name] = entry
        search = entry.get("search") or {}
        result["commands"] += [
            {
                "command": shlex.join(["python", *ctx.search(spec)[1:], *search_args]),
                "cwd": str(ctx.work),
                "exit_code": search.get("exit_code"),
                "wall_s": search.get("wall_s"),
                "resumed": resumed,
            },
            {
                "command": f"benchmarks/alternatives.py compare({name!r}, {str(spec)!r}, rounds={ctx.args.rounds}): "
                "the finders' probes and the configs' measurements, the search's included",
                "wall_s": entry["wall_s"],
                "error": entry.get("error"),
            },
        ]
        if entry.get("machine") and not result["machine"]:
            environment = load_study(ctx.work, data["name"]).user_attrs.get("environment") or {}
            result.update(
                device=environment.get("device"), device_name=environment.get("device_name"), machine=entry["machine"]
            )
        write()
    errors = [f"{name}: {w['error']}" for name, w in workloads.items() if w.get("error")]
    if errors:
        raise PartError("; ".join(errors))


def _same_job(work: Path, name: str, spec: Path) -> bool:
    """Whether the work folder holds study `name` made from this spec (the `study` part's)."""
    from autotuner.spec.job import load_spec

    try:
        study = load_study(work, name)
    except (PartError, KeyError):
        return False
    return (study.user_attrs.get("autotuner") or {}).get("identity") == load_spec(spec).identity()


def _previous(path: Path, tiny: bool) -> dict[str, Any]:
    """The workloads of an earlier alternatives file of the same kind (tiny or not): kept when
    this run measures only some of them."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return dict(data.get("workloads") or {}) if data.get("tiny") == tiny else {}


def _error(exc: BaseException) -> str:
    if isinstance(exc, PartError):
        return str(exc)
    lines = traceback.format_exception(exc)
    return f"{type(exc).__name__}: {exc}\n{''.join(lines[-6:])}"[:4000]


def check_device(ctx: Context, part: str) -> None:
    """The full sizes are for a GPU: refuse them where the framework sees none (a CPU would take
    hours, and the gpt study's energy objective would be refused anyway)."""
    if ctx.tiny or part == "tests":  # the tests skip themselves where torch sees no GPU
        return
    if ctx.on_cpu:
        raise PartError("--device cpu runs only with --tiny: the full sizes are for a GPU")
    probe = (
        "import jax, sys; sys.exit(0 if jax.devices('gpu') else 1)"
        if part == "jax"
        else "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    )
    env = _env({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        framework = f"jax (a CUDA jaxlib: {JAX_CUDA_INSTALL})" if part == "jax" else "torch"
        raise PartError(
            f"{framework} sees no GPU here; the full sizes are for a GPU (`--device cpu --tiny` is the CPU dry run): "
            + (done.stderr.strip().splitlines() or [""])[-1][:300]
        )


def run_part(ctx: Context, part: str) -> dict[str, Any]:
    ctx.deadline = Deadline(ctx.budget_s)
    started = time.perf_counter()
    result: dict[str, Any] = {
        "part": part,
        "benchmark": "benchmarks/gpu.py",
        "invocation": shlex.join(["python", "benchmarks/gpu.py", *sys.argv[1:]]),
        "tiny": ctx.tiny,
        "device_requested": ctx.device or "the spec's (auto)",
        "device": None,
        "device_name": None,
        "machine": None,
        "budget_s": ctx.budget_s,
        "work": str(ctx.work),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commands": [],
        "changes": [],
        "status": "running",
        "error": None,
    }
    filename = f"gpu-{part}.json"
    kept = ctx.work / "logs"  # every part's file, beside its commands' logs, whatever `out` holds
    if kept.resolve() == ctx.out.resolve():
        kept = kept / "this-run"

    def write() -> None:
        result["wall_s"] = time.perf_counter() - started
        write_results(filename, result, kept)
        refused = replacement_refused(read_result(ctx.out / filename), result, dry=ctx.dry, force=ctx.force)
        if refused:
            ctx.refused[part] = f"{refused}; this run's file is {kept / filename}"
        else:
            ctx.refused.pop(part, None)
            write_results(filename, result, ctx.out)

    print(f"\n===== gpu.py --part {part}{' --tiny' if ctx.tiny else ''} (at most {ctx.budget_s:.0f} s)", flush=True)
    try:
        ctx.work.mkdir(parents=True, exist_ok=True)
        check_device(ctx, part)
        if part == "study":
            part_study(ctx, result)
        elif part == "apply":
            part_apply(ctx, result)
        elif part == "alternatives":
            part_alternatives(ctx, result, write)
        elif part == "tests":
            part_tests(ctx, result)
        else:
            part_jax(ctx, result)
        failed = [
            c for c in result["commands"] if c.get("exit_code") not in (None, 0, *c.get("accepted_exit_codes", ()))
        ]
        stopped = any(c.get("stopped_at_time_limit") for c in result["commands"])
        result["status"] = "stopped at the time limit" if stopped else "ok"
        if failed and not stopped:
            result["status"] = "error"
            result["error"] = "; ".join(f"{c['command']} exited {c['exit_code']}" for c in failed)
    except BaseException as exc:  # write what we got, whatever happened (Ctrl-C included)
        stopped = any(c.get("stopped_at_time_limit") for c in result["commands"])
        if isinstance(exc, PartError) and stopped:  # stopped before its study had anything to read
            result["status"] = "stopped at the time limit"
        else:
            result["status"] = "error" if isinstance(exc, Exception) else "interrupted"
        result["error"] = _error(exc)
        if not isinstance(exc, Exception):
            raise
    finally:
        write()
    if part in ctx.refused:
        print(f"[gpu.py] kept {ctx.out / filename}: {ctx.refused[part]}", flush=True)
    else:
        print(f"[gpu.py] wrote {ctx.out / filename}", flush=True)
    return result


GPU_TESTS = "tests/e2e/test_gpu.py"
TEST_SELECTIONS = {
    "quick": "not compile_mode and not out_of_memory and not jax and not two_ranks and not inference and not float8",
    "more": "compile_mode or out_of_memory or inference or float8",
}
"""`pytest -k` of the `gpu` tests: the quick ones (every precision, MFU, NVML's energy, energy as an
objective, `--jobs 1`) for `--lease`; the out-of-memory trial, every compile mode (CUDA graphs
included) with accumulation, the inference study and the gpt's float8 configs (torchao's recipes,
compiled, where the GPU has fp8 tensor cores) for `--lease-more`."""
TEST_LINE = re.compile(r"^(tests/\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
DEVICE_PROBE = """import json, platform, torch
cuda = torch.cuda.is_available()
name = torch.cuda.get_device_name(0) if cuda else (platform.processor() or platform.machine())
print(json.dumps({"device": "cuda:0" if cuda else "cpu", "device_name": name, "torch": torch.__version__}))"""


def parse_junit(path: Path) -> list[dict[str, Any]]:
    """Every test case of pytest's JUnit XML: its name, outcome, seconds and message."""
    import xml.etree.ElementTree as ElementTree

    tests = []
    for case in ElementTree.parse(path).iter("testcase"):
        outcome, message = "passed", ""
        for tag, name in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            if (node := case.find(tag)) is not None:
                outcome, message = name, (node.get("message") or "")[:300]
                break
        tests.append(
            {"test": case.get("name"), "outcome": outcome, "time_s": float(case.get("time") or 0), "message": message}
        )
    return tests


def parse_pytest_output(output: str) -> list[dict[str, Any]]:
    """The outcomes `pytest -v` printed, test by test: where no JUnit XML was written (pytest killed)."""
    return [
        {"test": m[1].split("::")[-1], "outcome": m[2].lower(), "time_s": None, "message": ""}
        for line in output.splitlines()
        if (m := TEST_LINE.match(line.strip()))
    ]


def part_tests(ctx: Context, result: dict[str, Any]) -> None:
    """`pytest -m gpu` of tests/e2e/test_gpu.py, the selection `ctx.extra_args["tests"]` names
    (`quick` by default), stopped at the part's deadline as Ctrl-C stops it."""
    selection = (ctx.extra_args.get("tests") or ["quick"])[0]
    probe = subprocess.run(
        [sys.executable, "-c", DEVICE_PROBE], env=_env(), capture_output=True, text=True, timeout=300
    )
    if probe.returncode == 0:
        found = json.loads(probe.stdout.strip().splitlines()[-1])
        result.update(
            device=found["device"],
            device_name=found["device_name"],
            machine=f"{found['device_name']}, torch {found['torch']}",
        )
    junit = ctx.work / "logs" / "tests.xml"
    junit.unlink(missing_ok=True)
    command = [sys.executable, "-m", "pytest", GPU_TESTS, "-m", "gpu", "-k", TEST_SELECTIONS[selection]]
    command += ["-o", "addopts=", "-p", "no:cacheprovider", "-v", "-rfE", f"--junitxml={junit}"]
    run = run_command(command, ROOT, ctx.until(), ctx.work / "logs" / "tests.log", grace=ctx.grace_s)
    run["accepted_exit_codes"] = [5]  # 5: no test selected
    result["commands"].append(run)
    result["selection"] = {"name": selection, "expression": TEST_SELECTIONS[selection], "file": GPU_TESTS}
    if junit.exists():
        result["tests"] = parse_junit(junit)
    else:
        result["tests"] = parse_pytest_output((ctx.work / "logs" / "tests.log").read_text())
    result["counts"] = dict(collections.Counter(t["outcome"] for t in result["tests"]))
    if run["exit_code"] == 1:
        failed = [t["test"] for t in result["tests"] if t["outcome"] in ("failed", "error")]
        raise PartError(f"pytest: {len(failed)} failed: {', '.join(failed)}")


# ------------------------------------------------------------------ the lease: one command on a lent GPU


class Step(NamedTuple):
    name: str
    part: str
    budget_s: float
    what: str
    args: tuple[str, ...] = ()
    """Added to the part's command (`ctx.extra_args[part]`); for `tests`, the selection's name."""
    grace_s: float = 20.0
    """How long an interrupted command has before it is killed (a search exports its best then)."""
    tiny_budget_s: float = 80.0
    """The budget in a `--tiny` dry run: for a step that finishes there, many times what it needs
    on the slowest 2-core VM (so that no machine's speed decides whether it does); for the JAX step
    (op-by-op on a CPU, minutes), a few seconds, so that it is always stopped at its budget, early
    or late, and shows the stop recorded."""


LEASE_S = 480.0
"""The most a lease command takes: 8 minutes, inside the 10 a lent machine gives a command, and
inside its 15 minutes in all with the machine's start and the tree's copy."""
LEASE_SCRIPT_S = 10.0
"""What the lease keeps beside its steps: the script's start, the plan and the summary."""
LEASE_WRITE_S = 10.0
"""What a step keeps, after its command, to read the study back and write its files."""
LEASES: dict[str, tuple[Step, ...]] = {
    "lease": (
        Step(
            "study",
            "study",
            200.0,
            "the gpt study (studies/gpu-gpt.yaml: the full pytorch preset, energy objective): "
            "trials for 70 s, then re-measurement and the profile",
            ("--timeout", "70"),
            grace_s=40.0,
            tiny_budget_s=150.0,
        ),
        Step(
            "apply",
            "apply",
            100.0,
            "`autotuner apply` of the study's winner: the promise and the run time",
            ("--steps", "20"),
            tiny_budget_s=100.0,
        ),
        Step(
            "jax",
            "jax",
            90.0,
            "the JAX gpt study (studies/gpu-gpt-jax.yaml): its reference and two trials, no profile",
            ("--trials", "2", "--no-profile"),
            tiny_budget_s=20.0,
        ),
        Step(
            "tests", "tests", 80.0, f"`pytest -m gpu` of the quick tests (-k '{TEST_SELECTIONS['quick']}')", ("quick",)
        ),
    ),
    "lease-more": (
        Step(
            "jax",
            "jax",
            240.0,
            "the JAX gpt study (studies/gpu-gpt-jax.yaml, the full jax preset) as far as it gets",
            grace_s=40.0,
        ),
        Step(
            "tests",
            "tests",
            230.0,
            "`pytest -m gpu`: the out-of-memory trial, every compile mode (CUDA graphs included) with "
            f"accumulation, the inference study and the gpt's float8 configs (-k '{TEST_SELECTIONS['more']}')",
            ("more",),
        ),
    ),
}
"""What `--lease` and `--lease-more` run, in order, each step within its budget (seconds): the
budgets and LEASE_SCRIPT_S sum to at most LEASE_S."""
LEASE_LOGS = {
    "study": ("study.log",),
    "apply": ("apply.log",),
    "jax": ("jax.log",),
    "tests": ("tests.log", "tests.xml"),
}
LOG_TAIL_BYTES = 200_000
"""A log copied into the lease's folder keeps its last 200 kB (a handful of small files)."""


def lease_plan(mode: str) -> dict[str, Any]:
    steps = LEASES[mode]
    return {
        "mode": mode,
        "total_budget_s": LEASE_S,
        "script_reserve_s": LEASE_SCRIPT_S,
        "budgets_sum_s": sum(step.budget_s for step in steps) + LEASE_SCRIPT_S,
        "steps": [
            {
                "step": step.name,
                "part": step.part,
                "what": step.what,
                "budget_s": step.budget_s,
                "tiny_budget_s": step.tiny_budget_s,
                "args": list(step.args),
                "file": f"gpu-{step.part}.json",
                "status": "planned",
            }
            for step in steps
        ],
    }


def _copy_tail(source: Path, target: Path) -> None:
    if not source.exists():
        return
    data = source.read_bytes()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data[-LOG_TAIL_BYTES:] if len(data) > LOG_TAIL_BYTES else data)


def run_lease(ctx: Context, mode: str, started: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The steps of `LEASES[mode]` in turn, each stopped at its budget (its command interrupted,
    then killed) and recorded so, the next run all the same; `lease.json` (the plan and what each
    step did), the steps' files and their logs' tails go into `ctx.out`."""
    overall = Deadline(LEASE_S - (time.perf_counter() - started))
    plan = lease_plan(mode)
    plan.update(
        invocation=shlex.join(["python", "benchmarks/gpu.py", *sys.argv[1:]]),
        tiny=ctx.tiny,
        device_requested=ctx.device or "the spec's (auto)",
        work=str(ctx.work),
        started=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        status="running",
    )

    def write() -> None:
        plan["wall_s"] = time.perf_counter() - started
        write_results("lease.json", plan, ctx.out)

    print(f"\n===== gpu.py --{mode}: {len(LEASES[mode])} steps, at most {LEASE_S:.0f} s in all", flush=True)
    for step in LEASES[mode]:
        print(f"  {step.name:<6} {step.budget_s:5.0f} s  {step.what}", flush=True)
    write()
    results = []
    for step, entry in zip(LEASES[mode], plan["steps"], strict=True):
        budget = min(step.tiny_budget_s if ctx.tiny else step.budget_s, overall.left() - LEASE_SCRIPT_S / 2)
        if budget < 2 * LEASE_WRITE_S:
            entry.update(status="skipped", error=f"{overall.left():.0f} s of the lease left")
            write()
            continue
        ctx.budget_s, ctx.grace_s, ctx.write_reserve_s = budget, min(step.grace_s, budget / 4), LEASE_WRITE_S
        ctx.extra_args = {step.part: list(step.args)}
        step_started = time.perf_counter()
        result = run_part(ctx, step.part)
        wall = time.perf_counter() - step_started
        for name in LEASE_LOGS[step.part]:
            _copy_tail(ctx.work / "logs" / name, ctx.out / "logs" / name)
        stopped = any(c.get("stopped_at_time_limit") for c in result["commands"])
        entry.update(
            status=result["status"],
            budget_given_s=budget,
            wall_s=wall,
            stopped_at_time_limit=stopped,
            killed=any(c.get("killed") for c in result["commands"]),
            over_budget=wall > budget,
            error=(result.get("error") or "").splitlines()[0][:300] if result.get("error") else None,
        )
        results.append(result)
        write()
    plan["status"] = "ok" if all(s["status"] == "ok" for s in plan["steps"]) else "incomplete"
    write()
    return plan, results


# ------------------------------------------------------------------ keeping the evidence


def read_result(path: Path) -> dict[str, Any] | None:
    """A result file's data; None where there is none (or none that reads as a result)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _evidence(data: dict[str, Any] | None) -> str | None:
    """What a result file is evidence of: the device its full-size run named, else None (no file,
    a dry run's, or a run that stopped before it knew its device)."""
    if not data or data.get("tiny") or data.get("device_requested") == "cpu" or not data.get("device_name"):
        return None
    started = f", started {data['started']}" if data.get("started") else ""
    return f"a result on {data['device_name']}{started}"


def replacement_refused(existing: dict[str, Any] | None, new: dict[str, Any], *, dry: bool, force: bool) -> str | None:
    """Why a run's result `new` may not replace the file holding `existing`; None where it may.
    A dry run (`--tiny`, or a CPU run) never replaces a GPU run's file; a GPU run replaces one of
    the device it names (`device_name`), another device's (or, naming none, anyone's) only with
    `force`."""
    held = _evidence(existing)
    if held is None:
        return None
    if dry:
        return f"it holds {held}, which a dry run or a CPU run never replaces"
    assert existing is not None
    if force or new.get("device_name") == existing["device_name"]:
        return None
    here = f"ran on {new['device_name']}" if new.get("device_name") else "named no device"
    return f"it holds {held} and this run {here} (--force replaces it)"


def refused_at_start(ctx: Context, parts: tuple[str, ...]) -> str | None:
    """Why this run may not start: a dry run aimed at benchmarks/results/, or at a folder whose
    files of its parts are GPU results it could not replace."""
    if not ctx.dry:
        return None
    if ctx.out.resolve().is_relative_to(RESULTS.resolve()):
        return (
            f"a dry run (--tiny) or a CPU run never writes into {RESULTS} (the committed GPU results): "
            "leave --out out (its default is <work>/results) or give another folder"
        )
    for part in parts:
        path = ctx.out / f"gpu-{part}.json"
        if refused := replacement_refused(read_result(path), {}, dry=True, force=ctx.force):
            return f"{path}: {refused}; give another --out"
    return None


# ------------------------------------------------------------------ the summary


def summary_line(result: dict[str, Any]) -> str:
    part = result["part"]
    head = f"{part:<12} {result['status']:<10} {result.get('wall_s', 0):6.0f} s  {result.get('machine') or '-'}"
    if part in ("study", "jax"):
        best_ = result.get("best") or {}
        energy = (result.get("energy") or {}).get("best_j_per_sample")
        return (
            f"{head}\n{'':<12} tuned over baseline {times(result.get('speedup'))}, "
            f"MFU {percent(result.get('mfu'), 1)}, "
            f"{result.get('trials_ran', 0)} trials, best {best_.get('config')}"
            + (f", {energy:.3g} J/sample" if energy else "")
        )
    if part == "apply":
        promise = result.get("promise") or {}
        return (
            f"{head}\n{'':<12} delivered {times(promise.get('speedup_delivered'))} of the export's "
            f"{times(promise.get('export_speedup'))}: ratio {promise.get('ratio', float('nan')):.3f}"
        )
    if part == "tests":
        counts = ", ".join(f"{n} {o}" for o, n in sorted((result.get("counts") or {}).items())) or "no test ran"
        return f"{head}\n{'':<12} {counts}"
    rows = []
    for name, w in (result.get("workloads") or {}).items():
        if w.get("error"):
            rows.append(f"{'':<12} {name}: error: {w['error'].splitlines()[0][:100]}")
            continue
        ratios = ", ".join(f"{label} {times(row.get('over_baseline'))}" for label, row in w["configs"].items())
        rows.append(f"{'':<12} {name}: {ratios}")
    return "\n".join([head, *rows])


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--part",
        action="append",
        choices=(*PARTS, "all"),
        help="the part to run; give it again for more, in the order given (default: all, in order)",
    )
    parser.add_argument(
        "--lease",
        metavar="OUT",
        help="one command on a lent GPU (at most 8 minutes): the gpt study, apply of its winner, the JAX study's "
        "reference and two trials, the quick `gpu` tests, each step within its budget; files and logs into OUT",
    )
    parser.add_argument(
        "--lease-more",
        metavar="OUT",
        help="what --lease leaves out (under 7 minutes): the JAX study, the out-of-memory trial, "
        "the compile modes (CUDA graphs) with accumulation",
    )
    parser.add_argument("--device", help="the specs' device for this run (default: theirs, auto); cpu needs --tiny")
    parser.add_argument("--tiny", action="store_true", help="workloads and budgets of seconds (a dry run)")
    parser.add_argument(
        "--out",
        help="where gpu-<part>.json go (default: benchmarks/results for a GPU run; <work>/results for a dry run "
        "(--tiny) or a CPU run, which never write into benchmarks/results)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace a result file of another device (or where this run names none); "
        "a dry run never replaces a GPU run's",
    )
    parser.add_argument(
        "--work",
        help="the folder the studies, specs and logs go in (default: autotuner-gpu[-tiny] in the temporary folder); "
        "`apply` and `alternatives` use the `study` part's study there",
    )
    parser.add_argument("--budget-s", type=float, default=PART_BUDGET_S, help="seconds a part may take (default 540)")
    parser.add_argument(
        "--workload", action="append", choices=("gpt", "cnn"), help="alternatives: only these (default both)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="alternatives: measurements of each config (default 1)")
    parser.add_argument("--apply-steps", type=int, help="apply: optimizer steps (default: autotuner apply's)")
    return parser


def main(argv: list[str] | None = None) -> int:
    arguments = argument_parser()
    started = time.perf_counter()
    args = arguments.parse_args(argv)
    mode = "lease" if args.lease else "lease-more" if args.lease_more else None
    if mode:
        if args.lease and args.lease_more or args.part or args.out:
            arguments.error("--lease and --lease-more take the folder themselves, alone: no --part, no --out")
        args.out = args.lease or args.lease_more
    ctx = Context(args)
    if mode:
        parts = tuple(dict.fromkeys(step.part for step in LEASES[mode]))
    else:
        parts = PARTS if not args.part or "all" in args.part else tuple(dict.fromkeys(args.part))
    if refused := refused_at_start(ctx, parts):
        arguments.error(refused)
    if mode:
        plan, results = run_lease(ctx, mode, started)
    else:
        results = [run_part(ctx, part) for part in parts]
    print(f"\n===== gpu.py: {time.perf_counter() - started:.0f} s in all; results in {ctx.out}")
    if mode:
        for step in plan["steps"]:
            wall = f"{step['wall_s']:.0f}" if step.get("wall_s") is not None else "-"
            print(f"{step['step']:<12} {step['status']:<26} {wall:>4} s of {step['budget_s']:.0f} s")
    for result in results:
        print(summary_line(result))
    for part, refused in ctx.refused.items():
        print(f"not written: {ctx.out / f'gpu-{part}.json'}: {refused}")
    return 0 if all(r["status"] != "error" for r in results) and not ctx.refused else 1


if __name__ == "__main__":
    sys.exit(main())
