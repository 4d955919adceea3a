"""The job spec file: its keys as strict pydantic models, and how YAML text becomes them.

`read_text` and `parse_yaml` read a file with `yaml.safe_load` (no tags that build Python
objects); `validate_spec` checks every key against the models below (unknown keys, wrong types,
non-positive sizes), the data's size and the study's name. Any problem is one `SpecError` line
naming the file, the key and what is allowed. What the keys mean for a backend (its knobs, the
space, the baseline) is checked in `autotuner.spec.job`. The spec reference in the docs is generated
from these models: each field's attribute docstring is its text.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from autotuner.errors import SpecError, shown
from autotuner.measurement.interval import DRIFT

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A study name (matched whole): it names the study's folder, runs/<name>/, so it can never be a path."""
NAME_RULE = "must be 1-64 letters, digits, '_', '-' or '.', starting with a letter or digit"
SAMPLERS = ("tpe", "random", "gp", "nsga2")
MAX_VALUES = 100_000
"""Most values (scalars, lists and mappings, aliases expanded) a spec may hold."""
SHOWN_KEY_CHARS = 80


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
    optimize: Literal["throughput", "latency"] = "throughput"
    """What the study maximizes. `throughput`: samples a second, each config serving a step of
    `global_batch` samples in calls of its own `batch_size`. `latency` (`task: inference` only):
    the time one call takes on a request of `global_batch` samples, which every config serves in
    one call (`batch_size` is `global_batch`), so the configs are ranked by the time of a call (the
    median window of calls, measured and re-measured as throughput is, each window timed by the
    calls it served alone: loading the next batch is not the config's); the speedup is the
    baseline's call time over the config's, and the export and report give each config's p50 and
    p99."""
    max_latency_ms: float | None = Field(None, gt=0, le=86_400_000)
    """`task: inference` only: the most a batch may take, in milliseconds, at the 99th percentile
    of a trial's calls (each timed alone, the device synchronised): a config slower than that is
    infeasible, however many samples a second it serves."""


class Budget(_Strict):
    trials: int = Field(30, gt=0, le=100_000)
    """Trials that are run (unsupported configs, which cost nothing, are not counted)."""
    timeout: float | None = Field(None, gt=0)
    """Seconds of trial wall time for the whole study, summed over every run and worker."""
    remeasure_top: int = Field(3, ge=0, le=1000)
    """Before the best is declared, this many of the fastest feasible configs (those within 15% of
    the best in their trials: one further behind cannot win), and the baseline, are measured again
    in fresh trial processes, then up to as many more that came out within the machine's noise of
    the best; 0: never. Not counted in `trials`."""
    remeasure_runs: int = Field(5, gt=0, le=100)
    """The most rounds of re-measurement: in each, every config still in contention and the
    baseline run one more trial process, measured together. Each round gives each config a
    speedup over the baseline beside it; from two rounds on, its speedup has a 90% interval
    (`autotuner.measurement.interval`). A config whose interval the leader's clears is out
    (`autotuner.results.standings.contenders`); the rounds never stop on the leader's interval
    (stopping on a narrow one would make it hold less often than it says), only at this cap, in
    the time (`remeasure_share`), or when no config is left. A config's throughput is the median
    over every window of its processes. The rounds are the whole re-measurement's: configs that come in later (a
    re-measurement reordered the top) get the rounds the first ones left, two at least."""
    remeasure_share: float = Field(0.5, ge=0, le=100)
    """The most re-measurement may cost, as a share of the wall time the study's trials took (every
    trial that ran a process, summed): its windows a process are as many as let three rounds fit in
    it (`remeasure_windows` at most, three at least), and after the second round it stops before a
    round that would take it past that time, saying what it left undecided. 0: no bound but
    `remeasure_runs`."""
    remeasure_width: float = Field(0.05, gt=0, le=1)
    """How certain the winner's speedup is asked to be: its interval's half-width relative to the
    speedup (0.05: within about 5% at 90%). Where the rounds end with the winner's interval wider,
    the search says so in one line, with the interval it has (more `remeasure_runs` or a larger
    `remeasure_share` narrow it). On the 2-core VM the quickstart's pair needs three rounds for
    it (`benchmarks/interval_coverage.py`)."""
    remeasure_drift: float = Field(DRIFT, ge=0, lt=1)
    """How far (a log standard deviation) a speedup measured in one session may stand apart from
    another session's on this machine, beyond what its rounds' spread says: a VM's speed moves in
    phases of minutes, and a study's rounds see one. The interval the study states, and the one
    `autotuner apply` measures, allow for it (`autotuner.measurement.interval.stated_interval`).
    The default is what 200 rounds over an hour gave on a 2-core AMD VM;
    `benchmarks/interval_coverage.py` measures it for a machine (its `drift` between blocks of
    rounds). 0: the rounds' own interval."""
    remeasure_windows: int = Field(10, gt=0, le=1000)
    """The most measured windows of each re-measurement process (a trial has `trial.windows`):
    fewer when `remeasure_share` leaves time for fewer. Measured in
    lockstep, what is left between two processes is the window-to-window noise, which more windows
    average out (`benchmarks/fidelity.py` compares 5, 15 and 30 windows of the same processes);
    a round that does not settle the leader adds processes, and so windows."""
    remeasure_group: int | None = Field(None, gt=0, le=1000)
    """The most trial processes a re-measurement keeps alive at once. In lockstep (on a CPU) every
    process of a group holds its model, optimizer and data while it waits for its turn; by
    default a group is as large as the memory available holds, judged from the configs' peak RSS
    in their trials; a group too large is split, the baseline beside the configs in each part.
    1: one process at a time (no lockstep)."""


