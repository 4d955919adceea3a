"""The JAX backend, trial-process side: one config of one workload, timed and seeded.

Imported by the fork server before any trial: importing jax initialises no device (that happens
in the trial process, on first use), so each trial gets its own XLA client, which `probe` and `run`
set up for the trial's device before anything starts it (`autotuner.backends.jax.apply.configure_process`:
the CPU platform only for `cpu`, CUDA device i only for `cuda:i`, no preallocation), and whose
arrays they keep on that device (JAX's default device throughout). The config is applied
by `autotuner.backends.jax.apply.TunedTraining`, the object users apply an exported config with in their
own loop: a trial trains through it, so what a study measures is exactly what a user gets.
"""

from __future__ import annotations

import platform
import random
import resource
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import optax

from autotuner.backends.jax.apply import (
    STRICT_MATMULS,
    TunedTraining,
    collate,
    configure_process,
    device_name,
    gpus,
    resolve_device,
)
from autotuner.backends.jax.workload import JaxWorkload, as_workload
from autotuner.environment import cpu_name
from autotuner.hardware import peak_flops
from autotuner.measure import measure_throughput
from autotuner.outcomes import NonFiniteLoss
from autotuner.telemetry import Telemetry, cuda_uuid, has_energy_counter, nvml_driver
from autotuner.trial import TrialRequest
from autotuner.workload import load_factory, workload_problem

try:
    RUNTIME_ERROR: type[Exception] = jax.errors.JaxRuntimeError
except AttributeError:  # jax < 0.4.36 names it only in jaxlib
    from jaxlib.xla_extension import XlaRuntimeError as RUNTIME_ERROR  # type: ignore[no-redef]
"""What XLA raises when a computation or an allocation fails."""
OUT_OF_MEMORY = "RESOURCE_EXHAUSTED"
"""XLA has no out-of-memory exception type of its own: an allocation it cannot make (on a GPU, or
on the host for the CPU) raises the runtime error above with this status code in its message."""
HELDOUT_DEFAULT = 256


def classify_exception(exc: BaseException) -> str | None:
    if isinstance(exc, RUNTIME_ERROR) and OUT_OF_MEMORY in str(exc):  # no finer type to go by (see above)
        return "oom"
    return None


# ---------------------------------------------------------------- environment


def _bf16_works(device: jax.Device) -> bool:
    try:
        ones = jax.device_put(np.ones((2, 2), jnp.bfloat16), device)
        return bool((ones @ ones).dtype == jnp.bfloat16)
    except Exception:
        return False


def _jit_works(device: jax.Device) -> bool:
    try:
        return float(jax.jit(lambda x: (x * 2.0).sum())(jax.device_put(np.ones(4, np.float32), device))) == 8.0
    except Exception:
        return False


def probe(arg: dict[str, Any]) -> dict[str, Any]:
    """The environment of `arg["device"]`, and whether `arg["workload"]` imports; with
    `arg["workload_args"]`, whether the factory builds a workload from them. JAX is set up for the
    device first (`configure_process`): a probe of `cuda:i` opens GPU i only, and reports it as
    `cuda:i` all the same; `device_count` is the GPUs the process sees (all of them for `auto`,
    what `search --jobs` probes)."""
    configure_process(arg["device"])
    device = resolve_device(arg["device"])
    with jax.default_device(device):
        return _environment(arg, device)


def _environment(arg: dict[str, Any], device: jax.Device) -> dict[str, Any]:
    if device.platform == "gpu":
        name = device.device_kind
        major, _, minor = str(getattr(device, "compute_capability", "0.0")).partition(".")
        ampere = int(major or 0) >= 8
        driver = nvml_driver()
        capabilities = {"accelerator": True, "bf16": ampere and _bf16_works(device), "fp16": True, "tf32": ampere}
        stats = device.memory_stats() or {}
        extra: dict[str, Any] = {
            "compute_capability": f"{major}.{minor}",
            "energy_counter": has_energy_counter(cuda_uuid(device.local_hardware_id)),
        }
        if "bytes_limit" in stats:
            extra["memory_mb"] = stats["bytes_limit"] // 2**20
    else:
        name = cpu_name()
        driver = platform.release()
        capabilities = {"accelerator": False, "bf16": _bf16_works(device), "fp16": False, "tf32": False}
        extra = {}
    capabilities["jit"] = _jit_works(device)

    def build(factory: Callable[..., Any]) -> None:
        _seed(0)
        as_workload(factory(**arg["workload_args"]), arg["workload"])

    workload_error = workload_problem(arg["workload"], arg.get("workload_args"), build)
    return {
        "device": device_name(device),
        "device_name": name,
        "device_count": len(gpus()),
        "driver": driver,
        "versions": {
            "python": platform.python_version(),
            "jax": jax.__version__,
            "jaxlib": jaxlib.__version__,
            "optax": optax.__version__,
        },
        "capabilities": capabilities,
        "peak_flops": peak_flops(name) if device.platform == "gpu" else {},
        "workload_error": workload_error,
        **extra,
    }


# ---------------------------------------------------------------- one trial


def _seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)


class _Subset:
    """The items of `dataset` at `indices`, in that order."""

    def __init__(self, dataset: Any, indices: list[int]):
        self.dataset, self.indices = dataset, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[self.indices[index]]


def _train_step(training: TunedTraining, batches: Iterator[Any]) -> jax.Array:
    """One optimizer step over `accumulation` micro-batches, written as a user's loop is; returns
    the mean loss (on the device)."""
    total = jnp.zeros((), jnp.float32)
    for _ in range(training.accumulation):
        batch = training.to_device(next(batches))
        with training.autocast():
            loss, grads = training.model(training.params, batch)
        training.backward(grads)
        total = total + loss
        training.step()
    return total / training.accumulation


