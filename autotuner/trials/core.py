"""One trial, in a trial process: the algorithm every backend runs, written once.

`run_trial` builds the workload with the trial's seed, measures it (warm-up, calibration, the
timed windows and their lockstep turns, telemetry: `autotuner.measurement.measured_phase.measure_throughput`),
counts its FLOPs, restores the initial weights and runs the drift phase (K optimizer steps on the
dataset's first items in order, then the loss on the held-out items). `probe` reports a device's
environment. Both call into a `TrialBackend`: the framework's own steps and nothing else.

Each backend's runner module (`Backend.runner`) holds its `TrialBackend` as `TRIAL_BACKEND`: the fork
server preloads that module (and with it the framework), and a trial process started by
`autotuner.trials.launcher.TrialLauncher` calls the entry point it is given by name on `TRIAL_BACKEND` (`run` or
`probe`; in a lockstep group, `run(request, turns=...)`: `autotuner.trials.lockstep`). This module imports
no framework.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, Protocol

from autotuner.config.knobs import Config
from autotuner.measurement.contention import CONTENDED_SHARE
from autotuner.measurement.measured_phase import measure_throughput
from autotuner.measurement.pruning import PruneBound, Pruner
from autotuner.measurement.telemetry import CpuSampler, Telemetry
from autotuner.measurement.timing import DONE, WindowTimer
from autotuner.measurement.traces import read_trace, top_operators
from autotuner.measurement.turns import Turns
from autotuner.trials.factory import load_factory, workload_problem
from autotuner.trials.outcomes import NonFiniteLoss
from autotuner.trials.probe import Environment, ProbeResult
from autotuner.trials.progress import PhaseFile
from autotuner.trials.request import ProbeRequest, ProfileRequest, TrialRequest
from autotuner.trials.streams import is_stream, prefix
from autotuner.trials.trial_output import Losses, ProfileOutput, TrialOutput

HELDOUT_DEFAULT = 256
"""Items of the held-out set when the workload names none: the dataset's last ones (a stream's
first ones); at most as many of a streamed held-out set."""


class Workload(Protocol):
    """What the core reads of a backend's workload (`TorchWorkload`, `JaxWorkload`, ...)."""

    dataset: Any
    heldout: Any
    tokens_per_sample: int | None
    flops_per_sample: float | None


class RankGroup(Protocol):
    """The ranks of a trial of several processes (the spec's `processes: N`), as the core sees them.
    Rank 0 measures: its timer announces every step it takes and the others take the same ones
    (`autotuner.measurement.timing.WindowTimer.follow`), so every collective meets its match;
    the drift phase runs on every rank alike, each on its shard of the same global batches. A
    backend that runs ranks provides it (`autotuner.backends.pytorch.ranks`)."""

    rank: int
    size: int
    devices: list[str]
    """Every rank's device, as a spec names it (`cpu`, `cuda:N`), in rank order."""

    def announce(self, what: str, count: int) -> None:
        """Rank 0: tell the other ranks what its timer does next."""

    def next_command(self) -> tuple[str, int]:
        """Any other rank: what rank 0's timer does next (waits for it)."""
        ...

    def gather(self, key: str, value: float) -> list[float]:
        """Every rank gives `value` under `key`; rank 0 gets them all, in rank order, the others []."""
        ...


