"""What every trial process needs, whatever it runs: the base both roles stand on.

A trial process configures itself for the trial's device, resolves and enters that device, seeds
the framework, builds the user's workload from its factory, and at the end reports its memory
and classifies what it raised. `TrialProcess` is that contract; the roles are its siblings:
`autotuner.trials.training.TrainingBackend` (the training trial's steps) and
`autotuner.trials.serving.ServingBackend` (an inference trial's). A framework writes its
process-level part once (`autotuner.backends.pytorch.process.TorchProcess`,
`autotuner.backends.jax.process.JaxProcess`) and each role beside it.

`probe` (an entry point of every role) reports a device's environment and whether the workload
builds and trains; `trial_process` is what every entry point that runs a config starts with.
The type parameters are the framework's own: `D` its device, `W` the role's workload.
This module imports no framework.
"""

from __future__ import annotations

import contextlib
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sized
from dataclasses import replace
from typing import Any, Generic, Protocol, TypeVar, cast

from autotuner.config.knobs import Config
from autotuner.measurement.contention import CONTENDED_SHARE
from autotuner.measurement.pruning import PruneBound, Pruner
from autotuner.measurement.telemetry import CpuSampler
from autotuner.trials.factory import load_factory, workload_problem
from autotuner.trials.probe import Environment, ProbeResult
from autotuner.trials.progress import PhaseFile
from autotuner.trials.request import ProbeRequest, TrialRequest
from autotuner.trials.streams import is_stream, prefix


class Workload(Protocol):
    """What the engine reads of a backend's workload (`TorchWorkload`, `JaxWorkload`, ...)."""

    @property
    def dataset(self) -> Any:
        """The user's items: a map-style dataset or a stream (`autotuner.trials.streams`)."""

    @property
    def heldout(self) -> Any | None:
        """Held-out items, as `dataset`; None: the dataset's last ones."""

    @property
    def tokens_per_sample(self) -> int | None: ...

    @property
    def flops_per_sample(self) -> float | None: ...


D = TypeVar("D")
"""The framework's device (`torch.device`, `jax.Device`)."""
W = TypeVar("W", bound=Workload)
"""The role's workload, as the backend checked the factory's result into it."""


class TrialProcess(ABC, Generic[D, W]):
    """The process half every role shares: the framework's device, environment, seeding, the
    build of the workload, memory and its errors. The entry points (`probe`, and each role's
    `run` and `profile`) call them in the order their docstrings say."""

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
    def resolve_device(self, spec: str) -> D:
        """The framework's device for a spec's `device` (`auto`, `cpu`, `cuda:N`); ValueError if none."""

    def on_device(self, device: D) -> contextlib.AbstractContextManager[object]:
        """The context the whole trial (or probe) runs in, after `resolve_device`."""
        return contextlib.nullcontext()

    def use_device(self, device: D) -> None:  # noqa: B027 - optional hook
        """Trials only, before the build: make `device` the process's current one (a probe leaves
        it alone: on CUDA 12, making a device current creates a context on it)."""

    @abstractmethod
    def environment(self, device: D) -> Environment:
        """Probe: `device`'s environment, before the workload is built (its capabilities are added
        to the environment's own: `workload_capabilities`)."""

    @abstractmethod
    def seed(self, seed: int) -> None:
        """Seed the framework's random generators (`random` is seeded already): before each build
        and before the drift phase."""

    # ------------------------------------------------------------ the workload

    @abstractmethod
    def as_workload(self, built: object, ref: str) -> W:
        """Check what factory `ref` returned (TypeError saying what is wrong) and return the workload."""

    def first_batch_problem(self, workload: W, count: int) -> str | None:
        """Probe, after the build and the dataset's size are checked: what fails when the dataset's
        first `count` items are batched as the loaders batch them and the model's output is computed
        on them, where the factory built the model, in a few words (e.g. `the collate function
        cannot batch ...: <the exception>`); None when nothing does."""
        return None

    def heldout_problem(self, workload: W, global_batch: int) -> str | None:
        """Probe: why the workload's held-out items cannot be measured with `global_batch`
        samples a step; None when they can."""
        return None

    def workload_capabilities(self, workload: W, device: D, count: int) -> dict[str, bool]:
        """Probe, once the first batch runs: what the workload offers the knobs (a model with
        convolutions, attention, blocks to checkpoint; an optimizer with a fused variant on
        `device`), merged into the environment's `capabilities`; `count` items make the batch."""
        return {}

    def parallel_capabilities(self, parallel: str | None, nodes: int) -> dict[str, bool]:
        """Probe: which way of running across processes this framework build offers, for a job
        whose ranks work together as `parallel` (None: one process) on `nodes` machines; merged
        into the environment's `capabilities`."""
        return {}

    def compilations(self) -> Callable[[], int]:
        """Before the measured phase: a count of the framework's compilations in this process so
        far (a graph compiled, a CUDA graph recorded, an executable built), read after each step:
        a step that moved it is no evidence of the config's pace
        (`autotuner.measurement.pruning`). A backend that compiles nothing counts none."""
        return lambda: 0

    # ------------------------------------------------------------ what is reported

    def gpu_uuid(self, device: D) -> str | None:
        """The NVML UUID of `device` when it is a GPU, for telemetry; None on the CPU."""
        return None

    def more_gpu_uuids(self, device: D) -> list[str]:
        """The NVML UUIDs of the GPUs this process runs on besides `device` (a JAX trial that
        drives several), for telemetry; the other ranks' GPUs of a trial of several processes
        are the training trial's to add."""
        return []

    def after_warmup(self, device: D, step: Callable[[], None]) -> None:  # noqa: B027 - optional hook
        """After the warm-up steps, before the first window: reset the peak-memory counters."""

    @abstractmethod
    def peak_memory_mb(self, device: D) -> float:
        """After the measured phase: the peak memory since `after_warmup`, in MiB."""

    def profiling(self, device: D, folder: str) -> contextlib.AbstractContextManager[list[str]]:
        """The framework's profiler around the steps run inside it; after the context, the list it
        gave holds the path of the Chrome trace it wrote into `folder` (`autotuner.measurement.traces`)."""
        raise NotImplementedError(f"{type(self).__name__} has no profiler")

    @abstractmethod
    def classify_exception(self, exc: BaseException) -> str | None:
        """`oom` when `exc` is the framework's out-of-memory error, else None. In a trial process,
        on any exception the entry point raised."""

    # ------------------------------------------------------------ entry point

    def probe(self, request: ProbeRequest) -> ProbeResult:
        """Entry point: the probe of `request`'s device and workload (`probe`)."""
        return probe(self, request)