def _forever(loader: Any) -> Iterator[Any]:
    while True:
        yield from loader


def _check_finite(loss: jax.Array | float, where: str) -> None:
    value = float(loss)
    if not np.isfinite(value):
        raise NonFiniteLoss(f"the loss became {value} during {where}")


def _peak_memory_mb(device: jax.Device) -> float:
    """The device's peak where the platform reports it (GPUs), else this process's peak RSS."""
    stats = device.memory_stats()
    if stats and "peak_bytes_in_use" in stats:
        return float(stats["peak_bytes_in_use"]) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _measure(workload: JaxWorkload, training: TunedTraining, request: TrialRequest) -> dict[str, Any]:
    batches = _forever(training.make_loader(workload.dataset, shuffle=True, seed=request.seed))
    running = jnp.zeros((), jnp.float32)

    def step() -> None:
        nonlocal running
        running = running + _train_step(training, batches)

    def synchronize() -> None:  # the latest parameters depend on every step dispatched before them
        jax.block_until_ready((training.params, running))

    def after_window() -> None:
        _check_finite(running, "the measured steps")

    device = training.device
    telemetry = Telemetry(gpu_uuid=cuda_uuid(device.local_hardware_id) if device.platform == "gpu" else None)
    throughput = measure_throughput(
        step,
        synchronize,
        warmup_steps=request.warmup_steps,
        steps=request.steps,
        windows=request.windows,
        samples_per_step=request.global_batch,
        min_window_s=request.min_window_s,
        cover_steps=request.cover_steps,
        after_window=after_window,
        telemetry=telemetry,
    )
    return {
        "throughput": throughput.as_dict(),
        "peak_memory_mb": _peak_memory_mb(device),
        "telemetry": telemetry.summary(request.global_batch * throughput.steps * throughput.windows),
    }


def _count_flops_per_sample(workload: JaxWorkload, training: TunedTraining) -> float | None:
    """Training FLOPs per sample of a workload that does not declare them: XLA's cost analysis of
    the differentiated loss (forward and backward, no optimizer) on one micro-batch, lowered
    without running it."""
    count = min(training.batch_size, len(workload.dataset))
    batch = training.to_device(collate(workload.dataset, np.arange(count)))
    with training.autocast():
        costs = jax.jit(training.model).lower(training.params, batch).cost_analysis()
    if isinstance(costs, list):  # one entry per computation in older jax
        costs = costs[0] if costs else {}
    flops = float((costs or {}).get("flops", 0.0))
    return flops / count if flops > 0 else None


def _heldout_loss(workload: JaxWorkload, training: TunedTraining, request: TrialRequest) -> float:
    """The mean loss over the held-out items: eager, fp32 parameters, strict fp32 matmuls (the
    weights are what is compared, not the evaluation's numerics), summed on the host in float64."""
    heldout = workload.heldout
    if heldout is None:
        size = len(workload.dataset)
        heldout = _Subset(workload.dataset, list(range(max(0, size - HELDOUT_DEFAULT), size)))
    count = len(heldout)
    chunk = request.heldout_batch  # the same for every trial of a study, so the sums add up alike
    total = 0.0
    with jax.default_matmul_precision(STRICT_MATMULS):
        for start in range(0, count, chunk):
            indices = np.arange(start, min(count, start + chunk))
            batch = training.to_device(collate(heldout, indices))
            total += float(workload.loss_fn(training.params, batch)) * len(indices)
    return total / count


def _drift_phase(workload: JaxWorkload, training: TunedTraining, request: TrialRequest) -> dict[str, Any]:
    """K optimizer steps on the dataset's first K*global_batch items in order, then the fp32 loss
    on the held-out batch."""
    needed = request.drift_steps * request.global_batch
    size = len(workload.dataset)
    ordered = _Subset(workload.dataset, [i % size for i in range(needed)])
    batches = iter(training.make_loader(ordered, shuffle=False, seed=request.seed))
    trajectory: list[float] = []
    for _ in range(request.drift_steps):
        loss = _train_step(training, batches)
        _check_finite(loss, f"drift step {len(trajectory) + 1}")
        trajectory.append(float(loss))
    heldout = _heldout_loss(workload, training, request)
    _check_finite(heldout, "the held-out evaluation")
    return {"heldout": heldout, "trajectory": trajectory}


def run(request: TrialRequest) -> dict[str, Any]:
    """One trial of `request` (see `autotuner.backends._base`), with JAX set up for its device before anything
    starts it (`configure_process`) and that device JAX's default throughout, so that what the
    workload and its loss make lands there, not on the process's first device."""
    configure_process(request.device)
    device = resolve_device(request.device)
    with jax.default_device(device):
        return _run(request, device)


def _run(request: TrialRequest, device: jax.Device) -> dict[str, Any]:
    _seed(request.seed)
    workload = as_workload(load_factory(request.workload)(**request.workload_args), request.workload)
    training = TunedTraining(
        request.config, workload.loss_fn, workload.optimizer, device=device, params=workload.params
    )
    result: dict[str, Any] = {
        "tokens_per_sample": workload.tokens_per_sample,
        "flops_per_sample": workload.flops_per_sample,
    }
    if request.measure:
        result.update(_measure(workload, training, request))
        if workload.flops_per_sample is None:
            result["flops_per_sample"] = _count_flops_per_sample(workload, training)
        training.restart(workload.params)  # the initial weights, a fresh optimizer; compiled once, not twice
    _seed(request.seed)
    result["losses"] = _drift_phase(workload, training, request)
    return result
