"""One inference trial, in a trial process: the algorithm of `task: inference`, written once.

`run_inference` builds the workload with the trial's seed and takes its held-out inputs: as many
of the workload's held-out items as make whole served steps (a multiple of `global_batch`, so
every config serves the same items in whole batches of its own size). It computes the model's
outputs on them in strict fp32 eager, before the config touches the model: the reference its
drift is measured against, in this process, so no output tensor crosses a process. Then it applies
the config (the backend's `TunedInference`: quantization, precision, compile, runtime, threads),
and, when the request measures, times it: a step serves `global_batch` samples in `accumulation`
calls of `batch_size` (`autotuner.measurement.timing`'s warm-up, calibration, windows and
lockstep turns, as a training trial's), each call timed alone with the device synchronised, so
the calls inside the measured windows give the latency of a batch (p50, p99). Last, the config
serves the held-out inputs and its outputs are compared with the reference's
(`ServingBackend.output_drift`: the relative error of the outputs, the top-1 agreement, the
accuracy against labels where the items carry them). The fp32 reference of the study
(`autotuner.search.reference`) runs the same with `measure` off: the strict config's own outputs
at one sample a call against those at the baseline's batch, the noise floor of fp32 itself.

This module imports no framework (numpy only, for the drift): the backend's `ServingBackend` does
the framework's part, on the process contract of every role (`autotuner.trials.process`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import statistics
import time
from abc import abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from autotuner.config.knobs import BATCH_SIZE, Config
from autotuner.measurement.measured_phase import measure_throughput
from autotuner.measurement.telemetry import Telemetry
from autotuner.measurement.timing import Throughput, WindowTimer, relative_spread
from autotuner.measurement.traces import read_trace, top_operators
from autotuner.measurement.turns import Turns
from autotuner.trials.outcomes import NonFiniteLoss
from autotuner.trials.process import D, TrialProcess, W, contention_watched, pruner, trial_process
from autotuner.trials.progress import PhaseFile
from autotuner.trials.request import ProfileRequest, TrialRequest
from autotuner.trials.trial_output import Latency, Losses, OutputDrift, ProfileOutput, TrialOutput

HELDOUT_ITEMS = 256
"""Held-out items a trial serves for its drift, at most (rounded down to whole served steps, one
step at least), when the workload names no held-out set: the dataset's last ones."""


@dataclass(frozen=True)
class Served:
    """A served call's wall time, by `time.monotonic`: when it began and how long it took."""

    began: float
    seconds: float


class Serving(Protocol):
    """What the core reads of a backend's `TunedInference`: the size of a call."""

    @property
    def batch_size(self) -> int: ...


S = TypeVar("S", bound=Serving)
"""The backend's `TunedInference`: the config applied to the workload's model."""
Out = TypeVar("Out")
"""The outputs of the held-out items as the backend gathers them (a tensor, an array)."""


class ServingBackend(TrialProcess[D, W], Generic[D, W, S, Out]):
    """The serving role of a trial process: what `run_inference` calls, on the process contract
    (`TrialProcess`: the set-up, build and seeding every role shares). A sibling of the training
    role (`autotuner.trials.training.TrainingBackend`), not a kind of it."""

    @abstractmethod
    def heldout_items(self, workload: W, count: int) -> list[Any]:
        """The first `count` of the workload's held-out items (its `heldout`, else the dataset's last
        `count`), in order."""

    @abstractmethod
    def reference_outputs(self, workload: W, items: list[Any], batch: int, device: D) -> Out:
        """The model's outputs on `items`, strict fp32 eager on `device`, `batch` items a call,
        before any config is applied: what drift is measured against."""

    @abstractmethod
    def serving(self, workload: W, config: Config, device: D, example: list[Any], graph_file: str | None) -> S:
        """The backend's `TunedInference` of `config` over the workload's model on `device`;
        `example`: the items of one batch of the config's size (what an exported graph is traced
        with), `graph_file`: where the graph its runtime runs from is kept (`graph_file`), None
        when it runs the model itself or the study keeps no cache."""

    def graph_format(self, config: Config) -> str | None:
        """The format of the graph `config`'s runtime runs from, as a file suffix (`onnx`); None
        when it runs the framework's model itself."""
        return None

    @abstractmethod
    def batches(self, workload: W, serving: S, seed: int) -> Iterator[Any]:
        """The dataset's batches of the config's size, in a seeded order, epoch after epoch."""

    @abstractmethod
    def serve(self, serving: S, batch: Any) -> object:
        """The outputs of one call on `batch` (on the host or the device, as the runtime gives
        them), once the device has finished it."""

    @abstractmethod
    def served_outputs(self, workload: W, serving: S, items: list[Any]) -> Out:
        """The config's outputs on `items`, `batch_size` items a call."""

    @abstractmethod
    def output_drift(self, workload: W, outputs: Out, reference: Out, items: list[Any]) -> OutputDrift:
        """How far `outputs` are from `reference` (`OutputDrift`)."""

    def heldout_problem(self, workload: W, global_batch: int) -> str | None:
        """A held-out set smaller than one served step: drift is measured on whole steps, the same
        items for every config in whole batches of its own size."""
        if workload.heldout is not None and len(workload.heldout) < global_batch:
            return (
                f"the held-out set holds {len(workload.heldout)} items, fewer than one served step "
                f"({global_batch}, the global batch): drift is measured on whole steps"
            )
        return None

    def run(self, request: TrialRequest, turns: Turns | None = None) -> TrialOutput:
        """Entry point: one inference trial of `request` (`run_inference`)."""
        return run_inference(self, request, turns)

    def profile(self, request: ProfileRequest) -> ProfileOutput:
        """Entry point: `request.steps` served steps of its trial's config under the profiler
        (`profile_inference`)."""
        return profile_inference(self, request)


