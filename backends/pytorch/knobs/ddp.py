"""The knobs of `parallel: ddp`: DistributedDataParallel's own arguments and its communication hook."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from autotuner.backends.pytorch.capabilities import TorchCapabilities
from autotuner.backends.pytorch.knobs._family import Build, TorchFamily
from autotuner.config.knobs import ACCUMULATION, Config, Knob

if TYPE_CHECKING:
    import torch
    from torch.nn.parallel import DistributedDataParallel

BUCKET_CAP_MB = Knob(
    "bucket_cap_mb",
    "DDP: megabytes of gradients all-reduced together; larger buckets, fewer and later all-reduces (default 25)",
    None,
    25,
    not_run_when="not `parallel: ddp`",
    maximum=4096,
    quiet=True,
)
BUCKET_VIEW = Knob(
    "bucket_view",
    "DDP `gradient_as_bucket_view`: gradients are views into the buckets (no copy, less memory)",
    (False, True),
    False,
    not_run_when="not `parallel: ddp`",
    memory_order=(True, False),
    quiet=True,
)
STATIC_GRAPH = Knob(
    "static_graph",
    "DDP `static_graph`: the same parameters get gradients every step",
    (False, True),
    False,
    not_run_when="not `parallel: ddp`; with accumulation (DDP's static graph fails under `no_sync`)",
    quiet=True,
)
COMM_HOOK = Knob(
    "comm_hook",
    "DDP gradient communication: as computed, compressed to fp16 or bf16 (torch's default hooks), or PowerSGD "
    "(rank 1, error feedback, warm start, compressing from step 2, not after PowerSGD's default 1,000 vanilla "
    "steps: a config is judged as it trains)",
    ("none", "fp16", "bf16", "powersgd"),
    "none",
    not_run_when="not `parallel: ddp`; bf16 without a GPU (torch's bf16 hook needs CUDA and NCCL)",
    quiet=True,
)
DDP_KNOBS = (BUCKET_CAP_MB, BUCKET_VIEW, STATIC_GRAPH, COMM_HOOK)


def irrelevant(knob: Knob, value: object, caps: TorchCapabilities) -> str | None:
    if not caps.ddp:
        return f"{knob.name}={value}: a knob of parallel: ddp (a trial of several processes)"
    if knob.name == COMM_HOOK.name and value == "bf16" and not (caps.accelerator and caps.bf16):
        return "comm_hook=bf16: torch's bf16 compression hook needs a GPU with bf16 (CUDA and NCCL)"
    return None


def conflict(config: Config, caps: TorchCapabilities) -> str | None:
    if config.get(STATIC_GRAPH.name) and config.get(ACCUMULATION.name, 1) > 1:
        # the reducer asserts in the first no_sync backward, and past that stops reducing
        return "static_graph=True with accumulation: DDP's static graph fails under no_sync (pytorch/pytorch#143580)"
    return None


POWERSGD_START = 2
"""PowerSGD compresses from this optimizer step on (the earliest it allows with error feedback):
a config is measured, and its drift judged, as it trains, not over vanilla all-reduces that
PowerSGD's default of 1,000 steps would run first."""


def distributed_data_parallel(
    model: torch.nn.Module, config: Mapping[str, object], device: torch.device
) -> DistributedDataParallel:
    """`model` wrapped in DistributedDataParallel with the config's bucket size, bucket views,
    static graph and communication hook (fp16 or bf16 compression: torch's default hooks;
    PowerSGD: rank 1, error feedback and warm start, from step `POWERSGD_START`)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=int(BUCKET_CAP_MB.of(config)),
        gradient_as_bucket_view=bool(BUCKET_VIEW.of(config)),
        static_graph=bool(STATIC_GRAPH.of(config)),
    )
    hook = COMM_HOOK.of(config)
    if hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=POWERSGD_START)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return ddp


def apply(build: Build) -> None:
    """Under `parallel: ddp`, the model wrapped in DistributedDataParallel (kept where it is wrapped
    already: the runner's drift phase)."""
    if build.parallel != "ddp":
        return
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(build.wrapped, DistributedDataParallel):
        build.ddp = build.wrapped
    else:
        build.ddp = build.model = distributed_data_parallel(build.model, build.config, build.device)


FAMILY = TorchFamily(DDP_KNOBS, irrelevant, conflict, apply)
