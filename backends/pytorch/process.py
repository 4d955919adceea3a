"""The PyTorch backend's trial process, for every role: the device, its environment, seeding, the
compile cache, memory, the profiler and torch's errors (`autotuner.trials.process.TrialProcess`).
`TorchProcess` is written once and stands beside each role: `PyTorchTrial` (training,
`autotuner.backends.pytorch.runner`) and `PyTorchServing` (`autotuner.backends.pytorch.inference_runner`).

Imported by the fork server before any trial, so importing it must not initialise CUDA.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import sys
from collections.abc import Callable, Iterator

import torch
import torch._dynamo  # noqa: F401 - the first optimizer imports it (~1.5 s): let the fork server pay once

from autotuner.backends.pytorch import PYTORCH
from autotuner.backends.pytorch.device import resolve_device
from autotuner.backends.pytorch.probe import environment, gpu_uuid, parallel_capabilities
from autotuner.config.knobs import PRECISION, Config
from autotuner.trials.probe import Environment

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


_COMPILATIONS = [0]
"""Compilations dynamo has started in this process: a graph traced and compiled, a backward
compiled lazily, a CUDA graph recorded (`TorchProcess.compilations`)."""


def _count_compilation(args: object) -> None:
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


class TorchProcess:
    """PyTorch's part of every trial process (`autotuner.trials.process.TrialProcess`), beside a
    role: `class PyTorchTrial(TorchProcess, TrainingBackend[...])`."""

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

    def parallel_capabilities(self, parallel: str | None, nodes: int) -> dict[str, bool]:
        return parallel_capabilities(parallel, nodes)

    def compilations(self) -> Callable[[], int]:
        return lambda: _COMPILATIONS[0]

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
