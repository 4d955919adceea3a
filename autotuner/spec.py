"""The job spec: one YAML file, validated whole before anything runs or is stored.

`load_spec(path)` reads it with `yaml.safe_load` (no tags that build Python objects), checks
every key against the models below (unknown keys, wrong types, non-positive sizes) and then
against the backend's knob table (unknown knobs or values, empty choice lists, a batch size that
does not divide `global_batch`). Any problem is one `SpecError` line naming the file, the key
and what is allowed. Nothing in a spec is executed except the workload factory it names, which is
trusted code (like a pytest conftest.py) imported in trial processes.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autotuner.backends import BACKENDS, Backend, Capabilities, get_backend
from autotuner.errors import SpecError, shown
from autotuner.knobs import DERIVED, Config, Knob
from autotuner.workload import is_import_path

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A study name (matched whole): it names files in studies/, so it can never be a path."""
NAME_RULE = "must be 1-64 letters, digits, '_', '-' or '.', starting with a letter or digit"
SAMPLERS = ("tpe", "random", "gp", "nsga2")
MAX_VALUES = 100_000
"""Most values (scalars, lists and mappings, aliases expanded) a spec may hold."""
MAX_CONFIGS = 100_000
"""Most configs a search space may hold: every one is listed for the sampler."""
SHOWN_KEY_CHARS = 80
TRIAL_TIMEOUT_S = 600.0
"""A trial's timeout when the spec sets none, before the backend's factor for its config."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class Objective(_Strict):
    max_drift: float = Field(0.01, gt=0, le=1e6)
    """Largest relative held-out loss drift from the fp32 reference that is still feasible."""
    max_memory_mb: float | None = Field(None, gt=0, le=2**30)
    """Limit of a trial's `peak_memory_mb`, in MiB. On a GPU: the most device memory the process
    held after its warm-up, the larger of the caching allocator's reserved peak (fragmentation and
    CUDA-graph pools included) and NVML's figure for the process (its CUDA context included); on
    the CPU: the trial process's peak resident memory."""
    energy: bool = False
    """Also minimize energy per sample (J, from NVML's energy counter): a third objective of the
    study, for its Pareto front. Needs a GPU with an energy counter."""


class Budget(_Strict):
    trials: int = Field(30, gt=0, le=100_000)
    """Trials that are run (unsupported configs, which cost nothing, are not counted)."""
    timeout: float | None = Field(None, gt=0)
    """Seconds of trial wall time for the whole study, summed over every run and worker."""
    remeasure_top: int = Field(3, ge=0, le=1000)
    """Before the best is declared, this many of the fastest feasible configs, and the baseline,
    are measured again in fresh trial processes, then up to as many more that came out within the
    machine's noise of the best; 0: never. Not counted in `trials`."""
    remeasure_runs: int = Field(2, gt=0, le=100)
    """Re-measurement runs per config, each a trial process: the config's throughput is then the
    median over every window of its processes."""
    remeasure_windows: int = Field(30, gt=0, le=1000)
    """Measured windows of each re-measurement run (a trial has `trial.windows`). The
    re-measurement decides the best and its speedup; measured in lockstep, what is left between
    two runs is the window-to-window noise, which more windows average out
    (`benchmarks/fidelity.py` compares 5, 15 and 30 windows of the same processes)."""
    remeasure_group: int | None = Field(None, gt=0, le=1000)
    """The most trial processes a re-measurement keeps alive at once. In lockstep (on a CPU) every
    process of a group holds its model, optimizer and data while it waits for its turn; by
    default a group is as large as the memory available holds, judged from the configs' peak RSS
    in their trials; a group too large is split, the baseline beside the configs in each part.
    1: one process at a time (no lockstep)."""


class TrialSettings(_Strict):
    warmup_steps: int = Field(3, ge=0, le=10_000)
    steps: int = Field(10, gt=0, le=100_000)
    """Optimizer steps per measured window."""
    windows: int = Field(3, gt=0, le=1000)
    min_window_s: float = Field(0.5, ge=0, le=3600)
    """A window lasts at least this long: `steps` is raised once, from a calibration window."""
    drift_steps: int = Field(5, gt=0, le=10_000)
    """K: optimizer steps the trial and the reference take before the held-out loss is compared."""
    timeout: float | None = Field(None, gt=0, le=7 * 86400)
    """Seconds before a trial process is killed and recorded as `timeout`. None: `TRIAL_TIMEOUT_S`
    times the backend's factor for the config (`Backend.timeout_factor`: compiling costs more)."""
    max_memory_mb: float | None = Field(None, ge=64, le=2**30)
    """Host memory each trial process may allocate (RLIMIT_DATA: heap and private mappings), in
    MiB; past it an allocation fails and the trial is `oom`. None: no limit. CPU trials only: on
    a GPU the driver's mappings of device and pinned memory count against RLIMIT_DATA, so a search
    on a GPU refuses it (`check_trial_limits`); `objective.max_memory_mb` limits device memory."""
    seed: int = Field(0, ge=0, lt=2**32)


