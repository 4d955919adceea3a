"""The PyTorch backend, trial-process side: one config of one workload, timed and seeded.

Imported by the fork server before any trial, so importing it must not initialise CUDA.
Precision is decided once, before the loop (an autocast context or a null one, a GradScaler
enabled only for fp16); the step itself has no branches on the config.
"""

from __future__ import annotations

import contextlib
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

from autotuner.hardware import peak_flops
from autotuner.measure import measure_throughput
from autotuner.outcomes import NonFiniteLoss
from autotuner.telemetry import GpuSampler
from autotuner.trial import TrialRequest
from autotuner.workload import WorkloadImportError, load_factory
from backends.pytorch.workload import TorchWorkload, as_workload

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
COMPILE_MODES = {"default": None, "reduce-overhead": "reduce-overhead", "max-autotune": "max-autotune"}


def classify_exception(exc: BaseException) -> str | None:
    return "oom" if isinstance(exc, torch.OutOfMemoryError) else None


# ---------------------------------------------------------------- environment


def resolve_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {spec!r}: CUDA is not available here")
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise ValueError(f"device {spec!r}: only {torch.cuda.device_count()} CUDA device(s) visible")
        return torch.device("cuda", index)
    if device.type != "cpu":
        raise ValueError(f"device {spec!r}: the pytorch backend runs on cpu or cuda")
    return device


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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
    """The environment of `arg["device"]`, and whether `arg["workload"]` imports."""
    device = resolve_device(arg["device"])
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name = props.name
        try:
            import pynvml

            pynvml.nvmlInit()
            driver = pynvml.nvmlSystemGetDriverVersion()
        except Exception:
            driver = "unknown"
        capabilities = {
            "accelerator": True,
            "bf16": torch.cuda.is_bf16_supported(),
            "fp16": True,
            "tf32": props.major >= 8,
            "compile": _compile_works(device),
            "cuda_graphs": True,
        }
        extra = {"compute_capability": f"{props.major}.{props.minor}", "memory_mb": props.total_memory // 2**20}
    else:
        name = f"{_cpu_name()} ({os.cpu_count()} cores)"
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
    workload_error = None
    try:
        load_factory(arg["workload"])
    except WorkloadImportError as exc:
        workload_error = str(exc)
    return {
        "device": str(device),
        "device_name": name,
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


def _set_matmul_precision(precision: str) -> None:
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


class Trainer:
    """One optimizer step of a workload under one config."""

    def __init__(
        self, workload: TorchWorkload, forward: Callable[..., Any], config: dict[str, Any], device: torch.device
    ):
        self.workload, self.forward, self.device = workload, forward, device
        self.accumulation = int(config["accumulation"])
        precision = config["precision"]
        self.autocast: Callable[[], contextlib.AbstractContextManager[Any]] = (
            (lambda: torch.autocast(device.type, dtype=AUTOCAST_DTYPES[precision]))
            if precision in AUTOCAST_DTYPES
            else contextlib.nullcontext
        )
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
        self.optimizer = workload.optimizer(workload.model.parameters())
        self.non_blocking = device.type == "cuda"

    def to_device(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.to(self.device, non_blocking=self.non_blocking)
        if isinstance(value, (list, tuple)):
            return type(value)(self.to_device(v) for v in value)
        if isinstance(value, dict):
            return {k: self.to_device(v) for k, v in value.items()}
        return value

    def step(self, batches: Iterator[Any]) -> torch.Tensor:
        """One optimizer step over `accumulation` micro-batches; returns the mean loss (on device)."""
        total = torch.zeros((), device=self.device)
        for _ in range(self.accumulation):
            inputs, target = self.to_device(next(batches))
            with self.autocast():
                loss = self.workload.loss_fn(self.forward(inputs), target)
            self.scaler.scale(loss / self.accumulation).backward()
            total += loss.detach().float()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return total / self.accumulation


def _loader(
    dataset: Any, config: dict[str, Any], device: torch.device, shuffle: bool, seed: int
) -> torch.utils.data.DataLoader:
    workers = int(config["workers"])
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=int(config["batch_size"]),
        shuffle=shuffle,
        drop_last=True,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        persistent_workers=workers > 0,
        # Linux's usual fork: workers start in milliseconds. (A trial process comes from a fork
        # server, whose default would start a second fork server and re-import torch.)
        multiprocessing_context="fork" if workers > 0 else None,
        generator=torch.Generator().manual_seed(seed),
    )


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


def _measure(
    workload: TorchWorkload, forward: Callable[..., Any], request: TrialRequest, device: torch.device
) -> dict[str, Any]:
    config = request.config
    trainer = Trainer(workload, forward, config, device)
    batches = _forever(_loader(workload.dataset, config, device, shuffle=True, seed=request.seed))
    running = torch.zeros((), device=device)

    def step() -> None:
        nonlocal running
        running = running + trainer.step(batches)

    def after_window() -> None:
        _check_finite(running, "the measured steps")

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    samples_per_step = request.global_batch
    with GpuSampler(device.index or 0) if device.type == "cuda" else contextlib.nullcontext() as sampler:
        throughput = measure_throughput(
            step,
            _synchronize(device),
            warmup_steps=request.warmup_steps,
            steps=request.steps,
            windows=request.windows,
            samples_per_step=samples_per_step,
            after_window=after_window,
        )
    metrics: dict[str, Any] = {"throughput": throughput.as_dict(), "peak_memory_mb": _peak_memory_mb(device)}
    if sampler is not None:
        metrics["gpu"] = sampler.summary(samples_per_step * request.steps * request.windows)
    return metrics


def _drift_phase(
    workload: TorchWorkload, forward: Callable[..., Any], request: TrialRequest, device: torch.device
) -> dict[str, Any]:
    """K optimizer steps on the dataset's first K*global_batch items in order, then the fp32 loss
    on the held-out batch."""
    config = request.config
    needed = request.drift_steps * request.global_batch
    size = len(workload.dataset)  # type: ignore[arg-type]
    ordered = torch.utils.data.Subset(workload.dataset, [i % size for i in range(needed)])
    trainer = Trainer(workload, forward, config, device)
    batches = iter(_loader(ordered, config, device, shuffle=False, seed=request.seed))
    trajectory: list[float] = []
    for _ in range(request.drift_steps):
        loss = trainer.step(batches)
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
            inputs, target = trainer.to_device(torch.utils.data.default_collate(items))
            total += workload.loss_fn(workload.model(inputs), target).double() * len(items)
    workload.model.train()
    loss = total / count
    _check_finite(loss, "the held-out evaluation")
    return {"heldout": loss.item(), "trajectory": trajectory}


def run(request: TrialRequest) -> dict[str, Any]:
    device = resolve_device(request.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    _set_matmul_precision(request.config["precision"])
    _seed(request.seed)
    workload = as_workload(load_factory(request.workload)(**request.workload_args), request.workload)
    workload.model.to(device).train()
    initial = copy.deepcopy(workload.model.state_dict())
    mode = request.config["compile"]
    forward = workload.model if mode == "none" else torch.compile(workload.model, mode=COMPILE_MODES[mode])
    result: dict[str, Any] = {
        "tokens_per_sample": workload.tokens_per_sample,
        "flops_per_sample": workload.flops_per_sample,
    }
    if request.measure:
        result.update(_measure(workload, forward, request, device))
        workload.model.load_state_dict(initial)
    _seed(request.seed)
    result["losses"] = _drift_phase(workload, forward, request, device)
    return result
