"""The PyTorch backend, trial-process side: one config of one workload, timed and seeded.

Imported by the fork server before any trial, so importing it must not initialise CUDA.
The config is applied by `autotuner.backends.pytorch.apply.TunedTraining`, the object users apply an
exported config with in their own loop: a trial trains through it, so what a study measures is
exactly what a user gets.
"""

from __future__ import annotations

import os
import platform
import random
import resource
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch._dynamo  # noqa: F401 - the first optimizer imports it (~1.5 s): let the fork server pay once

from autotuner.backends.pytorch.apply import TunedTraining, resolve_device, strict_fp32
from autotuner.backends.pytorch.workload import TorchWorkload, as_workload
from autotuner.environment import cpu_name
from autotuner.hardware import peak_flops
from autotuner.measure import measure_throughput
from autotuner.outcomes import NonFiniteLoss
from autotuner.telemetry import Telemetry, cuda_uuid, has_energy_counter, nvml_driver
from autotuner.trial import TrialRequest
from autotuner.workload import load_factory, workload_problem

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


def classify_exception(exc: BaseException) -> str | None:
    """`oom` when `exc`, or an exception it wraps (torch.compile wraps what failed while compiling),
    is an out-of-memory error of the device or of the host."""
    oom_types = _oom_types()
    for cause in _causes(exc):
        if isinstance(cause, oom_types):
            return "oom"
        if isinstance(cause, RuntimeError):  # no type to go by (see above)
            text = str(cause)
            if HOST_ALLOCATION_FAILED in text or any(marker in text for marker in CUDA_ALLOCATION_FAILED):
                return "oom"
    return None


# ---------------------------------------------------------------- environment


def _cpu_autocast_works(dtype: torch.dtype) -> bool:
    try:
        with torch.autocast("cpu", dtype=dtype):
            return torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == dtype
    except Exception:
        return False


def _compile_works(device: torch.device) -> bool:
    try:
        import torch._inductor  # noqa: F401
    except Exception:
        return False
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except Exception:
            return False
        return True
    return shutil.which(os.environ.get("CXX", "g++")) is not None or shutil.which("c++") is not None


def probe(arg: dict[str, Any]) -> dict[str, Any]:
    """The environment of `arg["device"]`, and whether `arg["workload"]` imports; with
    `arg["workload_args"]`, whether the factory builds a workload from them."""
    device = resolve_device(arg["device"])
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name = props.name
        driver = nvml_driver()
        ampere = props.major >= 8  # of this device: is_bf16_supported() asks about cuda:0, and counts emulation
        capabilities = {
            "accelerator": True,
            "bf16": ampere,
            "fp16": True,
            "tf32": ampere,
            "compile": _compile_works(device),
            "cuda_graphs": True,
        }
        extra = {
            "compute_capability": f"{props.major}.{props.minor}",
            "memory_mb": props.total_memory // 2**20,
            "energy_counter": has_energy_counter(cuda_uuid(device.index or 0)),
        }
    else:
        name = cpu_name()
        driver = platform.release()
        capabilities = {
            "accelerator": False,
            "bf16": _cpu_autocast_works(torch.bfloat16),
            "fp16": _cpu_autocast_works(torch.float16),
            "tf32": False,
            "compile": _compile_works(device),
            "cuda_graphs": False,
        }
        extra = {}

    def build(factory: Callable[..., Any]) -> None:
        _seed(0)
        as_workload(factory(**arg["workload_args"]), arg["workload"])

    workload_error = workload_problem(arg["workload"], arg.get("workload_args"), build)
    return {
        "device": str(device),
        "device_name": name,
        "device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "driver": driver,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        },
        "capabilities": capabilities,
        "peak_flops": peak_flops(name) if device.type == "cuda" else {},
        "workload_error": workload_error,
        **extra,
    }


# ---------------------------------------------------------------- one trial


def _seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def _train_step(workload: TorchWorkload, training: TunedTraining, batches: Iterator[Any]) -> torch.Tensor:
    """One optimizer step over `accumulation` micro-batches, written as a user's loop is; returns
    the mean loss (on the device)."""
    total = torch.zeros((), device=training.device)
    for _ in range(training.accumulation):
        inputs, target = training.to_device(next(batches))
        with training.autocast():
            loss = workload.loss_fn(training.model(inputs), target)
        training.backward(loss)
        total += loss.detach().float()
        training.step()
    return total / training.accumulation