def compare_outputs(
    outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None = None, error: float | None = None
) -> OutputDrift:
    """How far `outputs` are from `reference` (the primary output of every held-out item, in
    order, float64): their relative error, `||outputs - reference|| / ||reference||` over every
    element (`error` in its place: a workload's `drift_fn`); where the outputs are class scores
    (a last axis of two or more), the share of items whose top-1 class is the reference's, and
    with integer `labels` shaped as the predictions, the accuracy of both."""
    if error is None:
        scale = float(np.linalg.norm(reference))
        error = float(np.linalg.norm(outputs - reference)) / scale if scale else 0.0
    agreement = accuracy = reference_accuracy = None
    if outputs.ndim >= 2 and outputs.shape[-1] >= 2:
        chosen, expected = outputs.argmax(-1), reference.argmax(-1)
        agreement = float((chosen == expected).mean())
        if labels is not None and np.issubdtype(labels.dtype, np.integer) and labels.shape == chosen.shape:
            accuracy = float((chosen == labels).mean())
            reference_accuracy = float((expected == labels).mean())
    return OutputDrift(error, agreement, accuracy, reference_accuracy)


def heldout_count(available: int, global_batch: int) -> int:
    """Held-out items a trial serves: at most `HELDOUT_ITEMS` (or all `available` when fewer), in
    whole served steps of `global_batch`, one step at least."""
    steps = max(1, min(available, max(HELDOUT_ITEMS, global_batch)) // global_batch)
    return steps * global_batch


def graph_file(request: TrialRequest, graph_format: str | None) -> str | None:
    """Where a trial keeps the graph its runtime runs from (`ServingBackend.graph_format`: an ONNX
    export), in the study's compile cache: one per workload, arguments, seed and batch size, so
    the model is exported once for a study and each batch size, and every later trial of it
    reuses the file. None for a runtime that runs the model itself, or without a cache."""
    if not request.compile_cache or graph_format is None:
        return None
    key = json.dumps(
        [request.workload, request.workload_args, request.seed, request.config[BATCH_SIZE.name]],
        sort_keys=True,
        default=str,
    )
    name = f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.{graph_format}"
    return os.path.join(request.compile_cache, graph_format, name)


def percentile(values: list[float], share: float) -> float:
    """The `share` quantile of `values` (nearest rank, as a latency percentile is read)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def latency(calls: list[Served], spans: list[tuple[float, float]]) -> Latency | None:
    """The latency of the calls that began inside the measured windows' `spans`, in milliseconds."""
    inside = [c.seconds * 1e3 for c in calls if any(start <= c.began <= end for start, end in spans)]
    if not inside:
        return None
    return Latency(
        p50_ms=statistics.median(inside),
        p99_ms=percentile(inside, 0.99),
        mean_ms=statistics.fmean(inside),
        calls=len(inside),
    )


def by_calls(throughput: Throughput, calls: list[Served]) -> Throughput:
    """`throughput` with each window timed by its served calls alone (`TrialRequest.time_calls`):
    a window's samples over the seconds of the calls that began in it, so loading the next batch
    is not the config's. A pruned measurement is left as its rule judged it."""
    if throughput.stopped is not None or not throughput.window_spans:
        return throughput
    samples = throughput.steps * throughput.samples_per_step
    seconds = [sum(c.seconds for c in calls if start <= c.began <= end) for start, end in throughput.window_spans]
    if not all(seconds):
        return throughput
    rates = [samples / s for s in seconds]
    return dataclasses.replace(
        throughput,
        samples_per_s=statistics.median(rates),
        spread=relative_spread(rates),
        window_samples_per_s=rates,
        measured_s=sum(seconds),
    )


def run_inference(
    backend: ServingBackend[D, W, S, Out], request: TrialRequest, turns: Turns | None = None
) -> TrialOutput:
    """One inference trial of `request`, as the module says; with `turns`, its measured phase takes
    its turns in a lockstep group."""
    started = time.perf_counter()
    with trial_process(backend, request) as (device, phase, workload):
        return _run(backend, request, device, workload, phase, turns, started)


def _run(
    backend: ServingBackend[D, W, S, Out],
    request: TrialRequest,
    device: D,
    workload: W,
    phase: PhaseFile,
    turns: Turns | None,
    started: float,
) -> TrialOutput:
    available = len(workload.heldout) if workload.heldout is not None else len(workload.dataset)
    items = backend.heldout_items(workload, heldout_count(available, request.global_batch))
    phase(f"reference outputs, {len(items)} items in strict fp32")
    reference = backend.reference_outputs(workload, items, request.heldout_batch, device)
    batch = int(request.config[BATCH_SIZE.name])
    serving = backend.serving(
        workload, request.config, device, items[:batch], graph_file(request, backend.graph_format(request.config))
    )
    output = TrialOutput(
        losses=Losses(math.nan, []),
        tokens_per_sample=workload.tokens_per_sample,
        flops_per_sample=workload.flops_per_sample,
        dataset_items=len(workload.dataset),
    )
    if request.measure:
        output.setup_s = time.perf_counter() - started
        stopped = _measure(backend, workload, serving, request, device, output, turns, phase)
        if stopped or not request.drift:
            return output
    phase(f"outputs on {len(items)} held-out items")
    if not request.measure:  # the study's reference: fp32 itself, one sample a call against the baseline's batch
        single = backend.reference_outputs(workload, items, 1, device)
        output.output_drift = backend.output_drift(workload, single, reference, items)
    else:
        output.output_drift = backend.output_drift(
            workload, backend.served_outputs(workload, serving, items), reference, items
        )
    if not math.isfinite(output.output_drift.relative_error):
        raise NonFiniteLoss(f"the outputs became {output.output_drift.relative_error} on the held-out items")
    return output


def profile_inference(backend: ServingBackend[D, W, S, Out], profile: ProfileRequest) -> ProfileOutput:
    """`profile.steps` served steps of its trial's config under the framework's profiler, after
    the trial's warm-up steps (compilation is not what a call costs): the trace's path and its
    operators by self time (`autotuner.measurement.traces.top_operators`)."""
    request = profile.trial
    with trial_process(backend, request) as (device, phase, workload):
        batch = int(request.config[BATCH_SIZE.name])
        example = backend.heldout_items(workload, batch)
        serving = backend.serving(
            workload, request.config, device, example, graph_file(request, backend.graph_format(request.config))
        )
        batches = backend.batches(workload, serving, request.seed)
        calls = request.global_batch // batch
        phase(f"warm-up, {request.warmup_steps} steps")
        for _ in range(max(1, request.warmup_steps) * calls):
            backend.serve(serving, next(batches))
        phase(f"profiling {profile.steps} steps")
        with backend.profiling(device, profile.folder) as written:
            for _ in range(profile.steps * calls):
                backend.serve(serving, next(batches))
    where, total_ms, operators = top_operators(read_trace(written[0]), profile.steps)
    return ProfileOutput(trace=written[0], where=where, total_ms=total_ms, operators=operators)


def _measure(
    backend: ServingBackend[D, W, S, Out],
    workload: W,
    serving: S,
    request: TrialRequest,
    device: D,
    output: TrialOutput,
    turns: Turns | None,
    phase: PhaseFile,
) -> bool:
    """The measured phase: steps of `accumulation` calls, each timed alone; whether it was
    stopped early (pruned)."""
    batches = backend.batches(workload, serving, request.seed)
    calls: list[Served] = []
    calls_a_step = request.global_batch // int(request.config[BATCH_SIZE.name])

    def step() -> None:
        for _ in range(calls_a_step):
            batch = next(batches)
            began = time.monotonic()
            backend.serve(serving, batch)
            calls.append(Served(began, time.monotonic() - began))

    telemetry = Telemetry(gpu_uuid=backend.gpu_uuid(device))
    watch = pruner(request, backend)
    timer = WindowTimer(
        step,
        lambda: None,  # every call ends synchronised (`serve`)
        after_warmup=lambda counted_step: backend.after_warmup(device, counted_step),
        watch=watch,
    )
    with contention_watched(watch):
        throughput = measure_throughput(timer, request.measuring(), telemetry=telemetry, turns=turns, phase=phase)
    if watch is not None:
        output.prune_held_off = list(watch.held_off_shares)
    output.throughput = by_calls(throughput, calls) if request.time_calls else throughput
    output.latency = latency(calls, throughput.window_spans)
    output.telemetry = telemetry.summary(throughput.telemetry_samples)
    output.peak_memory_mb = max(backend.peak_memory_mb(device), output.telemetry.get("gpu_process_memory_mb_max", 0.0))
    return throughput.stopped is not None
