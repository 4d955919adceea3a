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
from autotuner.config.knobs import BATCH_SIZE, PRECISION
from autotuner.integrations import (
    SDPA_FLAGS,
    accumulation_per_process,
    assignment,
    common_setup,
    header,
    knobs,
    loader_arguments,
    on_cuda,
)

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


def _checkpointing_arguments() -> dict[str, Any]:
    # transformers 5 renamed gradient_checkpointing; a copy (`apply`) that sets only the old,
    # deprecated name keeps the resolved new one, False: use the name the installed version reads
    from transformers import TrainingArguments

    fields = {field.name for field in dataclasses.fields(TrainingArguments)}
    name = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    return {name: True, f"{name}_kwargs": {"use_reentrant": False}}


def _optim(config: TunedConfig) -> dict[str, Any]:
    choice = knobs(config)["optimizer"]
    if choice == "fused":
        return {"optim": "adamw_torch_fused"}
    if choice == "foreach" and on_cuda(config):
        return {"optim": "adamw_torch"}
    return {}


def _training_arguments(config: TunedConfig, world_size: int) -> dict[str, Any]:
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
    }


def _warn_of_setup(config: TunedConfig) -> None:
    needed = setup_code(config)
    if needed:
        warnings.warn(
            f"the Trainer's arguments have no place for part of this config; run: {'; '.join(needed)}", stacklevel=3
        )


def training_arguments(config: TunedConfig, world_size: int = 1) -> dict[str, Any]:
    """`TrainingArguments` keyword arguments for the tuned knobs, for a run in `world_size` processes.
    Warns when the config needs `setup_code` too."""
    _warn_of_setup(config)
    return _training_arguments(config, world_size)


def apply(args: TrainingArguments, config: TunedConfig) -> TrainingArguments:
    """A copy of `args` with the tuned knobs; the accumulation is divided by `args.world_size`
    (the processes the launcher started) so the global batch is the study's. Warns when the config
    needs `setup_code` too."""
    _warn_of_setup(config)
    return dataclasses.replace(args, **_training_arguments(config, world_size=args.world_size))


def setup_code(config: TunedConfig) -> list[str]:
    """Lines of Python for what `TrainingArguments` cannot hold, to run on your `model` before
    `Trainer(model=model, args=args, ...)`: cuDNN's benchmark mode, the SDPA kernel, channels_last,
    the attention implementation (its `sdpa` one for an SDPA kernel, as the study switched it), and,
    off a GPU, an AdamW with foreach=True for the Trainer."""
    params = knobs(config)
    lines = common_setup(params, held=(PRECISION.name,))
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


def snippet(config: TunedConfig) -> str:
    """Python code building `TrainingArguments` with the tuned knobs, and the setup lines for the rest."""
    setup = setup_code(config)
    lines = [
        *header(config, "hf-trainer"),
        "# autotuner.integrations.transformers.apply(args, config) divides it by args.world_size.",
        *(["import torch"] if setup else []),
        "from transformers import TrainingArguments",
        "",
        *assignment("tuned", _training_arguments(config, 1)),
        'args = TrainingArguments(output_dir="trainer-output", **tuned)  # your own arguments beside them',
        *([SETUP_COMMENT, *setup] if setup else []),
    ]
    return "\n".join(lines) + "\n"