class TrialSettings(_Strict):
    warmup_steps: int = Field(3, ge=0, le=10_000)
    """Optimizer steps before anything is timed (compile or jit, allocator settling); their wall
    time is kept as `warmup_s`."""
    steps: int = Field(10, gt=0, le=100_000)
    """Optimizer steps per measured window."""
    windows: int = Field(3, gt=0, le=1000)
    """Measured windows per trial: the throughput is their median, stored with their spread."""
    min_window_s: float = Field(0.5, ge=0, le=3600)
    """A window lasts at least this long: `steps` is raised once, from calibration windows (from one
    step until one lasts a quarter of it)."""
    prune_after: int = Field(2, ge=0, le=1000)
    """Windows after which a search trial that cannot reach the best feasible throughput so far is
    stopped and stored as pruned, its drift not measured: when even its fastest window is more than
    15% behind (`autotuner.measurement.pruning`). 0: no trial is pruned. The baseline never is."""
    drift_steps: int = Field(5, gt=0, le=10_000)
    """K: optimizer steps the trial and the reference take before the held-out loss is compared."""
    timeout: float | None = Field(None, gt=0, le=7 * 86400)
    """Seconds before a trial process is killed and recorded as `timeout`. None: `TRIAL_TIMEOUT_S`
    times the backend's factor for the config (`Backend.timeout_factor`: compiling costs more)."""
    quiet_wait: float = Field(60.0, ge=0, le=86400)
    """Seconds a search waits for a busy machine to be quiet before it runs a contended trial again
    (one whose windows other work took more than 10% of the CPU in: `autotuner.measurement.contention`); the
    second run is recorded, flagged `contended` if the machine was still busy."""
    max_memory_mb: float | None = Field(None, ge=64, le=2**30)
    """Host memory each trial process may allocate (RLIMIT_DATA: heap and private mappings), in
    MiB; past it an allocation fails and the trial is `oom`. None: no limit. CPU trials only: on
    a GPU the driver's mappings of device and pinned memory count against RLIMIT_DATA, so a search
    on a GPU refuses it (`check_trial_limits`); `objective.max_memory_mb` limits device memory."""
    seed: int = Field(0, ge=0, lt=2**32)
    """The seed every trial and the reference build the workload with."""