def seed_trial(backend: TrialProcess[D, W], seed: int) -> None:
    """Seed Python's and the framework's random generators for a build or a phase."""
    random.seed(seed)
    backend.seed(seed)


PROBE_ITEMS = 2
"""Items of the batch the probe runs the model on (two, not one: batch norm cannot train on a
single sample)."""


def probe(backend: TrialProcess[D, W], request: ProbeRequest) -> ProbeResult:
    """The environment of `request.device`, and whether `request.workload` imports; with its
    `workload_args`, whether the factory builds a workload from them, and with its `global_batch`
    too, whether its data makes a global batch the model runs on (and what the workload offers
    the knobs, added to the environment's capabilities)."""
    backend.configure_process(request.device, None)
    device = backend.resolve_device(request.device)
    built: list[W] = []
    args = dict(request.workload_args or {})

    def build(factory: Callable[..., object]) -> None:
        seed_trial(backend, 0)
        built.append(backend.as_workload(factory(**args), request.workload))

    with backend.on_device(device):
        environment = backend.environment(device)
        parallel = backend.parallel_capabilities(request.parallel, request.nodes)
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


def _data_problem(backend: TrialProcess[D, W], workload: W, global_batch: int) -> str | None:
    """Why the workload's data cannot make steps of `global_batch` samples, or None: an empty or
    too small dataset or held-out set, items the collate function cannot batch, a model that
    fails on the first batch or whose loss cannot be found (`first_batch_problem`)."""
    dataset, heldout = workload.dataset, workload.heldout
    if is_stream(dataset):  # read ahead: a stream says its size by ending
        size = len(prefix(dataset, global_batch))
        if size < global_batch:
            return (
                f"the stream ended after {size} items, fewer than one global batch ({global_batch}): "
                "no step can be taken"
            )
    else:
        size = len(cast(Sized, dataset))  # a dataset that is no stream has a size (`as_workload`)
        if size == 0:
            return "the dataset is empty"
        if size < global_batch:
            return f"the dataset holds {size} items, fewer than one global batch ({global_batch}): no step can be taken"
    if heldout is not None and not prefix(heldout, 1):
        return "the held-out dataset is empty"
    if problem := backend.heldout_problem(workload, global_batch):
        return problem
    return backend.first_batch_problem(workload, min(PROBE_ITEMS, global_batch))


@contextlib.contextmanager
def trial_process(backend: TrialProcess[D, W], request: TrialRequest) -> Iterator[tuple[D, PhaseFile, W]]:
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


def pruner(request: TrialRequest, backend: TrialProcess[D, W]) -> Pruner | None:
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
