"""A study's trials read back from its storage, and ranked: what reports and exports see.

`records` reads every trial as a `TrialRecord` (the stored view; live Optuna trials are written
only by `autotuner.results.store`), with its config's re-measurement (`remeasure:<number>` claims,
`remeasurements`); `stored_reference` reads the fp32 reference. The ranking is here too: a
config's `speedup` over the baseline, the feasible ones `ranked`, the `best`, and which configs
are measured again before it is declared (`to_remeasure`). A search ends with them: its
`SearchSummary`.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Protocol

import optuna
from optuna.trial import FrozenTrial

from autotuner.config.knobs import Config, Params
from autotuner.measurement.interval import Interval, geometric_mean, stated_interval
from autotuner.measurement.pruning import TRIAL_NOISE
from autotuner.results.evidence import Reference, Remeasurement
from autotuner.results.standings import joint_among
from autotuner.study.names import (
    BASELINE,
    CLAIM_PREFIX,
    COLD_WARMUP,
    CONFIG,
    FEASIBLE,
    GIVEN_UP,
    OUTCOME,
    REASON,
    RECORD_ATTRS,
    REFERENCE,
    REMEASURE_CLAIM,
    ROLE,
    SEARCH,
)
from autotuner.study.optuna_adapter import study_id, study_storage
from autotuner.trials.outcomes import Outcome

Metrics = dict[str, Any]
"""A trial's metrics, stored as its user attrs: an open set of keys, the telemetry's among them
(a GPU's samplers add theirs), that the storage keeps as they are (`autotuner.results.store`
derives them)."""

REMEASURE_PREFIX = CLAIM_PREFIX + REMEASURE_CLAIM
"""The keys of the study system attrs (claims) holding the re-measurement of a trial's config."""
CUT_OFF = "its worker stopped while it ran (killed, or cut off from the storage); it is retried"
"""The reason of a trial failed for a missing heartbeat, which Optuna fails without one."""


@dataclass(frozen=True)
class TrialRecord:
    """One stored trial, as reports and exports see it."""

    number: int
    state: str
    config: Config
    params: Params
    role: str
    outcome: str
    reason: str
    feasible: bool
    metrics: Metrics = field(default_factory=dict)
    """The trial's other user attrs: what `autotuner.results.store.trial_metrics` derived."""
    remeasured: Remeasurement | None = None
    """The config's re-measurement, once done."""

    @property
    def trial_throughput(self) -> float:
        """What the trial itself measured (the Optuna value the dashboard plots)."""
        return float(self.metrics.get("throughput") or 0.0)

    @property
    def throughputs(self) -> list[float]:
        """Every measurement of the config: the trial's, then its re-measurement runs'."""
        return [self.trial_throughput, *(self.remeasured.throughputs if self.remeasured else [])]

    @property
    def rerun_windows(self) -> list[float]:
        """The rate of every window of the config's re-measurement runs."""
        return self.remeasured.rerun_windows if self.remeasured else []

    @property
    def throughput(self) -> float:
        """The config's throughput: the trial's median window, or once it is re-measured, the
        median over every window of its re-measurement processes. The trial that got it chosen
        is left out of that: where it was chosen for a lucky window, counting it would carry the
        luck into the figure."""
        windows = self.rerun_windows
        return float(statistics.median(windows)) if windows else self.trial_throughput

    @property
    def run_spread(self) -> float | None:
        """(max - min) / median of the config's processes' medians; None before it is re-measured."""
        runs = self.throughputs
        middle = statistics.median(runs)
        return (max(runs) - min(runs)) / middle if len(runs) > 1 and middle else None

    @property
    def remeasure_error(self) -> str | None:
        """Why a re-run of the config failed (it is then not declared best), or None."""
        return self.remeasured.error if self.remeasured else None

    @property
    def drift(self) -> float:
        value = self.metrics.get("drift")
        return math.inf if value in (None, "inf") else float(value)

    @property
    def ran(self) -> bool:
        """It cost a trial process (unsupported configs are decided without one; a pruned trial's
        process stopped early)."""
        return self.state == "PRUNED" or (self.state == "COMPLETE" and self.outcome != Outcome.UNSUPPORTED.value)

    @classmethod
    def from_frozen(cls, t: FrozenTrial, remeasured: Remeasurement | None = None) -> TrialRecord:
        attrs = dict(t.user_attrs)
        state = t.state.name
        return cls(
            number=t.number,
            state=state,
            config=attrs.get(CONFIG) or dict(t.params),
            params=dict(t.params),
            role=attrs.get(ROLE, SEARCH),
            outcome=attrs.get(OUTCOME, "interrupted" if state == "FAIL" else state.lower()),
            reason=attrs.get(REASON, CUT_OFF if state == "FAIL" else ""),
            feasible=bool(attrs.get(FEASIBLE, False)) and state == "COMPLETE",
            metrics={k: v for k, v in attrs.items() if k not in RECORD_ATTRS},
            remeasured=remeasured,
        )


