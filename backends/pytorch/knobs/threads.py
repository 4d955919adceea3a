"""`threads` (`task: inference`): the CPU's intra-op threads."""

from __future__ import annotations

import os

from autotuner.backends._base import Family
from autotuner.backends.pytorch.capabilities import InferenceCapabilities
from autotuner.config.knobs import Knob

THREADS = Knob(
    "threads",
    "intra-op threads on the CPU (`torch.set_num_threads`, or ONNX Runtime's `intra_op_num_threads`); 0: the "
    "framework's default (every core)",
    None,
    0,
    not_run_when="on a GPU; more than the machine's cores",
    minimum=0,
    maximum=4096,
    compiled=False,
)


def irrelevant(knob: Knob, value: object, caps: InferenceCapabilities) -> str | None:
    if caps.accelerator:
        return f"threads={value}: the CPU's intra-op threads; the model runs on the GPU"
    if int(str(value)) > (os.cpu_count() or 1):
        return f"threads={value}: this machine has {os.cpu_count()} cores"
    return None


FAMILY = Family[InferenceCapabilities]((THREADS,), irrelevant)
