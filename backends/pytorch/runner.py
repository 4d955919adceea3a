"""The PyTorch backend, trial-process side: PyTorch's steps of the one trial algorithm
(`autotuner.trials.core`), exposed as the runner module's `TRIAL_BACKEND`; what the probe reports of the device
is `autotuner.backends.pytorch.probe`.

Imported by the fork server before any trial, so importing it must not initialise CUDA.
The config is applied by `autotuner.backends.pytorch.apply.TunedTraining`, the object users apply an
exported config with in their own loop: a trial trains through it, so what a study measures is
exactly what a user gets.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch._dynamo  # noqa: F401 - the first optimizer imports it (~1.5 s): let the fork server pay once

from autotuner.backends.pytorch import PYTORCH
from autotuner.backends.pytorch.apply import (
    TunedTraining,
    load_full_state,
    resolve_device,
    strict_fp32,
    without_checkpointing,
)
from autotuner.backends.pytorch.probe import environment, gpu_uuid, parallel_capabilities, workload_capabilities
from autotuner.backends.pytorch.ranks import run_ranks
from autotuner.backends.pytorch.workload import TorchWorkload, as_workload, first_batch_problem
from autotuner.config.knobs import PRECISION, Config
from autotuner.measurement.turns import Turns
from autotuner.trials.core import TrialBackend, cache_state
from autotuner.trials.probe import Environment
from autotuner.trials.request import ProfileRequest, TrialRequest
from autotuner.trials.streams import prefix
from autotuner.trials.trial_output import ProfileOutput, TrialOutput

HOST_ALLOCATION_FAILED = "DefaultCPUAllocator: can't allocate memory"
"""c10's CPU allocator has no exception type of its own: when the host (or the trial's memory
limit) refuses an allocation it raises a plain RuntimeError with this text (alloc_cpu.cpp)."""
CUDA_ALLOCATION_FAILED = ("CUDA error: out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")
"""What CUDA errors say when an allocation outside the caching allocator (the CUDA context,
cuBLAS or cuDNN workspaces, a kernel launch) fails: a plain RuntimeError (or AcceleratorError)
with this text, not torch.OutOfMemoryError."""


def _oom_types() -> tuple[type[BaseException], ...]:
    """torch's out-of-memory exception types: `torch.OutOfMemoryError` from torch 2.5 on,
    `torch.cuda.OutOfMemoryError` (the same class there) before."""
    found = (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None))
    return tuple(t for t in found if isinstance(t, type))


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and the exceptions it was raised from or during, innermost last (each once)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        inner = getattr(current, "inner_exception", None)  # dynamo's BackendCompilerFailed, InductorError
        current = current.__cause__ or (inner if isinstance(inner, BaseException) else None) or current.__context__


FLOP_COUNT_SAMPLES = 2
"""Samples the FLOP count runs on: FLOPs per sample do not depend on the batch, and a full
micro-batch on top of the measured phase's optimizer state and graph pools may not fit (two, not one:
batch norm cannot train on a single sample)."""


def _host_copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights copied to host memory: the initial weights the drift phase restores, kept
    off the device so they are not in the measured phase's peak memory."""
    return {name: value.detach().to("cpu", copy=True) for name, value in model.state_dict().items()}


def inductor_cache(study_cache: str, config: Config | None) -> str:
    """The folder of the study's compile cache a trial of `config` compiles into: one per precision.

    AOTAutograd's cache, which torch.compile looks up first, is keyed on Dynamo's graph, which an
    autocast entered around the compiled model leaves out, and its key long held only whether
    autocast was on, not its dtype (torch 2.11 does; 2.13 keys the dtype). In one shared folder an
    fp16 trial was then served the graphs a bf16 trial had compiled, every lookup a hit: its
    warm-up was `warm` and it trained with bf16's casts. No precision can use another's graphs
    (their autocast dtype, or the TF32 flags inductor keys on, differ), so a folder each loses no
    hit, on any torch."""
    precision = (config or {}).get(PRECISION.name)
    return os.path.join(study_cache, f"pytorch-{precision}") if precision else study_cache


def _cache_lookups() -> dict[str, int]:
    """Hits and misses of inductor's FX graph cache and AOTAutograd's cache so far in this process."""
    from torch._dynamo.utils import counters

    return {
        "hit": counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"],
        "miss": counters["inductor"]["fxgraph_cache_miss"] + counters["aot_autograd"]["autograd_cache_miss"],
    }


_COMPILATIONS = [0]
"""Compilations dynamo has started in this process: a graph traced and compiled, a backward
compiled lazily, a CUDA graph recorded (`PyTorchTrial.compilations`)."""


def _count_compilation(args: Any) -> None:
    _COMPILATIONS[0] += 1


# registered as the fork server imports this module: every trial process counts from its start
torch._dynamo.callback.callback_handler.register_start_callback(_count_compilation)