class SamplerSettings(_Strict):
    name: Literal["tpe", "random", "gp", "nsga2"] = "tpe"
    seed: int | None = Field(None, ge=0, lt=2**32)


class JobSpec(_Strict):
    name: str
    backend: str
    workload: str
    global_batch: int = Field(gt=0, le=2**31)
    workload_args: dict[str, Any] = Field(default_factory=dict)
    device: str = "auto"
    baseline: dict[str, Any] = Field(default_factory=dict)
    space: str | dict[str, Any] | None = None
    objective: Objective = Objective()
    budget: Budget = Budget()
    trial: TrialSettings = TrialSettings()
    storage: str | None = None
    sampler: Literal["tpe", "random", "gp", "nsga2"] | SamplerSettings = SamplerSettings()


class Job:
    """A validated spec, with what follows from it: the resolved space and baseline."""

    def __init__(self, spec: JobSpec, source: str, text: str):
        self.spec, self.source, self.text = spec, source, text
        self.backend: Backend = get_backend(spec.backend)
        self.space: dict[str, list[Any]] = {}
        self.baseline: Config = {}

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def sampler(self) -> SamplerSettings:
        s = self.spec.sampler
        return SamplerSettings(name=s) if isinstance(s, str) else s

    def workload_path(self) -> str:
        return self.backend.resolve_workload(self.spec.workload)

    def storage_url(self, override: str | None = None) -> str:
        return override or self.spec.storage or f"sqlite:///studies/{self.name}.db"

    def identity(self) -> str:
        """Hash of everything that changes what a trial measures; a study keeps one identity.

        The device is not part of it (workers of one study use different GPUs; the hardware
        fingerprint guards what matters), nor the budget, storage, sampler or the trial's timeout
        and memory limit."""
        data = self.spec.model_dump(
            exclude={
                "budget": True,
                "storage": True,
                "sampler": True,
                "device": True,
                "trial": {"timeout", "max_memory_mb"},
            }
        )
        data["space"], data["baseline"] = self.space, self.baseline
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def compile_cache_dir(self) -> Path:
        """The study's own compile cache (torch.compile's), beside its default storage."""
        return (Path("studies") / f"{self.name}.compile-cache").resolve()

    def trial_timeout(self, *configs: Config) -> float:
        """Seconds a trial of the slowest of `configs` may take: `trial.timeout` when the spec sets
        it, else `TRIAL_TIMEOUT_S` times the backend's factor (a config that compiles longer gets
        longer); no config: the reference's, which compiles nothing."""
        if self.spec.trial.timeout is not None:
            return self.spec.trial.timeout
        return TRIAL_TIMEOUT_S * max((self.backend.timeout_factor(c) for c in configs), default=1.0)

    def complete(self, params: dict[str, Any]) -> Config:
        """A full config from sampled params: fixed knobs from the baseline, accumulation derived."""
        config: Config = {knob: params.get(knob, self.baseline[knob]) for knob in self.space}
        config["accumulation"] = self.spec.global_batch // int(config["batch_size"])
        return config

    def unsupported(self, capabilities: Capabilities) -> Callable[[dict[str, Any]], str | None]:
        """Why a device with `capabilities` cannot run sampled params, or None (what the samplers
        are given to skip such configs, as the search decides it)."""
        return lambda params: self.backend.unsupported_reason(self.complete(params), capabilities)

    def configs(self) -> Iterator[dict[str, Any]]:
        """Every point of the space, as sampled params."""
        names = list(self.space)
        for values in itertools.product(*(self.space[n] for n in names)):
            yield dict(zip(names, values, strict=True))

    def reference_config(self) -> Config:
        """The numerically strictest config: the baseline's batching, everything else strict."""
        config = {knob: self.backend.knobs[knob].reference for knob in self.space}
        config["batch_size"] = self.baseline["batch_size"]
        config["accumulation"] = self.spec.global_batch // config["batch_size"]
        return config


# ------------------------------------------------------------------ loading


