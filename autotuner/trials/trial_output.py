"""What a trial process sends back when it ran to its end: a trial's `TrialOutput`, with the
measured phase's `autotuner.measurement.timing.Throughput` and the drift phase's `Losses`. It is
pickled through the trial's pipe as it is (`autotuner.trials.launcher`); `as_dict` is its plain
form where it is kept as JSON (the benchmarks). A profile process sends a `ProfileOutput`.

This module imports no framework and no Optuna: trial processes and the search both load it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from autotuner.measurement.timing import Throughput
from autotuner.measurement.traces import Operator


@dataclass(frozen=True)
class Losses:
    """The drift phase's losses: the held-out loss after the K steps and each step's loss."""

    heldout: float
    trajectory: list[float]
    skipped_steps: int | None = None
    """The drift steps the config skipped (fp16 overflow), where the backend can tell."""


@dataclass(frozen=True)
class Latency:
    """An inference trial's calls inside its measured windows, each timed alone (device
    synchronised): how long a batch took, in milliseconds."""

    p50_ms: float
    p99_ms: float
    mean_ms: float
    calls: int


@dataclass(frozen=True)
class OutputDrift:
    """How far an inference config's outputs on the held-out inputs are from the model's in strict
    fp32 eager (`autotuner.trials.serving`)."""

    relative_error: float
    """||outputs - reference|| / ||reference||, Frobenius norms over every held-out item's
    outputs, computed in float64 (or what the workload's `drift_fn` returns instead)."""
    top1_agreement: float | None = None
    """Where the outputs are class scores (a last dimension of two or more): the share of items
    (and positions) whose arg-max is the reference's."""
    accuracy: float | None = None
    """Where the items carry integer labels of the outputs' shape: the share the config's arg-max gets right."""
    reference_accuracy: float | None = None
    """The same for the reference's outputs."""


@dataclass
class TrialOutput:
    """What a trial process sends back when it ran to its end."""

    losses: Losses
    tokens_per_sample: int | None = None
    flops_per_sample: float | None = None
    """Model FLOPs per sample (declared, or counted without recomputation): what MFU is of."""
    throughput: Throughput | None = None
    """None for the reference, which runs the drift phase only (so do the next three)."""
    peak_memory_mb: float | None = None
    telemetry: dict[str, float] | None = None
    """`autotuner.measurement.telemetry.Telemetry.summary` over the windows."""
    compile_cache: str | None = None
    setup_s: float | None = None
    """Wall time from the trial's start to its warm-up: the workload built, the config applied."""
    dataset_items: int | None = None
    """Items of the workload's training dataset (an epoch, for `run: {epochs: E}`)."""
    prune_held_off: list[float] = field(default_factory=list)
    """The share of the cores other work had taken by each window after which the trial was behind
    the best but not pruned, since it was slowed by that work (`autotuner.measurement.pruning`)."""
    latency: Latency | None = None
    """An inference trial's latency of a batch (`autotuner.trials.serving`); None for training."""
    output_drift: OutputDrift | None = None
    """An inference trial's drift: its outputs against the reference's; None for training."""

    def as_dict(self) -> dict[str, object]:
        """As plain data (the benchmarks keep trial outputs in JSON): what the measured phase
        gave only where it ran."""
        data: dict[str, object] = {
            "tokens_per_sample": self.tokens_per_sample,
            "flops_per_sample": self.flops_per_sample,
            "losses": asdict(self.losses),
            "dataset_items": self.dataset_items,
        }
        if self.throughput is not None:
            data.update(
                throughput=self.throughput.as_dict(),
                peak_memory_mb=self.peak_memory_mb,
                telemetry=self.telemetry,
                compile_cache=self.compile_cache,
                setup_s=self.setup_s,
                prune_held_off=self.prune_held_off,
            )
        if self.latency is not None:
            data["latency"] = asdict(self.latency)
        if self.output_drift is not None:
            data["output_drift"] = asdict(self.output_drift)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialOutput:
        throughput = data.get("throughput")
        return cls(
            losses=Losses(**data["losses"]),
            tokens_per_sample=data.get("tokens_per_sample"),
            flops_per_sample=data.get("flops_per_sample"),
            throughput=Throughput.from_dict(throughput) if throughput else None,
            peak_memory_mb=data.get("peak_memory_mb"),
            telemetry=data.get("telemetry"),
            compile_cache=data.get("compile_cache"),
            setup_s=data.get("setup_s"),
            dataset_items=data.get("dataset_items"),
            prune_held_off=data.get("prune_held_off", []),
            latency=Latency(**data["latency"]) if data.get("latency") else None,
            output_drift=OutputDrift(**data["output_drift"]) if data.get("output_drift") else None,
        )


@dataclass(frozen=True)
class ProfileOutput:
    """What a profile process sends back (`autotuner.trials.training.run_profile`): where its trace is,
    and the trace's operators by self time (`autotuner.measurement.traces.top_operators`)."""

    trace: str
    """The path of the Chrome trace the profiler wrote."""
    where: str
    """`device` (a GPU's kernels) or `host`."""
    total_ms: float
    """Self time of everything on that side, per step."""
    operators: list[Operator]


@dataclass(frozen=True)
class NodePart:
    """What a trial process on a node other than 0 sends back when its ranks of a trial across
    nodes ended well: node 0's trial process has the trial's output."""

    node_rank: int
