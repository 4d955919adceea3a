"""`memory_budget`: the share of a compiled graph's activations torch.compile keeps for the
backward, the rest recomputed (selective activation checkpointing by the min-cut partitioner)."""

from __future__ import annotations

from collections.abc import Mapping

from autotuner.backends.pytorch.capabilities import TorchCapabilities
from autotuner.backends.pytorch.knobs._family import Build, TorchFamily
from autotuner.backends.pytorch.knobs.compile import COMPILE
from autotuner.config.knobs import ASCENDING, Config, Knob

MEMORY_BUDGET = Knob(
    "memory_budget",
    "torch.compile's activation memory budget (`torch._functorch.config.activation_memory_budget`, "
    "process-wide): the share of a compiled graph's activations kept for the backward, the partitioner "
    "recomputing the cheapest of the rest (1: what it keeps by default; 0: as little as it can)",
    None,
    1.0,
    minimum=0.0,
    maximum=1.0,
    real=True,
    quiet=True,
    memory_order=ASCENDING,
    not_run_when="below 1 with `compile: none` (only a compiled graph is partitioned); torch.compile cannot build "
    "kernels here",
)
ATTRIBUTE = "torch._functorch.config.activation_memory_budget"


def irrelevant(knob: Knob, value: object, caps: TorchCapabilities) -> str | None:
    if not caps.compile:
        return f"memory_budget={value}: torch.compile cannot build kernels here, and only a compiled graph has one"
    return None


def conflict(config: Config, caps: TorchCapabilities) -> str | None:
    budget = MEMORY_BUDGET.of(config) if MEMORY_BUDGET.name in config else MEMORY_BUDGET.reference
    if budget != MEMORY_BUDGET.reference and config.get(COMPILE.name, COMPILE.reference) == "none":
        return f"memory_budget={budget} with compile=none: only torch.compile's partitioner recomputes activations"
    return None


def apply(build: Build) -> None:
    """The budget, set process-wide before the model is compiled (torch reads it when it compiles
    the training graph), and back at 1 for a config that leaves it there."""
    import torch._functorch.config

    torch._functorch.config.activation_memory_budget = float(MEMORY_BUDGET.of(build.config))


def setup(config: Mapping[str, object]) -> list[str]:
    budget = MEMORY_BUDGET.of(config) if MEMORY_BUDGET.name in config else MEMORY_BUDGET.reference
    if budget == MEMORY_BUDGET.reference:
        return []
    return [
        "import torch._functorch.config",
        f"{ATTRIBUTE} = {float(budget)!r}  # memory_budget: what torch.compile keeps for the backward",
    ]


FAMILY = TorchFamily((MEMORY_BUDGET,), irrelevant, conflict, apply, setup)
