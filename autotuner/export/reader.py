"""Reading an exported config (`runs/<name>/best.yaml`), and whether it fits this job and machine.

From Python, `load_config(path)` returns a `TunedConfig`; the backend's `TunedTraining` applies it
to the user's own model, optimizer and dataset (one implementation of what a config means: the
backend's `apply` module, which the trials themselves train through). `job_mismatch` and
`machine_mismatch` say why a config was not tuned for a job or for this hardware and software;
`autotuner apply` (`autotuner.search.apply_run`) refuses such a config unless forced.

Importing this module imports neither a framework nor Optuna: a training script that only reads
the config does not pay for the study machinery.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ValidationError

from autotuner.backends import BACKENDS, get_backend
from autotuner.backends._base import with_defaults
from autotuner.config.knobs import ACCUMULATION, BATCH_SIZE, Config
from autotuner.errors import SpecError
from autotuner.export.file import (
    READS_VERSIONS,
    Baseline,
    Drift,
    EnvironmentSection,
    ExportFile,
    Metrics,
    SpecRef,
    StudyRef,
)
from autotuner.measurement.interval import Interval
from autotuner.output.formatting import format_config
from autotuner.spec.keys import parse_yaml, read_text
from autotuner.study.fingerprint import fingerprint, machine
from autotuner.trials.probe import Environment

if TYPE_CHECKING:
    from autotuner.spec.job import Job

# ------------------------------------------------------------------ reading an export


@dataclass(frozen=True)
class TunedConfig:
    """An exported best config and the evidence behind it, validated. Plain data: no framework.

    Its sections are the export file's models (`autotuner.export.file`): typed where the file names
    a field (`tuned.metrics.throughput`, `tuned.spec.processes`), and read by name as mappings too
    (`tuned.study["name"]`, `tuned.metrics.get("drift")`), the evidence beyond the named fields
    included. A section given as a plain mapping is validated into its model."""

    params: Config
    """One value per knob, `accumulation` included: what `TunedTraining` applies."""
    metrics: Metrics
    """What the study measured for it: `throughput` (samples/s, median), its spread, drift, ..."""
    baseline: Baseline
    speedup: float | None
    environment: EnvironmentSection
    """The hardware and software it was tuned on, with its `fingerprint`."""
    spec: SpecRef
    """The job it was tuned for: `identity` (see `autotuner.spec.job.Job.identity`), path, global batch."""
    study: StudyRef
    drift: Drift
    source: str
    """The file it was read from."""
    speedup_interval: Interval | None = None
    """The speedup's interval, where the study's re-measurement ran two rounds or more."""

    def __post_init__(self) -> None:
        for name, model in _SECTIONS.items():
            section: object = getattr(self, name)
            if not isinstance(section, model):  # a config built by hand, its sections plain data
                try:
                    object.__setattr__(self, name, model.model_validate(section))
                except ValidationError as exc:
                    raise _validation_error(exc, f"{self.source} ({name})") from None

    @property
    def backend(self) -> str:
        return self.environment.backend

    @property
    def throughput(self) -> float:
        """The study's median throughput for this config, in samples/s."""
        return self.metrics.throughput

    @property
    def processes(self) -> int:
        """Ranks the job was tuned as on each node."""
        return self.spec.processes

    @property
    def nodes(self) -> int:
        """Machines the job's ranks were tuned across, each running `processes` of them."""
        return self.spec.nodes

    @property
    def world(self) -> int:
        """Ranks the job was tuned as, all nodes together: `global_batch` = micro-batch x
        accumulation x `world`."""
        return self.spec.nodes * self.spec.processes

    @property
    def parallel(self) -> str | None:
        """How its ranks train together (`ddp`, `fsdp`), which `TunedTraining` applies; None for one
        process."""
        return self.spec.parallel or None

    @property
    def fingerprint(self) -> str:
        return self.environment.fingerprint

    @property
    def identity(self) -> str:
        return self.spec.identity

    @property
    def machine(self) -> Environment:
        """`environment` as the probe's type: the machine it was tuned on."""
        return Environment.from_dict(self.environment)

    def __str__(self) -> str:
        return (
            f"{format_config(self.params)} (trial #{self.study.trial} of study {self.study.name}, "
            f"{self.throughput:,.0f} samples/s)"
        )


