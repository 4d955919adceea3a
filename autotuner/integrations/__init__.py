"""Exports of a tuned config to the trainers people already train with: the Hugging Face
`Trainer` (`transformers`), Lightning and Accelerate.

Each module maps the tuned knobs onto that trainer's own arguments and writes them as Python code
to paste (`snippet`, what `autotuner export --format` prints). What a trainer's arguments cannot
hold (TF32 outside the Hugging Face Trainer, torch.compile in Lightning, channels_last, the
attention kernel, cuDNN's benchmark mode, ...) is a line of code in the module's `setup_code`,
which its argument functions warn about: no knob is dropped silently. A knob at its reference
value (the value a config exported before the knob existed gets) adds nothing, so such a config
exports as it did then.

The global batch the study kept is `batch_size x accumulation` in one process. A trainer run in
`world_size` processes (torchrun, `accelerate launch`, DDP) gets `accumulation / world_size`
micro-steps per optimizer step, so `batch_size x accumulation' x world_size` is the same global
batch; an accumulation that `world_size` does not divide is refused.

Importing this package imports no trainer: a format's library is imported when it is asked for.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotuner.backends.pytorch import PREFETCH_FACTOR
from autotuner.config.knobs import ACCUMULATION, BATCH_SIZE, PRECISION, WORKERS
from autotuner.errors import SpecError
from autotuner.output.formatting import times

if TYPE_CHECKING:
    from autotuner.export.reader import TunedConfig


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
    """Refuse, in one line saying what to install, a format whose library is not installed (found,
    not imported: the snippet is text, and importing lightning takes seconds)."""
    wanted = FORMATS[fmt]
    if importlib.util.find_spec(wanted.library) is None:
        raise SpecError(
            f"{wanted.library} is not installed: pip install 'autotuner[{wanted.extra}]'", key=f"--format {fmt}"
        )


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
    if world_size < 1 or params[ACCUMULATION.name] % world_size:
        raise SpecError(
            f"the global batch {params['batch_size'] * params['accumulation']} "
            f"({params['batch_size']} x {params['accumulation']}) cannot be kept over {world_size} processes: "
            f"the accumulation {params['accumulation']} is not a multiple of {world_size}",
            source=config.source,
        )
    return int(params[ACCUMULATION.name]) // world_size


def on_cuda(config: TunedConfig) -> bool:
    """Whether the config was tuned on a CUDA device."""
    return config.machine.device.startswith("cuda")


def pin_memory(config: TunedConfig) -> bool:
    """Pinned loader memory where the study pinned it: the `pin_memory` knob, on a CUDA device only
    (on a CPU it does nothing; `TunedTraining` pins there neither)."""
    return bool(knobs(config)["pin_memory"]) and on_cuda(config)


def loader_arguments(config: TunedConfig) -> dict[str, Any]:
    """`torch.utils.data.DataLoader` keyword arguments for the tuned micro-batch, workers, pinned
    memory and, with workers, a prefetch depth other than DataLoader's default (the reference, 2)."""
    params = knobs(config)
    workers, prefetch = params[WORKERS.name], params[PREFETCH_FACTOR.name]
    return {
        "batch_size": params[BATCH_SIZE.name],
        "num_workers": workers,
        "pin_memory": pin_memory(config),
        "persistent_workers": workers > 0,  # DataLoader refuses it without workers
        # only workers prefetch: DataLoader refuses a prefetch_factor without them
        **({"prefetch_factor": prefetch} if workers > 0 and prefetch != PREFETCH_FACTOR.reference else {}),
    }


TF32_CODE = (
    'torch.set_float32_matmul_precision("high")  # precision=tf32: TF32 matmuls',
    "torch.backends.cudnn.allow_tf32 = True  # and TF32 convolutions",
)
"""What TF32 is in PyTorch (process-wide flags), for trainers without a TF32 argument."""