class TrialBackend(ABC):
    """The trial-process half of a backend: the framework's steps, which `run_trial` and `probe`
    call in the order their docstrings say. Device, workload, training and loss values are the
    framework's own objects; the core only passes them back."""

    name: str
    """The backend's name, as its engine side registers it (`autotuner.backends.Backend.name`)."""

    # ------------------------------------------------------------ the process and its device

    def configure_process(  # noqa: B027 - optional hook
        self, device_spec: str, compile_cache: str | None, config: Config | None = None
    ) -> None:
        """First of all, in every trial and probe process, before the framework starts a device.
        `compile_cache`: the study's compile-cache folder (None in probes, or for the default);
        `config`: the trial's config (None in probes)."""

    @abstractmethod
    def resolve_device(self, spec: str) -> Any:
        """The framework's device for a spec's `device` (`auto`, `cpu`, `cuda:N`); ValueError if none."""

    def on_device(self, device: Any) -> contextlib.AbstractContextManager[Any]:
        """The context the whole trial (or probe) runs in, after `resolve_device`."""
        return contextlib.nullcontext()

    def use_device(self, device: Any) -> None:  # noqa: B027 - optional hook
        """Trials only, before the build: make `device` the process's current one (a probe leaves
        it alone: on CUDA 12, making a device current creates a context on it)."""

    @abstractmethod
    def environment(self, device: Any) -> Environment:
        """Probe: `device`'s environment, before the workload is built (its capabilities are added
        to the environment's own: `workload_capabilities`)."""

    @abstractmethod
    def seed(self, seed: int) -> None:
        """Seed the framework's random generators (`random` is seeded already): before each build
        and before the drift phase."""

    # ------------------------------------------------------------ the workload and the config

    @abstractmethod
    def as_workload(self, built: Any, ref: str) -> Workload:
        """Check what factory `ref` returned (TypeError saying what is wrong) and return the workload."""

    def first_batch_problem(self, workload: Any, count: int) -> str | None:
        """Probe, after the build and the dataset's size are checked: what fails when the dataset's
        first `count` items are batched as the loaders batch them and the model's loss is computed
        on them, where the factory built the model, in a few words (e.g. `the collate function
        cannot batch ...: <the exception>`); None when nothing does."""
        return None

    def heldout_problem(self, workload: Any, global_batch: int) -> str | None:
        """Probe: why the workload's held-out items cannot be measured with `global_batch`
        samples a step (an inference trial serves them in whole steps); None when they can."""
        return None

    def workload_capabilities(self, workload: Any, device: Any, count: int) -> dict[str, bool]:
        """Probe, once the first batch trains: what the workload offers the knobs (a model with
        convolutions, attention, blocks to checkpoint; an optimizer with a fused variant on
        `device`), merged into the environment's `capabilities`; `count` items make the batch."""
        return {}

    def parallel_capabilities(self, parallel: str | None) -> dict[str, bool]:
        """Probe: which way of training across processes this framework build offers, for a job
        whose ranks train together as `parallel` (None: one process); merged into the
        environment's `capabilities`."""
        return {}

    def initial_state(self, workload: Any) -> Any:
        """Right after the build: the initial weights, as `restart` takes them back."""
        return None

    @abstractmethod
    def training(self, workload: Any, config: Config, device: Any, parallel: str | None = None) -> Any:
        """The backend's `TunedTraining` of `config` over the workload, on `device`; with `parallel`
        (`ddp`, `fsdp`), as this rank's part of a trial of several processes."""

    @abstractmethod
    def restart(self, workload: Any, training: Any, initial: Any) -> Any:
        """After the measured phase: the training to run the drift phase with, from the initial
        weights with a fresh optimizer, reusing what was compiled."""

    def compile_lookups(self) -> Any:
        """Before the training is built: the compile caches' counters, for `compile_cache`."""
        return None

    def compile_cache(self, before: Any) -> str | None:
        """After the measured phase: `warm`, `cold` or `partial` by the cache lookups since
        `before`; None when nothing was compiled or the framework has no such cache."""
        return None

    def compilations(self) -> Callable[[], int]:
        """Before the measured phase: a count of the framework's compilations in this process so
        far (a graph compiled, a CUDA graph recorded, an executable built), read after each step:
        a step that moved it is no evidence of the config's pace
        (`autotuner.measurement.pruning`). A backend that compiles nothing counts none."""
        return lambda: 0

    # ------------------------------------------------------------ the steps

    @abstractmethod
    def train_step(self, workload: Any, training: Any, batches: Iterator[Any]) -> Any:
        """One optimizer step over `accumulation` micro-batches from `batches`, as a user's loop
        takes it; returns the mean loss, a scalar left on the device."""

    @abstractmethod
    def synchronize(self, training: Any, pending: Any) -> None:
        """Wait until the device has finished what it was given (`pending`: the latest loss)."""

    def subset(self, dataset: Any, indices: list[int]) -> Any:
        """The items of `dataset` at `indices`, in that order, as the backend's loader takes them."""
        return Subset(dataset, indices)

    @abstractmethod
    def evaluation(self, workload: Any, training: Any) -> contextlib.AbstractContextManager[Any]:
        """The context of the held-out evaluation: eager, strict fp32 (the weights are compared,
        not the evaluation's numerics), no gradients."""

    @abstractmethod
    def batch_loss(self, workload: Any, training: Any, dataset: Any, indices: range) -> float:
        """Inside `evaluation`: the mean loss over the items of `dataset` at `indices`."""

    # ------------------------------------------------------------ what is reported

    def gpu_uuid(self, device: Any) -> str | None:
        """The NVML UUID of `device` when it is a GPU, for telemetry; None on the CPU."""
        return None

    def more_gpu_uuids(self, device: Any) -> list[str]:
        """The NVML UUIDs of the GPUs this process trains on besides `device` (a JAX trial that
        drives several), for telemetry; the other ranks' GPUs of a trial of several processes
        are the core's to add."""
        return []

    def after_warmup(self, device: Any, step: Callable[[], None]) -> None:  # noqa: B027 - optional hook
        """After the warm-up steps, before the first window: reset the peak-memory counters."""

    @abstractmethod
    def peak_memory_mb(self, device: Any) -> float:
        """After the measured phase: the peak memory since `after_warmup`, in MiB."""

    def flops_per_sample(self, workload: Any, training: Any) -> float | None:
        """After the measured phase, for a workload that does not declare them: the model's training
        FLOPs per sample (forward and backward, no optimizer), counted without what the config
        recomputes (activation checkpointing, remat), so that MFU is the model's for every config;
        or None. Any exception leaves them uncounted."""
        return None

    def skipped_steps(self, training: Any) -> int | None:
        """After the drift phase: the optimizer steps the config skipped (fp16 overflow), or None."""
        return None

    def profiling(self, device: Any, folder: str) -> contextlib.AbstractContextManager[list[str]]:
        """The framework's profiler around the steps run inside it; after the context, the list it
        gave holds the path of the Chrome trace it wrote into `folder` (`autotuner.measurement.traces`)."""
        raise NotImplementedError(f"{type(self).__name__} has no profiler")

    @abstractmethod
    def classify_exception(self, exc: BaseException) -> str | None:
        """`oom` when `exc` is the framework's out-of-memory error, else None. In a trial process,
        on any exception the entry point raised."""

    # ------------------------------------------------------------ entry points

    def run(self, request: TrialRequest, turns: Turns | None = None) -> TrialOutput:
        """Entry point: one trial of `request`; with `turns`, measured in a lockstep group."""
        return run_trial(self, request, turns)

    def probe(self, request: ProbeRequest) -> ProbeResult:
        """Entry point: the probe of `request`'s device and workload (`probe`)."""
        return probe(self, request)

    def profile(self, request: ProfileRequest) -> ProfileOutput:
        """Entry point: `request.steps` steps of its trial's config under the profiler (`run_profile`)."""
        return run_profile(self, request)