def records(study: optuna.Study) -> list[TrialRecord]:
    """Every trial of the study, but those given up without running (`GIVEN_UP`), with their
    re-measurements and, where their warm-up found its compiles cached, the cold one
    (`with_cold_warmups`)."""
    done = remeasurements(study)
    return with_cold_warmups(
        [
            TrialRecord.from_frozen(t, done.get(t.number))
            for t in study.get_trials(deepcopy=False)
            if GIVEN_UP not in t.user_attrs
        ]
    )


def with_cold_warmups(trials: list[TrialRecord]) -> list[TrialRecord]:
    """`trials`, those whose warm-up found the study's compile cache `warm` or `partial` with
    `COLD_WARMUP`: the longest warm-up of the trials of the same compiled config (the same value
    of every knob that changes what is compiled, `autotuner.config.knobs.Knob.compiled`) that compiled
    it cold. A config differing from another only in its loader workers reuses the other's
    compiled graphs, and its warm-up takes seconds where a real run, from a cold cache, takes
    the minutes of compiling; a warm one without a cold sibling keeps its own (its
    `compile_cache` says so)."""
    from autotuner.backends import BACKENDS

    outside = {k.name for b in BACKENDS.values() for k in b.knobs.values() if not k.compiled}

    def graph(t: TrialRecord) -> tuple[tuple[str, str], ...]:
        return tuple(sorted((k, repr(v)) for k, v in t.config.items() if k not in outside))

    cold: dict[tuple[tuple[str, str], ...], float] = {}
    for t in trials:
        if t.metrics.get("compile_cache") == "cold" and isinstance(t.metrics.get("warmup_s"), (int, float)):
            cold[graph(t)] = max(cold.get(graph(t), 0.0), float(t.metrics["warmup_s"]))
    return [
        dataclasses.replace(t, metrics={**t.metrics, COLD_WARMUP: cold[graph(t)]})
        if t.metrics.get("compile_cache") in ("warm", "partial") and graph(t) in cold
        else t
        for t in trials
    ]


def remeasurements(study: optuna.Study) -> dict[int, Remeasurement]:
    """The finished re-measurements of the study, by trial number (claims `remeasure:<number>`),
    each with the configs its interval is stated jointly with (`joint_among`)."""
    found: dict[int, Remeasurement] = {}
    for key, value in study_storage(study).get_study_system_attrs(study_id(study)).items():
        if key.startswith(REMEASURE_PREFIX) and isinstance(value, dict) and value.get("status") == "done":
            found[int(key.removeprefix(REMEASURE_PREFIX))] = Remeasurement.from_dict(value)
    for number, among in joint_among(found).items():
        found[number].among = among
    return found


def stored_reference(study: optuna.Study) -> Reference | None:
    """The study's fp32 reference (its `reference` user attr), or None before it is run."""
    stored = study.user_attrs.get(REFERENCE)
    return Reference.from_dict(stored) if stored is not None else None


def speedup(trial: TrialRecord, base: TrialRecord | None) -> float | None:
    """The config's throughput over the baseline's. Once it is re-measured, the geometric mean of
    its rounds' speedups over the baseline measured beside it (`speedup_interval`'s estimate), so
    that a change in the machine's speed between rounds falls on both; None without a baseline
    throughput."""
    if trial.remeasured is not None and trial.remeasured.speedups:
        return geometric_mean(trial.remeasured.speedups)
    baseline_windows = (trial.remeasured.baseline_windows if trial.remeasured else None) or []
    if trial.rerun_windows and baseline_windows:
        return trial.throughput / float(statistics.median(baseline_windows))
    return trial.throughput / base.throughput if base is not None and base.throughput > 0 else None


def speedup_interval(trial: TrialRecord) -> Interval | None:
    """The interval of the config's `speedup` from its re-measurement's rounds
    (`autotuner.measurement.interval.stated_interval`: a session's drift allowed for), stated
    jointly with the configs it was in contention with (`Remeasurement.among`); None before two
    rounds."""
    r = trial.remeasured
    return stated_interval(r.speedups, among=r.among, drift=r.drift) if r is not None else None


