"""What `autotuner apply` measured of a tuned config (`AppliedRun`), next to what the study
measured for it: the throughput here, the speedup over the baseline beside it, the promise check's
rounds and their verdict (`autotuner.results.promise`), the run's time, a served config's latency
and drift. `autotuner.search.apply_run` measures it; `autotuner.output.apply_console` prints it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from autotuner.config.knobs import Config, Value
from autotuner.measurement.interval import Interval, geometric_mean, stated_interval
from autotuner.measurement.timing import Throughput
from autotuner.results.promise import (
    TOLERANCE,
    Promised,
    Verdict,
    checked_interval,
    judge,
    look_level,
    rounds_to_decide,
    session_drift,
)
from autotuner.results.run_time import predicted_run_s
from autotuner.trials.probe import Environment
from autotuner.trials.trial_output import Latency, OutputDrift

AGREEMENT = 0.10
"""An applied throughput this far from the study's (relative) gets a warning."""
PROMISE = 0.05
"""Without intervals to compare (an export whose re-measurement ran one round), the speedup
`autotuner apply` delivers is within this of the export's (relative), or it warns."""


class ExportedBaseline(Protocol):
    """What an applied run reads of the export's baseline: its config (None where the study had none)."""

    @property
    def params(self) -> Mapping[str, Value] | None: ...


class Exported(Protocol):
    """What an applied run reads of the exported config it ran (`autotuner.apply.TunedConfig`,
    which the export layer above this one reads): the study's figures for it and for its baseline."""

    @property
    def source(self) -> str: ...

    @property
    def params(self) -> Mapping[str, Value]: ...

    @property
    def metrics(self) -> Mapping[str, object]: ...

    @property
    def baseline(self) -> ExportedBaseline: ...

    @property
    def study(self) -> Mapping[str, object]: ...

    @property
    def speedup(self) -> float | None: ...

    @property
    def speedup_interval(self) -> Interval | None: ...

    @property
    def throughput(self) -> float: ...

    @property
    def machine(self) -> Environment: ...


