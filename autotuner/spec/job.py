"""The job: a spec validated against its backend, with what follows from it.

`load_spec(path)` reads the YAML file and checks its keys (`autotuner.spec.keys`: the models of
the spec's sections), then checks it against the backend's knob table (unknown knobs or values,
empty choice lists, a batch size that does not divide `global_batch`) and resolves the search
space and the baseline (`autotuner.spec.space`). Any problem is one `SpecError` line naming the
file, the key and what is allowed. Nothing in a spec is executed except the workload factory it names, which is trusted
code (like a pytest conftest.py) imported in trial processes.

A `Job` is a value: what the search learns of the device (`Job.narrow`) gives a new one.

A study's outputs go into one folder of its own, `output_dir(name)`: `runs/<name>/` in the
current directory, which a user deletes, archives or shares whole.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path

from autotuner.backends import BACKENDS, Backend, Capabilities, get_backend
from autotuner.config.knobs import ACCUMULATION, BATCH_SIZE, Config, Params, Value
from autotuner.errors import SpecError, shown
from autotuner.measurement.telemetry import usable_cpus
from autotuner.spec.keys import JobSpec, SamplerSettings, parse_yaml, read_text, validate_spec
from autotuner.spec.space import SearchSpace, rank_batch, resolve_baseline, resolve_space
from autotuner.spec.tasks import TASKS, TRAIN, Task
from autotuner.trials.factory import is_import_path
from autotuner.trials.launcher import TrialLauncher
from autotuner.trials.nodes import split_endpoint
from autotuner.trials.probe import Environment
from autotuner.trials.request import ProbeRequest, TrialRequest

MAX_CONFIGS = 100_000
"""Most configs a searched space may hold, once narrowed to the device and workload
(`Job.narrow`): every one is listed for the sampler."""
MAX_DECLARED_CONFIGS = 1_000_000
"""Most configs a spec's space may declare: values that cannot matter on the device and workload
are dropped from it before the search (`Job.narrow`), and the rest must fit `MAX_CONFIGS`."""
TRIAL_TIMEOUT_S = 600.0
"""A trial's timeout when the spec sets none, before the backend's factor for its config."""


def output_dir(name: str) -> Path:
    """The folder of study `name`'s outputs (database, export, report, compile cache), relative to
    the current directory. One folder per study: what a user deletes, archives or shares, and the
    example specs in `studies/` stay clean. Whoever writes into it creates it."""
    return Path("runs") / name


@dataclass(frozen=True, eq=False)
class Job:
    """A validated spec, with what follows from it: the resolved space and baseline. A value:
    narrowing its space to a device (`narrow`) gives a new job."""

    spec: JobSpec
    source: str
    """Where the spec was read from, as its errors name it."""
    text: str
    backend: Backend
    """The spec's backend for its task (`get_backend`)."""
    baseline: Config
    """The baseline config (trial 0): a point of `space`."""
    space: SearchSpace
    """Knob -> the values searched: the declared ones, narrowed by `narrow` once the probe has
    said what the device and the workload can honour."""
    declared_space: SearchSpace
    """The space as the spec (and its preset) declared it: what the study's identity hashes."""

    @property
    def task(self) -> Task:
        """What the job does with its workload (`autotuner.spec.tasks`)."""
        return TASKS[self.spec.task]

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def parallel(self) -> str | None:
        """How the trial's ranks train together: the spec's `parallel`, by default with
        `processes` above 1 the backend's first way (`Backend.parallel`); None for one process."""
        return _parallel(self.spec, self.backend)

    @property
    def rank_batch(self) -> int:
        """Samples each rank takes per optimizer step: `global_batch` / `processes` (the
        micro-batch x accumulation of every config)."""
        return rank_batch(self.spec)

    @property
    def sampler(self) -> SamplerSettings:
        s = self.spec.sampler
        return SamplerSettings(name=s) if isinstance(s, str) else s

    def workload_path(self) -> str:
        return self.backend.resolve_workload(self.spec.workload)

    def output_dir(self) -> Path:
        """The study's folder of outputs, `runs/<name>/` (see `output_dir`)."""
        return output_dir(self.name)

    def storage_url(self, override: str | None = None) -> str:
        return override or self.spec.storage or f"sqlite:///{(self.output_dir() / 'study.db').as_posix()}"

    def earlier_default_storage(self, override: str | None = None) -> str | None:
        """The URL of this study's database where autotuner 0.1 kept it by default
        (`studies/<name>.db`), when the default storage is used, has no database yet, and that one
        exists: the search then says how to resume it rather than starting afresh in silence."""
        if override or self.spec.storage or (self.output_dir() / "study.db").exists():
            return None
        earlier = Path("studies") / f"{self.name}.db"
        return f"sqlite:///{earlier.as_posix()}" if earlier.is_file() else None

    def identity(self) -> str:
        """Hash of everything that changes what a trial measures; a study keeps one identity.

        The device is not part of it (workers of one study use different GPUs; the hardware
        fingerprint guards what matters), nor the budget, storage, sampler, the run and its cost,
        the profile, or the trial's timeout and memory limit."""
        data = self.spec.model_dump(
            exclude={
                "budget": True,
                "storage": True,
                "sampler": True,
                "device": True,
                "run": True,  # a study is ranked for any run: its trials measure the same
                "cost": True,
                "profile": True,  # what runs after the search, not what a trial measures
                "trial": {"timeout", "max_memory_mb"},
                "rendezvous": True,  # where the nodes meet, not what they measure
            }
        )
        # Keys added since, at their defaults, are left out: a study or an export made before them
        # keeps its identity (`task`: training; one node; no latency limit).
        if data.get("task") == TRAIN.name:
            del data["task"]
        if data.get("nodes") == 1:
            del data["nodes"]
        objective = data.get("objective", {})
        if objective.get("max_latency_ms") is None:
            objective.pop("max_latency_ms", None)
        if objective.get("optimize") == "throughput":
            objective.pop("optimize", None)
        # A quiet knob (one added after the first four) held at its reference value is left out,
        # so that adding a knob keeps the identity of every study whose space does not search it.
        knobs = self.backend.knobs
        fixed = {
            k
            for k, values in self.declared_space.items()
            if knobs[k].quiet and values == (knobs[k].reference,) and self.baseline.get(k) == knobs[k].reference
        }
        data["space"] = {k: v for k, v in self.declared_space.items() if k not in fixed}
        data["baseline"] = {k: v for k, v in self.baseline.items() if k not in fixed}
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def narrow(self, capabilities: Capabilities) -> tuple[Job, dict[str, dict[Value, str]]]:
        """This job with the values that cannot matter on a device with `capabilities` dropped
        from its space (`Backend.irrelevant`: the probe's device and workload), the baseline's own
        value aside; and those values, knob -> value -> why. A SpecError when the narrowed space is
        still larger than `MAX_CONFIGS`."""

        def irrelevant(knob: str, value: Value) -> str | None:
            return None if value == self.baseline.get(knob) else self.backend.irrelevant(knob, value, capabilities)

        space, dropped = self.space.narrowed(irrelevant)
        if space.size > MAX_CONFIGS:
            raise SpecError(
                f"the space holds {space.size:,} configs this device and workload can run; at most {MAX_CONFIGS:,} "
                "(give fewer choices)",
                source=self.source,
                key="space",
            )
        return replace(self, space=space), dropped

    def compile_cache_dir(self) -> Path:
        """The study's own compile cache (torch.compile's), in its folder beside its default storage."""
        return (self.output_dir() / "compile-cache").resolve()

    def trial_timeout(self, *configs: Config) -> float:
        """Seconds a trial of the slowest of `configs` may take: `trial.timeout` when the spec sets
        it, else `TRIAL_TIMEOUT_S` times the backend's factor (a config that compiles longer gets
        longer); no config: the reference's (`reference_config`)."""
        if self.spec.trial.timeout is not None:
            return self.spec.trial.timeout
        return TRIAL_TIMEOUT_S * max(self.backend.timeout_factor(c) for c in configs or (self.reference_config(),))

    def log_path(self, name: str) -> str:
        """Where the processes of `name` (`trial-<number>`, `reference`, `probe`, `apply`) keep their
        output: each its own `runs/<study>/logs/<name>.<pid>.log`, removed when it wrote nothing
        (`autotuner.trials.launcher.log_file`; `autotuner logs` prints them)."""
        return str(self.output_dir() / "logs" / name)

    def probe_request(self, device: str, log: str | None = None) -> ProbeRequest:
        """The probe of `device` for this job: its workload built from the spec's arguments and its
        data checked against its global batch, before anything is stored or run; with `log`, its
        output goes there (`TrialRequest.log`)."""
        return ProbeRequest(
            device,
            self.workload_path(),
            dict(self.spec.workload_args),
            self.spec.global_batch,
            self.parallel,
            log,
            nodes=self.spec.nodes,
        )

    def probe(
        self, launcher: TrialLauncher, device: str, source: str | None = None, log: str | None = None
    ) -> Environment:
        """`probe_request(device, log)` run by `launcher` (`autotuner.backends.Backend.probe`); a
        device that does not exist, or a machine that cannot hold the trial's ranks
        (`check_ranks`), is an error of `source` (the spec unless told)."""
        source = source or self.source
        if device == "cpu":  # told without a probe's seconds
            self.check_ranks(None, device, source, usable_cpus())
        environment = self.backend.probe(launcher, self.probe_request(device, log), source)
        self.check_ranks(environment, device, source, usable_cpus())
        return environment

    def check_ranks(self, environment: Environment | None, device: str, source: str, cpus: Collection[int]) -> None:
        """A SpecError naming `processes` when this machine cannot hold the trial's ranks: on GPUs,
        one each from `device` on among those visible; on the CPU (`environment` None: the spec's
        `device: cpu`, before any probe), a core each among the `cpus` the search may run on (more
        would share cores, each rank's step waiting on the others' threads, and a study of them
        would measure nothing the job could use)."""
        processes = self.spec.processes
        if processes == 1:
            return
        if environment is not None and environment.accelerator:
            needed = int(device.partition(":")[2] or 0) + processes
            if environment.device_count < needed:
                raise SpecError(
                    f"{processes} ranks from {device} need GPUs up to cuda:{needed - 1}; "
                    f"{environment.device_count} are visible",
                    source=source,
                    key="processes",
                )
        elif processes > len(cpus):
            raise SpecError(
                f"{processes} ranks on the CPU need a core each; this machine gives the search {len(cpus)} "
                f"(processes: {len(cpus)} at most)",
                source=source,
                key="processes",
            )

    def trial_request(
        self,
        config: Config,
        device: str,
        *,
        measure: bool = True,
        prune_best: float | None = None,
        progress: str | None = None,
        log: str | None = None,
    ) -> TrialRequest:
        """The request that runs `config` on `device`; with `prune_best` (a search trial: the best
        feasible throughput so far), one stopped early when it cannot reach it
        (`trial.prune_after`); with `progress`, one that writes its phase there
        (`autotuner.trials.progress`); with `log`, one whose output goes there (`log_path`)."""
        settings = self.spec.trial
        return TrialRequest(
            workload=self.workload_path(),
            workload_args=dict(self.spec.workload_args),
            device=device,
            config=dict(config),
            global_batch=self.spec.global_batch,
            seed=settings.seed,
            warmup_steps=settings.warmup_steps,
            steps=settings.steps,
            windows=settings.windows,
            drift_steps=settings.drift_steps,
            heldout_batch=self.baseline[BATCH_SIZE.name],
            measure=measure,
            min_window_s=settings.min_window_s,
            prune_best=prune_best,
            prune_after=settings.prune_after if prune_best is not None else 0,
            progress=progress,
            compile_cache=str(self.compile_cache_dir()),
            processes=self.spec.processes,
            nodes=self.spec.nodes,
            rendezvous=self.spec.rendezvous,
            parallel=self.parallel,
            log=log,
            time_calls=self.task.times_calls(self.spec),
        )

    def complete(self, params: Params) -> Config:
        """A full config from sampled params: fixed knobs from the baseline, accumulation derived."""
        config: Config = {knob: params.get(knob, self.baseline[knob]) for knob in self.space}
        config[ACCUMULATION.name] = self.rank_batch // int(config[BATCH_SIZE.name])
        return config

    def reference_config(self) -> Config:
        """The numerically strictest config: the baseline's batching, everything else strict, at
        the knobs' reference values or the backend's equally strict ones
        (`Backend.reference_overrides`: JAX's reference runs jitted)."""
        overrides = self.backend.reference_overrides()
        config = {knob: overrides.get(knob, self.backend.knobs[knob].reference) for knob in self.space}
        config[BATCH_SIZE.name] = self.baseline[BATCH_SIZE.name]
        config[ACCUMULATION.name] = self.rank_batch // config[BATCH_SIZE.name]
        return config


