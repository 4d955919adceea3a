"""`autotuner report`: a study's evidence, read from the storage alone, as the report shows it.

`load_report` reads the study (trials as `autotuner.results.records.TrialRecord`, the study user
attrs) into a `Report`; the tables below are plain text built once from it, and
`autotuner.output.pages` lays them out as a page of HTML or markdown.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import optuna

from autotuner.config.knobs import BATCH_SIZE
from autotuner.errors import SpecError
from autotuner.output import charts
from autotuner.output.formatting import format_config, percent, rate, runs, speedup_with_interval
from autotuner.results.evidence import Reference
from autotuner.results.profiles import Profile, stored_profiles
from autotuner.results.records import (
    TrialRecord,
    baseline,
    best,
    ranked,
    records,
    speedup,
    speedup_interval,
    spent_seconds,
    stored_reference,
)
from autotuner.results.run_time import Estimate, RunPlan, money, run_plan, verdict
from autotuner.study.fingerprint import describe, fingerprint
from autotuner.study.names import FINGERPRINT, NOT_SEARCHED
from autotuner.study.storage import StudySettings, open_storage, shown_url, study_environment, study_settings
from autotuner.trials.probe import Environment
from autotuner.trials.progress import duration

FORMATS = ("html", "md")
TOP = 10

Table = tuple[list[str], list[list[str]]]
"""Column headers and rows of plain (unescaped) text."""


@dataclass(frozen=True)
class Report:
    """What a report shows, read from one study."""

    name: str
    storage_url: str
    trials: list[TrialRecord]
    settings: StudySettings
    reference: Reference | None
    """None before the study's reference has run."""
    environment: Environment
    fingerprint: str
    plan: RunPlan | None = None
    """The real run the configs are ranked for (`autotuner.results.run_time`), or None."""
    profiles: dict[int, Profile] = field(default_factory=dict)
    """The profiles stored with the study (`autotuner.search.profiling`), by trial number."""
    not_searched: dict[str, dict[str, str]] = field(default_factory=dict)
    """Knob -> value -> why the device or the workload cannot use it (`autotuner.spec.job.Job.narrow`)."""

    @cached_property
    def best(self) -> TrialRecord | None:
        return best(self.trials, self.plan)

    @cached_property
    def run_steps(self) -> float | None:
        """The real run's optimizer steps (`RunPlan.optimizer_steps`), read once for every trial."""
        return self.plan.optimizer_steps(self.trials) if self.plan is not None else None

    def estimate(self, trial: TrialRecord) -> Estimate:
        """`trial`'s predicted run time and cost (`RunPlan.estimate`); none known without a plan."""
        return self.plan.estimate(trial, self.run_steps) if self.plan is not None else Estimate()

    @cached_property
    def baseline(self) -> TrialRecord | None:
        return baseline(self.trials)

    @property
    def tolerance(self) -> float:
        return float(self.settings.max_drift or 0.01)

    def speedup(self, trial: TrialRecord) -> str:
        """Its speedup over the baseline, with its interval once re-measured in two rounds or more."""
        return speedup_with_interval(speedup(trial, self.baseline), speedup_interval(trial))


def load_report(storage_url: str, name: str, *, default: bool = False) -> Report:
    """Read study `name` from the storage, or raise a one-line SpecError saying why not."""
    if storage_url.startswith("sqlite:///"):
        database = storage_url.removeprefix("sqlite:///")
        if database not in ("", ":memory:") and not Path(database).exists():
            # Opening a missing SQLite file would create an empty database: refuse instead.
            raise SpecError(f"no study database at {database}; run autotuner search first", key="storage")
    storage = open_storage(storage_url, default=default)
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise SpecError(f"no study {name!r} in {storage_url}", key="name") from None
    attrs = study.user_attrs
    settings = study_settings(attrs)
    if settings is None:
        raise SpecError(f"study {name!r} in {storage_url} was not made by autotuner", key="name")
    environment = study_environment(attrs)
    return Report(
        name=study.study_name,
        storage_url=storage_url,
        trials=records(study),
        settings=settings,
        reference=stored_reference(study),
        environment=environment,
        fingerprint=attrs.get(FINGERPRINT) or fingerprint(environment),
        plan=run_plan(attrs),
        profiles=stored_profiles(study),
        not_searched=attrs.get(NOT_SEARCHED) or {},
    )


# ------------------------------------------------------------------ content, shared by both formats


