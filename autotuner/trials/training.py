"""One training trial, in a trial process: the algorithm every backend runs, written once.

`run_trial` builds the workload with the trial's seed, measures it (warm-up, calibration, the
timed windows and their lockstep turns, telemetry: `autotuner.measurement.measured_phase.measure_throughput`),
counts its FLOPs, restores the initial weights and runs the drift phase (K optimizer steps on the
dataset's first items in order, then the loss on the held-out items). It calls into a
`TrainingBackend`: the framework's steps and nothing else, on the process contract every role
shares (`autotuner.trials.process.TrialProcess`: device, environment, seed, build, memory).

Each backend's runner module (`Backend.runner`) holds its `TrainingBackend` as `TRIAL_BACKEND`: the
fork server preloads that module (and with it the framework), and a trial process started by
`autotuner.trials.launcher.TrialLauncher` calls the entry point it is given by name on `TRIAL_BACKEND` (`run`,
`probe` or `profile`; in a lockstep group, `run(request, turns=...)`: `autotuner.trials.lockstep`).
This module imports no framework.
"""

from __future__ import annotations

import contextlib
import math
import time
from abc import abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, SupportsFloat, TypeVar

from autotuner.config.knobs import Config
from autotuner.measurement.measured_phase import measure_throughput
from autotuner.measurement.telemetry import Telemetry
from autotuner.measurement.timing import DONE, WindowTimer
from autotuner.measurement.traces import read_trace, top_operators
from autotuner.measurement.turns import Turns
from autotuner.trials.outcomes import NonFiniteLoss
from autotuner.trials.process import D, TrialProcess, W, contention_watched, pruner, seed_trial, trial_process
from autotuner.trials.progress import PhaseFile
from autotuner.trials.request import ProfileRequest, TrialRequest
from autotuner.trials.streams import Item, Subset, is_stream, prefix
from autotuner.trials.trial_output import Losses, ProfileOutput, TrialOutput

HELDOUT_DEFAULT = 256
"""Items of the held-out set when the workload names none: the dataset's last ones (a stream's
first ones); at most as many of a streamed held-out set."""


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


class Training(Protocol):
    """What the core reads of a backend's `TunedTraining`: its loader."""

    def make_loader(self, dataset: object, *, shuffle: bool = ..., seed: int | None = ...) -> Iterable[object]: ...


T = TypeVar("T", bound=Training)
"""The backend's `TunedTraining`: the config applied to the workload's model and loop."""


class TrainingBackend(TrialProcess[D, W], Generic[D, W, T]):
    """The training role of a trial process: the framework's steps, which `run_trial` and
    `run_profile` call in the order their docstrings say, on the process contract
    (`TrialProcess`). Loss values and batches are the framework's own; the core only passes
    them back."""

    def initial_state(self, workload: W) -> object:
        """Right after the build: the initial weights, as `restart` takes them back."""
        return None

    @abstractmethod
    def training(self, workload: W, config: Config, device: D, parallel: str | None = None) -> T:
        """The backend's `TunedTraining` of `config` over the workload, on `device`; with `parallel`
        (`ddp`, `fsdp`), as this rank's part of a trial of several processes."""

    @abstractmethod
    def restart(self, workload: W, training: T, initial: Any) -> T:
        """After the measured phase: the training to run the drift phase with, from the initial
        weights with a fresh optimizer, reusing what was compiled."""

    def compile_lookups(self) -> dict[str, int]:
        """Before the training is built: the compile caches' counters, for `compile_cache`."""
        return {}

    def compile_cache(self, before: dict[str, int]) -> str | None:
        """After the measured phase: `warm`, `cold` or `partial` by the cache lookups since
        `before`; None when nothing was compiled or the framework has no such cache."""
        return None

    # ------------------------------------------------------------ the steps

    @abstractmethod
    def train_step(self, workload: W, training: T, batches: Iterator[Any]) -> Any:
        """One optimizer step over `accumulation` micro-batches from `batches`, as a user's loop
        takes it; returns the mean loss, a scalar left on the device."""

    @abstractmethod
    def synchronize(self, training: T, pending: object) -> None:
        """Wait until the device has finished what it was given (`pending`: the latest loss)."""

    def subset(self, dataset: Any, indices: list[int]) -> Any:
        """The items of `dataset` at `indices`, in that order, as the backend's loader takes them."""
        return Subset(dataset, indices)

    @abstractmethod
    def evaluation(self, workload: W, training: T) -> contextlib.AbstractContextManager[object]:
        """The context of the held-out evaluation: eager, strict fp32 (the weights are compared,
        not the evaluation's numerics), no gradients."""

    @abstractmethod
    def batch_loss(self, workload: W, training: T, dataset: Any, indices: range) -> float:
        """Inside `evaluation`: the mean loss over the items of `dataset` at `indices`."""

    # ------------------------------------------------------------ what is reported

    def flops_per_sample(self, workload: W, training: T) -> float | None:
        """After the measured phase, for a workload that does not declare them: the model's training
        FLOPs per sample (forward and backward, no optimizer), counted without what the config
        recomputes (activation checkpointing, remat), so that MFU is the model's for every config;
        or None. Any exception leaves them uncounted."""
        return None

    def skipped_steps(self, training: T) -> int | None:
        """After the drift phase: the optimizer steps the config skipped (fp16 overflow), or None."""
        return None

    # ------------------------------------------------------------ entry points

    def run(self, request: TrialRequest, turns: Turns | None = None) -> TrialOutput:
        """Entry point: one trial of `request`; with `turns`, measured in a lockstep group."""
        return run_trial(self, request, turns)

    def profile(self, request: ProfileRequest) -> ProfileOutput:
        """Entry point: `request.steps` steps of its trial's config under the profiler (`run_profile`)."""
        return run_profile(self, request)