# ------------------------------------------------------------------ loading


def _parallel(spec: JobSpec, backend: Backend) -> str | None:
    return None if spec.world == 1 else spec.parallel or backend.parallel[0]


def _check_nodes(spec: JobSpec, backend: Backend, source: str) -> None:
    """`nodes` and `rendezvous` as this backend can run them."""
    if spec.nodes == 1:
        if spec.rendezvous is not None:
            raise SpecError(
                "rendezvous is where the nodes of a trial meet; set nodes: 2 or more, or leave it out",
                source=source,
                key="rendezvous",
            )
        return
    if not backend.nodes:
        raise SpecError(
            f"the {backend.name} backend runs a trial on one machine; nodes must be 1", source=source, key="nodes"
        )
    if spec.rendezvous is None:
        raise SpecError(
            f"nodes: {spec.nodes} needs rendezvous: host:port, node 0's address that every node reaches",
            source=source,
            key="rendezvous",
        )
    _check_endpoint(spec.rendezvous, source)


def _check_endpoint(endpoint: str, source: str) -> None:
    try:
        split_endpoint(endpoint)
    except ValueError as exc:
        raise SpecError(str(exc), source=source, key="rendezvous") from None


def _check_parallel(spec: JobSpec, backend: Backend, source: str) -> None:
    """`processes`, `nodes` and `parallel` as this backend can run them, `global_batch` split evenly."""
    _check_nodes(spec, backend, source)
    if spec.world == 1:
        if spec.parallel is not None:
            raise SpecError(
                f"parallel: {spec.parallel} trains several processes together; set processes: 2 or more",
                source=source,
                key="parallel",
            )
        return
    if not backend.parallel:
        raise SpecError(
            f"the {backend.name} backend runs a trial in one process; processes must be 1",
            source=source,
            key="processes",
        )
    if spec.parallel is not None and spec.parallel not in backend.parallel:
        raise SpecError(
            f"{spec.parallel} is not a way the {backend.name} backend trains; "
            f"choose between {', '.join(backend.parallel)}",
            source=source,
            key="parallel",
        )
    if spec.global_batch % spec.world:
        ranks = f"processes ({spec.processes})" if spec.nodes == 1 else f"nodes x processes ({spec.world})"
        raise SpecError(
            f"global_batch ({spec.global_batch}) is not a multiple of {ranks}: every rank "
            "takes the same share of each optimizer step",
            source=source,
            key="processes",
        )


