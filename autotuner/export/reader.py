"""Reading an exported config (`runs/<name>/best.yaml`), and whether it fits this job and machine.

From Python, `load_config(path)` returns a `TunedConfig`; the backend's `TunedTraining` applies it
to the user's own model, optimizer and dataset (one implementation of what a config means: the
backend's `apply` module, which the trials themselves train through). `job_mismatch` and
`machine_mismatch` say why a config was not tuned for a job or for this hardware and software;
`autotuner apply` (`autotuner.export.promise`) refuses such a config unless forced.

Importing this module imports neither a framework nor Optuna: a training script that only reads
the config does not pay for the study machinery.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autotuner.backends import BACKENDS
from autotuner.backends._base import with_defaults
from autotuner.config.knobs import Config, format_config
from autotuner.errors import SpecError
from autotuner.spec.keys import parse_yaml, read_text
from autotuner.study.fingerprint import fingerprint, framework_versions

if TYPE_CHECKING:
    from autotuner.spec.job import Job

READS_VERSIONS = (1,)
"""The `autotuner.export.writer.EXPORT_VERSION` values this reader understands."""


# ------------------------------------------------------------------ reading an export


class _Section(BaseModel):
    # The export carries more evidence than applying needs: keep it, check only what is used.
    model_config = ConfigDict(extra="allow", strict=True, frozen=True)


class _Metrics(_Section):
    throughput: float = Field(gt=0)


class _Baseline(_Section):
    params: dict[str, Any] | None = None
    throughput: float | None = None


class _Environment(_Section):
    backend: str
    fingerprint: str


class _SpecRef(_Section):
    identity: str
    global_batch: int | None = Field(None, gt=0)


class _StudyRef(_Section):
    name: str
    trial: int | None = None


class _ExportFile(BaseModel):
    # A newer export may add top-level evidence; what changes its meaning bumps `version`.
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)
    version: int
    params: dict[str, Any]
    metrics: _Metrics
    baseline: _Baseline
    speedup: float | None
    environment: _Environment
    spec: _SpecRef
    study: _StudyRef
    drift: dict[str, Any] = Field(default_factory=dict)


@dataclass(frozen=True)
class TunedConfig:
    """An exported best config and the evidence behind it, validated. Plain data: no framework."""

    params: Config
    """One value per knob, `accumulation` included: what `TunedTraining` applies."""
    metrics: dict[str, Any]
    """What the study measured for it: `throughput` (samples/s, median), its spread, drift, ..."""
    baseline: dict[str, Any]
    speedup: float | None
    environment: dict[str, Any]
    """The hardware and software it was tuned on, with its `fingerprint`."""
    spec: dict[str, Any]
    """The job it was tuned for: `identity` (see `autotuner.spec.job.Job.identity`), path, global batch."""
    study: dict[str, Any]
    drift: dict[str, Any]
    source: str
    """The file it was read from."""

    @property
    def backend(self) -> str:
        return str(self.environment["backend"])

    @property
    def throughput(self) -> float:
        """The study's median throughput for this config, in samples/s."""
        return float(self.metrics["throughput"])

    @property
    def fingerprint(self) -> str:
        return str(self.environment["fingerprint"])

    @property
    def identity(self) -> str:
        return str(self.spec["identity"])

    def __str__(self) -> str:
        return (
            f"{format_config(self.params)} (trial #{self.study.get('trial')} of study {self.study['name']}, "
            f"{self.throughput:,.0f} samples/s)"
        )


def _short(value: Any) -> str:
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


def parse_config(data: Any, source: str) -> TunedConfig:
    """Validate already-loaded export data; every problem is one `SpecError` line."""
    if not isinstance(data, dict):
        kind = "nothing" if data is None else type(data).__name__
        raise SpecError(
            f"an exported config is a mapping (params, metrics, baseline, environment, spec, study), not {kind}",
            source=source,
        )
    try:
        export = _ExportFile.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc, source) from None
    if export.version not in READS_VERSIONS:
        raise SpecError(
            f"export version {export.version} is not one this autotuner reads "
            f"({', '.join(map(str, READS_VERSIONS))}); export the study again with this version",
            source=source,
            key="version",
        )
    backend = BACKENDS.get(export.environment.backend)
    if backend is None:
        raise SpecError(
            f"{export.environment.backend!r} is not a backend; choose between {', '.join(BACKENDS)}",
            source=source,
            key="environment.backend",
        )
    params = dict(export.params)
    if backend.name == "pytorch" and "pin_memory" not in params:
        # exported before pinning was a knob: the loader then pinned on a CUDA device, as the study ran it
        params["pin_memory"] = str(export.environment.model_dump().get("device", "")).startswith("cuda")
    params = with_defaults(backend, params)  # exported before a knob existed: its reference value
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
    global_batch = export.spec.global_batch
    if global_batch is not None and params["batch_size"] * params["accumulation"] != global_batch:
        raise SpecError(
            f"batch_size x accumulation is {params['batch_size']} x {params['accumulation']}, "
            f"but spec.global_batch is {global_batch}",
            source=source,
            key="params.accumulation",
        )
    return TunedConfig(
        params=params,
        metrics=export.metrics.model_dump(),
        baseline=export.baseline.model_dump(),
        speedup=export.speedup,
        environment=export.environment.model_dump(),
        spec=export.spec.model_dump(),
        study=export.study.model_dump(),
        drift=dict(export.drift),
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


def _machine(environment: dict[str, Any]) -> str:
    return f"{environment.get('device_name')} ({framework_versions(environment)}, driver {environment.get('driver')})"


def job_mismatch(tuned: TunedConfig, job: Job) -> str | None:
    """Why `tuned` was not tuned for `job`, or None when it was (same identity)."""
    if tuned.identity == job.identity():
        return None
    return (
        f"it was tuned for another job (identity {tuned.identity}, spec {tuned.spec.get('path')}); "
        f"{job.source} is identity {job.identity()}: its workload, batch, space or trial settings differ"
    )


def machine_mismatch(tuned: TunedConfig, environment: dict[str, Any]) -> str | None:
    """Why `tuned` was not tuned on this hardware and software, or None when it was."""
    ours = fingerprint(environment)
    if tuned.fingerprint == ours:
        return None
    return (
        f"it was tuned on {_machine(tuned.environment)}, fingerprint {tuned.fingerprint}; "
        f"this machine is {_machine(environment)}, fingerprint {ours}: its figures need not hold here"
    )
