"""The backend contract, engine side, and what else a backend provides.

A backend has three parts:

* a `Backend` object (this module's abstract class), imported by the engine in the search
  process and registered with `autotuner.backends.register`. It must not import its framework. It
  holds the backend's knob table (the common knobs of `autotuner.config.knobs`, restricted to the
  values it honours, and the knobs only its framework has), its built-in workloads and
  search-space presets, and decides from its `Capabilities` (a subclass for the capabilities
  only its framework has) which configs the hardware cannot honour.
* a runner module (`Backend.runner`), imported only in trial processes (and preloaded by the
  fork server, so it must not touch the accelerator at import time). It holds the backend's
  `autotuner.trials.training.TrainingBackend`, the framework's steps of the one trial algorithm
  (`autotuner.trials.training`), as the module attribute ``TRIAL_BACKEND`` (an inference runner
  module holds its `autotuner.trials.serving.ServingBackend`): a trial process imports the module and
  calls on ``TRIAL_BACKEND`` the entry point the engine names (`autotuner.trials.launcher`). Both
  roles stand on `autotuner.trials.process.TrialProcess` (device, environment, seed, build,
  memory, errors), which a framework writes once beside them; they provide ``probe``, ``run``
  and ``profile`` over the backend's steps; the backend writes ``classify_exception``:

  ``probe(request: autotuner.trials.request.ProbeRequest) -> autotuner.trials.probe.ProbeResult``
      Called once per search in a trial process, before anything is stored
      (`autotuner.trials.process.probe`, over the backend's ``environment(device)``, which returns
      an `autotuner.trials.probe.Environment` named with the trial side's ``name``). The result
      holds the environment and ``workload_error``, one line (why the factory cannot be
      imported or does not build a workload from the request's ``workload_args``; why its data
      cannot train: an empty dataset, one smaller than ``global_batch``, or what the backend's
      optional ``first_batch_problem`` finds when it batches the first items and computes the
      loss on them; None when nothing is wrong).
  ``run(request: autotuner.trials.request.TrialRequest, turns=None) -> autotuner.trials.trial_output.TrialOutput``
      One trial: `autotuner.trials.training.run_trial`; with ``turns`` (`autotuner.measurement.turns.Turns`),
      measured in a lockstep group (`autotuner.trials.lockstep`). A non-finite loss raises
      `autotuner.trials.outcomes.NonFiniteLoss`; a loader that yields no batch, `autotuner.trials.training.EmptyLoader`.
  ``profile(request: autotuner.trials.request.ProfileRequest) -> autotuner.trials.trial_output.ProfileOutput``
      A config's steps under the framework's profiler (`autotuner.trials.training.run_profile`, over
      the backend's ``profiling``).
  ``classify_exception(exc: BaseException) -> str | None``
      ``"oom"`` when `exc` is the framework's out-of-memory exception type, else None; the
      trial process asks it about any exception the entry point raised.

* an apply module (``backends/<name>/apply.py``): the one implementation of what a config means
  for a training loop. The runner trains through it, and users import it for their
  own loop, so what a trial measured is what a user gets. It provides one class:

  ``TunedTraining(config, model, optimizer, dataset=None, device=None)``
      ``config`` is an `autotuner.apply.TunedConfig` (from ``load_config``: its ``params``,
      checked against this backend's knobs) or a plain mapping of knob values. The constructor
      does everything decided once: places the model on ``device`` (None: the backend's
      default), sets the precision (framework flags, autocast or dtype policy), compiles or
      jits the model (``model``: what the loop calls; a model already compiled is kept), and
      builds ``loader`` over ``dataset`` (None without one). Attributes: ``model``,
      ``optimizer``, ``device``, ``loader``, ``batch_size`` (micro-batch), ``accumulation``,
      ``global_batch``. Methods, called in this order each micro-step:
      ``to_device(batch)``, every tensor of a batch of any structure (nested mappings,
      sequences, namedtuples, dataclasses) on the device, anything else left as it is;
      ``autocast()``, a context for the forward pass and the loss;
      ``backward(loss)``, this micro-batch's gradients divided by ``accumulation`` (and scaled
      for fp16); ``step() -> bool``, which every ``accumulation``-th call steps the optimizer,
      clears the accumulated gradients and returns True, and otherwise returns False. And
      ``make_loader(dataset, *, shuffle=True, seed=None)``: a loader of micro-batches with the
      config's workers, dropping the last partial one. PyTorch's also takes ``collate_fn`` (a
      keyword: what batches the items of every loader it makes), the workload's in the trials,
      and ``parallel`` (``ddp`` or ``fsdp``, default the exported config's: this process is one
      rank of an initialised process group; it wraps or shards the model itself, and its loader
      takes this rank's share of the dataset, ``global_batch`` counting every rank).

  A JAX backend fills in the same names for a functional loop, with the initial parameters as
  a keyword (``TunedTraining(config, loss_fn, optimizer, dataset=None, device=None, *,
  params)``): ``model`` is the loss function differentiated under the config's dtype policy
  (``model(params, batch) -> (loss, grads)``, jitted with ``jit: on``; bf16 computes with bf16
  copies of the fp32 parameters), ``autocast()`` is the ``jax.default_matmul_precision``
  context (TF32 for ``tf32``, strict fp32 otherwise), ``backward(grads)`` accumulates the
  gradient pytree and ``step()`` applies the optax update with the mean gradient to ``params``,
  the fp32 master parameters it keeps. With ``devices=N`` (a config of ``parallel:
  data_parallel``) it trains over N local devices: a mesh, each micro-batch of ``batch_size x N``
  samples split between them, the parameters replicated or sharded as ``param_sharding`` says.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, Generic, Protocol, TypeVar

from autotuner.config.knobs import ACCUMULATION, BATCH_SIZE, PRECISION, WORKERS, Config, Knob
from autotuner.errors import BackendError, SpecError
from autotuner.search_spaces import available, load_preset
from autotuner.trials.factory import preloadable_imports
from autotuner.trials.launcher import TrialLauncher, TrialResult
from autotuner.trials.nodes import NodeStore
from autotuner.trials.outcomes import Outcome
from autotuner.trials.probe import PROBE_TIMEOUT_S, Environment, ProbeResult
from autotuner.trials.request import ProbeRequest


def capability(label: str) -> bool:
    """A capability field (False until the probe finds it), labelled for `autotuner env` and reports."""
    return field(default=False, metadata={"label": label})


class ExportedConfig(Protocol):
    """What a backend reads of an exported config (`autotuner.apply.TunedConfig`, which
    `autotuner.apply.load_config` returns): the backend it was tuned with and its knob values."""

    @property
    def backend(self) -> str: ...

    @property
    def params(self) -> Mapping[str, object]: ...


@dataclass(frozen=True)
class Capabilities:
    """What the device of a search can do, as the trial-process probe found it. These are the
    capabilities every backend reports; a backend whose knobs depend on more (a compiler, CUDA
    graphs) subclasses it (`Backend.capabilities_type`)."""

    accelerator: bool = capability("accelerator")
    """A GPU (CUDA) rather than the CPU."""
    bf16: bool = capability("bf16")
    fp16: bool = capability("fp16")
    tf32: bool = capability("tf32")

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Capabilities:
        names = {f.name for f in fields(cls)}
        return cls(**{k: bool(v) for k, v in data.items() if k in names})

    @classmethod
    def labels(cls) -> dict[str, str]:
        """Field name -> label, the accelerator aside (the device says it)."""
        return {f.name: f.metadata["label"] for f in fields(cls) if f.name != "accelerator"}


C = TypeVar("C", bound=Capabilities)


def _matters(knob: Knob, value: object, capabilities: object) -> str | None:
    return None


def _fits(config: Config, capabilities: object) -> str | None:
    return None


@dataclass(frozen=True)
class Family(Generic[C]):
    """A knob, or knobs that act together, with the rules that decide where they can run: the one
    place a knob's backend-side meaning lives (a module of its backend's `knobs` package). A
    backend's `irrelevant` and `unsupported_reason` are loops over its `Backend.families`."""

    knobs: tuple[Knob, ...]
    irrelevant: Callable[[Knob, object, C], str | None] = _matters
    """Why a value of one of its knobs (never the reference value) cannot matter on a device with
    these capabilities, whatever the rest of the config (`Backend.irrelevant`), or None."""
    conflict: Callable[[Config, C], str | None] = _fits
    """Why a config's values of its knobs cannot run with the rest of the config on these
    capabilities (`Backend.unsupported_reason`), or None."""

    def restricted(self, name: str, *choices: object) -> Family[C]:
        """This family with its knob `name` taking only `choices` (`Knob.restricted`)."""
        return replace(self, knobs=tuple(k.restricted(*choices) if k.name == name else k for k in self.knobs))


