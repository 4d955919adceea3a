"""The tuned config as Hugging Face `Trainer` arguments (`transformers.TrainingArguments`).

precision -> `bf16`/`fp16`/`tf32` (`tf32=False` for the other precisions, the strict fp32
matmuls the study ran them with), batch_size -> `per_device_train_batch_size`, accumulation ->
`gradient_accumulation_steps` (divided by the world size, to keep the global batch), workers ->
`dataloader_num_workers` and `dataloader_persistent_workers`, pin_memory ->
`dataloader_pin_memory` (pinned on a CUDA device only), prefetch_factor ->
`dataloader_prefetch_factor` (with workers), compile -> `torch_compile`/`torch_compile_mode`,
checkpointing=blocks -> `activation_checkpointing` with `{"use_reentrant": False}` (named
`gradient_checkpointing` in a transformers without `activation_checkpointing`), optimizer=fused ->
`optim="adamw_torch_fused"`, optimizer=foreach on a GPU -> `optim="adamw_torch"` (torch's AdamW
takes its foreach path for GPU parameters unless told otherwise); a config tuned on a CPU gets
`use_cpu=True`.

A config tuned as several ranks: with DDP, bucket_cap_mb -> `ddp_bucket_cap_mb`, static_graph ->
`ddp_static_graph`, and `ddp_find_unused_parameters=False` (the study's DistributedDataParallel;
the Trainer would look for unused parameters of a model without checkpointing); with FSDP2,
`fsdp` and `fsdp_config` (`version` 2, reshard_after_forward -> `reshard_after_forward`, offload ->
`cpu_offload`; the Trainer shards the model's `_no_split_modules` blocks, then the root, as the
study sharded its repeated blocks), and fsdp_mesh=hybrid -> `parallelism_config`, Accelerate's
`ParallelismConfig(*hybrid_shape())` (HSDP over (nodes, ranks per node), counted where the ranks
run; fsdp_mesh=hybrid_across, whose transposed mesh Accelerate cannot build, is a comment in
`setup_code`). `trainer_code` holds what the arguments cannot, lines that set it on the
Accelerate objects the Trainer built, after `Trainer(...)` and before `train()`:
bucket_view (`gradient_as_bucket_view`) and comm_hook (a `DDPCommunicationHookType`, PowerSGD's
options) on its `DistributedDataParallelKwargs`, and param_dtype and reduce_dtype as the FSDP
plugin's `MixedPrecisionPolicy` (the Trainer would make one of its precision, all bf16 or fp16).

`optim` picks the Trainer's own AdamW: an optimizer you pass to the Trainer (`optimizers=`) is
built by you, with `fused=True` or `foreach=True` where the config says so. `setup_code` holds
what `TrainingArguments` cannot: cuDNN's benchmark mode and the SDPA kernel (process-wide flags),
channels_last, the model's attention implementation (`set_attn_implementation`), and foreach off a
GPU (an AdamW for `Trainer(optimizer_cls_and_kwargs=...)`, transformers 4.47 or later);
`training_arguments` and `apply` warn when it is needed.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING, Any

from autotuner.backends.pytorch import COMPILE, PREFETCH_FACTOR
from autotuner.backends.pytorch.integrations import (
    HOOK_TYPES,
    accumulation_per_process,
    across_note,
    assignment,
    call,
    common_setup,
    dtype,
    fsdp_mesh,
    header,
    hybrid_import,
    knobs,
    launch_line,
    loader_arguments,
    on_cuda,
    parallel_knobs,
    parallelism_config,
    powersgd_options,
    split_imports,
)
from autotuner.backends.pytorch.knobs.attention import SDPA_FLAGS
from autotuner.config.knobs import BATCH_SIZE, PRECISION

if TYPE_CHECKING:
    from transformers import TrainingArguments

    from autotuner.export.reader import TunedConfig

FOREACH_ADAMW_CODE = (
    "# optimizer=foreach: off a GPU, torch's AdamW loops over the parameters unless told; pass "
    "Trainer(..., optimizer_cls_and_kwargs=foreach_adamw)",
    'foreach_adamw = (torch.optim.AdamW, {"lr": args.learning_rate, "betas": (args.adam_beta1, args.adam_beta2), '
    '"eps": args.adam_epsilon, "foreach": True})',
)
"""The Trainer's own AdamW (`adamw_torch`: learning rate, betas, epsilon from `args`; weight decay
per parameter group, set by the Trainer) with foreach=True, which `TrainingArguments` cannot ask for."""


SETUP_COMMENT = "# What the arguments cannot hold: run it before Trainer(model=model, args=args, ...)."
TRAINER_COMMENT = (
    "# What the arguments cannot hold of how the ranks train together: "
    "run it after trainer = Trainer(model=model, args=args, ...), before trainer.train()."
)
HOOK_TYPE_IMPORT = "from accelerate.utils import DDPCommunicationHookType"
POLICY_IMPORT = "from torch.distributed.fsdp import MixedPrecisionPolicy"
PARALLELISM_IMPORT = "from accelerate.utils import ParallelismConfig"
DDP_HANDLER = "trainer.accelerator.ddp_handler"
"""The `DistributedDataParallelKwargs` the Trainer builds from its arguments and wraps the model with."""
FSDP_PLUGIN = "trainer.accelerator.state.fsdp_plugin"
"""The `FullyShardedDataParallelPlugin` the Trainer builds from `fsdp_config` and shards the model with."""


def _checkpointing_arguments() -> dict[str, Any]:
    # transformers 5 renamed gradient_checkpointing; a copy (`apply`) that sets only the old,
    # deprecated name keeps the resolved new one, False: use the name the installed version reads
    from transformers import TrainingArguments

    fields = {field.name for field in dataclasses.fields(TrainingArguments)}
    name = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    return {name: True, f"{name}_kwargs": {"use_reentrant": False}}


def _fsdp_switch(reshard: bool, offload: bool) -> Any:
    # transformers 5 turns FSDP on with fsdp=True and reads the rest from fsdp_config; earlier
    # versions read the sharding and the offload from fsdp's words
    from transformers import TrainingArguments

    field = next(field for field in dataclasses.fields(TrainingArguments) if field.name == "fsdp")
    if field.default is None:
        return True
    return ("full_shard" if reshard else "shard_grad_op") + (" offload" if offload else "")


def _parallel_arguments(config: TunedConfig, *, code: bool) -> dict[str, Any]:
    values = parallel_knobs(config)
    if config.parallel == "ddp":
        return {
            "ddp_find_unused_parameters": False,  # the study's DistributedDataParallel's
            "ddp_bucket_cap_mb": values["bucket_cap_mb"],
            "ddp_static_graph": values["static_graph"],
        }
    if config.parallel == "fsdp":
        reshard, offload = values["reshard_after_forward"], values["offload"] == "cpu"
        hybrid = {"parallelism_config": parallelism_config(code=code)} if fsdp_mesh(config) == "hybrid" else {}
        return {
            "fsdp": _fsdp_switch(reshard, offload),
            "fsdp_config": {"version": 2, "reshard_after_forward": reshard, "cpu_offload": offload},
            **hybrid,
        }
    return {}


def _optim(config: TunedConfig) -> dict[str, Any]:
    choice = knobs(config)["optimizer"]
    if choice == "fused":
        return {"optim": "adamw_torch_fused"}
    if choice == "foreach" and on_cuda(config):
        return {"optim": "adamw_torch"}
    return {}


def _training_arguments(config: TunedConfig, world_size: int, *, code: bool = False) -> dict[str, Any]:
    params = knobs(config)
    loader = loader_arguments(config)
    precision, mode = params[PRECISION.name], params[COMPILE.name]
    return {
        "bf16": precision == "bf16",
        "fp16": precision == "fp16",
        "tf32": precision == "tf32",
        "per_device_train_batch_size": params[BATCH_SIZE.name],
        "gradient_accumulation_steps": accumulation_per_process(config, world_size),
        "dataloader_num_workers": loader["num_workers"],
        "dataloader_pin_memory": loader["pin_memory"],
        "dataloader_persistent_workers": loader["persistent_workers"],
        **({"dataloader_prefetch_factor": loader[PREFETCH_FACTOR.name]} if "prefetch_factor" in loader else {}),
        "torch_compile": mode != "none",
        **({"torch_compile_mode": mode} if mode != "none" else {}),
        **(_checkpointing_arguments() if params["checkpointing"] == "blocks" else {}),
        **_optim(config),
        # tuned on a CPU: train there (TrainingArguments refuses bf16 without a GPU otherwise)
        **({"use_cpu": True} if config.machine.device.startswith("cpu") else {}),
        **_parallel_arguments(config, code=code),
    }


def _warn_of_setup(config: TunedConfig) -> None:
    needed = setup_code(config) + trainer_code(config)
    if needed:
        warnings.warn(
            f"the Trainer's arguments have no place for part of this config; run: {'; '.join(needed)}", stacklevel=3
        )


def training_arguments(config: TunedConfig, world_size: int | None = None) -> dict[str, Any]:
    """`TrainingArguments` keyword arguments for the tuned knobs, for a run in `world_size` processes
    (None: as many as it was tuned as). Warns when the config needs `setup_code` or `trainer_code` too."""
    _warn_of_setup(config)
    return _training_arguments(config, config.world if world_size is None else world_size)


def apply(args: TrainingArguments, config: TunedConfig) -> TrainingArguments:
    """A copy of `args` with the tuned knobs; the accumulation is divided by `args.world_size`
    (the processes the launcher started) so the global batch is the study's. Warns when the config
    needs `setup_code` or `trainer_code` too."""
    _warn_of_setup(config)
    return dataclasses.replace(args, **_training_arguments(config, world_size=args.world_size))


def setup_code(config: TunedConfig) -> list[str]:
    """Lines of Python for what `TrainingArguments` cannot hold, to run on your `model` before
    `Trainer(model=model, args=args, ...)`: cuDNN's benchmark mode, the SDPA kernel, channels_last,
    the attention implementation (its `sdpa` one for an SDPA kernel, as the study switched it), and,
    off a GPU, an AdamW with foreach=True for the Trainer; a comment for fsdp_mesh=hybrid_across."""
    params = knobs(config)
    lines = common_setup(params, held=(PRECISION.name,))
    if fsdp_mesh(config) == "hybrid_across":
        lines.append(across_note("Accelerate's ParallelismConfig, the Trainer's,"))
    attention = params["attention"]
    if attention == "eager" or attention in SDPA_FLAGS:
        implementation = "eager" if attention == "eager" else "sdpa"
        lines.append(
            f'model.set_attn_implementation("{implementation}")  # attention={attention} '
            f'(or from_pretrained(..., attn_implementation="{implementation}"))'
        )
    if params["optimizer"] == "foreach" and not on_cuda(config):
        lines += FOREACH_ADAMW_CODE
    return lines


def _policy_needed(config: TunedConfig) -> bool:
    """Whether the FSDP plugin's mixed-precision policy must be set: the Trainer makes one of its
    precision (bf16 or fp16 everything), and none in fp32, which is the study's only for fp32
    parameters and reductions without mixed precision."""
    values = parallel_knobs(config)
    mixed = knobs(config)[PRECISION.name] in ("bf16", "fp16")
    return mixed or (values["param_dtype"], values["reduce_dtype"]) != ("fp32", "fp32")


def trainer_code(config: TunedConfig) -> list[str]:
    """Lines of Python for what `TrainingArguments` cannot hold of how the ranks train together, to
    run on `trainer` after `Trainer(model=model, args=args, ...)` and before `trainer.train()`
    (which wraps the model): DDP's bucket views and communication hook on the Trainer's
    `DistributedDataParallelKwargs`, FSDP2's parameter and reduction dtypes as its FSDP plugin's
    `MixedPrecisionPolicy`. Empty for one process."""
    values = parallel_knobs(config)
    lines = []
    if config.parallel == "ddp":
        if values["bucket_view"]:
            lines.append(f"{DDP_HANDLER}.gradient_as_bucket_view = True  # bucket_view")
        hook = values["comm_hook"]
        if hook != "none":
            lines += [
                HOOK_TYPE_IMPORT,
                f"{DDP_HANDLER}.comm_hook = DDPCommunicationHookType.{HOOK_TYPES[hook]}  # comm_hook={hook}",
            ]
        if hook == "powersgd":
            options = powersgd_options()
            lines.append(
                f"{DDP_HANDLER}.comm_state_option = {options!r}  "
                f"# rank 1, compressing from step {options['start_powerSGD_iter']} on"
            )
    if config.parallel == "fsdp" and _policy_needed(config):
        policy = {name: dtype(values[name], code=True) for name in ("param_dtype", "reduce_dtype")}
        lines += [
            POLICY_IMPORT,
            f"{FSDP_PLUGIN}.mixed_precision_policy = {call('MixedPrecisionPolicy', policy)}"
            f"  # param_dtype={values['param_dtype']}, reduce_dtype={values['reduce_dtype']}",
        ]
    return lines


def snippet(config: TunedConfig) -> str:
    """Python code building `TrainingArguments` with the tuned knobs, the setup lines for the rest,
    and for a config tuned as several ranks, the lines to run on the Trainer."""
    setup = setup_code(config)
    on_trainer = trainer_code(config)
    imports = [line for line in on_trainer if line.startswith("from ")]
    on_trainer = [line for line in on_trainer if line not in imports]
    imports += [PARALLELISM_IMPORT] if fsdp_mesh(config) == "hybrid" else []
    lines = [
        *header(config, "hf-trainer", launch_line(config)),
        "# autotuner.backends.pytorch.integrations.transformers.apply(args, config) divides it by args.world_size.",
        *(["import torch"] if setup or POLICY_IMPORT in imports else []),
        *sorted(line for line in imports if line.startswith("from accelerate")),
        *[line for line in imports if line.startswith("from torch")],
        "from transformers import TrainingArguments",
        *split_imports(hybrid_import(config))[0],
        "",
        *assignment("tuned", _training_arguments(config, config.world, code=True)),
        'args = TrainingArguments(output_dir="trainer-output", **tuned)  # your own arguments beside them',
        *([SETUP_COMMENT, *setup] if setup else []),
        *([TRAINER_COMMENT, *on_trainer] if on_trainer else []),
    ]
    return "\n".join(lines) + "\n"
