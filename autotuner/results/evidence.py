"""What trials measure, as types: a trial process's output, the fp32 reference, a re-measurement.

A trial process returns a `TrialOutput` (`autotuner.trials.core.run_trial`), pickled through its pipe
as it is (`autotuner.trials.launcher`): the measured phase's `Throughput` (`autotuner.measurement.timing`) and the
drift phase's `Losses`. A study keeps two more in its storage, as JSON: the fp32 `Reference` it
measures drift against (a study user attr) and each re-measured config's `Remeasurement` (in its
`remeasure:<number>` claim); `as_dict` and `from_dict` are their stored form, used where they are
written (`autotuner.workers.coordination`) and read (`autotuner.results.records`).

This module imports no framework and no Optuna: trial processes and the search both load it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from autotuner.config.knobs import Config
from autotuner.measurement.drift import Drift, measure_drift


@dataclass(frozen=True)
class Throughput:
    """A trial's measured phase (`autotuner.measurement.timing.measure_throughput`)."""

    samples_per_s: float
    """Median over windows."""
    spread: float
    """(max - min) / median over the windows' throughputs."""
    window_samples_per_s: list[float]
    warmup_s: float
    measured_s: float
    """Sum of the windows' wall time."""
    steps: int
    """Optimizer steps per window: the requested steps, raised to fill the minimum duration."""
    windows: int
    """Windows measured."""
    samples_per_step: int
    calibration_s: float = 0.0
    """Wall time of the calibration windows (0 without a minimum window duration)."""
    window_spans: list[tuple[float, float]] = field(default_factory=list)
    """When each window began and ended, by `time.monotonic` (one clock for every process of the
    machine: lockstep processes' windows can be set side by side)."""
    stopped: str | None = None
    """Why the windows stopped before all were measured (`autotuner.measurement.pruning`: the trial is pruned,
    its drift phase not run), or None."""
    warmup_steps: int = 0
    """Optimizer steps of the warm-up, whose wall time is `warmup_s`."""
    steps_taken: int = 0
    """Every optimizer step the measured phase took: warm-up, calibration, the untimed step that
    opens each lockstep turn, the windows."""
    trained_s: float = 0.0
    """Wall time from the warm-up's first step to the last window's end, less the waits for other
    processes' turns in lockstep: the time those `steps_taken` steps took to train."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Throughput:
        """From `as_dict`'s form read back from JSON (the spans come back as lists)."""
        spans = [(float(start), float(end)) for start, end in data.get("window_spans", [])]
        return cls(**{**data, "window_spans": spans})


@dataclass(frozen=True)
class Losses:
    """The drift phase's losses: the held-out loss after the K steps and each step's loss."""

    heldout: float
    trajectory: list[float]
    skipped_steps: int | None = None
    """The drift steps the config skipped (fp16 overflow), where the backend can tell."""


@dataclass
class TrialOutput:
    """What a trial process sends back when it ran to its end."""

    losses: Losses
    tokens_per_sample: int | None = None
    flops_per_sample: float | None = None
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

    def as_dict(self) -> dict[str, Any]:
        """As plain data (the benchmarks keep trial outputs in JSON): what the measured phase
        gave only where it ran."""
        data: dict[str, Any] = {
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
        )


@dataclass(frozen=True)
class Reference:
    """The study's fp32 reference (`autotuner.search.reference.run_reference`): the strictest config's drift
    phase, run twice from the same seed. Drift is measured against the first run's losses; the gap
    between the two runs is the noise floor shown next to the tolerance."""

    config: Config
    heldout: float
    trajectory: list[float]
    noise_floor: float
    """The drift of the second run from the first (held-out loss)."""
    noise_floor_trajectory: float
    """The same over the training-loss trajectory (its largest gap)."""
    runs_heldout: list[float]
    """Each run's held-out loss."""
    wall_s: float
    """Both runs' wall time."""

    def drift(self, losses: Losses) -> Drift:
        """How far a trial's drift phase came out from the reference's."""
        return measure_drift(losses.heldout, losses.trajectory, self.heldout, self.trajectory)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Reference:
        return cls(**data)


@dataclass
class Remeasurement:
    """A config's re-measurement (`autotuner.search.remeasure.Remeasurer`), built run by run."""

    throughputs: list[float] = field(default_factory=list)
    """The median throughput of each of its runs (a fresh trial process each)."""
    windows: list[list[float]] = field(default_factory=list)
    """The rates of each run's windows."""
    measured_s: list[float] = field(default_factory=list)
    """The wall time of each run's timed windows, in seconds (what the search spent measuring)."""
    baseline_windows: list[float] | None = None
    """The rates of the baseline's windows measured in the same group (in lockstep, between its
    own); None when the baseline was not measured beside it, or failed."""
    group: list[int] = field(default_factory=list)
    """The trial numbers measured together with it."""
    lockstep: bool = False
    """Whether the group was measured in lockstep (else one process after another)."""
    error: str | None = None
    """Why one of its runs failed (the config is then not declared best), or None."""

    @property
    def rerun_windows(self) -> list[float]:
        """The rate of every window of every run."""
        return [rate for run in self.windows for rate in run]

    def as_dict(self) -> dict[str, Any]:
        """The claim's stored form: `baseline_windows` and `error` only where there are some."""
        data: dict[str, Any] = {
            "throughputs": self.throughputs,
            "windows": self.windows,
            "measured_s": self.measured_s,
            "group": self.group,
            "lockstep": self.lockstep,
        }
        if self.baseline_windows is not None:
            data["baseline_windows"] = self.baseline_windows
        if self.error is not None:
            data["error"] = self.error
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Remeasurement:
        """From a `remeasure:<number>` claim, whose own keys (worker, lease, status) are left out;
        studies made by an older autotuner stored fewer of its keys."""
        return cls(
            throughputs=list(data.get("throughputs") or []),
            windows=[list(run) for run in data.get("windows") or []],
            measured_s=list(data.get("measured_s") or []),
            baseline_windows=data.get("baseline_windows"),
            group=list(data.get("group") or []),
            lockstep=bool(data.get("lockstep", False)),
            error=data.get("error"),
        )
