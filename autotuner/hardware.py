"""Peak dense FLOP/s per device and precision, for MFU. Matched by the device's name.

Figures are the vendors' datasheet numbers for dense (not sparse) math. A device missing here
gets no MFU rather than a guess.
"""

from __future__ import annotations

TFLOPS = 1e12

# name fragment (lower case) -> precision -> dense FLOP/s. Longest fragment wins.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    # NVIDIA H100 SXM5 datasheet: FP32 67, TF32 495, BF16/FP16 989.
    "h100 80gb hbm3": {"fp32": 67 * TFLOPS, "tf32": 495 * TFLOPS, "bf16": 989 * TFLOPS, "fp16": 989 * TFLOPS},
    "h100": {"fp32": 67 * TFLOPS, "tf32": 495 * TFLOPS, "bf16": 989 * TFLOPS, "fp16": 989 * TFLOPS},
    # H100 PCIe datasheet: FP32 51, TF32 378, BF16/FP16 756.
    "h100 pcie": {"fp32": 51 * TFLOPS, "tf32": 378 * TFLOPS, "bf16": 756 * TFLOPS, "fp16": 756 * TFLOPS},
    # H200 SXM datasheet: same tensor cores as the H100 SXM.
    "h200": {"fp32": 67 * TFLOPS, "tf32": 495 * TFLOPS, "bf16": 989 * TFLOPS, "fp16": 989 * TFLOPS},
    # A100 datasheet: FP32 19.5, TF32 156, BF16/FP16 312.
    "a100": {"fp32": 19.5 * TFLOPS, "tf32": 156 * TFLOPS, "bf16": 312 * TFLOPS, "fp16": 312 * TFLOPS},
    # L4 datasheet: FP32 30.3, TF32 60, BF16/FP16 121.
    "l4": {"fp32": 30.3 * TFLOPS, "tf32": 60 * TFLOPS, "bf16": 121 * TFLOPS, "fp16": 121 * TFLOPS},
}


def peak_flops(device_name: str) -> dict[str, float]:
    """The peak table of the device called `device_name`, or {} when it is not known."""
    name = device_name.lower()
    matches = [fragment for fragment in PEAK_FLOPS if fragment in name]
    return dict(PEAK_FLOPS[max(matches, key=len)]) if matches else {}


def gpt_flops_per_token(params_without_embeddings: int, layers: int, dim: int, length: int) -> float:
    """Training FLOPs per token, forward and backward: 6N for the weights plus 12*L*d*T for
    attention (Kaplan et al. 2020, as PaLM's appendix B and nanoGPT's estimate_mfu use it)."""
    return 6.0 * params_without_embeddings + 12.0 * layers * dim * length
