"""The tuned config as `accelerate.Accelerator` arguments and loader settings.

precision -> `mixed_precision` (`bf16`, `fp16`, `no`), accumulation ->
`gradient_accumulation_steps` (divided by the world size, to keep the global batch), compile ->
a `TorchDynamoPlugin` (inductor, the tuned mode), batch_size, workers, pin_memory (on a CUDA
device) and prefetch_factor -> the `DataLoader` passed to `prepare`. The Accelerator takes no
TF32, cuDNN benchmark, SDPA kernel, channels_last, activation checkpointing, attention
implementation or optimizer flag: `setup_code` holds them as lines to run on your `model` and
`optimizer` before `prepare` (the process-wide flags, `model.to(memory_format=torch.channels_last)`,
`enable_checkpointing(model)`, `optimizer = rebuilt_optimizer(optimizer, "fused")`), and
`accelerator_arguments` warns when it is needed.

A config tuned as several ranks gets, with DDP, `kwargs_handlers=[DistributedDataParallelKwargs(...)]`
(bucket_cap_mb -> `bucket_cap_mb`, bucket_view -> `gradient_as_bucket_view`, static_graph ->
`static_graph`, comm_hook -> `comm_hook`, a `DDPCommunicationHookType`, with PowerSGD's options in
`comm_state_option`); with FSDP2, `fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2, ...)`
(reshard_after_forward -> `reshard_after_forward`, param_dtype and reduce_dtype ->
`mixed_precision_policy`, an FSDP2 `MixedPrecisionPolicy`, which Accelerate keeps where it would
otherwise make one of `mixed_precision`; offload -> `cpu_offload`), and fsdp_mesh=hybrid ->
`parallelism_config=ParallelismConfig(*hybrid_shape())` (HSDP over Accelerate's mesh
(`dp_replicate`, `dp_shard`) = (nodes, ranks per node), counted where the ranks run);
fsdp_mesh=hybrid_across, whose transposed mesh Accelerate cannot build, is a comment in
`setup_code`. Launched with `accelerate launch --num_processes N`.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from autotuner.backends.pytorch import COMPILE
from autotuner.backends.pytorch.integrations import (
    HOOK_TYPES,
    TUNED_IMPORT,
    Code,
    accumulation_per_process,
    across_note,
    assignment,
    call,
    common_setup,
    ddp_arguments,
    dtype,
    fsdp_mesh,
    header,
    hybrid_import,
    imports_first,
    knobs,
    loader_arguments,
    model_setup,
    parallel_knobs,
    parallelism_config,
    powersgd_options,
    rendezvous,
    split_imports,
)
from autotuner.config.knobs import PRECISION

if TYPE_CHECKING:
    from autotuner.export.reader import TunedConfig

MIXED_PRECISION = {"fp32": "no", "tf32": "no", "bf16": "bf16", "fp16": "fp16"}
WRAP_NOTE = (
    "# The study sharded each block the model repeats on its own, then the whole model: "
    'auto_wrap_policy="transformer_based_wrap" does so for a Hugging Face model.'
)


def _parallel(config: TunedConfig, *, code: bool) -> dict[str, Any]:
    """The Accelerator's arguments for how the ranks train together: `kwargs_handlers` with DDP's
    `DistributedDataParallelKwargs`, or FSDP2's `fsdp_plugin`; with `code`, as code. Empty for one
    process."""
    values = parallel_knobs(config)
    arguments: dict[str, Any]
    if config.parallel == "ddp":
        arguments = ddp_arguments(values)
        hook = values["comm_hook"]
        if hook != "none":
            from accelerate.utils import DDPCommunicationHookType

            kind = HOOK_TYPES[hook]
            arguments["comm_hook"] = (
                Code(f"DDPCommunicationHookType.{kind}") if code else DDPCommunicationHookType[kind]
            )
        if hook == "powersgd":
            arguments["comm_state_option"] = powersgd_options()
        if code:
            return {"kwargs_handlers": Code(f"[{call('DistributedDataParallelKwargs', arguments)}]")}
        from accelerate.utils import DistributedDataParallelKwargs

        return {"kwargs_handlers": [DistributedDataParallelKwargs(**arguments)]}
    if config.parallel == "fsdp":
        policy = {name: dtype(values[name], code=code) for name in ("param_dtype", "reduce_dtype")}
        if code:
            precision: Any = call("MixedPrecisionPolicy", policy)
        else:
            from torch.distributed.fsdp import MixedPrecisionPolicy

            precision = MixedPrecisionPolicy(**policy)
        arguments = {
            "fsdp_version": 2,
            "reshard_after_forward": values["reshard_after_forward"],
            "mixed_precision_policy": precision,
            "cpu_offload": values["offload"] == "cpu",
        }
        hybrid = {"parallelism_config": parallelism_config(code=code)} if fsdp_mesh(config) == "hybrid" else {}
        if code:
            return {"fsdp_plugin": call("FullyShardedDataParallelPlugin", arguments), **hybrid}
        from accelerate.utils import FullyShardedDataParallelPlugin

        return {"fsdp_plugin": FullyShardedDataParallelPlugin(**arguments), **hybrid}
    return {}


def _parallel_names(config: TunedConfig) -> list[str]:
    """The names of `accelerate.utils` the code of `_parallel` uses."""
    if config.parallel == "ddp":
        hook = parallel_knobs(config)["comm_hook"] != "none"
        return ["DistributedDataParallelKwargs", *(["DDPCommunicationHookType"] if hook else [])]
    if config.parallel == "fsdp":
        return ["FullyShardedDataParallelPlugin", *(["ParallelismConfig"] if fsdp_mesh(config) == "hybrid" else [])]
    return []


def _arguments(config: TunedConfig, world_size: int) -> dict[str, Any]:
    params = knobs(config)
    return {
        "mixed_precision": MIXED_PRECISION[params[PRECISION.name]],
        "gradient_accumulation_steps": accumulation_per_process(config, world_size),
    }


def accelerator_arguments(config: TunedConfig, world_size: int | None = None) -> dict[str, Any]:
    """`Accelerator` keyword arguments for the tuned knobs, for `world_size` processes (None: as
    many as it was tuned as); with a compile mode, `dynamo_plugin` is a `TorchDynamoPlugin`; for a
    config tuned as several ranks, `kwargs_handlers` (DDP) or `fsdp_plugin` (FSDP2, with
    `parallelism_config` for a hybrid mesh). Warns when `setup_code` is needed too."""
    needed = setup_code(config)
    if needed:
        warnings.warn(
            f"the Accelerator has no argument for part of this config; run: {'; '.join(needed)}", stacklevel=2
        )
    arguments = _arguments(config, config.world if world_size is None else world_size)
    mode = knobs(config)[COMPILE.name]
    if mode != "none":
        from accelerate.utils import TorchDynamoPlugin

        arguments["dynamo_plugin"] = TorchDynamoPlugin(backend="inductor", mode=mode)
    return {**arguments, **_parallel(config, code=False)}


def dataloader_arguments(config: TunedConfig) -> dict[str, Any]:
    """`torch.utils.data.DataLoader` keyword arguments for the loader given to `prepare`."""
    return loader_arguments(config)


def setup_code(config: TunedConfig) -> list[str]:
    """Lines of Python for what the Accelerator's arguments cannot hold, to run on your `model` and
    `optimizer` before `prepare`: TF32, cuDNN's benchmark mode, the SDPA kernel, channels_last,
    activation checkpointing, eager attention, and the optimizer rebuilt with foreach=True or
    fused=True (`rebuilt_optimizer`, as `TunedTraining` rebuilds it: same class, parameter groups and
    hyperparameters); a comment for fsdp_mesh=hybrid_across."""
    params = knobs(config)
    lines = [*common_setup(params), *model_setup(params)]
    if fsdp_mesh(config) == "hybrid_across":
        lines.append(across_note("Accelerate's ParallelismConfig"))
    if params["optimizer"] != "as-given":
        lines += [
            f"{TUNED_IMPORT}rebuilt_optimizer",
            f'optimizer = rebuilt_optimizer(optimizer, "{params["optimizer"]}")  # optimizer={params["optimizer"]}',
        ]
    return imports_first(lines)


def snippet(config: TunedConfig) -> str:
    """Python code building the Accelerator and the DataLoader with the tuned knobs."""
    arguments: dict[str, Any] = _arguments(config, config.world)
    mode = knobs(config)[COMPILE.name]
    if mode != "none":
        arguments["dynamo_plugin"] = Code(f'TorchDynamoPlugin(backend="inductor", mode="{mode}")')
    arguments.update(_parallel(config, code=True))
    setup = setup_code(config)
    ours, code = split_imports(imports_first([*hybrid_import(config), *setup]))
    utils = sorted([*(["TorchDynamoPlugin"] if mode != "none" else []), *_parallel_names(config)])
    launch = f"accelerate launch --num_processes {config.world} your_training.py"
    if config.nodes > 1:
        host, _, port = rendezvous(config).rpartition(":")
        launch = (
            f"accelerate launch --num_machines {config.nodes} --num_processes {config.world} --machine_rank R "
            f"--main_process_ip {host} --main_process_port {port} --rdzv_backend c10d your_training.py (on node R)"
        )
    lines = [
        *header(config, "accelerate", launch),
        *([WRAP_NOTE] if config.parallel == "fsdp" else []),
        *(["import torch"] if setup or config.parallel == "fsdp" else []),
        "from accelerate import Accelerator",
        *([f"from accelerate.utils import {', '.join(utils)}"] if utils else []),
        *(["from torch.distributed.fsdp import MixedPrecisionPolicy"] if config.parallel == "fsdp" else []),
        "from torch.utils.data import DataLoader",
        *ours,
        "",
        *code,
        *assignment("accelerator_arguments", arguments),
        *assignment("loader_arguments", dataloader_arguments(config)),
        "accelerator = Accelerator(**accelerator_arguments)  # your own arguments beside them",
        "loader = DataLoader(dataset, shuffle=True, **loader_arguments)  # your dataset",
        "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)  # your model and optimizer",
    ]
    return "\n".join(lines) + "\n"