_SECTIONS: dict[str, type[BaseModel]] = {
    "metrics": Metrics,
    "baseline": Baseline,
    "environment": EnvironmentSection,
    "spec": SpecRef,
    "study": StudyRef,
    "drift": Drift,
}
"""`TunedConfig`'s sections and the export file's model of each."""


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _validation_error(exc: ValidationError, source: str) -> SpecError:
    error = exc.errors()[0]
    key = ".".join(str(part) for part in error["loc"]) or None
    if error["type"] == "missing":
        return SpecError(
            "required key is missing (autotuner search and autotuner export write it)", source=source, key=key
        )
    message = f"{error['msg'][0].lower()}{error['msg'][1:]}"
    return SpecError(f"{message} (got {_short(error.get('input'))})", source=source, key=key)


def parse_config(data: object, source: str) -> TunedConfig:
    """Validate already-loaded export data; every problem is one `SpecError` line."""
    if not isinstance(data, dict):
        kind = "nothing" if data is None else type(data).__name__
        raise SpecError(
            f"an exported config is a mapping (params, metrics, baseline, environment, spec, study), not {kind}",
            source=source,
        )
    try:
        export = ExportFile.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc, source) from None
    if export.version not in READS_VERSIONS:
        raise SpecError(
            f"export version {export.version} is not one this autotuner reads "
            f"({', '.join(map(str, READS_VERSIONS))}); export the study again with this version",
            source=source,
            key="version",
        )
    if export.environment.backend not in BACKENDS:
        raise SpecError(
            f"{export.environment.backend!r} is not a backend; choose between {', '.join(BACKENDS)}",
            source=source,
            key="environment.backend",
        )
    try:
        backend = get_backend(export.environment.backend, export.spec.task)
    except KeyError:
        raise SpecError(
            f"the {export.environment.backend} backend has no task {export.spec.task!r}", source=source, key="spec.task"
        ) from None
    device = str(export.environment.get("device", ""))
    params = with_defaults(backend, export.params, device)  # exported before a knob existed: what it implies
    for knob in params:
        if knob not in backend.knobs:
            raise SpecError(
                f"the {backend.name} backend has no knob {knob!r}; knobs: {', '.join(backend.knobs)}",
                source=source,
                key=f"params.{knob}",
            )
    for knob, definition in backend.knobs.items():
        if knob not in params:
            raise SpecError("required key is missing (this knob has no default)", source=source, key=f"params.{knob}")
        problem = definition.check(params[knob])
        if problem:
            raise SpecError(problem, source=source, key=f"params.{knob}")
    global_batch, processes = export.spec.global_batch, export.spec.processes * export.spec.nodes
    batch, accumulation = params[BATCH_SIZE.name], params[ACCUMULATION.name]
    if global_batch is not None and batch * accumulation * processes != global_batch:
        ranks = f" x {processes} processes" if processes > 1 else ""
        raise SpecError(
            f"batch_size x accumulation{' x processes' if ranks else ''} is {batch} x {accumulation}{ranks}, "
            f"but spec.global_batch is {global_batch}",
            source=source,
            key="params.accumulation",
        )
    return TunedConfig(
        params=params,
        metrics=export.metrics,
        baseline=export.baseline,
        speedup=export.speedup,
        speedup_interval=Interval.from_dict(export.speedup_interval.model_dump()) if export.speedup_interval else None,
        environment=export.environment,
        spec=export.spec,
        study=export.study,
        drift=export.drift,
        source=source,
    )


def load_config(path: str | Path) -> TunedConfig:
    """Read an exported config (`runs/<name>/best.yaml`, or `.json`) and validate it."""
    source = str(path)
    text = read_text(path, "config")
    if source.endswith(".json"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(f"line {exc.lineno}: not valid JSON ({exc.msg})", source=source) from None
        except (ValueError, RecursionError) as exc:  # a 5000-digit number, or nesting too deep
            raise SpecError(f"not valid JSON ({' '.join(str(exc).split())[:100]})", source=source) from None
    else:
        data = parse_yaml(text, source)
    return parse_config(data, source)


# ------------------------------------------------------------------ does it fit this job and machine


def job_mismatch(tuned: TunedConfig, job: Job) -> str | None:
    """Why `tuned` was not tuned for `job`, or None when it was (same identity)."""
    if tuned.identity == job.identity():
        return None
    return (
        f"it was tuned for another job (identity {tuned.identity}, spec {tuned.spec.path}); "
        f"{job.source} is identity {job.identity()}: its workload, batch, space or trial settings differ"
    )


def machine_mismatch(tuned: TunedConfig, environment: Environment) -> str | None:
    """Why `tuned` was not tuned on this hardware and software, or None when it was."""
    ours = fingerprint(environment)
    if tuned.fingerprint == ours:
        return None
    return (
        f"it was tuned on {machine(tuned.machine)}, fingerprint {tuned.fingerprint}; "
        f"this machine is {machine(environment)}, fingerprint {ours}: its figures need not hold here"
    )