def _describe_pydantic(error: dict[str, Any]) -> tuple[str, str]:
    loc = [str(p) for p in error["loc"] if not str(p).startswith(("function-", "literal["))]
    # Union members appear in the location (e.g. "str", "SamplerSettings"): drop them.
    loc = [p for p in loc if not (p[:1].isupper() or p in ("str", "dict[str,any]", "none"))]
    key = ".".join(loc)[:SHOWN_KEY_CHARS] or "(top level)"
    kind = error["type"]
    if kind == "extra_forbidden":
        return key, f"unknown key; allowed here: {', '.join(_allowed_keys(loc[:-1]))}"
    if kind == "missing":
        return key, "required key is missing"
    if loc == ["space"] and kind in ("string_type", "dict_type"):
        return key, f"must be a preset name or a mapping of knob -> [choices] (got {shown(error.get('input'))})"
    if kind == "literal_error":
        return key, f"{shown(error['input'])} is not allowed; choose between {error['ctx']['expected']}"
    return key, f"{error['msg'][0].lower()}{error['msg'][1:]} (got {shown(error.get('input'))})"


def _allowed_keys(loc: list[str]) -> list[str]:
    model: Any = JobSpec
    for part in loc:
        field = model.model_fields.get(part)
        annotation = getattr(field, "annotation", None)
        model = next(
            (
                a
                for a in getattr(annotation, "__args__", (annotation,))
                if isinstance(a, type) and issubclass(a, BaseModel)
            ),
            annotation,
        )
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return []
    return list(model.model_fields)


def _choices(value: Any, knob: Knob, key: str, source: str) -> list[Any]:
    if not isinstance(value, list):
        value = [value]
    if not value:
        raise SpecError("the list of choices is empty; give at least one value", source=source, key=key)
    for item in value:
        problem = knob.check(item)
        if problem:
            raise SpecError(problem, source=source, key=key)
    return list(dict.fromkeys(value))


def _resolve_space(job: Job, source: str) -> None:
    spec, backend = job.spec, job.backend
    searchable = [k for k in backend.knobs if k not in DERIVED]
    raw = spec.space
    inline: dict[str, Any] = {}
    preset_name = backend.default_space
    if isinstance(raw, str):
        preset_name = raw
    elif isinstance(raw, dict):
        inline = dict(raw)
        preset = inline.pop("preset", preset_name)
        if not isinstance(preset, str):
            raise SpecError(
                f"must be the name of a preset ({', '.join(backend.presets())})",
                source=source,
                key="space.preset",
            )
        preset_name = preset
    try:
        preset = backend.load_preset(preset_name)
    except KeyError:
        key = "space.preset" if isinstance(raw, dict) else "space"
        raise SpecError(
            f"no preset {shown(preset_name)}; choose between {', '.join(backend.presets())}",
            source=source,
            key=key,
        ) from None
    for knob in inline:
        if knob not in searchable:
            raise SpecError(
                f"the {backend.name} backend has no knob {shown(knob)}; knobs: {', '.join(searchable)}",
                source=source,
                key=f"space.{knob}",
            )
    for knob in searchable:
        if knob in inline:
            values = _choices(inline[knob], backend.knobs[knob], f"space.{knob}", source)
            if knob == "batch_size":
                for b in values:
                    if spec.global_batch % b:
                        raise SpecError(
                            f"{b} does not divide global_batch ({spec.global_batch})",
                            source=source,
                            key="space.batch_size",
                        )
        elif knob in preset:
            values = _choices(preset[knob], backend.knobs[knob], f"{preset_name} preset: {knob}", source)
            if knob == "batch_size":
                dividing = [b for b in values if spec.global_batch % b == 0]
                # No preset size divides an odd global batch: use its divisors in the preset's range.
                values = dividing or [
                    d for d in range(min(values), min(max(values), spec.global_batch) + 1) if spec.global_batch % d == 0
                ]
        else:
            values = [job.baseline.get(knob, backend.knobs[knob].reference)]
        job.space[knob] = values


def _resolve_baseline(job: Job, source: str) -> None:
    spec, backend = job.spec, job.backend
    for knob, value in spec.baseline.items():
        if knob not in backend.knobs or knob in DERIVED:
            allowed = ", ".join(k for k in backend.knobs if k not in DERIVED)
            raise SpecError(
                f"the {backend.name} backend has no knob {shown(knob)} to set; knobs: {allowed}",
                source=source,
                key=f"baseline.{knob}",
            )
        problem = backend.knobs[knob].check(value)
        if problem:
            raise SpecError(problem, source=source, key=f"baseline.{knob}")
    baseline = {k: knob.reference for k, knob in backend.knobs.items() if k not in DERIVED}
    baseline["batch_size"] = spec.global_batch
    baseline.update(spec.baseline)
    if spec.global_batch % baseline["batch_size"]:
        raise SpecError(
            f"{baseline['batch_size']} does not divide global_batch ({spec.global_batch})",
            source=source,
            key="baseline.batch_size",
        )
    job.baseline = baseline


