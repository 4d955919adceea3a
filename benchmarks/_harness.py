"""What the benchmark scripts share: real trials run the way the search runs them, a real
`autotuner search` in a fresh folder, the machine's description and the result files.

The benchmarks import this as a sibling module (`python benchmarks/<name>.py` puts
`benchmarks/` first on the path). They run under the thread settings of the shell that started
them (`OMP_WAIT_POLICY`, `OMP_NUM_THREADS`, ...), as a search's trials do, and each result file
records them: a benchmark measures what the search and the user's training run would.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna

from autotuner.backends import Capabilities
from autotuner.config.knobs import Config
from autotuner.measurement.hardware import thread_settings
from autotuner.measurement.pruning import CALIBRATION, WARM_UP, WINDOW, PruneBound, Pruner, Stopped
from autotuner.results.evidence import Reference
from autotuner.results.records import TrialRecord
from autotuner.results.store import Yardstick, record
from autotuner.search.reference import run_reference
from autotuner.spec.job import Job
from autotuner.study.names import DIRECTIONS
from autotuner.trials.launcher import TrialResult
from autotuner.trials.outcomes import Outcome
from autotuner.trials.probe import Environment
from autotuner.trials.request import TrialRequest
from autotuner.trials.trial_output import TrialOutput

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results"
TRIAL_SETTINGS = ("warmup_steps", "steps", "windows", "min_window_s", "drift_steps", "seed")
"""The spec's trial settings that change what a trial measures."""


def _environment(environment: Environment | Mapping[str, Any]) -> Environment:
    """A probed environment as it is; a stored one (a study's, an export's) read back."""
    return environment if isinstance(environment, Environment) else Environment.from_dict(environment)


def machine(environment: Environment | Mapping[str, Any]) -> str:
    """`AMD EPYC (2 cores), torch 2.13.0+cpu`: the device as the study's environment names it."""
    environment = _environment(environment)
    versions = environment.versions
    framework = next((f"{name} {versions[name]}" for name in ("torch", "jax") if versions.get(name)), "")
    return ", ".join(part for part in (environment.device_name, framework) if part)


def cores(environment: Environment | Mapping[str, Any]) -> int:
    """The CPU cores of the machine a study's environment describes (`... (2 cores)`), else this one's."""
    name = _environment(environment).device_name
    if name.endswith(" cores)"):
        return int(name.rsplit("(", 1)[1].split()[0])
    return os.cpu_count() or 1


def guide_config(
    job: Job, capabilities: Capabilities, environment: Environment | Mapping[str, Any], batch: int | None = None
) -> Config:
    """The config the optimization guides recommend: bf16 (fp16 where bf16 is not supported),
    the largest batch that fits (`batch`, by default the largest the global batch allows), one
    loader worker per core, and `torch.compile` on where it can build kernels."""
    precision = "bf16" if capabilities.bf16 else "fp16" if capabilities.fp16 else "fp32"
    return job.complete(
        {
            **job.baseline,
            "precision": precision,
            "batch_size": batch or job.spec.global_batch,
            "workers": cores(environment),
            "compile": "default" if capabilities.compile else "none",
        }
    )


def _held(job: Job, knob: str) -> bool:
    """A quiet knob (one added after the first four) held at its reference value."""
    definition = job.backend.knobs[knob]
    return (
        definition.quiet
        and job.space.get(knob) == (definition.reference,)
        and job.baseline.get(knob) == definition.reference
    )


def held_knobs(job: Job) -> dict[str, Any]:
    """The quiet knobs `job` holds at their reference value, with it: what a grid recorded before
    those knobs existed ran with, and what its entries' configs lack (`with_held`)."""
    return {k: job.space[k][0] for k in job.space if _held(job, k)}


def with_held(job: Job, grid: dict[str, Any]) -> dict[str, Any]:
    """`grid` with each entry's params and config completed by `held_knobs`."""
    held = held_knobs(job)
    for entry in grid["trials"]:
        entry["params"] = {**entry["params"], **{k: v for k, v in held.items() if k not in entry["params"]}}
        entry["config"] = {**entry["config"], **{k: v for k, v in held.items() if k not in entry["config"]}}
    return grid


