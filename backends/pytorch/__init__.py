"""The PyTorch backend, engine side: its knob table, built-in workloads and presets.

The trial-process half is `autotuner.backends.pytorch.runner`; user workloads return a
`autotuner.backends.pytorch.workload.TorchWorkload`. The knobs and their rules are one family a
module in `autotuner.backends.pytorch.knobs`, decided from the probe's capabilities, the
device's and the workload's (`TorchCapabilities`): a value that cannot matter anywhere in the
space (pinned memory without a GPU, channels_last for a model without convolutions) is dropped
from the space before the first trial (`Backend.irrelevant`); one that cannot run with the rest
of its config (flash attention in fp32 on a GPU, a prefetch depth without loader workers) is
recorded as unsupported (`Backend.unsupported_reason`).
"""

from __future__ import annotations

from autotuner.backends._base import Backend
from autotuner.backends.pytorch.capabilities import TorchCapabilities
from autotuner.backends.pytorch.knobs import PARALLEL as PARALLEL_KNOBS
from autotuner.backends.pytorch.knobs import TRAINING, TRAINING_KNOBS
from autotuner.backends.pytorch.knobs.attention import ATTENTION, HALF_PRECISION_ONLY, SDPA_BACKENDS
from autotuner.backends.pytorch.knobs.checkpointing import CHECKPOINTING
from autotuner.backends.pytorch.knobs.compile import COMPILE
from autotuner.backends.pytorch.knobs.compile import TIMEOUT_FACTOR as COMPILE_TIMEOUT_FACTOR
from autotuner.backends.pytorch.knobs.cudnn import CUDNN_BENCHMARK
from autotuner.backends.pytorch.knobs.ddp import BUCKET_CAP_MB, BUCKET_VIEW, COMM_HOOK, DDP_KNOBS, STATIC_GRAPH
from autotuner.backends.pytorch.knobs.fsdp import FSDP_KNOBS, OFFLOAD, PARAM_DTYPE, REDUCE_DTYPE, RESHARD_AFTER_FORWARD
from autotuner.backends.pytorch.knobs.loader import PIN_MEMORY, PREFETCH_FACTOR
from autotuner.backends.pytorch.knobs.memory_format import MEMORY_FORMAT
from autotuner.backends.pytorch.knobs.optimizer import OPTIMIZER
from autotuner.config.knobs import Config, Knob, knob_table
from autotuner.trials.nodes import NodeStore, split_endpoint

PYTORCH_KNOBS = TRAINING_KNOBS


class PyTorchBackend(Backend):
    name = "pytorch"
    runner = "autotuner.backends.pytorch.runner"
    knobs = knob_table(*PYTORCH_KNOBS)
    capabilities_type = TorchCapabilities
    families = TRAINING
    parallel = ("ddp", "fsdp")
    nodes = True
    builtin_workloads = {
        "mlp": "autotuner.backends.pytorch.builtin:mlp",
        "cnn": "autotuner.backends.pytorch.builtin:cnn",
        "gpt": "autotuner.backends.pytorch.builtin:gpt",
        "resnet": "autotuner.backends.pytorch.builtin:resnet",
    }
    default_space = "pytorch"
    requires = ("torch",)
    install = "pip install torch"
    formats = "autotuner.backends.pytorch.integrations"

    def default_preset(self, parallel: str | None) -> str:
        return f"pytorch-{parallel}" if parallel else self.default_space

    def node_store(self, endpoint: str, *, host: bool, timeout_s: float) -> NodeStore:
        """`torch.distributed`'s `TCPStore` at `endpoint`: the one the trials' `c10d` rendezvous and
        process groups use (`autotuner.backends.pytorch.nodes`)."""
        import datetime

        import torch.distributed as dist

        name, port = split_endpoint(endpoint)
        timeout = datetime.timedelta(seconds=timeout_s)
        return dist.TCPStore(name, port, is_master=host, wait_for_workers=False, timeout=timeout)

    def job_knobs(self, parallel: str | None) -> dict[str, Knob]:
        others = {k.name for mode, knobs in PARALLEL_KNOBS.items() if mode != parallel for k in knobs}
        return {name: knob for name, knob in self.knobs.items() if name not in others}

    def timeout_factor(self, config: Config) -> float:
        return COMPILE_TIMEOUT_FACTOR[config.get(COMPILE.name, "none")]


PYTORCH = PyTorchBackend()

__all__ = [
    "ATTENTION",
    "BUCKET_CAP_MB",
    "BUCKET_VIEW",
    "CHECKPOINTING",
    "COMM_HOOK",
    "COMPILE",
    "COMPILE_TIMEOUT_FACTOR",
    "CUDNN_BENCHMARK",
    "DDP_KNOBS",
    "FSDP_KNOBS",
    "HALF_PRECISION_ONLY",
    "MEMORY_FORMAT",
    "OFFLOAD",
    "OPTIMIZER",
    "PARALLEL_KNOBS",
    "PARAM_DTYPE",
    "PIN_MEMORY",
    "PREFETCH_FACTOR",
    "PYTORCH",
    "PYTORCH_KNOBS",
    "PyTorchBackend",
    "REDUCE_DTYPE",
    "RESHARD_AFTER_FORWARD",
    "SDPA_BACKENDS",
    "STATIC_GRAPH",
    "TorchCapabilities",
]
