"""Plotly figures of a study, built from its stored trials (`autotuner.results.records.TrialRecord`).

The report (`autotuner report`) embeds them in its page, and the dashboard saves them into the
study for optuna-dashboard. Every figure is honest about what it leaves out: trials that produced
no throughput are counted in a note, infinite drift is drawn at the top of the axis and labelled,
and exact zero drift at its bottom.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from plotly.graph_objects import Bar, Box, Figure, Scatter
from plotly.subplots import make_subplots

from autotuner.backends import knob_named
from autotuner.config.knobs import ACCUMULATION, BATCH_SIZE, Config
from autotuner.output.formatting import format_config, shown_knobs, times
from autotuner.results.records import TrialRecord, ranked, speedup
from autotuner.study.names import BASELINE

THROUGHPUT_TITLE = "throughput (samples/s)"
DRIFT_TITLE = "drift (relative)"
FEASIBLE_COLOUR = "#1f77b4"
INFEASIBLE_COLOUR = "#d62728"
FRONT_COLOUR = "#2ca02c"
BASELINE_COLOUR = "#7f7f7f"
LAYOUT: dict[str, Any] = {"template": "plotly_white", "margin": {"l": 70, "r": 30, "t": 70, "b": 60}}


def measured(trials: Sequence[TrialRecord]) -> list[TrialRecord]:
    """The trials that produced a throughput (ok, or ok but drifted / over the memory limit, or nan)."""
    return [t for t in trials if t.state == "COMPLETE" and t.throughput > 0]


def ok_trials(trials: Sequence[TrialRecord]) -> list[TrialRecord]:
    """The measured trials whose run ended ok (feasible or not: drift and memory are judged after)."""
    return [t for t in measured(trials) if t.outcome == "ok"]


def fastest_feasible(trials: Sequence[TrialRecord], top: int) -> list[TrialRecord]:
    """The `top` feasible trials, fastest first, as the best is chosen (`study.ranked`)."""
    return ranked(list(trials))[:top]


def pareto_front(trials: Sequence[TrialRecord]) -> list[TrialRecord]:
    """The feasible trials no other feasible trial beats on both throughput and drift, fastest first."""
    front: list[TrialRecord] = []
    lowest = math.inf
    for t in sorted((t for t in trials if t.feasible), key=lambda t: (-t.throughput, t.drift, t.number)):
        if t.drift < lowest:
            front.append(t)
            lowest = t.drift
    return front


def drift_text(value: float) -> str:
    """Relative drift as a percentage; values too small for three decimals in scientific notation."""
    if math.isinf(value):
        return "inf"
    if 0 < value < 5e-6:
        return f"{value * 100:.1e}%"
    return f"{value:.3%}"


def trial_drift_text(t: TrialRecord) -> str:
    """A trial's drift, with the drift steps fp16's gradient scaler skipped when it skipped any
    (a skipped step is an update the reference made and the trial did not: part of the drift)."""
    if "drift" not in t.metrics:
        return "-"
    skipped = int(t.metrics.get("drift_skipped_steps") or 0)
    return drift_text(t.drift) + (f" ({skipped} of the drift steps skipped by fp16 loss scaling)" if skipped else "")


def hover(t: TrialRecord) -> str:
    drift = drift_text(t.drift) if t.state == "COMPLETE" and "drift" in t.metrics else "-"
    lines = [
        f"trial #{t.number}" + (" (baseline)" if t.role == "baseline" else ""),
        format_config(t.config),
        f"{t.throughput:,.1f} samples/s, drift {drift}",
        "feasible" if t.feasible else f"infeasible: {t.outcome}" + (f": {t.reason}" if t.reason else ""),
    ]
    # plotly renders hover text as a small HTML subset: keep the stored strings from being read as markup
    return "<br>".join(html.escape(line, quote=False) for line in lines)


def _left_out_note(trials: Sequence[TrialRecord], shown: Sequence[TrialRecord]) -> str:
    shown_numbers = {t.number for t in shown}
    counts: dict[str, int] = {}
    for t in trials:
        if t.number not in shown_numbers:
            counts[t.outcome] = counts.get(t.outcome, 0) + 1
    if not counts:
        return ""
    what = ", ".join(f"{outcome} {n}" for outcome, n in sorted(counts.items()))
    return f"not plotted (no throughput measured): {what}"


def _note(figure: Figure, text: str, y: float = -0.12) -> None:
    if text:
        figure.add_annotation(
            text=text, xref="paper", yref="paper", x=0, y=y, showarrow=False, xanchor="left", font={"size": 11}
        )


def _level(figure: Figure, y: float, text: str, colour: str, dash: str, log: bool, side: str, x: int) -> None:
    """A labelled horizontal line at drift `y`, its label just above (`bottom`) or below (`top`) it."""
    figure.add_hline(y=y, line={"color": colour, "dash": dash, "width": 1})
    # Annotations on a log axis take log10 coordinates, unlike shapes (add_hline's own label misplaces).
    figure.add_annotation(
        text=text,
        xref="paper",
        x=x,
        xanchor="left" if x == 0 else "right",
        y=math.log10(y) if log else y,
        yanchor=side,
        showarrow=False,
        font={"color": colour, "size": 11},
    )


@dataclass(frozen=True)
class _DriftAxis:
    """The pareto figure's drift axis: logarithmic when the finite positive drifts (and the
    tolerance) span more than a decade; exact zero drift drawn at its floor (on a log axis) and
    infinite drift at its ceiling."""

    log: bool
    floor: float
    ceiling: float

    @classmethod
    def of(cls, shown: Sequence[TrialRecord], tolerance: float) -> _DriftAxis:
        finite = [t.drift for t in shown if math.isfinite(t.drift)]
        positive = [d for d in finite if d > 0] + ([tolerance] if tolerance > 0 else [])
        low, high = (min(positive), max(positive)) if positive else (1e-3, 1e-2)
        if high / low > 10:
            return cls(True, low / 10, high * 10)
        return cls(False, 0.0, high * 1.3 if high > 0 else 1.0)

    def y(self, t: TrialRecord) -> float:
        if math.isinf(t.drift):
            return self.ceiling
        return self.floor if self.zero(t) else t.drift

    def zero(self, t: TrialRecord) -> bool:
        """Drawn at the floor: zero drift on a log axis."""
        return self.log and t.drift == 0

    def at_edge(self, t: TrialRecord) -> bool:
        return math.isinf(t.drift) or self.zero(t)


def _points(axis: _DriftAxis, name: str, group: list[TrialRecord], colour: str | list[str], symbol: str) -> Scatter:
    return Scatter(
        name=name,
        x=[t.throughput for t in group],
        y=[axis.y(t) for t in group],
        mode="markers",
        marker={"color": colour, "size": 10, "symbol": symbol},
        text=[hover(t) for t in group],
        hovertemplate="%{text}<extra></extra>",
        customdata=[t.number for t in group],
    )


def _colours(group: list[TrialRecord]) -> list[str]:
    return [FEASIBLE_COLOUR if t.feasible else INFEASIBLE_COLOUR for t in group]


def _marked(axis: _DriftAxis, name: str, group: list[TrialRecord], colour: str, marker: dict[str, Any]) -> Scatter:
    """A trace of its own for the front or the baseline: markers larger than the trials'."""
    return Scatter(
        name=name,
        x=[t.throughput for t in group],
        y=[axis.y(t) for t in group],
        mode="lines+markers" if name.startswith("Pareto") else "markers",
        line={"color": colour, "width": 2, "shape": "hv"},
        marker={"color": colour, "line": {"width": 2}, **marker},
        text=[hover(t) for t in group],
        hovertemplate=f"%{{text}}<extra>{name.split(' (')[0]}</extra>",
        customdata=[t.number for t in group],
    )


