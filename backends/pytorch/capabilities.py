"""What the PyTorch backend's probe reports: the device's capabilities, the torch build's and the
workload's (`autotuner.backends.pytorch.probe`), which its knobs' families decide by
(`autotuner.backends.pytorch.knobs`). Imports no framework."""

from __future__ import annotations

from dataclasses import dataclass

from autotuner.backends._base import Capabilities, capability


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
    fp8_training: bool = capability("fp8 training (torchao float8)")
    """An NVIDIA GPU with fp8 tensor cores (compute capability 8.9 or later) and torchao's float8."""
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
    hsdp: bool = capability("FSDP2 hybrid sharding: a trial across 2+ nodes")
    """FSDP2 with the trial's ranks on two or more nodes (the spec's `nodes`): its hybrid meshes,
    which shard within a node and replicate across nodes or the other way round, can differ from
    sharding over every rank."""


@dataclass(frozen=True)
class InferenceCapabilities(TorchCapabilities):
    """`task: inference`'s: the optional libraries and kernels serving can use."""

    torchao: bool = capability("torchao (quantization)")
    fp8: bool = capability("fp8 matmuls")
    sparse24: bool = capability("2:4 sparse matmuls")
    sparse24_layers: bool = capability("workload: linear layers the 2:4 kernels take")
    onnxruntime: bool = capability("ONNX Runtime")
    ort_cpu: bool = capability("ONNX Runtime: CPU provider")
    ort_cuda: bool = capability("ONNX Runtime: CUDA provider")
    ort_tensorrt: bool = capability("ONNX Runtime: TensorRT provider")
