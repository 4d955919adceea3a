"""The knobs of `parallel: fsdp`: FSDP2's `fully_shard` arguments."""

from __future__ import annotations

from autotuner.backends._base import Family
from autotuner.backends.pytorch.capabilities import TorchCapabilities
from autotuner.config.knobs import PRECISION, Config, Knob

RESHARD_AFTER_FORWARD = Knob(
    "reshard_after_forward",
    "FSDP2: free the gathered parameters after the forward, gather them again for the backward",
    (True, False),
    True,
    not_run_when="not `parallel: fsdp`",
    memory_order=(True, False),
    quiet=True,
)
PARAM_DTYPE = Knob(
    "param_dtype",
    "FSDP2 `MixedPrecisionPolicy`: the dtype the gathered parameters compute in",
    ("fp32", "bf16"),
    "fp32",
    not_run_when="not `parallel: fsdp`; bf16 with `precision: fp16`",
    memory_order=("bf16", "fp32"),
    quiet=True,
)
REDUCE_DTYPE = Knob(
    "reduce_dtype",
    "FSDP2 `MixedPrecisionPolicy`: the dtype gradients are reduce-scattered in",
    ("fp32", "bf16"),
    "fp32",
    not_run_when="not `parallel: fsdp`",
    quiet=True,
)
OFFLOAD = Knob(
    "offload",
    "FSDP2 `CPUOffloadPolicy`: sharded parameters, gradients and optimizer state in host memory, the optimizer "
    "stepping on the CPU (memory, at a cost the trial measures)",
    ("none", "cpu"),
    "none",
    not_run_when="not `parallel: fsdp`; on the CPU (the parameters are in host memory already)",
    memory_order=("cpu", "none"),
    quiet=True,
)
FSDP_KNOBS = (RESHARD_AFTER_FORWARD, PARAM_DTYPE, REDUCE_DTYPE, OFFLOAD)


def irrelevant(knob: Knob, value: object, caps: TorchCapabilities) -> str | None:
    if not caps.fsdp:
        return f"{knob.name}={value}: a knob of parallel: fsdp (a trial of several processes)"
    if knob.name == OFFLOAD.name and not caps.accelerator:
        return "offload=cpu: the parameters are in host memory already"
    return None


def conflict(config: Config, caps: TorchCapabilities) -> str | None:
    if config.get(PARAM_DTYPE.name) == "bf16" and config.get(PRECISION.name) == "fp16":
        return "param_dtype=bf16: with precision fp16, autocast would compute bf16 parameters in fp16"
    return None


FAMILY = Family[TorchCapabilities](FSDP_KNOBS, irrelevant, conflict)