class TorchaoImportNoise(logging.Filter):
    """Drops what importing torchao logs that is no fault of the job and nothing it can change, said
    at every import in every trial's log (where it read as a warning about the config):

    - "Failed to load .../torchao/_C...so" under a CPU build of torch: its compiled extensions are
      CUDA kernels (MX formats, Hopper's CUTLASS) that need torch's CUDA libraries, so they never
      load there and nothing a CPU runs uses them; it read as a quantization path that failed;
    - torch's deprecation of `register_constant()` on the Enum subclasses torchao registers (the
      enums' module says whose they are: a job's own enums keep the warning)."""

    LOGGERS = ("torchao", "torch.utils._pytree")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "torch.utils._pytree":
            registered = record.args[0] if isinstance(record.args, tuple) and record.args else None
            return not (
                isinstance(registered, type) and getattr(registered, "__module__", "").split(".")[0] == "torchao"
            )
        message = record.getMessage()
        return not (torch.version.cuda is None and message.startswith("Failed to load ") and "torchao/_C" in message)

    @classmethod
    def install(cls) -> None:
        for name in cls.LOGGERS:
            logger = logging.getLogger(name)
            if not any(isinstance(f, cls) for f in logger.filters):
                logger.addFilter(cls())


class PyTorchTrial(TrialBackend):
    """PyTorch's steps of a trial (`autotuner.trials.core.TrialBackend`)."""

    name = PYTORCH.name

    def configure_process(self, device_spec: str, compile_cache: str | None, config: Config | None = None) -> None:
        if compile_cache:  # the study's own: warm-up must not depend on other studies' compiles
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache(compile_cache, config)
        TorchaoImportNoise.install()

    def resolve_device(self, spec: str) -> torch.device:
        return resolve_device(spec)

    def use_device(self, device: torch.device) -> None:
        if device.type == "cuda":
            torch.cuda.set_device(device)

    def environment(self, device: torch.device) -> Environment:
        return environment(device)

    def seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def as_workload(self, built: Any, ref: str) -> TorchWorkload:
        return as_workload(built, ref)

    def first_batch_problem(self, workload: TorchWorkload, count: int) -> str | None:
        return first_batch_problem(workload, count)

    def workload_capabilities(self, workload: TorchWorkload, device: torch.device, count: int) -> dict[str, bool]:
        return workload_capabilities(workload, device, count)

    def parallel_capabilities(self, parallel: str | None) -> dict[str, bool]:
        return parallel_capabilities(parallel)

    def initial_state(self, workload: TorchWorkload) -> dict[str, torch.Tensor]:
        return _host_copy(workload.model)

    def compile_lookups(self) -> dict[str, int]:
        return _cache_lookups()

    def compile_cache(self, before: dict[str, int]) -> str | None:
        now = _cache_lookups()
        return cache_state(now["hit"] - before["hit"], now["miss"] - before["miss"])

    def compilations(self) -> Callable[[], int]:
        return lambda: _COMPILATIONS[0]

    def training(
        self, workload: TorchWorkload, config: Config, device: torch.device, parallel: str | None = None
    ) -> TunedTraining:
        workload.model.to(device).train()
        return self._tuned(workload, workload.model, config, device, parallel)

    def restart(self, workload: TorchWorkload, training: TunedTraining, initial: Any) -> TunedTraining:
        load_full_state(workload.model, initial)
        # compiled (and wrapped for its ranks) once, not twice
        return self._tuned(workload, training.model, training.config, training.device, training.parallel)

    @staticmethod
    def _tuned(
        workload: TorchWorkload,
        model: torch.nn.Module,
        config: Config,
        device: torch.device,
        parallel: str | None,
    ) -> TunedTraining:
        """The config applied to `model`, with a fresh optimizer (and so a fresh GradScaler)."""
        optimizer = workload.optimizer(workload.model.parameters())
        return TunedTraining(
            config,
            model,
            optimizer,
            device=device,
            collate_fn=workload.collate_fn,
            checkpoint_blocks=workload.checkpoint_blocks,
            parallel=parallel,
        )

    def train_step(self, workload: TorchWorkload, training: TunedTraining, batches: Iterator[Any]) -> torch.Tensor:
        total = torch.zeros((), device=training.device)
        for _ in range(training.accumulation):
            batch = training.to_device(next(batches))
            with training.autocast():
                loss = workload.loss(training.model, batch)
            training.backward(loss)
            total += loss.detach().float()
            training.step()
        return total / training.accumulation

    def synchronize(self, training: TunedTraining, pending: Any) -> None:
        if training.device.type == "cuda":
            torch.cuda.synchronize(training.device)
        if training.world_size > 1:  # a window's edges are every rank's
            torch.distributed.barrier()

    def subset(self, dataset: Any, indices: list[int]) -> torch.utils.data.Subset[Any]:
        return torch.utils.data.Subset(dataset, indices)

    @contextlib.contextmanager
    def evaluation(self, workload: TorchWorkload, training: TunedTraining) -> Iterator[None]:
        workload.model.eval()  # the module itself: eager, whatever the config compiled
        try:
            with torch.no_grad(), strict_fp32():
                yield
        finally:
            workload.model.train()

    def batch_loss(self, workload: TorchWorkload, training: TunedTraining, dataset: Any, indices: range) -> float:
        batch = training.to_device(workload.collate([dataset[i] for i in indices]))
        return float(workload.loss(workload.model, batch).double())

    def gpu_uuid(self, device: torch.device) -> str | None:
        return gpu_uuid(device)

    def after_warmup(self, device: torch.device, step: Callable[[], None]) -> None:
        """On a GPU, the peak is reset here, because compiling and max-autotune's benchmarking of
        candidate kernels allocate more than training does and are not what the config needs; the
        warm-up's cached blocks are released first (they would stay in `reserved`), and one untimed
        step takes back from the device what training needs."""
        if device.type != "cuda":
            return
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)

    def peak_memory_mb(self, device: torch.device) -> float:
        """On a GPU, the most memory the caching allocator held (reserved: what the process took from
        the device, fragmentation and CUDA-graph pools included) since the last reset; on the CPU, the
        process's peak resident memory."""
        if device.type == "cuda":
            return torch.cuda.max_memory_reserved(device) / 2**20
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux

    @contextlib.contextmanager
    def profiling(self, device: torch.device, folder: str) -> Iterator[list[str]]:
        """`torch.profiler` with CPU activities, and CUDA ones on a GPU; its Chrome trace."""
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if device.type == "cuda" else [])]
        written: list[str] = []
        # Kineto writes a line to stderr as it starts and stops (USDT logger messages): into a log
        # beside the trace, not onto the search's console.
        with _stderr_to(os.path.join(folder, "profiler.log")), profile(activities=activities) as profiler:
            yield written
        path = os.path.join(folder, "trace.json")
        profiler.export_chrome_trace(path)
        written.append(path)

    def flops_per_sample(self, workload: TorchWorkload, training: TunedTraining) -> float | None:
        """The model FLOPs of one sample: one forward and backward of `FLOP_COUNT_SAMPLES` samples
        under `torch.utils.flop_counter` (matmuls, convolutions, and the CUDA attention kernels: it
        has no formula for the CPU's), eager and without the config's activation checkpointing
        (`without_checkpointing`: the forward a checkpointed block runs again in the backward is
        the config's cost, not the model's, so every config of a model is counted alike); the
        gradients are dropped and no optimizer step is taken (the weights are restored before the
        drift phase anyway). None when nothing was counted."""
        from torch.utils.flop_counter import FlopCounterMode

        items = prefix(workload.dataset, FLOP_COUNT_SAMPLES)
        count = len(items)
        try:
            batch = training.to_device(workload.collate(items))
            with without_checkpointing(workload.model), FlopCounterMode(display=False) as counter:
                workload.loss(workload.model, batch).backward()
        finally:
            workload.model.zero_grad(set_to_none=True)
        flops = counter.get_total_flops()
        return flops / count if flops > 0 else None

    def skipped_steps(self, training: TunedTraining) -> int:
        return training.skipped_steps

    def run(self, request: TrialRequest, turns: Turns | None = None) -> TrialOutput:
        """One trial; with `processes` above 1, as that many ranks (`autotuner.backends.pytorch.ranks`)."""
        if request.processes > 1:
            return run_ranks(self, "trial", request, turns)  # type: ignore[no-any-return]
        return super().run(request, turns)

    def profile(self, request: ProfileRequest) -> ProfileOutput:
        if request.trial.processes > 1:
            return run_ranks(self, "profile", request)  # type: ignore[no-any-return]
        return super().profile(request)

    def classify_exception(self, exc: BaseException) -> str | None:
        """`oom` when `exc`, or an exception it wraps (torch.compile wraps what failed while
        compiling), is an out-of-memory error of the device or of the host."""
        oom_types = _oom_types()
        for cause in _causes(exc):
            if isinstance(cause, oom_types):
                return "oom"
            if isinstance(cause, RuntimeError):  # no type to go by (see above)
                text = str(cause)
                if HOST_ALLOCATION_FAILED in text or any(marker in text for marker in CUDA_ALLOCATION_FAILED):
                    return "oom"
        return None


@contextlib.contextmanager
def _stderr_to(path: str) -> Iterator[None]:
    """File descriptor 2 (C++ code writes there too, not only `sys.stderr`) appends to `path`."""
    sys.stderr.flush()
    saved = os.dup(2)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 2)
    os.close(log)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


TRIAL_BACKEND = PyTorchTrial()