class Backend:
    """The engine-side half of a backend: knobs, built-ins, presets and what the hardware can honour.
    A subclass sets the class attributes below; its knobs' rules are its `families`."""

    name: str
    runner: str
    """Import path of the runner module (see the module docstring)."""
    knobs: Mapping[str, Knob]
    """Knob name -> the knob, with the values this backend honours (`autotuner.config.knobs.knob_table`
    of the common knobs, restricted where it honours fewer values, and the framework's own)."""
    capabilities_type: type[Capabilities] = Capabilities
    """What this backend's probe reports (a subclass where its knobs depend on more)."""
    parallel: tuple[str, ...] = ()
    """The ways a trial of several processes trains together (the spec's `parallel`), the default
    first; empty: a trial is one process."""
    nodes: bool = False
    """A trial's ranks may span several machines (the spec's `nodes`): its runner starts each node's
    ranks through `torch.distributed.elastic`."""
    builtin_workloads: Mapping[str, str]
    """`builtin:<name>` -> `package.module:function`."""
    families: tuple[Family[Any], ...] = ()
    """Its knobs' rules (`Family`), in the order `unsupported_reason` asks them; a knob in none
    (the micro-batch, the loader's workers) can run wherever the backend does."""
    default_space: str
    """Name of the search-space preset used when the spec names none (one of `presets()`)."""
    requires: tuple[str, ...] = ()
    """Top-level modules the runner imports: checked, never imported, when a spec names the backend."""
    install: str = ""
    """The command that installs them."""
    formats: str | None = None
    """Import path of the module whose `FORMATS` (name -> `autotuner.backends._formats.ExportFormat`)
    are the formats `autotuner export --format` writes this backend's configs in; None: none.
    Imported only when they are asked for (`autotuner.backends.export_formats`)."""

    def capabilities(self, data: Mapping[str, object]) -> Capabilities:
        """The probe's `capabilities` report as this backend's `capabilities_type`."""
        return self.capabilities_type.from_dict(data)

    def launcher(self, memory_limit_mb: float | None = None, workload: str | None = None) -> TrialLauncher:
        """A launcher of this backend's trial processes: its fork server preloads the runner, and
        the libraries the `workload` factory's module imports that it may import once for all
        trials (`autotuner.trials.factory.preloadable_imports`); with `memory_limit_mb`, each
        process may allocate that much (`trial.max_memory_mb`)."""
        libraries = preloadable_imports(workload) if workload else []
        return TrialLauncher([self.runner, *libraries], memory_limit_mb=memory_limit_mb)

    def node_store(self, endpoint: str, *, host: bool, timeout_s: float) -> NodeStore:
        """The store the nodes of a study share at `endpoint` (`host:port`): hosted here by node 0's
        search (`host`), else a client of it, whose connecting and each wait may take `timeout_s`
        (`autotuner.trials.nodes`). Only a backend whose trials span nodes (`nodes`) has one."""
        raise NotImplementedError(f"the {self.name} backend runs a trial on one machine")

    def probe(self, launcher: TrialLauncher, request: ProbeRequest, source: str | None = None) -> Environment:
        """The environment `request`'s probe finds, from a trial process of `launcher`. A device
        that does not exist, or a workload that cannot be tuned, is a `SpecError` (of `source`, the
        spec); a backend that cannot start, a `BackendError`."""
        probed: TrialResult[ProbeResult] = launcher.call(self.runner, "probe", request, PROBE_TIMEOUT_S)
        if probed.outcome is not Outcome.OK or probed.output is None:
            if probed.outcome is Outcome.ERROR and probed.reason.startswith("ValueError: device"):
                raise SpecError(probed.reason.removeprefix("ValueError: "), source=source)
            raise BackendError(f"the {self.name} backend could not start: {probed.outcome}: {probed.reason}")
        if probed.output.workload_error:
            raise SpecError(probed.output.workload_error, source=source, key="workload")
        # The first process of a launcher waits for its fork server to start: the interpreter and the
        # framework's import, which every run of the job pays before its first line.
        return replace(probed.output.environment, framework_start_s=probed.startup_s)

    def default_preset(self, parallel: str | None) -> str:
        """The search-space preset a spec that names none searches, for a job whose ranks train
        together as `parallel` (None: one process)."""
        return self.default_space

    def job_knobs(self, parallel: str | None) -> Mapping[str, Knob]:
        """The knobs of a job whose ranks train together as `parallel` (None: one process): all of
        `knobs` but those of the other ways of training across processes. A config holds these;
        one that lacks the others takes their reference values (`with_defaults`)."""
        return self.knobs

    def missing_requirements(self) -> str | None:
        """Why this backend cannot run in this Python (its framework is not installed), or None."""
        missing = [module for module in self.requires if importlib.util.find_spec(module) is None]
        if not missing:
            return None
        return f"the {self.name} backend needs {' and '.join(missing)}, not installed here: {self.install}"

    def unsupported_reason(self, config: Config, capabilities: Capabilities) -> str | None:
        """Why the hardware cannot honour `config` (it is then recorded, never run), or None: its
        precision (`unsupported_precision`), then each knob's value (`irrelevant`), then each
        family's `Family.conflict` with the rest of the config."""
        reason = self.unsupported_precision(config.get(PRECISION.name, "fp32"), capabilities)
        if reason:
            return reason
        for knob, value in config.items():
            if reason := self.irrelevant(knob, value, capabilities):
                return reason
        caps = self._capabilities(capabilities)
        for family in self.families:
            if reason := family.conflict(config, caps):
                return reason
        return None

    def irrelevant(self, knob: str, value: object, capabilities: Capabilities) -> str | None:
        """Why `value` of `knob` cannot matter on a device with `capabilities`, whatever the rest of
        the config (pinned memory without a GPU, say), or None: its family's `Family.irrelevant`;
        never for a knob's reference value. Such values are dropped from the space before the
        first trial (`autotuner.spec.job.Job.narrow`); `unsupported_reason` refuses them too, for
        configs that arrive otherwise (an exported config applied elsewhere)."""
        definition = self.knobs.get(knob)
        if definition is None or value == definition.reference:
            return None
        family = self._family_of.get(knob)
        return None if family is None else family.irrelevant(definition, value, self._capabilities(capabilities))

    @functools.cached_property
    def _family_of(self) -> dict[str, Family[Any]]:
        """Knob name -> its family (`families`): looked up for every value `irrelevant` is asked about."""
        return {knob.name: family for family in self.families for knob in family.knobs}

    def _capabilities(self, capabilities: Capabilities) -> Capabilities:
        """`capabilities` as this backend's `capabilities_type`: a plain `Capabilities` (no probe of
        this backend's) has none of the backend's own."""
        return capabilities if isinstance(capabilities, self.capabilities_type) else self.capabilities_type()

    def presets(self) -> list[str]:
        """The search-space presets a spec may name: by default the YAML files of
        `autotuner.search_spaces`."""
        return available()

    def load_preset(self, name: str) -> dict[str, Any]:
        """The preset `name` (one of `presets()`): knob -> choices; KeyError when there is none."""
        return load_preset(name)

    @staticmethod
    def unsupported_precision(precision: str, capabilities: Capabilities) -> str | None:
        """Why the device cannot compute in `precision`, or None (every backend's first check)."""
        if precision == "tf32" and not capabilities.tf32:
            return "tf32: this device has no TF32 matmuls (it needs an NVIDIA GPU of compute capability 8.0 or newer)"
        if precision == "bf16" and not capabilities.bf16:
            return "bf16: this device does not support bfloat16"
        if precision == "fp16" and not capabilities.fp16:
            return "fp16: this device does not support float16 autocast"
        return None

    def timeout_factor(self, config: Config) -> float:
        """How many times the default trial timeout a trial of `config` may take (compiling costs)."""
        return 1.0

    def reference_overrides(self) -> Config:
        """Knob values the fp32 reference runs with in place of those knobs' reference values
        (`autotuner.spec.job.Job.reference_config`): values just as strict numerically that make
        the reference quicker to run. The knobs' own reference values, what a spec's baseline and
        space default to, stay as they are. None by default."""
        return {}

    def config_params(self, config: ExportedConfig | Mapping[str, object]) -> Config:
        """The knob values of `config` (an `autotuner.apply.TunedConfig` or a plain mapping),
        checked against this backend's knob table; ValueError says what is wrong."""
        if not isinstance(config, Mapping):
            if config.backend != self.name:
                raise ValueError(f"this config was tuned with the {config.backend} backend, not {self.name}")
            config = config.params
        params = with_defaults(self, config)
        if set(params) != set(self.knobs):
            raise ValueError(
                f"a {self.name} config holds {', '.join(self.knobs)}; this one has {', '.join(params) or 'nothing'}"
            )
        for name, knob in self.knobs.items():
            problem = knob.check(params[name])
            if problem:
                raise ValueError(f"config {name}: {problem}")
        return params

    def resolve_workload(self, ref: str) -> str:
        """`builtin:name` -> its import path; any other reference is returned as it is."""
        if ref.startswith("builtin:"):
            return self.builtin_workloads[ref.removeprefix("builtin:")]
        return ref


