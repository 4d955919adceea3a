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
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from autotuner.backends.pytorch import COMPILE
from autotuner.config.knobs import PRECISION
from autotuner.integrations import (
    TUNED_IMPORT,
    Code,
    accumulation_per_process,
    assignment,
    common_setup,
    header,
    imports_first,
    knobs,
    loader_arguments,
    model_setup,
    split_imports,
)

if TYPE_CHECKING:
    from autotuner.export.reader import TunedConfig

MIXED_PRECISION = {"fp32": "no", "tf32": "no", "bf16": "bf16", "fp16": "fp16"}


def _arguments(config: TunedConfig, world_size: int) -> dict[str, Any]:
    params = knobs(config)
    return {
        "mixed_precision": MIXED_PRECISION[params[PRECISION.name]],
        "gradient_accumulation_steps": accumulation_per_process(config, world_size),
    }


def accelerator_arguments(config: TunedConfig, world_size: int = 1) -> dict[str, Any]:
    """`Accelerator` keyword arguments for the tuned knobs, for `world_size` processes; with a
    compile mode, `dynamo_plugin` is a `TorchDynamoPlugin`. Warns when `setup_code` is needed too."""
    needed = setup_code(config)
    if needed:
        warnings.warn(
            f"the Accelerator has no argument for part of this config; run: {'; '.join(needed)}", stacklevel=2
        )
    arguments = _arguments(config, world_size)
    mode = knobs(config)[COMPILE.name]
    if mode != "none":
        from accelerate.utils import TorchDynamoPlugin

        arguments["dynamo_plugin"] = TorchDynamoPlugin(backend="inductor", mode=mode)
    return arguments


def dataloader_arguments(config: TunedConfig) -> dict[str, Any]:
    """`torch.utils.data.DataLoader` keyword arguments for the loader given to `prepare`."""
    return loader_arguments(config)


def setup_code(config: TunedConfig) -> list[str]:
    """Lines of Python for what the Accelerator's arguments cannot hold, to run on your `model` and
    `optimizer` before `prepare`: TF32, cuDNN's benchmark mode, the SDPA kernel, channels_last,
    activation checkpointing, eager attention, and the optimizer rebuilt with foreach=True or
    fused=True (`rebuilt_optimizer`, as `TunedTraining` rebuilds it: same class, parameter groups and
    hyperparameters)."""
    params = knobs(config)
    lines = [*common_setup(params), *model_setup(params)]
    if params["optimizer"] != "as-given":
        lines += [
            f"{TUNED_IMPORT}rebuilt_optimizer",
            f'optimizer = rebuilt_optimizer(optimizer, "{params["optimizer"]}")  # optimizer={params["optimizer"]}',
        ]
    return imports_first(lines)


def snippet(config: TunedConfig) -> str:
    """Python code building the Accelerator and the DataLoader with the tuned knobs."""
    arguments: dict[str, Any] = _arguments(config, 1)
    mode = knobs(config)[COMPILE.name]
    if mode != "none":
        arguments["dynamo_plugin"] = Code(f'TorchDynamoPlugin(backend="inductor", mode="{mode}")')
    setup = setup_code(config)
    ours, code = split_imports(setup)
    lines = [
        *header(config, "accelerate"),
        *(["import torch"] if setup else []),
        "from accelerate import Accelerator",
        *(["from accelerate.utils import TorchDynamoPlugin"] if mode != "none" else []),
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