def measured_job(job: Job) -> dict[str, Any]:
    """What a recorded trial's figures depend on: a grid recorded for other values is stale."""
    spec = job.spec
    return json.loads(
        json.dumps(
            {
                "workload": spec.workload,
                "workload_args": spec.workload_args,
                "global_batch": spec.global_batch,
                # a knob held at its reference value measures what it measured before the knob existed
                "space": {k: v for k, v in job.space.items() if not _held(job, k)},
                "baseline": {k: v for k, v in job.baseline.items() if not _held(job, k)},
                "max_drift": spec.objective.max_drift,
                "trial": {k: getattr(spec.trial, k) for k in TRIAL_SETTINGS},
            }
        )
    )


def write_results(filename: str, data: dict[str, Any], folder: Path | None = None) -> Path:
    """`data` as JSON under benchmarks/results/ (or `folder`), with the conditions it was measured in."""
    conditions = {"threads": thread_settings(), "load_avg_when_written": os.getloadavg()}
    folder = folder or RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / filename
    path.write_text(json.dumps({**data, "conditions": conditions}, indent=2) + "\n")
    return path


def quartiles(values: list[float]) -> dict[str, float]:
    """Median and quartiles (what a noisy figure is quoted with)."""
    if len(values) < 2:
        return {"median": values[0], "p25": values[0], "p75": values[0]}
    low, _, high = statistics.quantiles(values, n=4, method="inclusive")
    return {"median": statistics.median(values), "p25": low, "p75": high}


class Trials:
    """Real trials of one job, launched as `autotuner search` launches them: the same fork
    server, trial requests and timeout; unsupported configs decided without a process."""

    def __init__(self, job: Job, device: str | None = None):
        self.job = job
        self.launcher = job.backend.launcher(job.spec.trial.max_memory_mb)
        self.environment = job.probe(self.launcher, device or job.spec.device)
        self.capabilities = job.backend.capabilities(self.environment.capabilities)

    @property
    def device(self) -> str:
        return self.environment.device

    def reference(self) -> Reference:
        return run_reference(self.launcher, self.job, self.device)

    def request(self, config: Config, **changes: Any) -> TrialRequest:
        """The request the search would send for `config`, with `changes` to its fields."""
        return dataclasses.replace(self.job.trial_request(config, self.device), **changes)

    def run(self, config: Config, request: TrialRequest | None = None) -> TrialResult[TrialOutput]:
        reason = self.job.backend.unsupported_reason(config, self.capabilities)
        if reason:
            return TrialResult.unsupported(reason)
        request = request or self.request(config)
        return self.launcher.call(self.job.backend.runner, "run", request, self.job.trial_timeout(request.config))


def stored(
    job: Job,
    config: Config,
    result: TrialResult[TrialOutput],
    reference: Reference,
    environment: Environment | Mapping[str, Any],
) -> TrialRecord:
    """What `autotuner.results.store.record` stores for this trial (in a throwaway in-memory study,
    created without Optuna's line announcing it)."""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(directions=list(DIRECTIONS))
    finally:
        optuna.logging.set_verbosity(verbosity)
    environment = _environment(environment)
    return record(study, study.ask(), config, result, role="search", against=Yardstick(job, reference, environment))


