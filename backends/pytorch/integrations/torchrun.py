"""The tuned config as a training script of your own, launched as the study ran it: the launch line
(`torchrun --standalone --nproc-per-node N`, or `python` for a config tuned as one process) and the
`TunedTraining` loop of `autotuner.backends.pytorch.apply`.

Nothing is mapped here: `TunedTraining` reads the export (`load_config`) and applies every knob
itself, as in the trials, the way the ranks train together included: with `parallel: ddp` it wraps
the model in `DistributedDataParallel` (bucket size, bucket views, static graph, communication
hook), with `parallel: fsdp` it shards it with FSDP2's `fully_shard` (resharding, mixed-precision
policy, offload), once `torch.distributed.init_process_group` has run in each process. After the
last step, `tuned.finish()` ends the ranks' training (a barrier; DDP's wrapper let go of) before
`destroy_process_group()`, so that a rank on the CPU does not abort at exit (see its docstring).
The code says which knobs it applies, so the snippet shows them as the other formats do. It needs
no other library than torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotuner.backends.pytorch.integrations import header, knobs, launch_line, on_cuda, parallel_knobs

if TYPE_CHECKING:
    from autotuner.export.reader import TunedConfig

EXPORT_SUFFIXES = (".yaml", ".yml", ".json")
WRAPPERS = {
    "ddp": "wraps the model in DistributedDataParallel",
    "fsdp": "shards each block the model repeats, then the whole model, with FSDP2's fully_shard",
}
LOOP = (
    "    for inputs, target in tuned.loader:  # micro-batches of the tuned size, with the tuned workers",
    "        inputs, target = tuned.to_device((inputs, target))",
    "        with tuned.autocast():  # the tuned precision",
    "            loss = loss_fn(tuned.model(inputs), target)  # your loss",
    "        tuned.backward(loss)",
    "        tuned.step()  # True when it took an optimizer step",
)
"""`TunedTraining`'s loop over an epoch (see its module's docstring), inside `for epoch in range(epochs)`."""


def export_path(config: TunedConfig) -> str:
    """Where the script loads the export from: the file `config` was read from, or for a config read
    from the study's storage (`autotuner export`), where `autotuner search` wrote it,
    `runs/<name>/best.yaml`."""
    if config.source.endswith(EXPORT_SUFFIXES):
        return config.source
    from autotuner.spec.job import output_dir

    return (output_dir(str(config.study["name"])) / "best.yaml").as_posix()


def snippet(config: TunedConfig, path: str | None = None) -> str:
    """A training script applying `config` with `TunedTraining`, loaded from `path` (default:
    `export_path`): for a config tuned as N ranks, one process of N started by torchrun, which
    joins the process group (NCCL on a GPU, gloo on a CPU) and trains on its GPU, `cuda:LOCAL_RANK`."""
    knobs(config)  # a PyTorch config, or refused
    parallel = config.parallel
    launch = launch_line(config)
    loading = f"config = load_config({path or export_path(config)!r})  # autotuner search writes it"
    if parallel is None:
        lines = [
            *header(config, "torchrun"),
            f"# launch: {launch} (one process)",
            "from autotuner.apply import load_config",
            "from autotuner.backends.pytorch.apply import TunedTraining",
            "",
            loading,
            "tuned = TunedTraining(config, model, optimizer, dataset)  # your model, optimizer and dataset",
            "for epoch in range(epochs):",
            *LOOP,
        ]
        return "\n".join(lines) + "\n"
    applied = ", ".join(f"{name}={value}" for name, value in parallel_knobs(config).items())
    cuda = on_cuda(config)
    lines = [
        *header(config, "torchrun", launch),
        f"# TunedTraining applies every knob; parallel={parallel}: it {WRAPPERS[parallel]} ({applied}).",
        *(["import os", ""] if cuda else []),
        *(["import torch"] if cuda else []),
        "import torch.distributed as dist",
        "",
        "from autotuner.apply import load_config",
        "from autotuner.backends.pytorch.apply import TunedTraining",
        "",
    ]
    if cuda:
        lines += [
            'local_rank = int(os.environ["LOCAL_RANK"])  # torchrun starts one process a GPU',
            "torch.cuda.set_device(local_rank)",
            'dist.init_process_group("nccl")',
            loading,
        ]
    else:
        lines += ['dist.init_process_group("gloo")  # tuned on a CPU', loading]
    device = 'f"cuda:{local_rank}"' if cuda else '"cpu"'
    lines += [
        f"tuned = TunedTraining(config, model, optimizer, dataset, device={device})  # your model, optimizer, dataset",
        "for epoch in range(epochs):",
        f"    tuned.loader.sampler.set_epoch(epoch)  # this rank's 1/{config.world} of the dataset, reshuffled",
        *LOOP,
        "tuned.finish()  # every rank done; lets go of what would keep the process group alive",
        "dist.destroy_process_group()",
    ]
    return "\n".join(lines) + "\n"
