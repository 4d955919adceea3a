"""The PyTorch backend, trial-process side: one config of one workload, timed and seeded.

Imported by the fork server before any trial, so importing it must not initialise CUDA.
The config is applied by `backends.pytorch.apply.TunedTraining`, the object users apply an
exported config with in their own loop: a trial trains through it, so what a study measures is
exactly what a user gets.
"""

from __future__ import annotations

import copy
import os
import platform
import random
import resource
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch._dynamo  # noqa: F401 - the first optimizer imports it (~1.5 s): let the fork server pay once

from autotuner.environment import cpu_name
from autotuner.hardware import peak_flops
from autotuner.measure import measure_throughput
from autotuner.outcomes import NonFiniteLoss
from autotuner.telemetry import Telemetry, has_energy_counter, nvml_driver
from autotuner.trial import TrialRequest
from autotuner.workload import load_factory, workload_problem
from backends.pytorch.apply import TunedTraining, resolve_device
from backends.pytorch.workload import TorchWorkload, as_workload

HOST_ALLOCATION_FAILED = "DefaultCPUAllocator: can't allocate memory"
"""c10's CPU allocator has no exception type of its own: when the host (or the trial's memory
limit) refuses an allocation it raises a plain RuntimeError with this text (alloc_cpu.cpp)."""


def classify_exception(exc: BaseException) -> str | None:
    if isinstance(exc, torch.OutOfMemoryError):
        return "oom"
    if type(exc) is RuntimeError and HOST_ALLOCATION_FAILED in str(exc):  # no type to go by (see above)
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
        capabilities = {
            "accelerator": True,
            "bf16": torch.cuda.is_bf16_supported(),
            "fp16": True,
            "tf32": props.major >= 8,
            "compile": _compile_works(device),
            "cuda_graphs": True,
        }
        extra = {
            "compute_capability": f"{props.major}.{props.minor}",
            "memory_mb": props.total_memory // 2**20,
            "energy_counter": has_energy_counter(device.index or 0),
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
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _measure(workload: TorchWorkload, training: TunedTraining, request: TrialRequest) -> dict[str, Any]:
    device = training.device
    batches = _forever(training.make_loader(workload.dataset, shuffle=True, seed=request.seed))
    running = torch.zeros((), device=device)

    def step() -> None:
        nonlocal running
        running = running + _train_step(workload, training, batches)

    def after_window() -> None:
        _check_finite(running, "the measured steps")

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    samples_per_step = request.global_batch
    telemetry = Telemetry(cuda_index=(device.index or 0) if device.type == "cuda" else None)
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
        telemetry=telemetry,
    )
    return {
        "throughput": throughput.as_dict(),
        "peak_memory_mb": _peak_memory_mb(device),
        "telemetry": telemetry.summary(samples_per_step * throughput.steps * throughput.windows),
    }


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
    with torch.no_grad():  # eager fp32: the weights are what is compared, not the eval numerics
        for start in range(0, count, chunk):
            items = [heldout[i] for i in range(start, min(count, start + chunk))]
            inputs, target = training.to_device(torch.utils.data.default_collate(items))
            total += workload.loss_fn(workload.model(inputs), target).double() * len(items)
    workload.model.train()
    loss = total / count
    _check_finite(loss, "the held-out evaluation")
    return {"heldout": loss.item(), "trajectory": trajectory}


def _count_flops_per_sample(workload: TorchWorkload, training: TunedTraining) -> float | None:
    """Training FLOPs per sample of a workload that does not declare them: one forward and
    backward of a micro-batch under `torch.utils.flop_counter` (matmuls and convolutions), eager,
    after the measured phase (the weights are restored before the drift phase); the gradients are
    dropped and no optimizer step is taken."""
    from torch.utils.flop_counter import FlopCounterMode

    count = min(training.batch_size, len(workload.dataset))  # type: ignore[arg-type]
    items = [workload.dataset[i] for i in range(count)]
    inputs, target = training.to_device(torch.utils.data.default_collate(items))
    with FlopCounterMode(display=False) as counter:
        workload.loss_fn(workload.model(inputs), target).backward()
    workload.model.zero_grad(set_to_none=True)
    flops = counter.get_total_flops()
    return flops / count if flops > 0 else None


def _training(
    workload: TorchWorkload, model: torch.nn.Module, request: TrialRequest, device: torch.device
) -> TunedTraining:
    """The config applied to `model`, with a fresh optimizer (and so a fresh GradScaler)."""
    return TunedTraining(request.config, model, workload.optimizer(workload.model.parameters()), device=device)


def run(request: TrialRequest) -> dict[str, Any]:
    device = resolve_device(request.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    _seed(request.seed)
    workload = as_workload(load_factory(request.workload)(**request.workload_args), request.workload)
    workload.model.to(device).train()
    initial = copy.deepcopy(workload.model.state_dict())
    training = _training(workload, workload.model, request, device)
    result: dict[str, Any] = {
        "tokens_per_sample": workload.tokens_per_sample,
        "flops_per_sample": workload.flops_per_sample,
    }
    if request.measure:
        result.update(_measure(workload, training, request))
        if workload.flops_per_sample is None:
            result["flops_per_sample"] = _count_flops_per_sample(workload, training)
        workload.model.load_state_dict(initial)
        training = _training(workload, training.model, request, device)  # compiled once, not twice
    _seed(request.seed)
    result["losses"] = _drift_phase(workload, training, request)
    return result
