"""The PyTorch backend's knobs, one family a module: each module holds its knobs' definitions
and the rules that decide where they can run (`autotuner.backends._base.Family`: when a value
cannot matter on a device, when it conflicts with the rest of a config). The backends' knob
tables and `families` are assembled here; what a config does to a model is
`autotuner.backends.pytorch.apply.TunedTraining`, which applies the families in `APPLY`'s order,
and, served, `autotuner.backends.pytorch.serving.TunedInference`. Imports no framework: a
family's functions import torch when they are called.

Adding a knob: a module here with its `Knob` and its `FAMILY` (a `TorchFamily`: its rules and its
`apply`, what it does to a training run as `TunedTraining` builds it), the family in `TRAINING`
(or `SERVING`) and in `APPLY`, and the knob in the presets that should search it (`search_spaces/`).
"""

from __future__ import annotations

from dataclasses import replace

from autotuner.backends.pytorch.knobs import (
    attention,
    checkpointing,
    compile,
    cudnn,
    ddp,
    float8,
    fsdp,
    loader,
    memory_budget,
    memory_format,
    optimizer,
    quantization,
    runtime,
    sparsity,
    threads,
)
from autotuner.config.knobs import ACCUMULATION, BATCH_SIZE, PRECISION, WORKERS

LOADER_WORKERS = replace(WORKERS, description="DataLoader `num_workers`, persistent workers")
COMMON = (
    replace(
        PRECISION,
        description="tf32: TF32 matmuls and convolutions; bf16/fp16: autocast, fp16 with a GradScaler; fp32: "
        "strict fp32",
    ),
    BATCH_SIZE,
    ACCUMULATION,
    LOADER_WORKERS,
)
"""The knobs every backend has, as PyTorch's training does them."""

TRAINING = (
    compile.FAMILY,
    memory_format.FAMILY,
    optimizer.FAMILY,
    checkpointing.FAMILY,
    attention.FAMILY,
    loader.FAMILY,
    cudnn.FAMILY,
    ddp.FAMILY,
    fsdp.FAMILY,
    memory_budget.FAMILY,
    float8.FAMILY,
)
"""The training knobs' families (beside the common knobs), in the knob table's order."""
APPLY = (
    cudnn.FAMILY,
    memory_format.FAMILY,
    float8.FAMILY,
    checkpointing.FAMILY,
    attention.FAMILY,
    ddp.FAMILY,
    fsdp.FAMILY,
    memory_budget.FAMILY,
    compile.FAMILY,
    optimizer.FAMILY,
    loader.FAMILY,
)
"""The order `TunedTraining` applies the families in (`TorchFamily.apply`): process-wide flags,
the model's layout, its linear layers in fp8 (converted before the wrappers, as torchtitan does),
checkpointing and attention on the user's module, then the wrappers (DDP or FSDP2, then
torch.compile round them), the optimizer rebuilt over the parameters as they are then, and the
loader."""
TRAINING_KNOBS = (*COMMON, *(knob for family in TRAINING for knob in family.knobs))
"""The PyTorch backend's knob table, in order."""
PARALLEL = {"ddp": ddp.DDP_KNOBS, "fsdp": (*fsdp.FSDP_KNOBS, *float8.FSDP_FLOAT8_KNOBS)}
"""The knobs of each way a job's ranks train together (the spec's `parallel`)."""
SERVING_ATTENTION = attention.FAMILY.restricted(
    attention.ATTENTION.name, "default", "flash", "efficient", "cudnn", "math"
)
"""Serving's attention: the SDPA kernels, no eager attention."""
SERVING = (
    runtime.FAMILY,
    SERVING_ATTENTION,
    sparsity.FAMILY,
    quantization.FAMILY,
    compile.FAMILY,
    threads.FAMILY,
    memory_format.FAMILY,
)
"""`task: inference`'s families, in the order their conflicts are asked (the runtime's first: on
ONNX Runtime, PyTorch's own knobs are what conflicts)."""