def _forever(loader: torch.utils.data.DataLoader) -> Iterator[Any]:
    while True:
        yield from loader


def _synchronize(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _check_finite(loss: torch.Tensor, where: str) -> None:
    if not torch.isfinite(loss).all():
        raise NonFiniteLoss(f"the loss became {loss.item()} during {where}")


def _peak_memory_mb(device: torch.device) -> float:
    """On a GPU, the most memory the caching allocator held (reserved: what the process took from
    the device, fragmentation and CUDA-graph pools included) since the last reset; on the CPU, the
    process's peak resident memory."""
    if device.type == "cuda":
        return torch.cuda.max_memory_reserved(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _reset_peak_memory(device: torch.device, step: Callable[[], None]) -> Callable[[], None]:
    """What runs after the warm-up on a GPU: the peak is reset there, because compiling and
    max-autotune's benchmarking of candidate kernels allocate more than training does and are not
    what the config needs; the warm-up's cached blocks are released first (they would stay in
    `reserved`), and one untimed step takes back from the device what training needs."""
    if device.type != "cuda":
        return lambda: None

    def reset() -> None:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)

    return reset


def _measure(workload: TorchWorkload, training: TunedTraining, request: TrialRequest) -> dict[str, Any]:
    device = training.device
    batches = _forever(training.make_loader(workload.dataset, shuffle=True, seed=request.seed))
    running = torch.zeros((), device=device)

    def step() -> None:
        nonlocal running
        running = running + _train_step(workload, training, batches)

    def after_window() -> None:
        _check_finite(running, "the measured steps")

    samples_per_step = request.global_batch
    telemetry = Telemetry(gpu_uuid=cuda_uuid(device.index or 0) if device.type == "cuda" else None)
    throughput = measure_throughput(
        step,
        _synchronize(device),
        warmup_steps=request.warmup_steps,
        steps=request.steps,
        windows=request.windows,
        samples_per_step=samples_per_step,
        min_window_s=request.min_window_s,
        cover_steps=request.cover_steps,
        after_window=after_window,
        after_warmup=_reset_peak_memory(device, step),
        telemetry=telemetry,
    )
    measured = telemetry.summary(samples_per_step * throughput.steps * throughput.windows)
    # NVML's figure holds the CUDA context and what the driver allocated outside the allocator
    peak = max(_peak_memory_mb(device), measured.get("gpu_process_memory_mb_max", 0.0))
    return {"throughput": throughput.as_dict(), "peak_memory_mb": peak, "telemetry": measured}


def _drift_phase(workload: TorchWorkload, training: TunedTraining, request: TrialRequest) -> dict[str, Any]:
    """K optimizer steps on the dataset's first K*global_batch items in order, then the fp32 loss
    on the held-out batch."""
    device = training.device
    needed = request.drift_steps * request.global_batch
    size = len(workload.dataset)  # type: ignore[arg-type]
    ordered = torch.utils.data.Subset(workload.dataset, [i % size for i in range(needed)])
    batches = iter(training.make_loader(ordered, shuffle=False, seed=request.seed))
    trajectory: list[float] = []
    for _ in range(request.drift_steps):
        loss = _train_step(workload, training, batches)
        _check_finite(loss, f"drift step {len(trajectory) + 1}")
        trajectory.append(loss.item())
    heldout = workload.heldout
    if heldout is None:
        heldout = torch.utils.data.Subset(workload.dataset, range(max(0, size - 256), size))
    count = len(heldout)  # type: ignore[arg-type]
    chunk = request.heldout_batch  # the same for every trial of a study, so the sums add up alike
    total = torch.zeros((), dtype=torch.float64, device=device)
    workload.model.eval()
    # eager strict fp32 (no TF32 left on by a tf32 config): the weights are what is compared
    with torch.no_grad(), strict_fp32():
        for start in range(0, count, chunk):
            items = [heldout[i] for i in range(start, min(count, start + chunk))]
            inputs, target = training.to_device(torch.utils.data.default_collate(items))
            total += workload.loss_fn(workload.model(inputs), target).double() * len(items)
    workload.model.train()
    loss = total / count
    _check_finite(loss, "the held-out evaluation")
    return {"heldout": loss.item(), "trajectory": trajectory, "skipped_steps": training.skipped_steps}


FLOP_COUNT_SAMPLES = 2
"""Samples the FLOP count runs on: FLOPs per sample do not depend on the batch, and a full
micro-batch beside the measured phase's optimizer state and graph pools may not fit (two, not one:
batch norm cannot train on a single sample)."""


def _count_flops_per_sample(workload: TorchWorkload, training: TunedTraining) -> float | None:
    """Training FLOPs per sample of a workload that does not declare them: one forward and
    backward of `FLOP_COUNT_SAMPLES` samples under `torch.utils.flop_counter` (matmuls and
    convolutions), eager, after the measured phase (the weights are restored before the drift
    phase); the gradients are dropped and no optimizer step is taken. None when nothing was
    counted, or when the count failed (out of memory, or a model that cannot take two samples):
    MFU is a figure about a trial, and its absence never fails one."""
    from torch.utils.flop_counter import FlopCounterMode

    count = min(FLOP_COUNT_SAMPLES, len(workload.dataset))  # type: ignore[arg-type]
    try:
        items = [workload.dataset[i] for i in range(count)]
        inputs, target = training.to_device(torch.utils.data.default_collate(items))
        with FlopCounterMode(display=False) as counter:
            workload.loss_fn(workload.model(inputs), target).backward()
    except Exception:
        return None
    finally:
        workload.model.zero_grad(set_to_none=True)
    flops = counter.get_total_flops()
    return flops / count if flops > 0 else None


def _host_copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights copied to host memory: the initial weights the drift phase restores, kept
    off the device so they are not in the measured phase's peak memory."""
    return {name: value.detach().to("cpu", copy=True) for name, value in model.state_dict().items()}


def _compile_cache(before: dict[str, int]) -> str | None:
    """How torch.compile's caches served this process since `before` (`_cache_lookups`): `warm`
    (every compiled graph came from the cache), `cold` (none did), `partial`; None when nothing
    was compiled."""
    now = _cache_lookups()
    hits = now["hit"] - before["hit"]
    misses = now["miss"] - before["miss"]
    if hits + misses == 0:
        return None
    return "warm" if misses == 0 else "cold" if hits == 0 else "partial"


def _cache_lookups() -> dict[str, int]:
    """Hits and misses of inductor's FX graph cache and AOTAutograd's cache so far in this process."""
    from torch._dynamo.utils import counters

    return {
        "hit": counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"],
        "miss": counters["inductor"]["fxgraph_cache_miss"] + counters["aot_autograd"]["autograd_cache_miss"],
    }


def _training(
    workload: TorchWorkload, model: torch.nn.Module, request: TrialRequest, device: torch.device
) -> TunedTraining:
    """The config applied to `model`, with a fresh optimizer (and so a fresh GradScaler)."""
    return TunedTraining(request.config, model, workload.optimizer(workload.model.parameters()), device=device)


def run(request: TrialRequest) -> dict[str, Any]:
    if request.compile_cache:  # the study's own: warm-up must not depend on other studies' compiles
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = request.compile_cache
    device = resolve_device(request.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    _seed(request.seed)
    workload = as_workload(load_factory(request.workload)(**request.workload_args), request.workload)
    initial = _host_copy(workload.model)
    workload.model.to(device).train()
    lookups = _cache_lookups()
    training = _training(workload, workload.model, request, device)
    result: dict[str, Any] = {
        "tokens_per_sample": workload.tokens_per_sample,
        "flops_per_sample": workload.flops_per_sample,
    }
    if request.measure:
        result.update(_measure(workload, training, request))
        result["compile_cache"] = _compile_cache(lookups)
        if workload.flops_per_sample is None:
            result["flops_per_sample"] = _count_flops_per_sample(workload, training)
        workload.model.load_state_dict(initial)
        training = _training(workload, training.model, request, device)  # compiled once, not twice
    _seed(request.seed)
    result["losses"] = _drift_phase(workload, training, request)
    return result