class RunLength(Protocol):
    """What ranking by a real run's length reads of its plan (`autotuner.results.run_time.RunPlan`)."""

    @property
    def has_length(self) -> bool: ...

    def optimizer_steps(self, trials: list[TrialRecord]) -> float | None: ...

    def run_s(self, t: TrialRecord, steps: float | None) -> float | None: ...


def ranked(trials: list[TrialRecord], plan: RunLength | None = None) -> list[TrialRecord]:
    """The feasible trials, fastest first: with a `plan` that says how long the real run is, by
    its predicted wall time (`autotuner.results.run_time`); else by `speedup` over the baseline
    (re-measured configs by their re-measurement beside the baseline), by
    `TrialRecord.throughput` without a baseline. No config that was not measured again ranks above
    the best one that was (`measured_first`). A config whose re-measurement failed is left out:
    it is not reliable."""
    feasible = [t for t in trials if t.feasible and not t.remeasure_error]
    steps = plan.optimizer_steps(trials) if plan is not None and plan.has_length else None
    if plan is not None and steps is not None:
        return measured_first(sorted(feasible, key=lambda t: (_or_inf(plan.run_s(t, steps)), t.number)))
    base = baseline(trials)
    by_speedup = base is not None and base.throughput > 0  # else there are no speedups
    return measured_first(
        sorted(feasible, key=lambda t: (-(speedup(t, base) or 0.0) if by_speedup else -t.throughput, t.number))
    )


def measured_first(order: list[TrialRecord]) -> list[TrialRecord]:
    """`order` with the configs that were not measured again and came before the first one that
    was (the baseline counts) moved to just after it: one left out of a re-measurement for time,
    within the noise of the best in its single trial, is not declared the best over one measured
    again. Unchanged where nothing was re-measured."""
    lead = next((i for i, t in enumerate(order) if t.rerun_windows), None)
    if lead is None:
        return order
    return [order[lead], *order[:lead], *order[lead + 1 :]]


def _or_inf(value: float | None) -> float:
    return math.inf if value is None else value


def to_remeasure(trials: list[TrialRecord], top: int, plan: RunLength | None = None) -> list[TrialRecord]:
    """The configs to measure again before the best is declared: of the `top` best feasible ones
    (`ranked`, with `plan` by the run's predicted time), those within
    `autotuner.measurement.pruning.TRIAL_NOISE` of the best, and the baseline; then, once some are
    re-measured, up to `top` more whose one trial came out below the best by less than the
    machine's noise (the median spread between the processes of the re-measured configs), since
    an unlucky process can hide the best as a lucky one can crown another. The ones already
    re-measured are included: the caller skips them."""
    order = ranked(trials, plan)
    steps = plan.optimizer_steps(trials) if plan is not None and plan.has_length else None

    def figure(t: TrialRecord) -> float:
        """What is compared, higher is better: the throughput, or the run's pace (1 / run_s)."""
        if plan is None or steps is None:
            return t.throughput
        run_s = plan.run_s(t, steps)
        return 1.0 / run_s if run_s else 0.0

    chosen = [t for t in order[:top] if figure(t) >= figure(order[0]) * (1 - TRIAL_NOISE)]
    base = baseline(trials)
    if base is not None and base.outcome == Outcome.OK.value and base not in chosen:
        chosen.append(base)
    spreads = [t.run_spread for t in trials if t.remeasured is not None and t.run_spread is not None]
    if order and spreads:
        within_noise = figure(order[0]) * (1 - statistics.median(spreads))
        chosen += [t for t in order[top:] if t.remeasured is None and figure(t) >= within_noise][:top]
    return chosen


def best(trials: list[TrialRecord], plan: RunLength | None = None) -> TrialRecord | None:
    """The best config: the first of `ranked`."""
    return next(iter(ranked(trials, plan)), None)


def baseline(trials: list[TrialRecord]) -> TrialRecord | None:
    return next((t for t in trials if t.role == BASELINE and t.state == "COMPLETE"), None)


def spent_seconds(trials: list[TrialRecord]) -> float:
    return sum(float(t.metrics.get("wall_s") or 0.0) for t in trials)


@dataclass
class SearchSummary:
    """What a search ends with: the study's trials read back, the best and the baseline among
    them, the export written (None without a best), and whether it was interrupted."""

    trials: list[TrialRecord]
    best: TrialRecord | None
    baseline: TrialRecord | None
    storage_url: str
    export: str | None
    interrupted: bool = False
    artifacts: str | None = None
    """The study's artifact store's folder, where it has one (the profiles' traces)."""

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        return 0 if self.best is not None else 1
