"""`sparsity` (`task: inference`): 2:4 semi-structured sparsity of the linear layers, served by
sparse kernels.

Not offered: unstructured pruning (zeroing weights where they are small). Dense kernels do the
same work on zeros, so it cannot make a forward pass faster; only 2:4 semi-structured sparsity
has kernels that skip the zeros (NVIDIA GPUs of compute capability 8.0 and later)."""

from __future__ import annotations

from autotuner.backends._base import Family
from autotuner.backends.pytorch.capabilities import InferenceCapabilities
from autotuner.backends.pytorch.knobs.quantization import QUANTIZATION, pip_line
from autotuner.config.knobs import PRECISION, Config, Knob

SPARSITY = Knob(
    "sparsity",
    "each four weights of a row of the linear layers pruned to their two largest, those layers cast to the "
    "precision's dtype and served by torchao's semi-structured sparse kernels (`sparsify_`); a model not trained "
    "for it drifts",
    ("none", "2:4"),
    "none",
    not_run_when="not an NVIDIA GPU of compute capability 8.0 or later; torchao not installed; no linear layer of a "
    "shape the kernels take (out_features a multiple of 32, in_features of 64); precision fp32 or tf32; with "
    "quantization; on an ONNX runtime",
    quiet=True,
)
SPARSE_ROWS, SPARSE_COLUMNS = 32, 64
"""A linear layer's weight the 2:4 kernels take in bf16 and fp16: rows (out_features) a multiple of
32, columns (in_features) of 64 (`torch.sparse.SparseSemiStructuredTensor`'s constraints)."""


def irrelevant(knob: Knob, value: object, caps: InferenceCapabilities) -> str | None:
    if not caps.torchao:
        return f"sparsity={value}: torchao is not installed here: {pip_line('torchao')}"
    if not caps.sparse24:
        return f"sparsity={value}: 2:4 sparse kernels need an NVIDIA GPU of compute capability 8.0 or later"
    if not caps.sparse24_layers:
        return (
            f"sparsity={value}: the model has no linear layer the 2:4 kernels take (out_features a "
            f"multiple of {SPARSE_ROWS}, in_features of {SPARSE_COLUMNS})"
        )
    return None


def conflict(config: Config, caps: InferenceCapabilities) -> str | None:
    if config.get(SPARSITY.name, SPARSITY.reference) == SPARSITY.reference:
        return None
    quantization, precision = config.get(QUANTIZATION.name, "none"), config.get(PRECISION.name, "fp32")
    if quantization != "none":
        return f"sparsity=2:4 with quantization={quantization}: not offered together"
    if precision not in ("bf16", "fp16"):
        return f"sparsity=2:4 with precision={precision}: the sparse weights are served in bf16 or fp16"
    return None


FAMILY = Family[InferenceCapabilities]((SPARSITY,), irrelevant, conflict)
