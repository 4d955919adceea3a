"""The PyTorch backend, engine side: knobs, built-in workloads, what a device and a workload can
honour.

The trial-process half is `autotuner.backends.pytorch.runner`; user workloads return a
`autotuner.backends.pytorch.workload.TorchWorkload`. Which knob values can matter is decided here
from the probe's capabilities, the device's and the workload's (`TorchCapabilities`): a value
that cannot matter anywhere in the space (pinned memory without a GPU, channels_last for a
model without convolutions) is dropped from the space before the first trial
(`PyTorchBackend.irrelevant`); one that cannot run with the rest of its config (flash attention
in fp32 on a GPU, a prefetch depth without loader workers) is recorded as unsupported.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotuner.backends._base import Backend, Capabilities, capability
from autotuner.config.knobs import COMMON_KNOBS, PRECISION, WORKERS, Config, Knob, knob_table

COMPILE = Knob(
    "compile",
    "torch.compile mode",
    ("none", "default", "reduce-overhead", "max-autotune"),
    "none",
    recommended=("default", "max-autotune", "reduce-overhead"),
)
MEMORY_FORMAT = Knob(
    "memory_format",
    "tensor layout of the model's convolutions and its 4-D inputs: contiguous (NCHW) or channels_last (NHWC)",
    ("contiguous", "channels_last"),
    "contiguous",
    quiet=True,
)
OPTIMIZER = Knob(
    "optimizer",
    "the workload's optimizer as given, or rebuilt with foreach=True (multi-tensor) or fused=True (one kernel)",
    ("as-given", "foreach", "fused"),
    "as-given",
    recommended=("fused",),
    quiet=True,
)
CHECKPOINTING = Knob(
    "checkpointing",
    "activation checkpointing of the model's repeated blocks: recompute their activations in the backward",
    ("none", "blocks"),
    "none",
    memory_order=("blocks", "none"),
    quiet=True,
)
ATTENTION = Knob(
    "attention",
    "the scaled-dot-product-attention backend (default: PyTorch's choice), or eager attention (Hugging Face models)",
    ("default", "flash", "efficient", "cudnn", "math", "eager"),
    "default",
    quiet=True,
)
PIN_MEMORY = Knob(
    "pin_memory",
    "loader batches in pinned host memory (faster copies to a GPU)",
    (False, True),
    False,
    recommended=(True,),
    compiled=False,
    quiet=True,
)
PREFETCH_FACTOR = Knob(
    "prefetch_factor", "batches each loader worker loads ahead", None, 2, maximum=64, compiled=False, quiet=True
)
CUDNN_BENCHMARK = Knob(
    "cudnn_benchmark",
    "cuDNN times its convolution algorithms for each new input shape and keeps the fastest",
    (False, True),
    False,
    recommended=(True,),
    compiled=False,
    quiet=True,
)
BUCKET_CAP_MB = Knob(
    "bucket_cap_mb",
    "DDP: megabytes of gradients all-reduced together; larger buckets, fewer and later all-reduces",
    None,
    25,
    maximum=4096,
    quiet=True,
)
BUCKET_VIEW = Knob(
    "bucket_view",
    "DDP gradient_as_bucket_view: gradients are views into the all-reduce buckets (no copy, less memory)",
    (False, True),
    False,
    memory_order=(True, False),
    quiet=True,
)
STATIC_GRAPH = Knob(
    "static_graph",
    "DDP static_graph: the set of parameters that get gradients is the same every step",
    (False, True),
    False,
    quiet=True,
)
COMM_HOOK = Knob(
    "comm_hook",
    "DDP gradient communication: as computed, compressed to fp16 or bf16, or PowerSGD (rank 1, error feedback)",
    ("none", "fp16", "bf16", "powersgd"),
    "none",
    quiet=True,
)
RESHARD_AFTER_FORWARD = Knob(
    "reshard_after_forward",
    "FSDP2: free the gathered parameters after the forward and gather them again for the backward",
    (True, False),
    True,
    memory_order=(True, False),
    quiet=True,
)
PARAM_DTYPE = Knob(
    "param_dtype",
    "FSDP2 MixedPrecisionPolicy: the dtype of the gathered parameters the forward and backward compute in",
    ("fp32", "bf16"),
    "fp32",
    memory_order=("bf16", "fp32"),
    quiet=True,
)
REDUCE_DTYPE = Knob(
    "reduce_dtype",
    "FSDP2 MixedPrecisionPolicy: the dtype gradients are reduce-scattered in",
    ("fp32", "bf16"),
    "fp32",
    quiet=True,
)
OFFLOAD = Knob(
    "offload",
    "FSDP2: sharded parameters, gradients and optimizer state in host memory; the optimizer steps on the CPU",
    ("none", "cpu"),
    "none",
    memory_order=("cpu", "none"),
    quiet=True,
)
DDP_KNOBS = (BUCKET_CAP_MB, BUCKET_VIEW, STATIC_GRAPH, COMM_HOOK)
"""The knobs of `parallel: ddp` (DistributedDataParallel's own arguments and its communication hook)."""
FSDP_KNOBS = (RESHARD_AFTER_FORWARD, PARAM_DTYPE, REDUCE_DTYPE, OFFLOAD)
"""The knobs of `parallel: fsdp` (FSDP2's `fully_shard` arguments)."""
PARALLEL_KNOBS = {"ddp": DDP_KNOBS, "fsdp": FSDP_KNOBS}

PYTORCH_KNOBS = (
    *COMMON_KNOBS,
    COMPILE,
    MEMORY_FORMAT,
    OPTIMIZER,
    CHECKPOINTING,
    ATTENTION,
    PIN_MEMORY,
    PREFETCH_FACTOR,
    CUDNN_BENCHMARK,
    *DDP_KNOBS,
    *FSDP_KNOBS,
)

COMPILE_TIMEOUT_FACTOR = {"none": 1.0, "default": 2.0, "reduce-overhead": 2.0, "max-autotune": 4.0}
"""A trial's default timeout per compile mode, in default timeouts: max-autotune benchmarks
candidate kernels for every matmul and convolution, which on a large model takes minutes."""

SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")
HALF_PRECISION_ONLY = ("flash", "cudnn")
"""SDPA backends whose CUDA kernels take fp16 and bf16 only (flash attention's CPU kernel takes fp32)."""


@dataclass(frozen=True)
class TorchCapabilities(Capabilities):
    compile: bool = capability("torch.compile")
    """torch.compile can build kernels here (a working inductor backend)."""
    cuda_graphs: bool = capability("CUDA graphs")
    cudnn: bool = capability("cuDNN")
    """A GPU with cuDNN: `cudnn_benchmark` can matter."""
    sdpa_flash: bool = capability("flash attention")
    sdpa_efficient: bool = capability("memory-efficient attention")
    sdpa_cudnn: bool = capability("cuDNN attention")
    # What the probe found of the workload (`autotuner.backends.pytorch.probe.workload_capabilities`).
    convolutions: bool = capability("workload: 2-D convolutions")
    sdpa: bool = capability("workload: scaled_dot_product_attention")
    hf_attention: bool = capability("workload: Hugging Face attention implementations")
    checkpoint_blocks: bool = capability("workload: repeated blocks to checkpoint")
    foreach_optimizer: bool = capability("workload: optimizer takes foreach")
    fused_optimizer: bool = capability("workload: optimizer takes fused here")
    # How the job's ranks train together (the spec's `parallel`), where this torch build has it.
    ddp: bool = capability("DistributedDataParallel")
    fsdp: bool = capability("FSDP2")


def model_knob_irrelevant(knob: str, value: object, caps: TorchCapabilities) -> str | None:
    """Why `value` (not the reference) of a knob that acts on the model itself (`compile`,
    `memory_format`, `attention`) cannot matter on this device and model, or None: what training
    and serving a PyTorch model share."""
    if knob == COMPILE.name:
        if not caps.compile:
            return f"compile={value}: torch.compile cannot build kernels here"
        if value == "reduce-overhead" and not caps.cuda_graphs:
            return "compile=reduce-overhead: CUDA graphs need a CUDA device"
    if knob == MEMORY_FORMAT.name and not caps.convolutions:
        return "memory_format=channels_last: the model has no 2-D convolutions"
    if knob == ATTENTION.name:
        if value == "eager":
            return None if caps.hf_attention else "attention=eager: only Hugging Face models choose their attention"
        if not (caps.sdpa or caps.hf_attention):
            return f"attention={value}: the model calls no scaled_dot_product_attention"
        if value != "math" and not getattr(caps, f"sdpa_{value}"):
            return f"attention={value}: this device or torch build has no {value} attention kernel"
    return None


class PyTorchBackend(Backend):
    name = "pytorch"
    runner = "autotuner.backends.pytorch.runner"
    knobs = knob_table(*PYTORCH_KNOBS)
    capabilities_type = TorchCapabilities
    parallel = ("ddp", "fsdp")
    builtin_workloads = {
        "mlp": "autotuner.backends.pytorch.builtin:mlp",
        "cnn": "autotuner.backends.pytorch.builtin:cnn",
        "gpt": "autotuner.backends.pytorch.builtin:gpt",
        "resnet": "autotuner.backends.pytorch.builtin:resnet",
    }
    default_space = "pytorch"
    requires = ("torch",)
    install = "pip install torch"

    def default_preset(self, parallel: str | None) -> str:
        return f"pytorch-{parallel}" if parallel else self.default_space

    def job_knobs(self, parallel: str | None) -> dict[str, Knob]:
        others = {k.name for mode, knobs in PARALLEL_KNOBS.items() if mode != parallel for k in knobs}
        return {name: knob for name, knob in self.knobs.items() if name not in others}

    def timeout_factor(self, config: Config) -> float:
        return COMPILE_TIMEOUT_FACTOR[config.get(COMPILE.name, "none")]

    def irrelevant(self, knob: str, value: object, capabilities: Capabilities) -> str | None:
        caps = capabilities if isinstance(capabilities, TorchCapabilities) else TorchCapabilities()
        if value == self.knobs[knob].reference:
            return None
        if reason := model_knob_irrelevant(knob, value, caps):
            return reason
        if knob == "optimizer" and not getattr(caps, f"{value}_optimizer"):
            return f"optimizer={value}: the workload's optimizer takes no {value}=True on this device"
        if knob == MEMORY_FORMAT.name and caps.fsdp:
            return (
                "memory_format=channels_last: FSDP2 shards contiguous parameters only, and channels_last "
                "lays the convolutions' weights out otherwise"
            )
        if knob == "checkpointing" and not caps.checkpoint_blocks:
            return "checkpointing=blocks: the model has no repeated blocks (name them: TorchWorkload.checkpoint_blocks)"
        for parallel, knobs in PARALLEL_KNOBS.items():
            if any(knob == k.name for k in knobs) and not getattr(caps, parallel):
                return f"{knob}={value}: a knob of parallel: {parallel} (a trial of several processes)"
        if knob == "offload" and not caps.accelerator:
            return "offload=cpu: the parameters are in host memory already"
        if knob == "comm_hook" and value == "bf16" and not (caps.accelerator and caps.bf16):
            return "comm_hook=bf16: torch's bf16 compression hook needs a GPU with bf16 (CUDA and NCCL)"
        if knob == "pin_memory" and not caps.accelerator:
            return "pin_memory=True: pinned host memory only speeds copies to a GPU"
        if knob == "cudnn_benchmark" and not (caps.cudnn and caps.convolutions):
            why = "the model has no convolutions" if caps.cudnn else "there is no GPU with cuDNN"
            return f"cudnn_benchmark=True: cuDNN times convolution algorithms, and {why}"
        return None

    def unsupported_reason(self, config: Config, capabilities: Capabilities) -> str | None:
        precision = self.unsupported_precision(config.get(PRECISION.name, "fp32"), capabilities)
        if precision:
            return precision
        for knob, value in config.items():
            if knob in self.knobs:
                reason = self.irrelevant(knob, value, capabilities)
                if reason:
                    return reason
        attention = config.get("attention", "default")
        if (
            attention in HALF_PRECISION_ONLY
            and capabilities.accelerator
            and config.get(PRECISION.name, "fp32") not in ("bf16", "fp16")
        ):
            return f"attention={attention}: its CUDA kernels compute in bf16 or fp16 only"
        if config.get(STATIC_GRAPH.name) and config.get("accumulation", 1) > 1:
            # the reducer asserts in the first no_sync backward, and past that stops reducing
            return (
                "static_graph=True with accumulation: DDP's static graph fails under no_sync (pytorch/pytorch#143580)"
            )
        if config.get(PARAM_DTYPE.name) == "bf16" and config.get(PRECISION.name) == "fp16":
            return "param_dtype=bf16: with precision fp16, autocast would compute bf16 parameters in fp16"
        if config.get(PREFETCH_FACTOR.name, 2) != PREFETCH_FACTOR.reference and config.get(WORKERS.name, 0) == 0:
            return "prefetch_factor: only loader workers prefetch (workers=0 loads in the training process)"
        return None


PYTORCH = PyTorchBackend()

__all__ = [
    "ATTENTION",
    "BUCKET_CAP_MB",
    "BUCKET_VIEW",
    "COMM_HOOK",
    "DDP_KNOBS",
    "FSDP_KNOBS",
    "OFFLOAD",
    "PARAM_DTYPE",
    "REDUCE_DTYPE",
    "RESHARD_AFTER_FORWARD",
    "STATIC_GRAPH",
    "CHECKPOINTING",
    "COMPILE",
    "COMPILE_TIMEOUT_FACTOR",
    "CUDNN_BENCHMARK",
    "MEMORY_FORMAT",
    "OPTIMIZER",
    "PIN_MEMORY",
    "PREFETCH_FACTOR",
    "PYTORCH",
    "PyTorchBackend",
    "TorchCapabilities",
    "model_knob_irrelevant",
]
