"""The PyTorch backend, trial-process side: what a probe finds out about a device and the software
around it (`autotuner.runner.TrialBackend.environment`): the device's name and driver, the
versions, the capabilities the knobs depend on (bf16, fp16, TF32, torch.compile, CUDA graphs),
the NVML facts (driver, energy counter) and the device's peak FLOP/s.

Imported with the runner by the fork server, so importing it must not initialise CUDA: only
calling its functions, in a trial process, touches the device.
"""

from __future__ import annotations

import os
import platform
import shutil
from typing import Any

import torch

from autotuner.environment import cpu_name, thread_settings
from autotuner.hardware import peak_flops
from autotuner.telemetry import cuda_uuid, has_energy_counter, nvml_driver


def environment(device: torch.device) -> dict[str, Any]:
    """`device`'s environment as `autotuner.backends._base` describes the probe's result, the
    workload aside."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name = props.name
        driver = nvml_driver()
        ampere = props.major >= 8  # of this device: is_bf16_supported() asks about cuda:0, and counts emulation
        capabilities = {"accelerator": True, "bf16": ampere, "fp16": True, "tf32": ampere, "cuda_graphs": True}
        extra = {
            "compute_capability": f"{props.major}.{props.minor}",
            "memory_mb": props.total_memory // 2**20,
            "energy_counter": has_energy_counter(gpu_uuid(device)),
        }
    else:
        name = cpu_name()
        driver = platform.release()
        capabilities = {
            "accelerator": False,
            "bf16": _cpu_autocast_works(torch.bfloat16),
            "fp16": _cpu_autocast_works(torch.float16),
            "tf32": False,
            "cuda_graphs": False,
        }
        extra = {}
    capabilities["compile"] = _compile_works(device)
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
        "threads": {"intra_op": torch.get_num_threads(), **thread_settings()},
        "peak_flops": peak_flops(name) if device.type == "cuda" else {},
        **extra,
    }


def gpu_uuid(device: torch.device) -> str | None:
    """The NVML UUID of `device` when it is a GPU (for telemetry and the energy counter); None on the CPU."""
    return cuda_uuid(device.index or 0) if device.type == "cuda" else None


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