def headline(report: Report) -> str:
    winner, base = report.best, report.baseline
    if winner is None:
        ran = sum(t.ran for t in report.trials)
        if not ran:
            return "No feasible config: no trial has run yet."
        return (
            f"No feasible config: none of the {ran} trials that ran was both ok and within the drift "
            f"tolerance{' and memory limit' if report.settings.max_memory_mb else ''}."
        )
    versus = f", {report.speedup(winner)} the baseline's {rate(base.throughput)}" if base and base.throughput else ""
    return (
        f"Best: trial #{winner.number} {format_config(winner.config)}: {rate(winner.throughput)}{versus}, "
        f"drift {charts.trial_drift_text(winner)}."
    )


def summary_table(report: Report) -> Table:
    winner, base = report.best, report.baseline
    settings, reference = report.settings, report.reference
    counts = Counter(t.outcome for t in report.trials)
    limit = settings.max_memory_mb
    plan = report.plan
    run_line = verdict(plan, report.trials, winner, base) if plan is not None and winner is not None else None
    rows = [
        ["study", f"{report.name} ({shown_url(report.storage_url)})"],
        ["workload", f"{settings.workload}, global batch {settings.global_batch}"],
        ["best config", f"#{winner.number} {format_config(winner.config)}" if winner else "none feasible"],
        ["best throughput", rate(winner.throughput) if winner else "-"],
        ["speedup over baseline", report.speedup(winner) if winner else "-"],
        *([["the run", run_line]] if run_line else []),
        ["baseline config", f"#{base.number} {format_config(base.config)}" if base else "not run yet"],
        ["baseline throughput", f"{rate(base.throughput)} ({base.outcome})" if base else "-"],
        ["drift tolerance", percent(settings.max_drift, 2)],
        [
            "reference noise floor",
            f"{charts.drift_text(reference.noise_floor)} (strict fp32, {format_config(reference.config)})"
            if reference is not None
            else "no reference run yet",
        ],
        ["memory limit", f"{limit:g} MiB" if limit else "none"],
        ["trials", f"{len(report.trials)} ({sum(t.ran for t in report.trials)} ran a process)"],
        ["feasible trials", str(sum(t.feasible for t in report.trials))],
        ["outcomes", ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "-"],
        ["trial time", f"{spent_seconds(report.trials):.1f} s"],
    ]
    return ["", ""], rows


def front_table(report: Report) -> Table:
    front = charts.pareto_front(report.trials)
    rows = [
        [f"#{t.number}", format_config(t.config), rate(t.throughput), report.speedup(t), charts.trial_drift_text(t)]
        for t in front
    ]
    return ["trial", "config", "throughput", "speedup", "drift"], rows


ESTIMATE_COLUMNS = (
    ("run time", "run_s"),
    ("run cost", "run_cost"),
    ("per million samples", "cost_per_million_samples"),
)
"""The top table's columns of `RunPlan.estimate`, shown where any config has the figure."""


def top_table(report: Report, top: int = TOP) -> Table:
    leaders = ranked(report.trials, report.plan)[:top]
    estimates = [report.estimate(t) for t in leaders]
    shown = [(column, key) for column, key in ESTIMATE_COLUMNS if any(getattr(e, key) is not None for e in estimates)]
    served = any(t.metrics.get("latency_p99_ms") is not None for t in leaders)  # an inference study
    rows = [
        [
            str(rank),
            f"#{t.number}",
            format_config(t.config),
            rate(t.throughput),
            _runs_text(t),
            report.speedup(t),
            charts.trial_drift_text(t),
            *([_latency_text(t)] if served else []),
            *(_estimate_text(key, estimate) for _, key in shown),
        ]
        for rank, (t, estimate) in enumerate(zip(leaders, estimates, strict=True), start=1)
    ]
    headers = ["rank", "trial", "config", "throughput", "runs", "speedup", "drift"]
    headers += ["latency p50 / p99"] if served else []
    return [*headers, *(column for column, _ in shown)], rows


def _latency_text(t: TrialRecord) -> str:
    """An inference trial's latency of a batch: `12.3 / 18.9 ms`."""
    p50, p99 = t.metrics.get("latency_p50_ms"), t.metrics.get("latency_p99_ms")
    return "-" if p50 is None or p99 is None else f"{float(p50):.1f} / {float(p99):.1f} ms"


def _estimate_text(key: str, estimate: Estimate) -> str:
    value = getattr(estimate, key)
    if value is None:
        return "-"
    return duration(value) if key == "run_s" else money(value, estimate.currency or "")


def _runs_text(t: TrialRecord) -> str:
    """The runs (processes) that measured a config: `1`, or each one's throughput and how far apart."""
    if t.remeasured is None:
        return "1"
    error = t.remeasure_error
    return f"{len(t.throughputs)}: {runs(t, ' / ')}" + (f"; {error}" if error else "")


