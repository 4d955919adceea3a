"""The answer in the user's units: each config's predicted wall time for the real training run
(`run:` in the spec) and what it costs (`cost:`).

A trial measures a config's pace in its windows (`TrialRecord.throughput`, its re-measurement's
where it was re-measured) and what comes before the first timed step: building the workload and
applying the config (`setup_s`), and the warm-up steps with whatever compilation or jit they
paid for (`warmup_s`; `compile_cache` says whether the compile cache was cold or warm). Before
both, every config alike, comes the framework's start: the interpreter and the framework's
import (`start_s`: the environment's `framework_start_s`, timed as the probe, the first trial
process, waits for the fork server that imports the framework). A run of N optimizer steps is predicted to take

    run_s = start_s + setup_s + warmup_s + max(0, N - warmup_steps) * global_batch / throughput

A real run starts from a cold compile cache: where a trial's warm-up found its compiles cached
(another trial of the same compiled config, loader workers aside, had compiled them), the warm-up
of that cold trial stands in for its own (`autotuner.results.records.with_cold_warmups`).

N is `run.steps`; for `run.epochs`, the epochs' samples (the dataset's items each) over the
global batch; for `run.hours`, the steps the baseline takes in that many hours, so the
baseline's `run_s` is those hours and every other config's says what the same training costs
with it.

With `cost.per_hour`, a run costs `run_s` hours at that rate; a million samples (and tokens, where
the workload declares tokens per sample) cost the hours they take at the config's throughput.
Where NVML gave energy per sample, the run's energy is that over the run's samples, in kWh.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, SupportsFloat

from autotuner.results.records import TrialRecord, baseline, ranked
from autotuner.spec.job import Job
from autotuner.study.names import COLD_WARMUP, ENERGY, RUN
from autotuner.trials.progress import duration


@dataclass(frozen=True)
class RunPlan:
    """The real run (one of `steps`, `epochs`, `hours`, or none) and the machine's hourly cost."""

    global_batch: int
    steps: int | None = None
    epochs: float | None = None
    hours: float | None = None
    per_hour: float | None = None
    currency: str = "USD"
    start_s: float = 0.0
    """The framework's start on this machine (see the module)."""

    @classmethod
    def from_job(cls, job: Job, start_s: float = 0.0) -> RunPlan | None:
        """The spec's `run` and `cost`; None when it has neither."""
        run, cost = job.spec.run, job.spec.cost
        if run is None and cost is None:
            return None
        return cls(
            global_batch=job.spec.global_batch,
            start_s=start_s,
            steps=run.steps if run else None,
            epochs=run.epochs if run else None,
            hours=run.hours if run else None,
            per_hour=cost.per_hour if cost else None,
            currency=cost.currency if cost else "USD",
        )

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> RunPlan | None:
        """From the study's `autotuner.study.names.RUN` attr; None when it holds none."""
        if not isinstance(data, dict) or not data.get("global_batch"):
            return None
        known = {k: data.get(k) for k in ("steps", "epochs", "hours", "per_hour")}
        return cls(
            global_batch=int(data["global_batch"]),
            currency=str(data.get("currency") or "USD"),
            start_s=float(data.get("start_s") or 0.0),
            **known,
        )

    @property
    def has_length(self) -> bool:
        """Whether it says how long the run is (else it only prices an hour)."""
        return any(v is not None for v in (self.steps, self.epochs, self.hours))

    def describe(self) -> str:
        """`a run of 10,000 steps`, `a run of 3 epochs`, `the baseline's 10 hours`."""
        if self.steps is not None:
            return f"a run of {self.steps:,} steps"
        if self.epochs is not None:
            return f"a run of {self.epochs:g} epochs"
        if self.hours is not None:
            return f"the baseline's {self.hours:g} hours of training"
        return "no run length"

    def optimizer_steps(self, trials: list[TrialRecord]) -> float | None:
        """The run's optimizer steps; None when the trials cannot tell them (no dataset size for
        `epochs`, no measured baseline for `hours`)."""
        if self.steps is not None:
            return float(self.steps)
        if self.epochs is not None:
            items = next((t.metrics["dataset_items"] for t in trials if t.metrics.get("dataset_items")), None)
            return self.epochs * float(items) / self.global_batch if items else None
        if self.hours is not None:
            base = baseline(trials)
            if base is None or base.throughput <= 0:
                return None
            # the baseline's run lasts `hours`: its set-up and warm-up, then steps at its pace
            left_s = self.hours * 3600 - self.start_s - _before_steps_s(base.metrics)
            return _warmup_steps(base.metrics) + max(0.0, left_s) * base.throughput / self.global_batch
        return None

    def run_s(self, t: TrialRecord, steps: float | None) -> float | None:
        """`t`'s predicted wall time for a run of `steps` optimizer steps (see the module); None
        without steps or a throughput."""
        if steps is None or t.throughput <= 0:
            return None
        return predicted_run_s(t.metrics, t.throughput, self.global_batch, steps, self.start_s)

    def pace_to_win(self, trials: list[TrialRecord], warmup_steps: int) -> float | None:
        """The throughput at which the run's timed steps alone (its steps less `warmup_steps`) take
        as long as the best of `trials`' whole predicted run: a config slower than that cannot win,
        however little its set-up and warm-up cost. None without a run length or a best."""
        steps = self.optimizer_steps(trials)
        leader = next(iter(ranked(trials, self)), None)
        best_run_s = self.run_s(leader, steps) if leader is not None else None
        if steps is None or not best_run_s:
            return None
        return max(0.0, steps - warmup_steps) * self.global_batch / best_run_s

    def estimate(self, t: TrialRecord, steps: float | None) -> Estimate:
        """What `t` is predicted to take and cost, the figures that are known (`Estimate`)."""
        run_s = self.run_s(t, steps)
        costs = self.per_hour is not None and t.throughput > 0
        per_hour = self.per_hour or 0.0
        tokens = t.metrics.get("tokens_per_s")
        # the config's tokens per sample, at the throughput that ranks it
        per_sample = float(tokens) / t.trial_throughput if tokens and t.trial_throughput > 0 else 0.0
        energy = t.metrics.get(ENERGY)
        return Estimate(
            run_s=run_s,
            run_steps=steps if run_s is not None else None,
            run_cost=run_s / 3600 * per_hour if costs and run_s is not None else None,
            cost_per_million_samples=1e6 / t.throughput / 3600 * per_hour if costs else None,
            cost_per_million_tokens=1e6 / (t.throughput * per_sample) / 3600 * per_hour
            if costs and per_sample > 0
            else None,
            currency=self.currency if costs else None,
            run_energy_kwh=float(energy) * steps * self.global_batch / 3.6e6
            if steps is not None and isinstance(energy, (int, float))
            else None,
        )