def with_defaults(backend: Backend, params: Mapping[str, object], device: str = "") -> Config:
    """`params` with every quiet knob it lacks (one added after the first four) at the value a
    config exported before the knob existed implies (`Knob.before`: its reference value, or what
    the study ran on `device` without it), so it still means what it meant then. The first four
    knobs have no default: a config always held them."""
    missing = {name: knob.before(device) for name, knob in backend.knobs.items() if name not in params and knob.quiet}
    return {**params, **missing}


class TunedLoop:
    """What every backend's `TunedTraining` reads from a config before its framework does anything:
    `config` (the knob values, checked against `backend`'s knobs), the precision, the micro-batch,
    the accumulation and the loader's workers."""

    def __init__(self, backend: Backend, config: ExportedConfig | Mapping[str, object]):
        self.config: Mapping[str, Any] = MappingProxyType(backend.config_params(config))
        """Every knob's value, read-only; `KNOB.of(config)` reads one as its knob's type."""
        self.precision: str = PRECISION.of(self.config)
        self.batch_size = int(BATCH_SIZE.of(self.config))
        self.accumulation = int(ACCUMULATION.of(self.config))
        self.workers = int(WORKERS.of(self.config))

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step: micro-batch x accumulation."""
        return self.batch_size * self.accumulation