class RunSettings(_Strict):
    steps: int | None = Field(None, gt=0, le=10**12)
    """Optimizer steps of the real training run."""
    epochs: float | None = Field(None, gt=0, le=10**6)
    """Epochs of the real training run: each is the workload's dataset once, `global_batch`
    samples an optimizer step."""
    hours: float | None = Field(None, gt=0, le=10**6)
    """Hours your current config (the baseline) trains for: the run is the optimizer steps it
    takes in that time, at the baseline's measured pace."""

    @model_validator(mode="after")
    def _one_length(self) -> RunSettings:
        given = [name for name in ("steps", "epochs", "hours") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of steps, epochs or hours (got {', '.join(given) or 'none'})")
        return self


class CostSettings(_Strict):
    per_hour: float = Field(gt=0, le=10**7)
    """What an hour of the machine costs."""
    currency: str = Field("USD", min_length=1, max_length=8, pattern=r"^[A-Za-z$€£¥]+$")
    """The currency `per_hour` is in, as it is shown: `USD`, `EUR`, ..."""


class ProfileSettings(_Strict):
    steps: int = Field(3, ge=0, le=10_000)
    """Optimizer steps the best config and the baseline each run under the framework's profiler
    after the search, after their warm-up (`autotuner.search.profiling`). 0: no profile (as `--no-profile`)."""
    artifacts: str | None = None
    """The folder of the study's Optuna artifact store, where the traces go. Default:
    `runs/<name>/artifacts/`."""


class SamplerSettings(_Strict):
    name: Literal["tpe", "random", "gp", "nsga2"] = "tpe"
    """`tpe`, `random`, `gp` or `nsga2`."""
    seed: int | None = Field(None, ge=0, lt=2**32)
    """The sampler's seed (none: a fresh one each run)."""


class JobSpec(_Strict):
    name: str
    """The study's name: 1-64 letters, digits, `_`, `-` or `.`, starting with a letter or digit. It
    names the study's folder, `runs/<name>/` (its database, export, report and compile cache), so
    it is never a path."""
    backend: str
    """The framework backend: `pytorch` or `jax`."""
    task: Literal["train", "inference"] = "train"
    """What a trial measures: `train`, optimizer steps of the workload (drift: the held-out loss
    after K steps against the fp32 reference's); `inference`, the model's forward pass alone
    (throughput and latency of a batch; drift: its outputs on the held-out inputs against the
    model's in strict fp32 eager). PyTorch only."""
    workload: str
    """The training job: `package.module:function`, a factory returning the backend's workload
    (imported and called in the trial processes: trusted code, like a pytest `conftest.py`), or a
    built-in one (`builtin:mlp`, `builtin:cnn`, `builtin:gpt`)."""
    global_batch: int = Field(gt=0, le=2**31)
    """Samples per optimizer step, the same in every config: `batch_size` x `accumulation`. With
    `task: inference`, the samples a measured step serves, in `accumulation` calls of `batch_size`
    each: every config serves the same samples, whatever its batch."""
    workload_args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments the workload factory is called with."""
    device: str = "auto"
    """`auto` (`cuda:0` if there is a GPU, else the CPU), `cpu`, `cuda` or `cuda:N`. With
    `processes`, the first of the trial's devices: its ranks use `cuda:N` to `cuda:N+processes-1`
    (on the CPU, each rank its own share of the cores)."""
    processes: int = Field(1, gt=0, le=1024)
    """Ranks of every trial, as the job runs: 1 (one process, one device), or N processes on this
    machine, each on its own GPU (on the CPU, its own cores), all in one process group (NCCL on
    GPUs, gloo on the CPU). `global_batch` is kept in every config: micro-batch x accumulation x
    N. The fp32 reference runs with the same N."""
    nodes: int = Field(1, gt=0, le=1024)
    """Machines every trial spans, each running `processes` ranks: 1 (this machine), or M, each
    node running `autotuner search <spec> --node-rank R` (node 0 the search that holds the study,
    the others following it). `global_batch` is kept in every config: micro-batch x accumulation x
    M x `processes`. PyTorch training only; needs `rendezvous`."""
    rendezvous: str | None = None
    """With `nodes` above 1: `host:port` of node 0, which every node reaches. Node 0's search hosts
    a `torch.distributed` store there for the study; every trial's `c10d` rendezvous (through
    `torch.distributed.elastic`) and its ranks' process group meet on it."""
    parallel: Literal["ddp", "fsdp", "data_parallel"] | None = None
    """How the ranks train together. PyTorch: `ddp` (DistributedDataParallel) or `fsdp` (FSDP2's
    `fully_shard`), N processes. JAX: `data_parallel`, one trial process that drives N local
    devices (GPUs from `device` on; on the CPU, N host devices), each micro-batch split between
    them, the parameters replicated or sharded as the `param_sharding` knob says. Default with
    `processes` above 1: the backend's first (`ddp`, `data_parallel`)."""
    baseline: dict[str, Any] = Field(default_factory=dict)
    """Your current config, knob -> value: always trial 0, and every speedup is over it. Knobs left
    out take the strict value (fp32, no workers, no compile or jit) and `batch_size` defaults to
    `global_batch`."""
    space: str | dict[str, Any] | None = None
    """The search space: a preset's name, or a mapping of knob -> list of choices with an optional
    `preset` (choices given inline replace the preset's). Default: the backend's own preset."""
    objective: Objective = Objective()
    """What is feasible: drift tolerance, a memory limit, energy as a third objective."""
    budget: Budget = Budget()
    """How much the study runs, and how its best is measured again."""
    trial: TrialSettings = TrialSettings()
    """How each trial process measures a config."""
    run: RunSettings | None = None
    """The real training run (`steps`, `epochs` or `hours`): with it, each trial's predicted wall
    time for that run, warm-up and compilation included (`run_s`), ranks the feasible configs
    instead of their throughput. It changes no measurement: a study can be ranked for any run."""
    cost: CostSettings | None = None
    """What the machine costs (`per_hour`, `currency`): each trial and the export get the run's
    cost (with `run`) and the cost per million samples (and tokens)."""
    profile: ProfileSettings = ProfileSettings()
    """The profile of the winner against the baseline, after the search: steps, and where the
    traces are stored."""
    storage: str | None = None
    """The study's storage, any SQLAlchemy URL. Default: `sqlite:///runs/<name>/study.db`."""
    sampler: Literal["tpe", "random", "gp", "nsga2"] | SamplerSettings = SamplerSettings()
    """The Optuna sampler: its name, or a mapping with `name` and `seed`. The default, `tpe`,
    starts from a rule-of-thumb config and a local search around the best trial before TPE."""

    @property
    def world(self) -> int:
        """Ranks of every trial, all nodes together: `nodes` x `processes`."""
        return self.nodes * self.processes