def pareto_figure(trials: Sequence[TrialRecord], tolerance: float) -> Figure:
    """Throughput against drift for every measured trial, the Pareto front of the feasible ones
    joined, and the drift tolerance as a horizontal line. Drift the axis cannot show (zero on a
    logarithmic axis, infinite) is drawn at its floor or ceiling, each with its own marker and a
    label, so no trial disappears off the axis (`_DriftAxis`)."""
    shown = measured(trials)
    axis = _DriftAxis.of(shown, tolerance)
    figure = Figure()
    inside = [t for t in shown if not axis.at_edge(t)]
    figure.add_trace(_points(axis, "feasible", [t for t in inside if t.feasible], FEASIBLE_COLOUR, "circle"))
    figure.add_trace(_points(axis, "infeasible", [t for t in inside if not t.feasible], INFEASIBLE_COLOUR, "x"))
    # Drift the axis cannot show gets its own trace, so the legend says where those points are drawn.
    zero = [t for t in shown if axis.zero(t)]
    if zero:
        figure.add_trace(_points(axis, "drift 0 (drawn at the axis floor)", zero, _colours(zero), "triangle-down"))
    infinite = [t for t in shown if math.isinf(t.drift)]
    if infinite:
        figure.add_trace(_points(axis, "drift inf (drawn at the top)", infinite, _colours(infinite), "triangle-up"))
    front = {"size": 14, "symbol": "diamond-open"}
    figure.add_trace(_marked(axis, "Pareto front (feasible)", pareto_front(trials), FRONT_COLOUR, front))
    base = next((t for t in shown if t.role == BASELINE), None)
    if base is not None:
        figure.add_trace(_marked(axis, "baseline", [base], BASELINE_COLOUR, {"size": 20, "symbol": "circle-open"}))
    log, floor, ceiling = axis.log, axis.floor, axis.ceiling
    _level(figure, tolerance, f"tolerance {tolerance:.2%}", INFEASIBLE_COLOUR, "dash", log, "bottom", 0)
    if infinite:
        _level(figure, ceiling, "drift = inf (nan/inf loss)", "#999999", "dot", log, "top", 1)
    if zero:
        _level(figure, floor, "drift = 0 (identical to the reference)", "#999999", "dot", log, "bottom", 1)
    figure.update_layout(
        title="Throughput against drift",
        xaxis_title=THROUGHPUT_TITLE,
        yaxis_title=DRIFT_TITLE,
        legend={"orientation": "h", "y": 1.02, "x": 1, "xanchor": "right", "yanchor": "bottom"},
        **LAYOUT,
    )
    if log:
        figure.update_yaxes(type="log", exponentformat="e", range=[math.log10(floor) - 0.3, math.log10(ceiling) + 0.3])
    else:
        figure.update_yaxes(range=[-0.05 * ceiling, ceiling * 1.1], tickformat=".2%")
    _note(figure, _left_out_note(trials, shown) if shown else "no trial has measured a throughput yet")
    return figure


