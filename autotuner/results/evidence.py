"""What a study keeps besides its trials, as types: the fp32 `Reference` drift is measured against
(a study user attr) and each re-measured config's `Remeasurement` (in its `remeasure:<number>`
claim). `as_dict` and `from_dict` are their stored form, used where they are written
(`autotuner.search.reference`, `autotuner.workers.coordination`) and read
(`autotuner.results.records`).

This module imports no framework and no Optuna.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from autotuner.config.knobs import Config
from autotuner.measurement.drift import Drift, measure_drift
from autotuner.measurement.interval import DRIFT
from autotuner.trials.trial_output import Losses


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
    outputs: bool = False
    """An inference study's reference (`task: inference`): drift compares a config's outputs with
    the fp32 model's, in each trial; `heldout` and `trajectory` are empty, and the noise floor is
    fp32's own, at one sample a call against the baseline's batch."""

    def drift(self, losses: Losses) -> Drift:
        """How far a trial's drift phase came out from the reference's."""
        return measure_drift(losses.heldout, losses.trajectory, self.heldout, self.trajectory)

    def as_dict(self) -> dict[str, object]:
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
    speedups: list[float] = field(default_factory=list)
    """Each run's speedup over the baseline's process measured beside it (in its group): the run's
    median window over the baseline's. The rounds `autotuner.measurement.interval` makes the
    speedup's interval of; empty for the baseline and where the baseline failed."""
    baseline_windows: list[float] | None = None
    """The rates of the baseline's windows measured in the same group (in lockstep, between its
    own); None when the baseline was not measured beside it, or failed."""
    group: list[int] = field(default_factory=list)
    """The trial numbers measured together with it."""
    lockstep: bool = False
    """Whether the group was measured in lockstep (else one process after another)."""
    error: str | None = None
    """Why one of its runs failed (the config is then not declared best), or None."""
    among: int = 1
    """How many configs its speedup interval is stated jointly with, its own included
    (`autotuner.results.standings.joint_among`): set when the study's re-measurements are read, so
    that a later re-measurement that brings in a rival counts too."""
    drift: float = DRIFT
    """The session's drift its speedup interval allows for (`budget.remeasure_drift` when it was
    measured; `autotuner.measurement.interval.stated_interval`)."""

    @property
    def rerun_windows(self) -> list[float]:
        """The rate of every window of every run."""
        return [rate for run in self.windows for rate in run]

    def as_dict(self) -> dict[str, object]:
        """The claim's stored form: `speedups`, `baseline_windows` and `error` only where there are some."""
        data: dict[str, object] = {
            "throughputs": self.throughputs,
            "windows": self.windows,
            "measured_s": self.measured_s,
            "group": self.group,
            "lockstep": self.lockstep,
            "drift": self.drift,
        }
        if self.speedups:
            data["speedups"] = self.speedups
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
            speedups=list(data.get("speedups") or []),
            baseline_windows=data.get("baseline_windows"),
            group=list(data.get("group") or []),
            lockstep=bool(data.get("lockstep", False)),
            error=data.get("error"),
            drift=float(data.get("drift", DRIFT)),
        )
