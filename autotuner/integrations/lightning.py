"""The tuned config as Lightning `Trainer` and `DataLoader` arguments.

precision -> `precision` (`bf16-mixed`, `16-mixed`, `32-true`), accumulation ->
`accumulate_grad_batches` (divided by the world size, to keep the global batch), batch_size and
workers -> the `DataLoader` the user passes to `fit`. Lightning's Trainer takes neither TF32 nor
torch.compile: `setup_code` says what to run instead (TF32 flags before `fit`, and
`torch.compile(model, mode=...)` on the LightningModule before `fit`), and `trainer_arguments`
warns when there is such a line.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from autotuner.integrations import TF32_CODE, accumulation_per_process, assignment, header, knobs, loader_arguments

if TYPE_CHECKING:
    from autotuner.apply import TunedConfig

PRECISIONS = {"fp32": "32-true", "tf32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}


def _trainer_arguments(config: TunedConfig, world_size: int) -> dict[str, Any]:
    return {
        "precision": PRECISIONS[knobs(config)["precision"]],
        "accumulate_grad_batches": accumulation_per_process(config, world_size),
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
    """`torch.utils.data.DataLoader` keyword arguments: the micro-batch, workers, pinned memory."""
    return loader_arguments(config)


def setup_code(config: TunedConfig) -> list[str]:
    """Lines of Python for what the Trainer's arguments cannot hold: TF32, torch.compile's mode."""
    params = knobs(config)
    lines = list(TF32_CODE) if params["precision"] == "tf32" else []
    if params["compile"] != "none":
        lines.append(f'model = torch.compile(model, mode="{params["compile"]}")  # the LightningModule, before fit')
    return lines


def snippet(config: TunedConfig) -> str:
    """Python code building the Trainer and the DataLoader with the tuned knobs."""
    setup = setup_code(config)
    lines = [
        *header(config, "lightning"),
        *(["import torch"] if setup else []),
        "from lightning import Trainer",
        "from torch.utils.data import DataLoader",
        "",
        *assignment("trainer_arguments", _trainer_arguments(config, 1)),
        *assignment("loader_arguments", dataloader_arguments(config)),
        *setup,
        "trainer = Trainer(**trainer_arguments)  # your own arguments beside them",
        "loader = DataLoader(dataset, shuffle=True, **loader_arguments)  # your dataset",
        "trainer.fit(model, loader)  # your LightningModule",
    ]
    return "\n".join(lines) + "\n"
