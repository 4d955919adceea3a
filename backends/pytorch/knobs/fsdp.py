"""The knobs of `parallel: fsdp`: FSDP2's `fully_shard` arguments."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, cast

from autotuner.backends.pytorch.capabilities import TorchCapabilities
from autotuner.backends.pytorch.knobs._family import Build, TorchFamily
from autotuner.config.knobs import PRECISION, Config, Knob

if TYPE_CHECKING:
    import torch

RESHARD_AFTER_FORWARD = Knob(
    "reshard_after_forward",
    "FSDP2: free the gathered parameters after the forward, gather them again for the backward",
    (True, False),
    True,
    not_run_when="not `parallel: fsdp`",
    memory_order=(True, False),
    quiet=True,
)
PARAM_DTYPE = Knob(
    "param_dtype",
    "FSDP2 `MixedPrecisionPolicy`: the dtype the gathered parameters compute in",
    ("fp32", "bf16"),
    "fp32",
    not_run_when="not `parallel: fsdp`; bf16 with `precision: fp16`",
    memory_order=("bf16", "fp32"),
    quiet=True,
)
REDUCE_DTYPE = Knob(
    "reduce_dtype",
    "FSDP2 `MixedPrecisionPolicy`: the dtype gradients are reduce-scattered in",
    ("fp32", "bf16"),
    "fp32",
    not_run_when="not `parallel: fsdp`",
    quiet=True,
)
OFFLOAD = Knob(
    "offload",
    "FSDP2 `CPUOffloadPolicy`: sharded parameters, gradients and optimizer state in host memory, the optimizer "
    "stepping on the CPU (memory, at a cost the trial measures)",
    ("none", "cpu"),
    "none",
    not_run_when="not `parallel: fsdp`; on the CPU (the parameters are in host memory already)",
    memory_order=("cpu", "none"),
    quiet=True,
)
FSDP_KNOBS = (RESHARD_AFTER_FORWARD, PARAM_DTYPE, REDUCE_DTYPE, OFFLOAD)


def irrelevant(knob: Knob, value: object, caps: TorchCapabilities) -> str | None:
    if not caps.fsdp:
        return f"{knob.name}={value}: a knob of parallel: fsdp (a trial of several processes)"
    if knob.name == OFFLOAD.name and not caps.accelerator:
        return "offload=cpu: the parameters are in host memory already"
    return None


def conflict(config: Config, caps: TorchCapabilities) -> str | None:
    if config.get(PARAM_DTYPE.name) == "bf16" and config.get(PRECISION.name) == "fp16":
        return "param_dtype=bf16: with precision fp16, autocast would compute bf16 parameters in fp16"
    return None


def dtype(choice: str) -> torch.dtype | None:
    """FSDP2's MixedPrecisionPolicy dtype for a `param_dtype` or `reduce_dtype` value (None: the
    parameters' own, fp32)."""
    import torch

    return {"fp32": None, "bf16": torch.bfloat16}[choice]


def fully_sharded(
    model: torch.nn.Module,
    config: Mapping[str, object],
    device: torch.device,
    blocks: Sequence[type[torch.nn.Module]] | None,
) -> torch.nn.Module:
    """`model` sharded in place with FSDP2's `fully_shard` over every rank of the process group:
    each of its blocks (`blocks`, else a Hugging Face model's or the largest module type it repeats:
    `autotuner.backends.pytorch.modules.repeated_blocks`) on its own, then the root, with the
    config's resharding, mixed-precision policy and offload."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    from autotuner.backends.pytorch.modules import repeated_blocks

    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    shard = functools.partial(
        fully_shard,
        mesh=mesh,
        reshard_after_forward=bool(RESHARD_AFTER_FORWARD.of(config)),
        mp_policy=MixedPrecisionPolicy(
            param_dtype=dtype(PARAM_DTYPE.of(config)), reduce_dtype=dtype(REDUCE_DTYPE.of(config))
        ),
        offload_policy=CPUOffloadPolicy() if OFFLOAD.of(config) == "cpu" else OffloadPolicy(),
    )
    kinds = tuple(blocks or ()) or repeated_blocks(model)
    for module in list(model.modules()):
        if kinds and isinstance(module, kinds) and module is not model:
            shard(module)
    shard(model)
    return model


def over_parameters(
    optimizer: torch.optim.Optimizer, names: Mapping[int, str], model: torch.nn.Module
) -> torch.optim.Optimizer:
    """`optimizer` over `model`'s parameters as they are now (FSDP2 replaces each parameter with its
    shard): a new optimizer of its class, with its groups and hyperparameters, each parameter
    found again by its name (`names`: the old parameters' ids -> their names). Itself when it holds
    the model's parameters already."""
    current = dict(model.named_parameters())
    if all(id(p) in {id(q) for q in current.values()} for g in optimizer.param_groups for p in g["params"]):
        return optimizer
    if optimizer.state:
        raise ValueError("parallel=fsdp shards the parameters: pass an optimizer that has not stepped yet")
    groups = [{**group, "params": [current[names[id(p)]] for p in group["params"]]} for group in optimizer.param_groups]
    accepted = inspect.signature(type(optimizer).__init__).parameters
    return type(optimizer)(groups, **{k: v for k, v in optimizer.defaults.items() if k in accepted})


def apply(build: Build) -> None:
    """Under `parallel: fsdp`, the model sharded in place (kept where it is sharded already: the
    runner's drift phase), and the optimizer over its shards."""
    if build.parallel != "fsdp":
        return
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(build.module, FSDPModule):
        names = {id(p): name for name, p in build.model.named_parameters()}
        fully_sharded(build.model, build.config, build.device, build.checkpoint_blocks)
        build.optimizer = over_parameters(build.optimizer, names, build.model)
    build.fsdp = cast(FSDPModule, build.module)  # `fully_shard` made it one, changing its class in place


FAMILY = TorchFamily(FSDP_KNOBS, irrelevant, conflict, apply)