def cache_state(hits: int, misses: int) -> str | None:
    """A compile cache as a trial's warm-up found it (`TrialBackend.compile_cache`): `warm`
    (every lookup hit), `cold` (none did) or `partial`; None without lookups."""
    if hits + misses == 0:
        return None
    return "warm" if misses == 0 else "cold" if hits == 0 else "partial"


class Subset:
    """The items of `dataset` at `indices`, in that order."""

    def __init__(self, dataset: Any, indices: list[int]):
        self.dataset, self.indices = dataset, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[self.indices[index]]


class EmptyLoader(ValueError):
    """A trial's loader yields no batch (its dataset holds fewer items than one micro-batch)."""


def _forever(loader: Any) -> Iterator[Any]:
    """The loader's batches, epoch after epoch; `EmptyLoader` when an epoch yields none."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise EmptyLoader("the data loader yields no batch: the dataset holds fewer items than one micro-batch")


def _check_finite(loss: Any, where: str) -> float:
    value = float(loss)
    if not math.isfinite(value):
        raise NonFiniteLoss(f"the loss became {value} during {where}")
    return value


def seed_trial(backend: TrialBackend, seed: int) -> None:
    """Seed Python's and the framework's random generators for a build or a phase."""
    random.seed(seed)
    backend.seed(seed)


def probe(backend: TrialBackend, request: ProbeRequest) -> ProbeResult:
    """The environment of `request.device`, and whether `request.workload` imports; with its
    `workload_args`, whether the factory builds a workload from them, and with its `global_batch`
    too, whether its data makes a global batch the model trains on (and what the workload offers
    the knobs, added to the environment's capabilities)."""
    backend.configure_process(request.device, None)
    device = backend.resolve_device(request.device)
    built: list[Workload] = []
    args = dict(request.workload_args or {})

    def build(factory: Callable[..., Any]) -> None:
        seed_trial(backend, 0)
        built.append(backend.as_workload(factory(**args), request.workload))

    with backend.on_device(device):
        environment = backend.environment(device)
        parallel = backend.parallel_capabilities(request.parallel)
        environment = replace(environment, capabilities={**environment.capabilities, **parallel})
        workload_args = None if request.workload_args is None else args
        problem = workload_problem(request.workload, workload_args, build)
        if problem is None and built and request.global_batch:
            problem = _data_problem(backend, built[0], request.global_batch)
            problem = problem and " ".join(f"{request.workload}: {problem}".split())[:400]
            if problem is None:
                count = min(PROBE_ITEMS, request.global_batch)
                offered = backend.workload_capabilities(built[0], device, count)
                environment = replace(environment, capabilities={**environment.capabilities, **offered})
    return ProbeResult(environment, problem)


PROBE_ITEMS = 2
"""Items of the batch the probe runs the model on (two, not one: batch norm cannot train on a
single sample)."""


def _data_problem(backend: TrialBackend, workload: Workload, global_batch: int) -> str | None:
    """Why the workload's data cannot train with `global_batch` samples per optimizer step, or None:
    an empty or too small dataset or held-out set, items the collate function cannot batch, a
    model that fails on the first batch or whose loss cannot be found (`first_batch_problem`)."""
    if is_stream(workload.dataset):  # read ahead: a stream says its size by ending
        size = len(prefix(workload.dataset, global_batch))
        if size < global_batch:
            return (
                f"the stream ended after {size} items, fewer than one global batch ({global_batch}): "
                "no step can be taken"
            )
    else:
        size = len(workload.dataset)
        if size == 0:
            return "the dataset is empty"
        if size < global_batch:
            return f"the dataset holds {size} items, fewer than one global batch ({global_batch}): no step can be taken"
    if workload.heldout is not None and not prefix(workload.heldout, 1):
        return "the held-out dataset is empty"
    if problem := backend.heldout_problem(workload, global_batch):
        return problem
    return backend.first_batch_problem(workload, min(PROBE_ITEMS, global_batch))


def run_trial(
    backend: TrialBackend, request: TrialRequest, turns: Turns | None = None, group: RankGroup | None = None
) -> TrialOutput:
    """One trial of `request` (see `autotuner.backends._base`); with `turns`, its measured phase
    takes its turns in a lockstep group; with `group`, this process is one rank of the trial's
    (what rank 0 returns is the trial's output)."""
    backend.configure_process(request.device, request.compile_cache, request.config)
    device = backend.resolve_device(request.device)
    backend.use_device(device)
    with backend.on_device(device):
        return _run(backend, request, device, turns, group)


def _run(
    backend: TrialBackend, request: TrialRequest, device: Any, turns: Turns | None, group: RankGroup | None
) -> TrialOutput:
    started = time.perf_counter()
    phase = PhaseFile(request.progress)
    phase("building the workload")
    seed_trial(backend, request.seed)
    workload = backend.as_workload(load_factory(request.workload)(**request.workload_args), request.workload)
    initial = backend.initial_state(workload)
    lookups = backend.compile_lookups()
    training = backend.training(workload, request.config, device, request.parallel)
    output = TrialOutput(
        losses=Losses(math.nan, []),
        tokens_per_sample=workload.tokens_per_sample,
        flops_per_sample=workload.flops_per_sample,
        dataset_items=None if is_stream(workload.dataset) else len(workload.dataset),
    )
    if request.measure:
        output.setup_s = time.perf_counter() - started  # a real run builds the same before its first step
        stopped = _measure(backend, workload, training, request, device, output, turns, phase, group)
        output.compile_cache = backend.compile_cache(lookups)
        if stopped:  # pruned: no drift to measure
            return output
        if not request.drift:
            return output
        if workload.flops_per_sample is None:
            phase("counting FLOPs")
            output.flops_per_sample = _count_flops(backend, workload, training, group)
        training = backend.restart(workload, training, initial)
    seed_trial(backend, request.seed)
    output.losses = _drift_phase(backend, workload, training, request, phase, group)
    return output


@contextlib.contextmanager
def trial_process(backend: TrialBackend, request: TrialRequest) -> Iterator[tuple[Any, PhaseFile, Any]]:
    """The trial process set up for `request`'s config (`configure_process`), its device current,
    inside the device's context, the workload built from the trial's seed: its device, its phase
    file and the workload. What every entry point that runs a config starts with."""
    backend.configure_process(request.device, request.compile_cache, request.config)
    device = backend.resolve_device(request.device)
    backend.use_device(device)
    with backend.on_device(device):
        phase = PhaseFile(request.progress)
        phase("building the workload")
        seed_trial(backend, request.seed)
        yield (
            device,
            phase,
            backend.as_workload(load_factory(request.workload)(**request.workload_args), request.workload),
        )


def run_profile(backend: TrialBackend, profile: ProfileRequest, group: RankGroup | None = None) -> ProfileOutput:
    """`profile.steps` optimizer steps of its trial's config under the framework's profiler, after
    the trial's warm-up steps (compilation is not what a step costs), the trace written into
    `profile.folder`: the trace's path and its operators by self time
    (`autotuner.measurement.traces.top_operators`). In a trial of several processes every rank
    takes the steps and rank 0's are profiled."""
    request = profile.trial
    with trial_process(backend, request) as (device, phase, workload):
        training = backend.training(workload, request.config, device, request.parallel)
        batches = _forever(training.make_loader(workload.dataset, shuffle=True, seed=request.seed))
        phase(f"warm-up, {request.warmup_steps} steps")
        loss: Any = None
        for _ in range(max(1, request.warmup_steps)):
            loss = backend.train_step(workload, training, batches)
        backend.synchronize(training, loss)
        phase(f"profiling {profile.steps} steps")
        leading = group is None or group.rank == 0
        profiling = backend.profiling(device, profile.folder) if leading else contextlib.nullcontext([""])
        with profiling as written:
            for _ in range(profile.steps):
                loss = backend.train_step(workload, training, batches)
            backend.synchronize(training, loss)
        _check_finite(loss, "the profiled steps")
    if not leading:
        return ProfileOutput(trace="", where="", total_ms=0.0, operators=[])
    where, total_ms, operators = top_operators(read_trace(written[0]), profile.steps)
    return ProfileOutput(trace=written[0], where=where, total_ms=total_ms, operators=operators)


def _count_flops(backend: TrialBackend, workload: Any, training: Any, group: RankGroup | None) -> float | None:
    """MFU is a figure about a trial, and its absence never fails a trial of one process. A rank of
    several counts through the model as it is spread over the ranks (FSDP's collectives): one rank
    whose count fails would leave the others inside a collective, or send them on with the model
    half gathered, so its error ends the trial at once, said as it is."""
    if group is not None and group.size > 1:
        return backend.flops_per_sample(workload, training)
    try:
        return backend.flops_per_sample(workload, training)
    except Exception:
        return None


def _measure(
    backend: TrialBackend,
    workload: Any,
    training: Any,
    request: TrialRequest,
    device: Any,
    output: TrialOutput,
    turns: Turns | None,
    phase: PhaseFile,
    group: RankGroup | None = None,
) -> bool:
    """The measured phase; whether it was stopped early (pruned). In a trial of several processes,
    rank 0 measures and the others follow its timer (`RankGroup`); the peak memory is the
    largest rank's."""
    batches = _forever(training.make_loader(workload.dataset, shuffle=True, seed=request.seed))
    running: Any = 0.0

    def step() -> None:
        nonlocal running
        running = running + backend.train_step(workload, training, batches)

    def after_window() -> None:
        _check_finite(running, "the measured steps")

    ranks = [backend.gpu_uuid(backend.resolve_device(d)) for d in group.devices[1:]] if group is not None else []
    others = [*backend.more_gpu_uuids(device), *(uuid for uuid in ranks if uuid is not None)]
    telemetry = Telemetry(gpu_uuid=backend.gpu_uuid(device), more_gpus=others)

    leading = group is None or group.rank == 0
    watch = pruner(request, backend) if leading else None
    timer = WindowTimer(
        step,
        lambda: backend.synchronize(training, running),
        after_window=after_window,
        after_warmup=lambda counted_step: backend.after_warmup(device, counted_step),
        announce=group.announce if group is not None and group.size > 1 and leading else None,
        watch=watch,
    )
    if not leading:
        assert group is not None
        stopped = timer.follow(group.next_command)
        group.gather("peak_memory_mb", backend.peak_memory_mb(device))
        return stopped
    with contention_watched(watch):
        throughput = measure_throughput(timer, request.measuring(), telemetry=telemetry, turns=turns, phase=phase)
    if watch is not None:
        output.prune_held_off = list(watch.held_off_shares)
    measured = telemetry.summary(throughput.telemetry_samples)  # every span's samples, not the last windows'
    output.throughput = throughput
    peaks = [backend.peak_memory_mb(device)]
    # pruned, the other ranks may be inside a step: they end with the trial (`RankGroup`)
    if group is not None and group.size > 1 and throughput.stopped is None:
        group.announce(DONE, 0)
        peaks = group.gather("peak_memory_mb", peaks[0])
    # NVML's figure holds the CUDA context and what the driver allocated outside the framework's allocator
    output.peak_memory_mb = max(*peaks, measured.get("gpu_process_memory_mb_max", 0.0))
    output.telemetry = measured
    return throughput.stopped is not None


def pruner(request: TrialRequest, backend: TrialBackend) -> Pruner | None:
    """The rule that stops a search trial that cannot reach the best so far
    (`autotuner.measurement.pruning.Pruner`), told the framework's compilations; None for a trial
    that is never pruned (the baseline, a re-measurement, the reference)."""
    if request.prune_best is None or request.prune_after <= 0:
        return None
    bound = PruneBound(request.prune_best, request.prune_after, request.steps, request.min_window_s)
    return Pruner(bound, request.global_batch, compilations=backend.compilations())


@contextlib.contextmanager
def contention_watched(watch: Pruner | None) -> Iterator[None]:
    """Around a measured phase that `watch` may stop: the CPU that other work takes from then on,
    so that the rule holds off while it is more than `CONTENDED_SHARE` (slowed by it, a trial would
    look a loser; the shares it held off at are kept in `prune_held_off`)."""
    if watch is None:
        yield
        return
    with CpuSampler() as cpu:

        def held_off() -> float | None:
            share = cpu.others_share()
            return share if share > CONTENDED_SHARE else None

        watch.held_off = held_off
        yield


def _drift_phase(
    backend: TrialBackend,
    workload: Any,
    training: Any,
    request: TrialRequest,
    phase: PhaseFile,
    group: RankGroup | None = None,
) -> Losses:
    """K optimizer steps on the dataset's first K*global_batch items in order (again from its start
    where it holds fewer), then the loss on the held-out items. In a trial of several processes each
    rank's loader takes its shard of every global batch (the backend's `make_loader`), a step's loss
    is the mean over the ranks, and every rank evaluates the whole held-out set (the same weights:
    the same loss). Of a stream, both are bounded prefixes read in its order (`HELDOUT_DEFAULT`)."""
    needed = request.drift_steps * request.global_batch
    if is_stream(workload.dataset):
        first = prefix(workload.dataset, needed)
        ordered: Any = [first[i % len(first)] for i in range(needed)]
    else:
        size = len(workload.dataset)
        ordered = backend.subset(workload.dataset, [i % size for i in range(needed)])
    batches = iter(training.make_loader(ordered, shuffle=False, seed=request.seed))
    trajectory: list[float] = []
    for _ in range(request.drift_steps):
        phase(f"drift step {len(trajectory) + 1} of {request.drift_steps}")
        loss = _check_finite(backend.train_step(workload, training, batches), f"drift step {len(trajectory) + 1}")
        if group is not None and group.size > 1:
            losses = group.gather(f"drift_loss/{len(trajectory)}", loss)
            loss = math.fsum(losses) / len(losses) if losses else loss
        trajectory.append(loss)
    heldout = workload.heldout
    if heldout is not None and is_stream(heldout):
        heldout = prefix(heldout, HELDOUT_DEFAULT)
    elif heldout is None and is_stream(workload.dataset):
        heldout = prefix(workload.dataset, HELDOUT_DEFAULT)
    elif heldout is None:
        heldout = backend.subset(workload.dataset, list(range(max(0, size - HELDOUT_DEFAULT), size)))
    count = len(heldout)
    phase(f"held-out loss, {count} items")
    chunk = request.heldout_batch  # the same for every trial of a study, so the sums add up alike
    total = 0.0  # summed on the host in float64
    with backend.evaluation(workload, training):
        for start in range(0, count, chunk):
            indices = range(start, min(count, start + chunk))
            total += backend.batch_loss(workload, training, heldout, indices) * len(indices)
    loss = _check_finite(total / count, "the held-out evaluation")
    return Losses(loss, trajectory, backend.skipped_steps(training))