def knob_tables(report: Report) -> list[tuple[str, Table]]:
    """Per knob: the best and median throughput of the ok trials at each value."""
    ok = charts.ok_trials(report.trials)
    tables = []
    for knob in charts.knobs_of(ok):
        by_value: dict[str, list[float]] = {}
        for t in (t for t in ok if knob in t.config):
            by_value.setdefault(charts.knob_value(t.config, knob), []).append(t.throughput)
        rows = [
            [value, str(len(by_value[value])), rate(max(by_value[value])), rate(statistics.median(by_value[value]))]
            for value in charts.value_order(knob, ok)
        ]
        title = "batch_size (micro x accumulation)" if knob == BATCH_SIZE.name else knob
        tables.append((title, (["value", "ok trials", "best", "median"], rows)))
    return tables


def peak_memory(peak_mb: float | None, total_mb: float | None) -> str:
    """`1,234 MiB (15% of 8,192)`: a trial's peak and the headroom it leaves, as a share of the
    device's memory (the GPU's, or the host's for a CPU), where the probe knew it."""
    if peak_mb is None:
        return "-"
    share = f" ({peak_mb / total_mb:.0%} of {total_mb:,.0f})" if total_mb else ""
    return f"{peak_mb:,.0f} MiB{share}"


def trial_table(report: Report) -> Table:
    def metric(t: TrialRecord, key: str, fmt: str) -> str:
        value = t.metrics.get(key)
        return "-" if value is None else fmt.format(value)

    rows = [
        [
            f"#{t.number}",
            t.role,
            format_config(t.config),
            t.outcome,
            "yes" if t.feasible else "no",
            t.reason,
            rate(t.throughput),
            percent(t.metrics.get("throughput_spread"), 1),
            _runs_text(t),
            charts.trial_drift_text(t),
            metric(t, "warmup_s", "{:.2f} s"),
            peak_memory(t.metrics.get("peak_memory_mb"), report.environment.memory_mb),
            _output_text(t),
        ]
        for t in sorted(report.trials, key=lambda t: t.number)
    ]
    headers = ["trial", "role", "config", "outcome", "feasible", "reason", "throughput", "spread", "runs", "drift"]
    return [*headers, "warm-up", "peak memory", "output"], rows


def _output_text(t: TrialRecord) -> str:
    """What a trial's processes wrote, in a few words, and the command that prints it all."""
    warned = t.metrics.get("warned")
    return f"warned: {warned} (autotuner logs {t.number})" if warned else "-"


def profile_pair(report: Report) -> tuple[Profile | None, Profile | None]:
    """The stored profiles of the baseline and of the best, where they were profiled."""
    base, winner = report.baseline, report.best
    return (
        report.profiles.get(base.number) if base is not None else None,
        report.profiles.get(winner.number) if winner is not None else None,
    )


def profile_table(report: Report, top: int = TOP) -> Table | None:
    """Self time per step of the operators on top in either profile, the baseline's against the
    best's; None before anything was profiled."""
    pair = [p for p in profile_pair(report) if p is not None]
    if not pair:
        return None
    names: list[str] = []
    for op in sorted((op for p in pair for op in p.operators), key=lambda op: -op.self_ms):
        if op.name not in names:
            names.append(op.name)
    headers = ["operator (self time a step)", *[f"{p.role} #{p.trial} ({p.where})" for p in pair]]

    def cell(p: Profile, name: str) -> str:
        op = next((op for op in p.operators if op.name == name), None)
        return "-" if op is None else f"{op.self_ms:.3g} ms ({op.share:.0%})"

    rows = [["total", *[f"{p.total_ms:.3g} ms" for p in pair]]]
    rows += [[name, *[cell(p, name) for p in pair]] for name in names[:top]]
    return headers, rows


def profile_note(report: Report) -> str:
    """What was profiled, what it took, where the traces are."""
    pair = [p for p in profile_pair(report) if p is not None]
    traces = "; ".join(
        f"{p.role} #{p.trial}: {p.steps} steps after its warm-up, {p.seconds:.1f} s, trace {p.artifact_name} "
        f"(artifact {p.artifact})"
        for p in pair
    )
    return (
        f"{traces}. The traces are in the study's artifact store; optuna-dashboard lists them on the study's "
        "page (with --artifact-dir), and Perfetto (ui.perfetto.dev) or chrome://tracing opens them."
    )


def not_searched_table(report: Report) -> Table:
    """The knob values left out of the search, each with its reason."""
    rows = [[knob, value, why] for knob, values in report.not_searched.items() for value, why in values.items()]
    return ["knob", "value", "why it was not searched"], rows


def environment_table(report: Report) -> Table:
    rows = [[what, value] for what, value in describe(report.environment) if what != "fingerprint"]
    return ["", ""], [*rows, ["fingerprint", report.fingerprint]]