def as_pruned(job: Job, result: TrialResult[TrialOutput], best: float | None) -> TrialResult[TrialOutput]:
    """`result`, a trial recorded without pruning, as the search's rule
    (`autotuner.measurement.pruning.Pruner`) would have ended it against `best` (the best feasible
    throughput before it; None: nothing to prune against): pruned, with the stretches it was judged
    on, or as it was. The recorded figures are replayed on a clock: the warm-up's steps after the
    first, at the windows' median pace (the recording keeps only the warm-up's whole time, the
    first step's compile in it); the calibration as two windows sharing its recorded time and
    steps; each recorded window over its own time, its steps evenly."""
    output = result.output
    throughput = output.throughput if output is not None else None
    settings = job.spec.trial
    if throughput is None or result.outcome is not Outcome.OK or best is None or settings.prune_after <= 0:
        return result
    bound = PruneBound(best, settings.prune_after, settings.steps, settings.min_window_s)
    now = [0.0]
    pruner = Pruner(bound, throughput.samples_per_step, clock=lambda: now[0])
    step_s = throughput.samples_per_step / throughput.samples_per_s

    def stretch(kind: str, steps: int, seconds: float, window: bool) -> None:
        pruner.begin(kind, steps)
        for _ in range(steps):
            now[0] += seconds / steps
            pruner.stepped()
        pruner.ended(seconds if window else None)

    try:
        if throughput.warmup_steps > 1:
            stretch(WARM_UP, throughput.warmup_steps - 1, (throughput.warmup_steps - 1) * step_s, False)
        calibrated = round(throughput.calibration_s / step_s)
        if calibrated >= 2:
            for _ in range(2):
                stretch(CALIBRATION, calibrated // 2, throughput.calibration_s / 2, True)
        for rate in throughput.window_samples_per_s:
            stretch(WINDOW, throughput.steps, throughput.steps * throughput.samples_per_step / rate, True)
    except Stopped as stop:
        judged = list(pruner.behind)
        pruned = dataclasses.replace(
            throughput,
            samples_per_s=statistics.median(judged),
            window_samples_per_s=judged,
            stopped=stop.reason,
            bound=pruner.bound_rate,
            floor=pruner.floor,
            trained_s=now[0],
        )
        return dataclasses.replace(result, output=dataclasses.replace(output, throughput=pruned))
    return result


def result_to_json(result: TrialResult[TrialOutput]) -> dict[str, Any]:
    """A trial process's result as plain data (`result_from_json` reads it back)."""
    return {
        "outcome": result.outcome.value,
        "reason": result.reason,
        "traceback": result.traceback,
        "result": result.output.as_dict() if result.output is not None else {},
        "startup_s": result.startup_s,
        "wall_s": result.wall_s,
    }


def result_from_json(data: dict[str, Any]) -> TrialResult[TrialOutput]:
    output = data.get("result")
    return TrialResult(
        Outcome(data["outcome"]),
        data["reason"],
        data.get("traceback"),
        TrialOutput.from_dict(output) if output else None,
        data.get("startup_s"),
        data.get("wall_s", 0.0),
    )


@dataclass
class SearchRun:
    """One `autotuner search` run in its own folder, and the study it left."""

    wall_s: float
    exit_code: int
    started: datetime
    ended: datetime
    study: optuna.Study


def run_search(
    spec: Path, name: str, folder: Path, *args: str, python: str = sys.executable, path: Path | None = None
) -> SearchRun:
    """`autotuner search --spec SPEC` with `folder` as the working directory (so a fresh study in
    folder/runs/<name>/), timed from the command's start to its exit; `python`: the interpreter
    whose autotuner runs it; `path`: a folder put first on PYTHONPATH (the repository, for the
    workloads of its examples)."""
    pythonpath = os.pathsep.join(filter(None, [str(path or ""), os.environ.get("PYTHONPATH")]))
    started = datetime.now()
    clock = time.perf_counter()
    done = subprocess.run(
        [python, "-m", "autotuner", "search", "--spec", str(spec.resolve()), *args],
        cwd=folder,
        env={**os.environ, "COLUMNS": "160", "PYTHONPATH": pythonpath},
    )
    wall_s = time.perf_counter() - clock
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{folder}/runs/{name}/study.db")
    return SearchRun(wall_s, done.returncode, started, datetime.now(), study)


def revision() -> str:
    """The repository's commit, `-dirty` appended when the work tree has changes: what ran."""
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain"], capture_output=True, text=True)
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def install_revision(revision: str, folder: Path) -> str:
    """autotuner as it was at git `revision`, installed (not editable) into a virtualenv in
    `folder` that uses this one's packages for everything else; its interpreter's path."""
    tree, venv = folder / "tree", folder / "venv"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), revision], check=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        python = venv / "bin" / "python"
        found = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True,
            capture_output=True,
            text=True,
        )
        site = Path(found.stdout.strip())
        ours = [p for p in sys.path if p.endswith("site-packages")]
        (site / "autotuner-benchmark-base.pth").write_text("\n".join(ours) + "\n")
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", str(tree)],
            check=True,
        )
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)
    return str(python)