def speedup_figure(trials: Sequence[TrialRecord], baseline: TrialRecord | None, top: int = 10) -> Figure:
    """The speedup over the baseline of the `top` fastest feasible configs, fastest at the top."""
    ranked = fastest_feasible(trials, top)
    figure = Figure()
    if baseline is None or baseline.throughput <= 0:
        figure.update_layout(title="Speedup over the baseline", **LAYOUT)
        _note(figure, "the baseline has no measured throughput: no speedup to show", y=0.5)
        return figure
    labels = [f"#{t.number} {format_config(t.config)}" for t in ranked]
    values = [speedup(t, baseline) for t in ranked]
    figure.add_trace(
        Bar(
            name="speedup",
            x=values,
            y=labels,
            orientation="h",
            marker={"color": [BASELINE_COLOUR if t.role == "baseline" else FEASIBLE_COLOUR for t in ranked]},
            text=[times(v) for v in values],
            textposition="auto",
            hovertext=[hover(t) for t in ranked],
            hovertemplate="%{hovertext}<extra></extra>",
            customdata=[t.number for t in ranked],
        )
    )
    figure.add_vline(
        x=1.0,
        line={"color": BASELINE_COLOUR, "dash": "dash"},
        annotation_text=f"baseline #{baseline.number}",
        annotation_position="top",
    )
    figure.update_layout(
        title=f"Speedup over the baseline (top {len(ranked)} feasible configs)",
        xaxis_title="speedup (x baseline throughput)",
        yaxis={"autorange": "reversed", "automargin": True},
        height=max(300, 60 + 34 * len(ranked)),
        **LAYOUT,
    )
    if not ranked:
        _note(figure, "no feasible config yet", y=0.5)
    return figure