@dataclass(frozen=True)
class AppliedRun:
    """What running a job with a tuned config gave, next to what the study measured."""

    tuned: Exported
    """The exported config (`autotuner.apply.TunedConfig`)."""
    config: Config
    """The config as run (accumulation derived from this job's global batch)."""
    environment: Environment
    throughput: Throughput
    """Its median, spread, windows, warm-up."""
    heldout_loss: float | None
    drift_steps: int
    wall_s: float
    baseline: Throughput | None = None
    """The export's baseline config, run here over as many optimizer steps (or as many as its
    windows cover in `baseline_most_s`) and measured the same way, in windows of its own length,
    so that the speedup delivered is a ratio taken on this machine now."""
    lockstep: bool = False
    """The baseline was measured in lockstep with the config (else after it)."""
    setup_s: float = 0.0
    """The config's trial process from its start to its warm-up: the workload built, the config applied."""
    start_s: float = 0.0
    """The framework's start here (the environment's `framework_start_s`, `autotuner.results.run_time`)."""
    compile_cache: str | None = None
    """`cold`, `warm` or `partial`: the compile cache as the config's warm-up found it (None: nothing compiled)."""
    rounds: tuple[float, ...] = ()
    """The promise check's rounds: each a fresh process of the config beside one of the baseline,
    measured as the study's re-measurement measures a round; the config's median window over the
    baseline's (`promise_rounds`)."""
    rounds_error: str | None = None
    """Why a round failed, ending the check early (what it measured before is kept)."""
    latency: Latency | None = None
    """An inference config's latency of a batch here (`task: inference`)."""
    output_drift: OutputDrift | None = None
    """An inference config's outputs here against the model's in strict fp32 (`task: inference`)."""
    latency_limit_ms: float | None = None
    """The job's `objective.max_latency_ms`, which the p99 here is held to (`task: inference`)."""
    warned: str | None = None
    """What the run's processes wrote (`autotuner.trials.launcher.warning_summary`), in `log`."""
    log: str | None = None
    tolerance: float = TOLERANCE
    """How far the speedup here may be from the export's, as a factor either way, for the promise
    to be kept (`judge`)."""
    most_rounds: int = 2
    """The most rounds the promise check could run (`promise_rounds`'s `most`): where its looks'
    levels come from (`look_level`)."""

    @property
    def within_latency_limit(self) -> bool | None:
        """Whether the p99 latency of a call here is within the job's limit; None without either."""
        if self.latency is None or self.latency_limit_ms is None:
            return None
        return self.latency.p99_ms <= self.latency_limit_ms

    @property
    def run_s(self) -> float:
        """What the config's optimizer steps here (`throughput.steps_taken`) took, the framework's
        start, set-up and warm-up included, waits for the baseline's turns left out: a run of
        that many steps."""
        return self.start_s + self.setup_s + self.throughput.trained_s

    @property
    def predicted_run_s(self) -> float | None:
        """What the study predicts for a run of as many steps (`autotuner.results.run_time`), from the
        export's framework start, set-up, warm-up and throughput."""
        if self.tuned.throughput <= 0 or self.throughput.steps_taken <= 0:
            return None
        steps = self.throughput.steps_taken
        start_s = self.tuned.machine.framework_start_s or 0.0
        return predicted_run_s(
            self.tuned.metrics, self.tuned.throughput, self.throughput.samples_per_step, steps, start_s
        )

    @property
    def samples_per_s(self) -> float:
        return self.throughput.samples_per_s

    @property
    def ratio(self) -> float:
        """Applied over study throughput (medians)."""
        return self.samples_per_s / self.tuned.throughput

    @property
    def agrees(self) -> bool:
        return abs(self.ratio - 1.0) <= AGREEMENT

    @property
    def speedup(self) -> float | None:
        """The tuned config's throughput over the baseline's, both run here."""
        return self.samples_per_s / self.baseline.samples_per_s if self.baseline else None

    @property
    def promise_ratio(self) -> float | None:
        """The speedup delivered here over the one in the export."""
        return self.speedup / self.tuned.speedup if self.speedup and self.tuned.speedup else None

    @property
    def quarters(self) -> tuple[float, float] | None:
        """The config's median throughput over the first and over the last quarter of its windows,
        or None with fewer than 12 windows."""
        rates = self.throughput.window_samples_per_s
        quarter = len(rates) // 4
        if quarter < 3:
            return None
        return statistics.median(rates[:quarter]), statistics.median(rates[-quarter:])

    @property
    def slowdown(self) -> float | None:
        """How much slower the last quarter of the config's windows ran than the first (negative
        when faster), or None with fewer than 12 windows."""
        return None if self.quarters is None else 1.0 - self.quarters[1] / self.quarters[0]

    @property
    def interval(self) -> Interval | None:
        """The speedup here and its interval, from the promise check's rounds (two or more), a
        session's drift allowed for as in the study's (`stated_interval`, `session_drift`)."""
        return stated_interval(self.rounds, drift=session_drift(self.tuned.speedup_interval))

    @property
    def checked_speedup(self) -> float | None:
        """The promise check's speedup: the geometric mean of its rounds (the interval's estimate)."""
        return geometric_mean(self.rounds) if self.rounds else None

    @property
    def checked(self) -> Interval | None:
        """The speedup here with its interval at the level of the look the check stopped at
        (`checked_interval`): what `judge` judged."""
        level = look_level(len(self.rounds), self.most_rounds)
        return checked_interval(self.rounds, self.tuned.speedup_interval, level)

    @property
    def promised(self) -> Promised | None:
        """What the export promised, widened by the tolerance (`Promised`)."""
        return Promised.of(self.tuned.speedup_interval, self.tuned.speedup, self.tolerance)

    @property
    def verdict(self) -> Verdict | None:
        """Whether the promise check kept the export's promise (`judge`); None where it did not run
        (no baseline here, fewer than two rounds, or an export without a speedup)."""
        checked, promised = self.checked, self.promised
        return None if checked is None or promised is None else judge(checked, promised)

    @property
    def rounds_to_decide(self) -> int | None:
        """About how many rounds an undecided check would need (`rounds_to_decide`)."""
        promised = self.promised
        return None if promised is None else rounds_to_decide(self.rounds, self.tuned.speedup_interval, promised)

    @property
    def keeps_promise(self) -> bool | None:
        """Without a `verdict` (no promise check's rounds to judge): whether the whole run's speedup
        is within `PROMISE` of the export's; None where nothing can tell (no baseline run)."""
        ratio = self.promise_ratio
        return None if ratio is None else abs(ratio - 1.0) <= PROMISE
