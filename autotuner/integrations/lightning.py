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
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from autotuner.backends.pytorch import COMPILE
from autotuner.config.knobs import PRECISION
from autotuner.integrations import (
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

PRECISIONS = {"fp32": "32-true", "tf32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}


def _trainer_arguments(config: TunedConfig, world_size: int) -> dict[str, Any]:
    params = knobs(config)
    return {
        "precision": PRECISIONS[params[PRECISION.name]],
        "accumulate_grad_batches": accumulation_per_process(config, world_size),
        **({"benchmark": True} if params["cudnn_benchmark"] else {}),  # torch.backends.cudnn.benchmark
    }


def trainer_arguments(config: TunedConfig, world_size: int = 1) -> dict[str, Any]:
    """`lightning.Trainer` keyword arguments for the tuned knobs, for `world_size` processes
    (devices x nodes). Warns when the config needs `setup_code` too."""
    needed = setup_code(config)
    if needed:
        warnings.warn(
            f"Lightning's Trainer has no argument for part of this config; run: {'; '.join(needed)}", stacklevel=2
        )
    return _trainer_arguments(config, world_size)


def dataloader_arguments(config: TunedConfig) -> dict[str, Any]:
    """`torch.utils.data.DataLoader` keyword arguments: the micro-batch, workers, pinned memory, prefetch."""
    return loader_arguments(config)


def setup_code(config: TunedConfig) -> list[str]:
    """Lines of Python for what the Trainer's arguments cannot hold, to run on the LightningModule
    (`model`) before `fit`: TF32, the SDPA kernel, channels_last, activation checkpointing, eager
    attention, torch.compile's mode, and a comment for the optimizer flag."""
    params = knobs(config)
    lines = [*common_setup(params, held=("cudnn_benchmark",)), *model_setup(params)]
    if params[COMPILE.name] != "none":
        lines.append(f'model = torch.compile(model, mode="{params[COMPILE.name]}")  # the LightningModule, before fit')
    if params["optimizer"] != "as-given":
        flag = params["optimizer"]
        lines.append(f"# optimizer={flag}: build the optimizer in configure_optimizers with {flag}=True")
    return imports_first(lines)


def snippet(config: TunedConfig) -> str:
    """Python code building the Trainer and the DataLoader with the tuned knobs."""
    setup = setup_code(config)
    ours, code = split_imports(setup)
    lines = [
        *header(config, "lightning"),
        *(["import torch"] if setup else []),
        "from lightning import Trainer",
        "from torch.utils.data import DataLoader",
        *ours,
        "",
        *assignment("trainer_arguments", _trainer_arguments(config, 1)),
        *assignment("loader_arguments", dataloader_arguments(config)),
        *code,
        "trainer = Trainer(**trainer_arguments)  # your own arguments beside them",
        "loader = DataLoader(dataset, shuffle=True, **loader_arguments)  # your dataset",
        "trainer.fit(model, loader)  # your LightningModule",
    ]
    return "\n".join(lines) + "\n"