CUDNN_BENCHMARK_CODE = "torch.backends.cudnn.benchmark = True  # cudnn_benchmark: cuDNN times its convolutions"
CHANNELS_LAST_CODE = (
    "model = model.to(memory_format=torch.channels_last)  "
    "# memory_format=channels_last; inputs follow at the first conv"
)
"""The model's layout. The study converted 4-D float batches as well (`to_device`); a convolution
with channels_last weights returns channels_last outputs from a contiguous input, so the layout
holds from the first convolution on without touching the user's batches."""
SDPA_FLAGS = {
    "flash": "enable_flash_sdp",
    "efficient": "enable_mem_efficient_sdp",
    "math": "enable_math_sdp",
    "cudnn": "enable_cudnn_sdp",
}
"""`attention` backend -> the `torch.backends.cuda` function that turns its kernel on or off."""


def sdpa_code(attention: str) -> list[str]:
    """Lines leaving `attention` the only scaled-dot-product-attention kernel, for the whole process:
    the flags `torch.nn.attention.sdpa_kernel` with that one backend sets around each of the study's
    forwards (CPU kernels obey them too); nothing for `default` and `eager`."""
    if attention not in SDPA_FLAGS:
        return []
    return [
        f"torch.backends.cuda.{flag}({name == attention})"
        + (f"  # attention={attention}: the only SDPA kernel left on" if name == attention else "")
        for name, flag in SDPA_FLAGS.items()
    ]


TUNED_IMPORT = "from autotuner.backends.pytorch.apply import "
"""How a setup line imports a function `TunedTraining` applies a config with (public API)."""


def imports_first(lines: list[str]) -> list[str]:
    """`lines` with their imports of `TunedTraining`'s functions merged into one line at the top."""
    names = [line.removeprefix(TUNED_IMPORT) for line in lines if line.startswith(TUNED_IMPORT)]
    code = [line for line in lines if not line.startswith(TUNED_IMPORT)]
    return ([TUNED_IMPORT + ", ".join(names)] if names else []) + code


def split_imports(setup: list[str]) -> tuple[list[str], list[str]]:
    """A format's setup lines as the lines of a snippet's import block (the first-party section:
    a blank line, then autotuner's import) and the code."""
    ours = [line for line in setup if line.startswith(TUNED_IMPORT)]
    return (["", *ours] if ours else []), [line for line in setup if line not in ours]


def common_setup(params: Mapping[str, Any], *, held: Collection[str] = ()) -> list[str]:
    """The setup lines of every format for the knobs its arguments do not hold (`held` names those
    they do), in the order `TunedTraining` applies them: TF32, cuDNN's benchmark mode and the SDPA
    kernel (process-wide flags), then the model's channels_last layout."""
    lines = list(TF32_CODE) if params[PRECISION.name] == "tf32" and PRECISION.name not in held else []
    if params["cudnn_benchmark"] and "cudnn_benchmark" not in held:
        lines.append(CUDNN_BENCHMARK_CODE)
    lines += sdpa_code(params["attention"])
    if params["memory_format"] == "channels_last":
        lines.append(CHANNELS_LAST_CODE)
    return lines


def model_setup(params: Mapping[str, Any]) -> list[str]:
    """Lines for a trainer that neither checkpoints activations nor picks a model's attention
    (Lightning, Accelerate). `enable_checkpointing` is `TunedTraining`'s own: a Hugging Face model's
    gradient checkpointing (non-reentrant) where `model` is one, else non-reentrant
    `torch.utils.checkpoint` of the largest block type `model` repeats (inside a LightningModule
    too). Eager attention is a Hugging Face model's, the only kind the study could keep it for."""
    lines = []
    if params["checkpointing"] == "blocks":
        lines += [
            f"{TUNED_IMPORT}enable_checkpointing",
            "enable_checkpointing(model)  # checkpointing=blocks: Hugging Face models' own, or the repeated blocks",
        ]
    if params["attention"] == "eager":
        lines.append('model.set_attn_implementation("eager")  # attention=eager: on your Hugging Face model')
    return lines


def header(config: TunedConfig, fmt: str) -> list[str]:
    """The comment lines a snippet starts with: where the config comes from and the batch rule."""
    params = config.params
    global_batch = params[BATCH_SIZE.name] * params[ACCUMULATION.name]
    speedup = f", {times(config.speedup)} the baseline" if config.speedup else ""
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
