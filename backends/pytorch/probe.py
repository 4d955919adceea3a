"""The PyTorch backend, trial-process side: what a probe finds out about a device and the software
around it (`autotuner.trials.process.TrialProcess.environment`): the device's name and driver, the
versions, the capabilities the knobs depend on (bf16, fp16, TF32, torch.compile, CUDA graphs),
the NVML facts (driver, energy counter) and the device's peak FLOP/s.

Imported with the runner by the fork server, so importing it must not initialise CUDA: only
calling its functions, in a trial process, touches the device.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import platform
import shutil
from typing import TYPE_CHECKING, Any

import torch

from autotuner.backends.pytorch import PYTORCH
from autotuner.measurement.hardware import cpu_name, peak_flops, thread_settings
from autotuner.measurement.nvml import cuda_uuid, has_energy_counter, nvml_driver
from autotuner.trials.probe import Environment
from autotuner.trials.streams import prefix

if TYPE_CHECKING:
    from autotuner.backends.pytorch.workload import InferenceWorkload, TorchWorkload


def parallel_capabilities(parallel: str | None, nodes: int) -> dict[str, bool]:
    """`ddp` and `fsdp`: whether the job's ranks train that way (its `parallel`) and this torch
    build can (torch.distributed, and FSDP2's `fully_shard`); `hsdp`: FSDP2 whose ranks span
    `nodes` of 2 or more, where its hybrid meshes differ from one over every rank."""
    distributed = torch.distributed.is_available()
    fsdp = parallel == "fsdp" and distributed and importlib.util.find_spec("torch.distributed.fsdp") is not None
    return {"ddp": parallel == "ddp" and distributed, "fsdp": fsdp, "hsdp": fsdp and nodes >= 2}


def environment(device: torch.device) -> Environment:
    """`device`'s environment (`autotuner.trials.probe.Environment`), the workload aside."""
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
            "cuda_graphs": True,
            "cudnn": torch.backends.cudnn.is_available(),
            # the kernels' own requirements (sm80 for flash and cuDNN attention, sm50 for efficient)
            "sdpa_flash": ampere,
            "sdpa_efficient": props.major >= 5,
            "sdpa_cudnn": ampere and torch.backends.cudnn.is_available(),
            # fp8 tensor cores from Ada and Hopper on, and torchao's float8 training to use them
            "fp8_training": (props.major, props.minor) >= (8, 9) and _has_float8(),
        }
        extra: dict[str, Any] = {
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
            "cudnn": False,
            "sdpa_flash": True,  # a CPU kernel of its own (fp32 and bf16)
            "sdpa_efficient": False,
            "sdpa_cudnn": False,
            "fp8_training": False,  # torch._scaled_mm's fp8 kernels are CUDA's
        }
        extra = {"memory_mb": _host_memory_mb()}
    capabilities["compile"] = _compile_works(device)
    return Environment(
        backend=PYTORCH.name,
        device=str(device),
        device_name=name,
        device_count=torch.cuda.device_count() if torch.cuda.is_available() else 0,
        driver=driver,
        versions={
            "python": platform.python_version(),
            "torch": str(torch.__version__),  # a TorchVersion: unpickling it would import torch
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        },
        capabilities=capabilities,
        threads={"intra_op": torch.get_num_threads(), **thread_settings()},
        peak_flops=peak_flops(name) if device.type == "cuda" else {},
        **extra,
    )


def workload_capabilities(
    workload: TorchWorkload | InferenceWorkload, device: torch.device, count: int
) -> dict[str, bool]:
    """What the workload offers the knobs (`autotuner.backends.pytorch.TorchCapabilities`): 2-D
    convolutions (channels_last, cuDNN's benchmark), a call of scaled_dot_product_attention in its
    loss on the first `count` items (run where the model was built, without gradients) or Hugging
    Face attention implementations, blocks to checkpoint, and which of foreach and fused its
    optimizer's class takes, fused tried on `device` (fused kernels exist for some devices only)."""
    from torch.overrides import TorchFunctionMode

    from autotuner.backends.pytorch.apply import is_hugging_face, repeated_blocks

    model = workload.model

    class Calls(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.sdpa = False

        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.sdpa = self.sdpa or getattr(func, "__name__", "") == "scaled_dot_product_attention"
            return func(*args, **(kwargs or {}))

    calls = Calls()
    try:
        batch = workload.collate(prefix(workload.dataset, count))
        with torch.no_grad(), calls:
            workload.loss(model, batch)
    except Exception:  # the probe's first-batch check has passed: this only decides a capability
        pass
    hugging_face = is_hugging_face(model)
    optimizer = workload.optimizer(p for p in model.parameters())
    accepted = inspect.signature(type(optimizer).__init__).parameters
    return {
        "convolutions": any(isinstance(m, torch.nn.Conv2d) for m in model.modules()),
        "sdpa": calls.sdpa,
        "hf_attention": hugging_face,
        "checkpoint_blocks": bool(workload.checkpoint_blocks)
        or bool(hugging_face and getattr(model, "supports_gradient_checkpointing", False))
        or bool(repeated_blocks(model)),
        "foreach_optimizer": "foreach" in accepted,
        "fused_optimizer": "fused" in accepted and _fused_works(type(optimizer), device),
    }


def _fused_works(kind: type[torch.optim.Optimizer], device: torch.device) -> bool:
    """Whether `kind(..., fused=True)` builds and steps over an fp32 parameter on `device`."""
    try:
        param = torch.nn.Parameter(torch.zeros(2, device=device))
        param.grad = torch.ones_like(param)
        kind([param], fused=True).step()  # type: ignore[call-arg]
    except Exception:
        return False
    return True


def gpu_uuid(device: torch.device) -> str | None:
    """The NVML UUID of `device` when it is a GPU (for telemetry and the energy counter); None on the CPU."""
    return cuda_uuid(device.index or 0) if device.type == "cuda" else None


def _host_memory_mb() -> int | None:
    """The host's physical memory, what a CPU trial's peak is a share of."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    except (ValueError, OSError):
        return None


def _cpu_autocast_works(dtype: torch.dtype) -> bool:
    try:
        with torch.autocast("cpu", dtype=dtype):
            return torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == dtype
    except Exception:
        return False


def _has_float8() -> bool:
    """Whether torchao (whose `torchao.float8` trains in fp8) is installed: found, not imported,
    since importing it costs a probe seconds."""
    return importlib.util.find_spec("torchao") is not None


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