def validate_spec(data: object, source: str) -> JobSpec:
    """Already-loaded YAML data as a `JobSpec`: its keys, types, bounds, size and name checked."""
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
        errors = exc.errors()
        key, message = _describe_pydantic(max(errors, key=lambda e: len(e["loc"])))
        raise SpecError(message, source=source, key=key) from None
    if not NAME.fullmatch(spec.name):
        raise SpecError(NAME_RULE, source=source, key="name")
    return spec


def _describe_pydantic(error: ErrorDetails) -> tuple[str, str]:
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
    if kind == "value_error":  # a model's own check: its message says it all
        return key, str(error["ctx"]["error"])
    if kind == "literal_error":
        return key, f"{shown(error['input'])} is not allowed; choose between {error['ctx']['expected']}"
    return key, f"{error['msg'][0].lower()}{error['msg'][1:]} (got {shown(error.get('input'))})"


def _allowed_keys(loc: list[str]) -> list[str]:
    model: type[BaseModel] = JobSpec
    for part in loc:
        field = model.model_fields.get(part)
        annotation = getattr(field, "annotation", None)
        found = next(
            (
                a
                for a in getattr(annotation, "__args__", (annotation,))
                if isinstance(a, type) and issubclass(a, BaseModel)
            ),
            annotation,
        )
        if not (isinstance(found, type) and issubclass(found, BaseModel)):
            return []
        model = found
    return list(model.model_fields)


def _check_size(data: object, source: str) -> None:
    """Refuse data that contains itself, or holds more than MAX_VALUES values once YAML aliases
    are expanded: a few lines of anchors can stand for billions of values."""
    count = 0

    def walk(value: object, ancestors: frozenset[int]) -> None:
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


def parse_yaml(text: str, source: str) -> object:
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