def cache_state(hits: int, misses: int) -> str | None:
    """A compile cache as a trial's warm-up found it (`TrainingBackend.compile_cache`): `warm`
    (every lookup hit), `cold` (none did) or `partial`; None without lookups."""
    if hits + misses == 0:
        return None
    return "warm" if misses == 0 else "cold" if hits == 0 else "partial"


class EmptyLoader(ValueError):
    """A trial's loader yields no batch (its dataset holds fewer items than one micro-batch)."""


def _forever(loader: Iterable[Item]) -> Iterator[Item]:
    """The loader's batches, epoch after epoch; `EmptyLoader` when an epoch yields none."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise EmptyLoader("the data loader yields no batch: the dataset holds fewer items than one micro-batch")


def _check_finite(loss: SupportsFloat, where: str) -> float:
    value = float(loss)
    if not math.isfinite(value):
        raise NonFiniteLoss(f"the loss became {value} during {where}")
    return value


@dataclass(frozen=True)
class TrialRun(Generic[D, W, T]):
    """A training trial as its phases run it: the backend, the request, the device, the workload
    built, the phase file and, in a trial of several processes, this rank's group."""

    backend: TrainingBackend[D, W, T]
    request: TrialRequest
    device: D
    workload: W
    phase: PhaseFile
    group: RankGroup | None

    @property
    def leading(self) -> bool:
        """Whether this process measures and reports: the only one, or rank 0."""
        return self.group is None or self.group.rank == 0

    @property
    def ranks(self) -> int:
        """The trial's processes."""
        return 1 if self.group is None else self.group.size


def run_trial(
    backend: TrainingBackend[D, W, T], request: TrialRequest, turns: Turns | None = None, group: RankGroup | None = None
) -> TrialOutput:
    """One trial of `request` (see `autotuner.backends._base`); with `turns`, its measured phase
    takes its turns in a lockstep group; with `group`, this process is one rank of the trial's
    (what rank 0 returns is the trial's output)."""
    started = time.perf_counter()
    with trial_process(backend, request) as (device, phase, workload):
        return _run(TrialRun(backend, request, device, workload, phase, group), turns, started)


def _run(run: TrialRun[D, W, T], turns: Turns | None, started: float) -> TrialOutput:
    backend, request, workload = run.backend, run.request, run.workload
    initial = backend.initial_state(workload)
    lookups = backend.compile_lookups()
    training = backend.training(workload, request.config, run.device, request.parallel)
    output = TrialOutput(
        losses=Losses(math.nan, []),
        tokens_per_sample=workload.tokens_per_sample,
        flops_per_sample=workload.flops_per_sample,
        dataset_items=None if is_stream(workload.dataset) else len(workload.dataset),
    )
    if request.measure:
        output.setup_s = time.perf_counter() - started  # a real run builds the same before its first step
        stopped = _measure(run, training, output, turns)
        output.compile_cache = backend.compile_cache(lookups)
        if stopped:  # pruned: no drift to measure
            return output
        if not request.drift:
            return output
        if workload.flops_per_sample is None:
            run.phase("counting FLOPs")
            output.flops_per_sample = _count_flops(run, training)
        training = backend.restart(workload, training, initial)
    seed_trial(backend, request.seed)
    output.losses = _drift_phase(run, training)
    return output


def run_profile(
    backend: TrainingBackend[D, W, T], profile: ProfileRequest, group: RankGroup | None = None
) -> ProfileOutput:
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


def _count_flops(run: TrialRun[D, W, T], training: T) -> float | None:
    """MFU is a figure about a trial, and its absence never fails a trial of one process. A rank of
    several counts through the model as it is spread over the ranks (FSDP's collectives): one rank
    whose count fails would leave the others inside a collective, or send them on with the model
    half gathered, so its error ends the trial at once, said as it is."""
    if run.ranks > 1:
        return run.backend.flops_per_sample(run.workload, training)
    try:
        return run.backend.flops_per_sample(run.workload, training)
    except Exception:
        return None


def _measure(run: TrialRun[D, W, T], training: T, output: TrialOutput, turns: Turns | None) -> bool:
    """The measured phase; whether it was stopped early (pruned). In a trial of several processes,
    rank 0 measures and the others follow its timer (`RankGroup`); the peak memory is the
    largest rank's."""
    backend, request, workload, device, group = run.backend, run.request, run.workload, run.device, run.group
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

    leading = run.leading
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
        throughput = measure_throughput(timer, request.measuring(), telemetry=telemetry, turns=turns, phase=run.phase)
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


def _drift_phase(run: TrialRun[D, W, T], training: T) -> Losses:
    """K optimizer steps on the dataset's first K*global_batch items in order (again from its start
    where it holds fewer), then the loss on the held-out items. In a trial of several processes each
    rank's loader takes its shard of every global batch (the backend's `make_loader`), a step's loss
    is the mean over the ranks, and every rank evaluates the whole held-out set (the same weights:
    the same loss). Of a stream, both are bounded prefixes read in its order (`HELDOUT_DEFAULT`)."""
    backend, request, workload, phase, group = run.backend, run.request, run.workload, run.phase, run.group
    needed = request.drift_steps * request.global_batch
    if is_stream(workload.dataset):
        first = prefix(workload.dataset, needed)
        ordered: object = [first[i % len(first)] for i in range(needed)]
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
