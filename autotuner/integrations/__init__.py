"""Exports of a tuned config to the trainers people already train with: the Hugging Face
`Trainer` (`transformers`), Lightning and Accelerate.

Each module maps the tuned knobs onto that trainer's own arguments and writes them as Python code
to paste (`snippet`, what `autotuner export --format` prints). What a trainer's arguments cannot
hold (TF32 outside the Hugging Face Trainer, torch.compile in Lightning) is a line of code in the
module's `setup_code`, which its argument functions warn about: no knob is dropped silently.

The global batch the study kept is `batch_size x accumulation` in one process. A trainer run in
`world_size` processes (torchrun, `accelerate launch`, DDP) gets `accumulation / world_size`
micro-steps per optimizer step, so `batch_size x accumulation' x world_size` is the same global
batch; an accumulation that `world_size` does not divide is refused.

Importing this package imports no trainer: a format's library is imported when it is asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotuner.errors import SpecError

if TYPE_CHECKING:
    from autotuner.apply import TunedConfig


@dataclass(frozen=True)
class Format:
    module: str
    """The module of `autotuner.integrations` that writes it."""
    library: str
    """The import name of the trainer's library."""
    extra: str
    """The autotuner extra that installs it."""


FORMATS = {
    "hf-trainer": Format("autotuner.integrations.transformers", "transformers", "hf"),
    "lightning": Format("autotuner.integrations.lightning", "lightning", "lightning"),
    "accelerate": Format("autotuner.integrations.accelerate", "accelerate", "accelerate"),
}
"""`autotuner export --format` name -> what writes it."""


class Code(str):
    """A value written into a snippet as the code it holds, not as its repr."""


def require(fmt: str) -> None:
    """Refuse, in one line saying what to install, a format whose library is not importable."""
    wanted = FORMATS[fmt]
    try:
        importlib.import_module(wanted.library)
    except ImportError:
        raise SpecError(
            f"{wanted.library} is not installed: pip install 'autotuner[{wanted.extra}]'", key=f"--format {fmt}"
        ) from None


def snippet(fmt: str, config: TunedConfig) -> str:
    """The Python code of format `fmt` for `config` (its library must be installed)."""
    require(fmt)
    module = importlib.import_module(FORMATS[fmt].module)
    text: str = module.snippet(config)
    return text


# ------------------------------------------------------------------ shared by the formats


def knobs(config: TunedConfig) -> dict[str, Any]:
    """The tuned knob values; these trainers are PyTorch's, so a config of another backend is refused."""
    if config.backend != "pytorch":
        raise SpecError(
            f"it was tuned with the {config.backend} backend; trainer exports are for PyTorch configs",
            source=config.source,
        )
    return dict(config.params)


def accumulation_per_process(config: TunedConfig, world_size: int) -> int:
    """The micro-steps per optimizer step that keep the study's global batch over `world_size` processes."""
    params = config.params
    if world_size < 1 or params["accumulation"] % world_size:
        raise SpecError(
            f"the global batch {params['batch_size'] * params['accumulation']} "
            f"({params['batch_size']} x {params['accumulation']}) cannot be kept over {world_size} processes: "
            f"the accumulation {params['accumulation']} is not a multiple of {world_size}",
            source=config.source,
        )
    return int(params["accumulation"]) // world_size


def pin_memory(config: TunedConfig) -> bool:
    """Pinned loader memory where the study pinned it: on a CUDA device (on a CPU it does nothing)."""
    return str(config.environment.get("device", "")).startswith("cuda")


def loader_arguments(config: TunedConfig) -> dict[str, Any]:
    """`torch.utils.data.DataLoader` keyword arguments for the tuned micro-batch and workers."""
    params = knobs(config)
    return {
        "batch_size": params["batch_size"],
        "num_workers": params["workers"],
        "pin_memory": pin_memory(config),
        "persistent_workers": params["workers"] > 0,  # DataLoader refuses it without workers
    }


TF32_CODE = (
    'torch.set_float32_matmul_precision("high")  # precision=tf32: TF32 matmuls',
    "torch.backends.cudnn.allow_tf32 = True  # and TF32 convolutions",
)
"""What TF32 is in PyTorch (process-wide flags), for trainers without a TF32 argument."""


def header(config: TunedConfig, fmt: str) -> list[str]:
    """The comment lines a snippet starts with: where the config comes from and the batch rule."""
    params = config.params
    global_batch = params["batch_size"] * params["accumulation"]
    speedup = f", {config.speedup:.2f}x the baseline" if config.speedup else ""
    return [
        f"# autotuner export --format {fmt}: {config}{speedup}",
        f"# Global batch {global_batch} = {params['batch_size']} per micro-batch x {params['accumulation']} "
        "accumulation, in one process;",
        "# in N processes (torchrun, accelerate launch) divide the accumulation by N to keep it.",
    ]


def assignment(name: str, values: Mapping[str, Any]) -> list[str]:
    """`name = {...}`, one key a line: a dict literal the user can read and edit."""
    lines = [f"{name} = {{"]
    lines += [f"    {key!r}: {value if isinstance(value, Code) else repr(value)}," for key, value in values.items()]
    return [*lines, "}"]
