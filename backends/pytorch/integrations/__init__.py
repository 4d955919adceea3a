"""Exports of a tuned config to the trainers people already train with: the Hugging Face
`Trainer` (`transformers`), Lightning and Accelerate; and to `torchrun` with `TunedTraining`.

Each module maps the tuned knobs onto that trainer's own arguments and writes them as Python code
to paste (`snippet`, what `autotuner export --format` prints). What a trainer's arguments cannot
hold (TF32 outside the Hugging Face Trainer, torch.compile in Lightning, channels_last, the
attention kernel, cuDNN's benchmark mode, ...) is a line of code in the module's `setup_code`,
which its argument functions warn about: no knob is dropped silently. A knob at its reference
value (the value a config exported before the knob existed gets) adds nothing, so such a config
exports as it did then; the knobs of a config tuned as several ranks are the exception, written
whatever their values, since a trainer's own DDP and FSDP defaults are not always the study's.

The global batch the study kept is `batch_size x accumulation x processes` (`processes`: the ranks
a trial ran as, 1 for one process; with several, the accumulation is each rank's). A trainer run in
`world_size` processes (torchrun, `accelerate launch`, DDP) gets `accumulation x processes /
world_size` micro-steps per optimizer step, so `batch_size x accumulation' x world_size` is the same
global batch: the config's own accumulation on as many processes as it was tuned on. One that
`world_size` does not divide is refused. The snippets are for the processes the config was tuned
as, and say how they are launched. A config tuned as several ranks carries how they train
together (`parallel`: DDP or FSDP2) and its knobs (`DDP_KNOBS`, `FSDP_KNOBS`): every format maps
them onto its trainer's own DDP and FSDP settings, with code or a comment for what they cannot
hold, as for the other knobs.

Importing this package imports no trainer: a format's library is imported when it is asked for.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from autotuner.backends._formats import ExportFormat
from autotuner.backends.pytorch import PREFETCH_FACTOR
from autotuner.config.knobs import ACCUMULATION, BATCH_SIZE, PRECISION, WORKERS, Config
from autotuner.errors import SpecError
from autotuner.measurement.allocator import assignments
from autotuner.output.formatting import times

if TYPE_CHECKING:
    from pathlib import Path

    from autotuner.export.reader import TunedConfig
    from autotuner.spec.job import Job


FORMATS = {
    fmt.name: fmt
    for fmt in (
        ExportFormat("hf-trainer", f"{__name__}.transformers", "transformers", "hf", "the Hugging Face Trainer's"),
        ExportFormat("lightning", f"{__name__}.lightning", "lightning", "lightning", "Lightning's"),
        ExportFormat("accelerate", f"{__name__}.accelerate", "accelerate", "accelerate", "Accelerate's"),
        ExportFormat("torchrun", f"{__name__}.torchrun", "torch", None, "a torchrun script's"),
        ExportFormat(
            "onnx",
            f"{__name__}.onnx",
            "onnx",
            "inference",
            "an inference winner on ONNX Runtime as its model and session settings",
            files=True,
        ),
    )
}
"""`autotuner export --format` name -> the module of this package that writes it: a trainer's
arguments as Python (their `what` is the trainer's), or files (`ExportFormat.files`). The PyTorch
backend names this table (`Backend.formats`), from which the command's choices and help come."""
TRAINERS = tuple(name for name, fmt in FORMATS.items() if not fmt.files)
"""The formats that write a trainer's arguments as Python."""


class Code(str):
    """A value written into a snippet as the code it holds, not as its repr."""


def require(fmt: str) -> None:
    """Refuse, in one line saying what to install, format `fmt` when its library is not installed."""
    FORMATS[fmt].require()


def snippet(fmt: str, config: TunedConfig) -> str:
    """The Python code of trainer format `fmt` for `config` (its library must be installed)."""
    return FORMATS[fmt].snippet(config)


def write(fmt: str, config: TunedConfig, job: Job, path: Path) -> list[Path]:
    """The files of format `fmt` (`ExportFormat.files`) for `config`, a config of `job`, written at
    `path` (and beside it); their paths."""
    return FORMATS[fmt].write(config, job, path)


# ------------------------------------------------------------------ shared by the formats


def knobs(config: TunedConfig) -> Config:
    """The tuned knob values; these trainers are PyTorch's, so a config of another backend is refused."""
    if config.backend != "pytorch":
        raise SpecError(
            f"it was tuned with the {config.backend} backend; trainer exports are for PyTorch configs",
            source=config.source,
        )
    return dict(config.params)


def accumulation_per_process(config: TunedConfig, world_size: int | None = None) -> int:
    """The micro-steps per optimizer step that keep the study's global batch over `world_size`
    processes (None: the processes the config was tuned as, whose accumulation it is)."""
    params = config.params
    world_size = config.world if world_size is None else world_size
    micro_steps = int(params[ACCUMULATION.name]) * config.world  # micro-batches per optimizer step, all ranks
    if world_size < 1 or micro_steps % world_size:
        of = f"{params['accumulation']} x {config.world}" if config.world > 1 else str(params["accumulation"])
        raise SpecError(
            f"the global batch {params['batch_size'] * micro_steps} "
            f"({params['batch_size']} x {of}) cannot be kept over {world_size} processes: "
            f"the accumulation {of} is not a multiple of {world_size}",
            source=config.source,
        )
    return micro_steps // world_size


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


def common_setup(params: Mapping[str, object], *, held: Collection[str] = ()) -> list[str]:
    """The setup lines of every format for the knobs its arguments do not hold (`held` names those
    they do): TF32 (process-wide flags), then each knob family's own lines
    (`autotuner.backends.pytorch.knobs._family.TorchFamily.setup`: cuDNN's benchmark mode, the
    model's channels_last layout, the SDPA kernel, torch.compile's memory budget, ...) in the order
    `TunedTraining` applies them."""
    from autotuner.backends.pytorch.knobs import APPLY

    lines = list(TF32_CODE) if params[PRECISION.name] == "tf32" and PRECISION.name not in held else []
    for family in APPLY:
        if not any(knob.name in held for knob in family.knobs):
            lines += family.setup(params)
    return lines


def model_setup(params: Mapping[str, object]) -> list[str]:
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


def header(config: TunedConfig, fmt: str, launch: str = "") -> list[str]:
    """The comment lines a snippet starts with: where the config comes from and the batch rule;
    for a config tuned as several processes, how they are launched (`launch`)."""
    params = config.params
    processes = config.world
    batch, accumulation = params[BATCH_SIZE.name], params[ACCUMULATION.name]
    speedup = f", {times(config.speedup)} the baseline" if config.speedup else ""
    first = f"# autotuner export --format {fmt}: {config}{speedup}"
    if processes == 1:
        lines = [
            first,
            f"# Global batch {batch * accumulation} = {batch} per micro-batch x {accumulation} "
            "accumulation, in one process;",
            "# in N processes (torchrun, accelerate launch) divide the accumulation by N to keep it.",
        ]
    else:
        lines = [
            first,
            f"# Global batch {batch * accumulation * processes} = {batch} per micro-batch x {accumulation} "
            f"accumulation x {ranks(config)} (parallel: {config.parallel}), as tuned;",
            f"# launch: {launch}; on N processes instead, accumulation {accumulation * processes} / N keeps it.",
        ]
    return [*lines, ALLOCATOR_LINE, *hybrid_note(config, across=fmt == "torchrun")]


ALLOCATOR_LINE = (
    f"# measured with glibc's allocator keeping freed memory: launch with {assignments()} set "
    "(autotuner.measurement.allocator)"
)
"""The header's last line: the allocator settings the study measured the job with."""


def ranks(config: TunedConfig) -> str:
    """The ranks the config was tuned as, in words: `4 processes`, `2 nodes x 4 processes`."""
    processes = f"{config.processes} process{'es' if config.processes > 1 else ''}"
    return processes if config.nodes == 1 else f"{config.nodes} nodes x {processes}"


def rendezvous(config: TunedConfig) -> str:
    """Node 0's `host:port` for a config tuned across nodes: where the study's nodes met."""
    return config.spec.rendezvous or "NODE0_HOST:29500"


def launch_line(config: TunedConfig) -> str:
    """The shell line starting a script with the processes the config was tuned as (torchrun's;
    across nodes, the line every node runs, meeting at a `c10d` rendezvous as the study's did)."""
    if config.world == 1:
        return "python your_training.py"
    if config.nodes > 1:
        return (
            f"torchrun --nnodes {config.nodes} --nproc-per-node {config.processes} --rdzv-backend c10d "
            f"--rdzv-endpoint {rendezvous(config)} --rdzv-id {config.study['name']} your_training.py (on every node)"
        )
    return f"torchrun --standalone --nproc-per-node {config.processes} your_training.py"


# ------------------------------------------------------------------ how the ranks train together


def parallel_knobs(config: TunedConfig) -> dict[str, Any]:
    """The knobs of the config's `parallel` (DDP's or FSDP2's) with their values; empty for one
    process."""
    from autotuner.backends.pytorch import PARALLEL_KNOBS

    params = knobs(config)
    return {knob.name: params[knob.name] for knob in PARALLEL_KNOBS.get(config.parallel or "", ())}


COMM_HOOKS = {
    "fp16": ("default_hooks", "fp16_compress_hook"),
    "bf16": ("default_hooks", "bf16_compress_hook"),
    "powersgd": ("powerSGD_hook", "powerSGD_hook"),
}
"""`comm_hook` -> the module of `torch.distributed.algorithms.ddp_comm_hooks` and the hook in it
`TunedTraining` registers on its DistributedDataParallel."""
HOOKS_IMPORT = "from torch.distributed.algorithms.ddp_comm_hooks import "
HOOK_TYPES = {"fp16": "FP16", "bf16": "BF16", "powersgd": "POWER_SGD"}
"""`comm_hook` -> the `accelerate.utils.DDPCommunicationHookType` member naming the same hook (the
Hugging Face Trainer's DDP is Accelerate's)."""


def ddp_arguments(values: Mapping[str, object]) -> dict[str, Any]:
    """DistributedDataParallel's own keyword arguments for the DDP knobs of `values`
    (`parallel_knobs`): the names Lightning's `DDPStrategy` and Accelerate's
    `DistributedDataParallelKwargs` pass on to it."""
    return {
        "bucket_cap_mb": values["bucket_cap_mb"],
        "gradient_as_bucket_view": values["bucket_view"],
        "static_graph": values["static_graph"],
    }


def powersgd_options() -> dict[str, int]:
    """`PowerSGDState` keyword arguments as `TunedTraining` builds it (rank 1; error feedback and warm
    start are PowerSGDState's defaults), compressing from `POWERSGD_START` on."""
    from autotuner.backends.pytorch.apply import POWERSGD_START

    return {"matrix_approximation_rank": 1, "start_powerSGD_iter": POWERSGD_START}


def comm_hook(choice: str, *, code: bool) -> object:
    """The DDP communication hook function for `comm_hook` (not `none`): the function, or with
    `code`, its name under `HOOKS_IMPORT`."""
    module, name = COMM_HOOKS[choice]
    if code:
        return Code(f"{module}.{name}")
    from torch.distributed.algorithms import ddp_comm_hooks

    return getattr(getattr(ddp_comm_hooks, module), name)


DTYPE_CODE = {"fp32": "None", "bf16": "torch.bfloat16"}
"""FSDP2's `param_dtype` and `reduce_dtype` values as code (None: the parameters' own dtype, fp32),
as `autotuner.backends.pytorch.apply.DTYPES` holds them."""


def dtype(choice: str, *, code: bool) -> Any:
    """A mixed-precision dtype knob's value (`fp32`, `bf16`) as the dtype FSDP takes, or as code."""
    if code:
        return Code(DTYPE_CODE[choice])
    from autotuner.backends.pytorch.apply import DTYPES

    return DTYPES[choice]


def fsdp_mesh(config: TunedConfig) -> str:
    """The config's `fsdp_mesh` (`flat` for a config not tuned with FSDP2)."""
    return str(parallel_knobs(config).get("fsdp_mesh", "flat"))


def hybrid_import(config: TunedConfig) -> list[str]:
    """The import line of `hybrid_shape` for a snippet whose arguments call it (`fsdp_mesh:
    hybrid`), else none."""
    return [f"{TUNED_IMPORT}hybrid_shape"] if fsdp_mesh(config) == "hybrid" else []


def hybrid_note(config: TunedConfig, *, across: bool) -> list[str]:
    """The header's comment for a config whose hybrid mesh the format builds (`hybrid`, and with
    `across` `hybrid_across`, which `TunedTraining` alone builds): the nodes are counted where the
    ranks run, as `TunedTraining` counts them (`autotuner.backends.pytorch.apply.hybrid_shape`)."""
    layout = fsdp_mesh(config)
    if layout == "flat" or (layout == "hybrid_across" and not across):
        return []
    return [
        f"# fsdp_mesh={layout}: the nodes are counted where the ranks run, from WORLD_SIZE and LOCAL_WORLD_SIZE "
        f"({config.processes} ranks a node as tuned): launch on every node with torchrun --nnodes M "
        f"--nproc-per-node {config.processes}, or a launcher that sets them"
    ]


def hybrid_shape(*, code: bool) -> Any:
    """`fsdp_mesh: hybrid`'s mesh shape, (nodes, ranks per node) = (replicas, shards), counted in
    this process (`autotuner.backends.pytorch.apply.hybrid_shape`), or with `code` its call as code
    (`hybrid_import`)."""
    if code:
        return Code("hybrid_shape()")
    from autotuner.backends.pytorch.apply import hybrid_shape

    return hybrid_shape()


def parallelism_config(*, code: bool) -> Any:
    """Accelerate's `ParallelismConfig` of `fsdp_mesh: hybrid` (the Accelerator's and the Hugging
    Face Trainer's): FSDP2 over its 2-D mesh (`dp_replicate`, `dp_shard`) = (nodes, ranks per
    node), replicas outer as the study's; with `code`, as code."""
    if code:
        return Code("ParallelismConfig(*hybrid_shape())")
    from accelerate.utils import ParallelismConfig

    return ParallelismConfig(*hybrid_shape(code=False))


def across_note(trainer: str) -> str:
    """The setup comment of `fsdp_mesh: hybrid_across` for a `trainer` whose mesh puts a node's
    ranks in one shard group: it cannot shard across the nodes and replicate within one."""
    return (
        f"# fsdp_mesh=hybrid_across: {trainer} shards a node's ranks together; it has no mesh that shards across "
        "nodes and replicates within one (TunedTraining's has): sharded over every rank here"
    )


def call(name: str, arguments: Mapping[str, object]) -> Code:
    """`name(key=value, ...)` as code, each value its repr unless it is `Code`."""
    written = ", ".join(
        f"{key}={value if isinstance(value, Code) else repr(value)}" for key, value in arguments.items()
    )
    return Code(f"{name}({written})")


def assignment(name: str, values: Mapping[str, object]) -> list[str]:
    """`name = {...}`, one key a line: a dict literal the user can read and edit."""
    lines = [f"{name} = {{"]
    lines += [f"    {key!r}: {value if isinstance(value, Code) else repr(value)}," for key, value in values.items()]
    return [*lines, "}"]
