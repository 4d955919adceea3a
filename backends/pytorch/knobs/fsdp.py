"""The knobs of `parallel: fsdp`: FSDP2's `fully_shard` arguments."""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, cast

from autotuner.backends.pytorch.capabilities import TorchCapabilities
from autotuner.backends.pytorch.knobs._family import Build, TorchFamily
from autotuner.config.knobs import PRECISION, Config, Knob

if TYPE_CHECKING:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

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
    "FSDP2 `MixedPrecisionPolicy`: the dtype gradients are reduce-scattered in (and, with `fsdp_mesh` hybrid, "
    "all-reduced across the replicas in)",
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
FSDP_MESH = Knob(
    "fsdp_mesh",
    "FSDP2's device mesh on a trial across nodes: `flat` shards over every rank; `hybrid` (HSDP), a 2-D mesh "
    "(replicate, shard) = (nodes, ranks per node), gathers and reduce-scatters within a node and all-reduces each "
    "shard's gradients across the nodes; `hybrid_across`, its transpose, shards across the nodes and replicates "
    "within one (ranks per node: torchrun's `LOCAL_WORLD_SIZE`)",
    ("flat", "hybrid", "hybrid_across"),
    "flat",
    not_run_when="not `parallel: fsdp`; `hybrid`, `hybrid_across` on one node (`nodes: 1`)",
    memory_order=("flat", "hybrid"),  # a shard of a node's ranks is larger than one of every rank's
    quiet=True,
)
FSDP_KNOBS = (RESHARD_AFTER_FORWARD, PARAM_DTYPE, REDUCE_DTYPE, OFFLOAD, FSDP_MESH)
HYBRID_DIMS = ("replicate", "shard")
"""The names of a hybrid mesh's dimensions, outer first (FSDP2 replicates over the first, shards
over the second)."""


def irrelevant(knob: Knob, value: object, caps: TorchCapabilities) -> str | None:
    if not caps.fsdp:
        return f"{knob.name}={value}: a knob of parallel: fsdp (a trial of several processes)"
    if knob.name == OFFLOAD.name and not caps.accelerator:
        return "offload=cpu: the parameters are in host memory already"
    if knob.name == FSDP_MESH.name and not caps.hsdp:
        return f"fsdp_mesh={value}: a trial on one node has no nodes to replicate across (nodes: 2 or more)"
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


def hybrid_shape() -> tuple[int, int]:
    """(nodes, ranks per node) of the job this process is a rank of: the ranks per node from
    `LOCAL_WORLD_SIZE`, which torchrun (torch elastic) sets in every rank, as a trial's ranks have
    it (unset: every rank on one node); the ranks from the process group, or before one is
    initialised (a trainer building its own mesh) from `WORLD_SIZE`, torchrun's too. Global rank
    = node x ranks per node + local rank, as torchrun numbers them."""
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        world = torch.distributed.get_world_size()
    else:
        world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if local < 1 or world % local:
        raise ValueError(f"LOCAL_WORLD_SIZE={local}: the {world} ranks do not make nodes of {local} ranks each")
    return world // local, local


def device_mesh(layout: str, device_type: str) -> DeviceMesh:
    """The mesh FSDP2 shards over for an `fsdp_mesh` value: every rank in one dimension (`flat`),
    or HSDP's 2-D mesh (replicate, shard) (`HYBRID_DIMS`): for `hybrid` the nodes by the ranks of
    each, so a shard group is one node's ranks; for `hybrid_across` its transpose, so a shard group
    holds one rank of each node and the ranks of a node replicate each other."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    if layout == "flat":
        return init_device_mesh(device_type, (torch.distributed.get_world_size(),))
    nodes, local = hybrid_shape()
    if layout == "hybrid":
        return init_device_mesh(device_type, (nodes, local), mesh_dim_names=HYBRID_DIMS)
    ranks = torch.arange(nodes * local).reshape(nodes, local)
    return DeviceMesh(device_type, ranks.T, mesh_dim_names=HYBRID_DIMS)


def fully_sharded(
    model: torch.nn.Module,
    config: Mapping[str, object],
    device: torch.device,
    blocks: Sequence[type[torch.nn.Module]] | None,
) -> torch.nn.Module:
    """`model` sharded in place with FSDP2's `fully_shard` over the ranks of the process group, on
    the config's mesh (`device_mesh`): each of its blocks (`blocks`, else a Hugging Face model's or
    the largest module type it repeats: `autotuner.backends.pytorch.modules.repeated_blocks`) on its
    own, then the root, with the config's resharding, mixed-precision policy and offload."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    from autotuner.backends.pytorch.modules import repeated_blocks

    shard = functools.partial(
        fully_shard,
        mesh=device_mesh(FSDP_MESH.of(config), device.type),
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