def knob_value(config: Config, knob: str) -> str:
    """The knob's value as a category label; the batch size as micro-batch x accumulation."""
    if knob == BATCH_SIZE.name:
        return f"{config.get(BATCH_SIZE.name)}x{config.get(ACCUMULATION.name, 1)}"
    return str(config.get(knob))


def value_order(knob: str, trials: Sequence[TrialRecord]) -> list[str]:
    """The knob's values among `trials` as labels: in the knob table's order, or numerically."""
    values = {knob_value(t.config, knob) for t in trials if knob in t.config}
    known = knob_named(knob)
    choices = known.choices if known is not None else None
    if choices is not None:
        known = [str(c) for c in choices if str(c) in values]
        return known + sorted(values - set(known))
    numbers = {knob_value(t.config, knob): t.config.get(knob) for t in trials}
    return sorted(values, key=lambda v: (not isinstance(numbers.get(v), (int, float)), numbers.get(v) or 0, v))


def knobs_of(trials: Sequence[TrialRecord]) -> list[str]:
    """The knobs the trials' configs set, in config order, without the derived accumulation, and
    a quiet knob only where some trial moved it from its reference value (`shown_knobs`)."""
    names: dict[str, None] = {}
    for t in trials:
        names.update(dict.fromkeys(k for k in t.config if k != ACCUMULATION.name))
    shown = set(shown_knobs([t.config for t in trials]))
    return [name for name in names if name in shown]


def throughput_by_knob_figure(trials: Sequence[TrialRecord]) -> Figure:
    """One panel per knob: the throughput of every ok trial by the knob's value (box + points)."""
    ok = ok_trials(trials)
    knobs = knobs_of(ok)
    columns = max(1, len(knobs)) if len(knobs) <= 4 else 3  # four knobs fit one row; more wrap by three
    rows = max(1, math.ceil(len(knobs) / columns))
    titles = [("batch_size (micro x accumulation)" if k == BATCH_SIZE.name else k) for k in knobs]
    figure = make_subplots(rows=rows, cols=columns, subplot_titles=titles or None, horizontal_spacing=0.08)
    for index, knob in enumerate(knobs):
        row, col = index // columns + 1, index % columns + 1
        having = [t for t in ok if knob in t.config]
        values = [knob_value(t.config, knob) for t in having]
        figure.add_trace(
            Box(
                name=knob,
                x=values,
                y=[t.throughput for t in having],
                boxpoints="all",
                jitter=0.4,
                pointpos=0,
                marker={"color": FEASIBLE_COLOUR, "size": 7},
                line={"color": FEASIBLE_COLOUR},
                text=[hover(t) for t in having],
                hovertemplate="%{text}<extra></extra>",
                customdata=[t.number for t in having],
                showlegend=False,
            ),
            row=row,
            col=col,
        )
        figure.update_xaxes(
            type="category", categoryorder="array", categoryarray=value_order(knob, having), row=row, col=col
        )
        if col == 1:
            figure.update_yaxes(title_text=THROUGHPUT_TITLE, row=row, col=col)
    figure.update_layout(title="Throughput by knob value (ok trials)", height=max(350, 320 * rows), **LAYOUT)
    if not knobs:
        _note(figure, "no ok trial yet", y=0.5)
    return figure
