"""The tuned config as Hugging Face `Trainer` arguments (`transformers.TrainingArguments`).

Every knob has an argument: precision -> `bf16`/`fp16`/`tf32` (`tf32=False` for the other
precisions, the strict fp32 matmuls the study ran them with), batch_size ->
`per_device_train_batch_size`, accumulation -> `gradient_accumulation_steps` (divided by the
world size, to keep the global batch), workers -> `dataloader_num_workers` and
`dataloader_persistent_workers`, pinned memory where the study pinned it, compile ->
`torch_compile`/`torch_compile_mode`; a config tuned on a CPU gets `use_cpu=True`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from autotuner.integrations import accumulation_per_process, assignment, header, knobs, loader_arguments

if TYPE_CHECKING:
    from transformers import TrainingArguments

    from autotuner.apply import TunedConfig


def training_arguments(config: TunedConfig, world_size: int = 1) -> dict[str, Any]:
    """`TrainingArguments` keyword arguments for the tuned knobs, for a run in `world_size` processes."""
    params = knobs(config)
    loader = loader_arguments(config)
    precision, mode = params["precision"], params["compile"]
    return {
        "bf16": precision == "bf16",
        "fp16": precision == "fp16",
        "tf32": precision == "tf32",
        "per_device_train_batch_size": params["batch_size"],
        "gradient_accumulation_steps": accumulation_per_process(config, world_size),
        "dataloader_num_workers": loader["num_workers"],
        "dataloader_pin_memory": loader["pin_memory"],
        "dataloader_persistent_workers": loader["persistent_workers"],
        "torch_compile": mode != "none",
        **({"torch_compile_mode": mode} if mode != "none" else {}),
        # tuned on a CPU: train there (TrainingArguments refuses bf16 without a GPU otherwise)
        **({"use_cpu": True} if str(config.environment.get("device", "")).startswith("cpu") else {}),
    }


def apply(args: TrainingArguments, config: TunedConfig) -> TrainingArguments:
    """A copy of `args` with the tuned knobs; the accumulation is divided by `args.world_size`
    (the processes the launcher started) so the global batch is the study's."""
    return dataclasses.replace(args, **training_arguments(config, world_size=args.world_size))


def snippet(config: TunedConfig) -> str:
    """Python code building `TrainingArguments` with the tuned knobs."""
    lines = [
        *header(config, "hf-trainer"),
        "# autotuner.integrations.transformers.apply(args, config) divides it by args.world_size.",
        "from transformers import TrainingArguments",
        "",
        *assignment("tuned", training_arguments(config)),
        'args = TrainingArguments(output_dir="trainer-output", **tuned)  # your own arguments beside them',
    ]
    return "\n".join(lines) + "\n"