@dataclass(frozen=True)
class Estimate:
    """What a config's run is predicted to take and cost (`RunPlan.estimate`): None where it is not
    known (no run length, no price, no energy counter)."""

    run_s: float | None = None
    """The run's time, start and warm-up included (`RunPlan.run_s`)."""
    run_steps: float | None = None
    """The optimizer steps it is for."""
    run_cost: float | None = None
    """Its price at `cost.per_hour`, in `currency`."""
    cost_per_million_samples: float | None = None
    cost_per_million_tokens: float | None = None
    """Where the workload counts tokens."""
    currency: str | None = None
    run_energy_kwh: float | None = None
    """Where the device counts energy."""

    def as_dict(self) -> dict[str, object]:
        """The figures that are known, as an export's metrics hold them."""
        return {k: v for k, v in asdict(self).items() if v is not None}


def predicted_run_s(
    metrics: Mapping[str, object], throughput: float, global_batch: int, steps: float, start_s: float = 0.0
) -> float:
    """The formula of the module: the framework's `start_s`, a config's measured `setup_s` and
    warm-up (its metrics, as a trial or an export holds them; from a cold compile cache where one
    is known), then the steps after its `warmup_steps` at `throughput`."""
    return start_s + _before_steps_s(metrics) + max(0.0, steps - _warmup_steps(metrics)) * global_batch / throughput


def _before_steps_s(metrics: Mapping[str, object]) -> float:
    warmup = metrics.get(COLD_WARMUP, metrics.get("warmup_s"))
    return _number(metrics.get("setup_s")) + _number(warmup)


def _warmup_steps(metrics: Mapping[str, object]) -> int:
    return int(_number(metrics.get("warmup_steps")))


def _number(value: object) -> float:
    """A figure of a trial's metrics, 0 where it has none."""
    if value is None:
        return 0.0
    if not isinstance(value, SupportsFloat | str):
        raise TypeError(f"not a number: {value!r}")
    return float(value or 0.0)


def run_plan(study_attrs: Mapping[str, Any]) -> RunPlan | None:
    """The `RunPlan` a study's latest search was started with (its user attrs), or None."""
    return RunPlan.from_dict(study_attrs.get(RUN))


def verdict(plan: RunPlan, trials: list[TrialRecord], best: TrialRecord, base: TrialRecord | None) -> str | None:
    """One line: what the best config's run takes and costs against the baseline's, e.g.
    `a run of 10,000 steps: 3m12s instead of 13m05s, 0.13 USD instead of 0.55 USD`; None when
    nothing of it is known."""
    steps = plan.optimizer_steps(trials)
    ours, theirs = plan.estimate(best, steps), plan.estimate(base, steps) if base is not None else Estimate()
    parts = []
    if ours.run_s is not None:
        instead = f" instead of {duration(theirs.run_s)}" if theirs.run_s is not None else ""
        parts.append(duration(ours.run_s) + instead)
    if ours.run_cost is not None:
        parts.append(
            f"the tuned run costs {money(ours.run_cost, plan.currency)}"
            + (f" instead of {money(theirs.run_cost, plan.currency)}" if theirs.run_cost is not None else "")
        )
    elif ours.cost_per_million_samples is not None:
        parts.append(f"{money(ours.cost_per_million_samples, plan.currency)} per million samples")
    if not parts:
        return None
    return (f"{plan.describe()}: " if plan.has_length else "") + ", ".join(parts)


def money(value: float, currency: str) -> str:
    """`0.13 USD`; amounts under a cent keep three significant digits."""
    return f"{value:,.2f} {currency}" if value >= 0.01 else f"{value:.3g} {currency}"
