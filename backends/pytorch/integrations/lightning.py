"""The tuned config as Lightning `Trainer` and `DataLoader` arguments.

precision -> `precision` (`bf16-mixed`, `16-mixed`, `32-true`), accumulation ->
`accumulate_grad_batches` (divided by the world size, to keep the global batch),
cudnn_benchmark -> `benchmark=True`, batch_size, workers, pin_memory (on a CUDA device) and
prefetch_factor -> the `DataLoader` the user passes to `fit`. Lightning's Trainer takes no TF32,
torch.compile mode, SDPA kernel, channels_last, activation checkpointing, attention
implementation or optimizer flag: `setup_code` says what to run instead on the LightningModule
(`model`) before `fit` (the TF32 and SDPA flags, `model.to(memory_format=torch.channels_last)`,
`enable_checkpointing(model)`, `torch.compile(model, mode=...)`; for foreach or fused, a comment:
`configure_optimizers` builds the optimizer, so it passes the flag), and `trainer_arguments` warns
when there is such a line.

A config tuned as several ranks gets `devices` (the processes) and `strategy`: with DDP a
`DDPStrategy` (bucket_cap_mb -> `bucket_cap_mb`, bucket_view -> `gradient_as_bucket_view`,
static_graph -> `static_graph`, comm_hook -> `ddp_comm_hook`, torch's fp16 or bf16 compression hook
or PowerSGD's with its `ddp_comm_state`, as `TunedTraining` registers them); with FSDP2 an
`FSDPStrategy`, which is FSDP1 (`FullyShardedDataParallel`), the nearest Lightning has:
reshard_after_forward -> `sharding_strategy` `FULL_SHARD` (True) or `SHARD_GRAD_OP` (False: the
gathered parameters are kept from the forward to the backward), offload -> `cpu_offload`,
param_dtype and reduce_dtype -> `mixed_precision` (FSDP1's `MixedPrecision`; without it Lightning
would make one of its precision), fsdp_mesh=hybrid -> `HYBRID_SHARD` (`_HYBRID_SHARD_ZERO2` without
resharding) over `device_mesh=hybrid_shape()`, (nodes, ranks per node) counted where the ranks run;
fsdp_mesh=hybrid_across, whose transposed mesh the strategy cannot be given before its process group
exists, and float8_all_gather and float8_precompute, FSDP2's, are a comment (sharded over every rank,
the layers converted without them). `trainer_arguments` warns of it; FSDP2 itself is Lightning's
`ModelParallelStrategy` with `fully_shard` in the LightningModule's `configure_model`.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from autotuner.backends.pytorch import COMPILE
from autotuner.backends.pytorch.integrations import (
    COMM_HOOKS,
    HOOKS_IMPORT,
    accumulation_per_process,
    across_note,
    assignment,
    call,
    comm_hook,
    common_setup,
    ddp_arguments,
    dtype,
    fsdp_mesh,
    header,
    hybrid_import,
    hybrid_shape,
    imports_first,
    knobs,
    launch_line,
    loader_arguments,
    model_setup,
    parallel_knobs,
    powersgd_options,
    split_imports,
)
from autotuner.backends.pytorch.knobs.float8 import FSDP_FLOAT8_KNOBS
from autotuner.config.knobs import PRECISION

if TYPE_CHECKING:
    from autotuner.export.reader import TunedConfig

PRECISIONS = {"fp32": "32-true", "tf32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}
SHARDING = {
    (True, False): "FULL_SHARD",
    (False, False): "SHARD_GRAD_OP",
    (True, True): "HYBRID_SHARD",
    (False, True): "_HYBRID_SHARD_ZERO2",
}
"""(reshard_after_forward, fsdp_mesh is hybrid) -> FSDP1's sharding strategy that does the same with
the gathered parameters, over every rank or within each node, replicated across the nodes."""
FSDP1_NOTE = (
    "Lightning's FSDPStrategy is FSDP1 (FullyShardedDataParallel), the nearest to the study's FSDP2 "
    "(fully_shard): for FSDP2 itself, use ModelParallelStrategy() and fully_shard in configure_model"
)

WRAP_NOTE = (
    "# The study sharded each block the model repeats on its own, then the whole model: "
    "FSDPStrategy(auto_wrap_policy={YourBlock}, ...) does the same."
)


def _trainer_arguments(config: TunedConfig, world_size: int) -> dict[str, Any]:
    params = knobs(config)
    return {
        "precision": PRECISIONS[params[PRECISION.name]],
        "accumulate_grad_batches": accumulation_per_process(config, world_size),
        **({"benchmark": True} if params["cudnn_benchmark"] else {}),  # torch.backends.cudnn.benchmark
        **({"devices": world_size // config.nodes} if config.parallel else {}),
        **({"num_nodes": config.nodes} if config.nodes > 1 else {}),
    }


def _strategy(config: TunedConfig, *, code: bool) -> Any:
    """The strategy of a config tuned as several ranks (a `DDPStrategy` or an `FSDPStrategy`), or
    with `code` the code building it; None for one process."""
    values = parallel_knobs(config)
    arguments: dict[str, Any]
    if config.parallel == "ddp":
        arguments = ddp_arguments(values)
        hook = values["comm_hook"]
        if hook != "none":
            arguments["ddp_comm_hook"] = comm_hook(hook, code=code)
        if hook == "powersgd":
            state: dict[str, Any] = {"process_group": None, **powersgd_options()}
            if code:
                arguments["ddp_comm_state"] = call("powerSGD_hook.PowerSGDState", state)
            else:
                from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

                arguments["ddp_comm_state"] = PowerSGDState(**state)
        if code:
            return call("DDPStrategy", arguments)
        from lightning.pytorch.strategies import DDPStrategy

        return DDPStrategy(**arguments)
    if config.parallel == "fsdp":
        policy = {name: dtype(values[name], code=code) for name in ("param_dtype", "reduce_dtype")}
        if code:
            precision: Any = call("MixedPrecision", policy)
        else:
            from torch.distributed.fsdp import MixedPrecision

            precision = MixedPrecision(**policy)
        hybrid = fsdp_mesh(config) == "hybrid"
        arguments = {
            "sharding_strategy": SHARDING[values["reshard_after_forward"], hybrid],
            "cpu_offload": values["offload"] == "cpu",
            "mixed_precision": precision,
            **({"device_mesh": hybrid_shape(code=code)} if hybrid else {}),
        }
        if code:
            return call("FSDPStrategy", arguments)
        from lightning.pytorch.strategies import FSDPStrategy

        return FSDPStrategy(**arguments)
    return None


def _strategy_imports(config: TunedConfig) -> list[str]:
    """The import lines the code of `_strategy` needs."""
    if config.parallel == "ddp":
        hook = parallel_knobs(config)["comm_hook"]
        hooks = [HOOKS_IMPORT + COMM_HOOKS[hook][0]] if hook != "none" else []
        return [*hooks, "from lightning.pytorch.strategies import DDPStrategy"]
    if config.parallel == "fsdp":
        return [
            "from lightning.pytorch.strategies import FSDPStrategy",
            "from torch.distributed.fsdp import MixedPrecision",
        ]
    return []


def trainer_arguments(config: TunedConfig, world_size: int | None = None) -> dict[str, Any]:
    """`lightning.Trainer` keyword arguments for the tuned knobs, for `world_size` processes
    (devices x nodes; None: as many as it was tuned as); for a config tuned as several ranks,
    `devices` and the `strategy` object. Warns when the config needs `setup_code` too, and of FSDP1
    standing in for FSDP2."""
    needed = setup_code(config)
    if needed:
        warnings.warn(
            f"Lightning's Trainer has no argument for part of this config; run: {'; '.join(needed)}", stacklevel=2
        )
    if config.parallel == "fsdp":
        warnings.warn(FSDP1_NOTE, stacklevel=2)
    arguments = _trainer_arguments(config, config.world if world_size is None else world_size)
    if config.parallel:
        arguments["strategy"] = _strategy(config, code=False)
    return arguments


def dataloader_arguments(config: TunedConfig) -> dict[str, Any]:
    """`torch.utils.data.DataLoader` keyword arguments: the micro-batch, workers, pinned memory, prefetch."""
    return loader_arguments(config)


def setup_code(config: TunedConfig) -> list[str]:
    """Lines of Python for what the Trainer's arguments cannot hold, to run on the LightningModule
    (`model`) before `fit`: TF32, the SDPA kernel, channels_last, activation checkpointing, eager
    attention, torch.compile's mode, and a comment for the optimizer flag, FSDP2's fp8 gathers and
    fsdp_mesh=hybrid_across."""
    params = knobs(config)
    fp8_gather = [knob.name for knob in FSDP_FLOAT8_KNOBS if params.get(knob.name) is True]
    if fp8_gather:  # FSDP2's; the FSDPStrategy is FSDP1
        params = {**params, **{knob.name: knob.reference for knob in FSDP_FLOAT8_KNOBS}}
    lines = [*common_setup(params, held=("cudnn_benchmark",)), *model_setup(params)]
    if fp8_gather:
        fsdp1 = "Lightning's FSDPStrategy (FSDP1) gathers the weights in their own dtype"
        lines.append(f"# {', '.join(fp8_gather)}: FSDP2's; {fsdp1}")
    if fsdp_mesh(config) == "hybrid_across":
        lines.append(across_note("Lightning's HYBRID_SHARD"))
    if params[COMPILE.name] != "none":
        lines.append(f'model = torch.compile(model, mode="{params[COMPILE.name]}")  # the LightningModule, before fit')
    if params["optimizer"] != "as-given":
        flag = params["optimizer"]
        lines.append(f"# optimizer={flag}: build the optimizer in configure_optimizers with {flag}=True")
    return imports_first(lines)


def snippet(config: TunedConfig) -> str:
    """Python code building the Trainer and the DataLoader with the tuned knobs."""
    setup = setup_code(config)
    ours, code = split_imports(imports_first([*hybrid_import(config), *setup]))
    arguments = _trainer_arguments(config, config.world)
    strategy = _strategy(config, code=True)
    if strategy is not None:
        arguments["strategy"] = strategy
    launch = f"python your_training.py, the Trainer starting its {config.processes} processes (devices)"
    if config.nodes > 1:
        launch = (
            f"{launch_line(config)}: the Trainer (num_nodes={config.nodes}, devices={config.processes}) "
            "joins the processes torchrun started"
        )
    lines = [
        *header(config, "lightning", launch),
        *([f"# {FSDP1_NOTE}.", WRAP_NOTE] if config.parallel == "fsdp" else []),
        *(["import torch"] if setup or config.parallel == "fsdp" else []),
        *sorted(
            ["from lightning import Trainer", "from torch.utils.data import DataLoader", *_strategy_imports(config)]
        ),
        *ours,
        "",
        *assignment("trainer_arguments", arguments),
        *assignment("loader_arguments", dataloader_arguments(config)),
        *code,
        "trainer = Trainer(**trainer_arguments)  # your own arguments beside them",
        "loader = DataLoader(dataset, shuffle=True, **loader_arguments)  # your dataset",
        "trainer.fit(model, loader)  # your LightningModule",
    ]
    return "\n".join(lines) + "\n"