def parse_spec(data: Any, source: str, text: str = "") -> Job:
    """Validate already-loaded YAML data."""
    if data is None:
        raise SpecError(
            "the file is empty; a job spec needs at least name, backend, workload and global_batch", source=source
        )
    if not isinstance(data, dict):
        raise SpecError(
            f"a job spec is a mapping of keys (name, backend, workload, global_batch, ...), not {type(data).__name__}",
            source=source,
        )
    _check_size(data, source)
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        # For a union (e.g. sampler: name or mapping) the deepest error is the telling one.
        errors: list[Any] = list(exc.errors())
        key, message = _describe_pydantic(max(errors, key=lambda e: len(e["loc"])))
        raise SpecError(message, source=source, key=key) from None
    if not NAME.fullmatch(spec.name):
        raise SpecError(NAME_RULE, source=source, key="name")
    if spec.backend not in BACKENDS:
        raise SpecError(
            f"{shown(spec.backend)} is not a backend; choose between {', '.join(BACKENDS)}",
            source=source,
            key="backend",
        )
    backend = get_backend(spec.backend)
    missing = backend.missing_requirements()
    if missing:
        raise SpecError(missing, source=source, key="backend")
    ref = spec.workload
    if ref.startswith("builtin:"):
        if ref.removeprefix("builtin:") not in backend.builtin_workloads:
            choices = ", ".join(f"builtin:{n}" for n in backend.builtin_workloads)
            raise SpecError(
                f"no built-in workload {shown(ref)}; choose between {choices} or give package.module:function",
                source=source,
                key="workload",
            )
    elif not is_import_path(ref):
        raise SpecError(
            f"{shown(ref)} is neither builtin:<name> nor package.module:function", source=source, key="workload"
        )
    if not re.fullmatch(r"auto|cpu|cuda(:[0-9]+)?", spec.device):
        raise SpecError(
            f"{shown(spec.device)} is not a device; use auto, cpu, cuda or cuda:N", source=source, key="device"
        )
    job = Job(spec, source, text)
    _resolve_baseline(job, source)
    _resolve_space(job, source)
    for knob, value in job.baseline.items():  # the baseline is trial 0: it is a point of the space
        if value not in job.space[knob]:
            job.space[knob] = [value, *job.space[knob]]
    configs = math.prod(len(values) for values in job.space.values())
    if configs > MAX_CONFIGS:
        raise SpecError(
            f"the space holds {configs:,} configs; at most {MAX_CONFIGS:,} (give fewer choices)",
            source=source,
            key="space",
        )
    return job


def _check_size(data: Any, source: str) -> None:
    """Refuse data that contains itself, or holds more than MAX_VALUES values once YAML aliases
    are expanded: a few lines of anchors can stand for billions of values."""
    count = 0

    def walk(value: Any, ancestors: frozenset[int]) -> None:
        nonlocal count
        count += 1
        if count > MAX_VALUES:
            raise SpecError(f"too large: more than {MAX_VALUES:,} values once its aliases are expanded", source=source)
        if isinstance(value, (dict, list)):
            if id(value) in ancestors:
                raise SpecError("a value contains itself (a YAML alias inside its own anchor)", source=source)
            inner = ancestors | {id(value)}
            for item in value.values() if isinstance(value, dict) else value:
                walk(item, inner)

    try:
        walk(data, frozenset())
    except RecursionError:
        raise SpecError("not valid YAML (nested too deeply)", source=source) from None


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of `path`, or one SpecError line saying why it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError("no such file", source=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(
            f"cannot read the {what}: {exc.__class__.__name__}: {getattr(exc, 'strerror', None) or exc}",
            source=str(path),
        ) from None


def load_spec(path: str | Path) -> Job:
    source = str(path)
    text = read_text(path, "spec")
    return parse_spec(parse_yaml(text, source), source, text)


def parse_yaml(text: str, source: str) -> Any:
    """YAML text as plain data, with `yaml.safe_load`: no tag builds a Python object. Any problem
    is one SpecError line naming `source`."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"{where}not valid YAML ({problem})", source=source) from None
    except RecursionError:
        raise SpecError("not valid YAML (nested too deeply)", source=source) from None
    except (ValueError, OverflowError) as exc:  # a scalar the constructor refuses: 2024-13-45, a 5000-digit int
        raise SpecError(f"not valid YAML ({' '.join(str(exc).split())[:100]})", source=source) from None