def parse_spec(data: object, source: str, text: str = "") -> Job:
    """Validate already-loaded YAML data: its keys (`autotuner.spec.keys`), then against the backend."""
    spec = validate_spec(data, source)
    if spec.backend not in BACKENDS:
        raise SpecError(
            f"{shown(spec.backend)} is not a backend; choose between {', '.join(BACKENDS)}",
            source=source,
            key="backend",
        )
    TASKS[spec.task].check(spec, source)
    try:
        backend = get_backend(spec.backend, spec.task)
    except KeyError:
        raise SpecError(f"the {spec.backend} backend has no task {spec.task}", source=source, key="task") from None
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
    _check_parallel(spec, backend, source)
    parallel = _parallel(spec, backend)
    baseline = resolve_baseline(spec, backend, parallel, source)
    # the baseline is trial 0: it is a point of the space
    space = resolve_space(spec, backend, parallel, baseline, source).with_first(baseline)
    if space.size > MAX_DECLARED_CONFIGS:
        raise SpecError(
            f"the space holds {space.size:,} configs; at most {MAX_DECLARED_CONFIGS:,} (give fewer choices)",
            source=source,
            key="space",
        )
    return Job(spec, source, text, backend, baseline, space, declared_space=space)


def load_spec(path: str | Path) -> Job:
    source = str(path)
    text = read_text(path, "spec")
    return parse_spec(parse_yaml(text, source), source, text)
