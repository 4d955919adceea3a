"""The report's page (`autotuner report`): a `autotuner.output.report.Report`'s tables and charts
laid out as HTML or markdown, and written whole. The HTML page is self-contained (plotly.js
inlined once, no external CSS, JS or fonts), so it opens offline; the markdown, for a pull-request
comment, gives the charts' key numbers as tables.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotuner.output import charts
from autotuner.output.formatting import percent
from autotuner.output.report import (
    TOP,
    Report,
    Table,
    environment_table,
    front_table,
    headline,
    knob_tables,
    not_searched_table,
    profile_note,
    profile_table,
    summary_table,
    top_table,
    trial_table,
)
from autotuner.spec.job import output_dir


def report_path(name: str, fmt: str = "html") -> Path:
    """Where study `name`'s report goes unless told otherwise: `runs/<name>/report.<fmt>`."""
    return output_dir(name) / f"report.{fmt}"


def write_report(report: Report, path: Path, fmt: str = "html") -> Path:
    text = render_html(report) if fmt == "html" else render_markdown(report)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)  # a reader never sees half a file
    return path


# ------------------------------------------------------------------ HTML

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2em auto; max-width: 1280px;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
td.num { text-align: right; white-space: nowrap; }
tr.infeasible td { color: #8a1f1f; background: #fff6f6; }
.headline { font-size: 1.1em; padding: 0.6em 1em; border-left: 4px solid #2ca02c; background: #f3faf3; }
.headline.none { border-color: #d62728; background: #fdf3f3; }
.chart { margin: 0.5em 0; }
.scroll { overflow-x: auto; }
code { font-size: 0.95em; }
"""

_NUMERIC = {
    "throughput",
    "speedup",
    "drift",
    "spread",
    "warm-up",
    "peak memory",
    "best",
    "median",
    "ok trials",
    "run time",
    "run cost",
    "per million samples",
}


def html_table(table: Table, row_classes: Sequence[str] | None = None) -> str:
    headers, rows = table
    numeric = [h in _NUMERIC for h in headers]
    head = "" if not any(headers) else "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in headers) + "</tr>"
    body = []
    for index, row in enumerate(rows):
        cls = f' class="{row_classes[index]}"' if row_classes and row_classes[index] else ""
        cells = "".join(
            f"<td{' class=num' if numeric[i] else ''}>{html.escape(cell)}</td>" for i, cell in enumerate(row)
        )
        body.append(f"<tr{cls}>{cells}</tr>")
    return f'<div class="scroll"><table>{head}{"".join(body)}</table></div>'


def _plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    # plotly.js names CDN defaults for map traces these charts never draw; `\/` keeps the
    # strings the same in JS while the page holds no CDN address at all.
    return get_plotlyjs().replace("https://cdn", "https:\\/\\/cdn")


def _figure_html(figure: Any, div_id: str) -> str:
    body: str = figure.to_html(
        full_html=False,
        include_plotlyjs=False,
        div_id=div_id,
        default_height=figure.layout.height or 450,
        config={"displaylogo": False, "responsive": True},
    )
    return f'<div class="chart">{body}</div>'


def render_html(report: Report) -> str:
    trials = report.trials
    table = trial_table(report)
    sections = [
        f"<h1>autotuner report: {html.escape(report.name)}</h1>",
        f'<p class="headline{"" if report.best else " none"}">{html.escape(headline(report))}</p>',
        "<h2>Summary</h2>",
        html_table(summary_table(report)),
        "<h2>Pareto front: throughput against drift</h2>",
        "<p>Every trial that measured a throughput; the feasible trials no other feasible trial beats on "
        "both throughput and drift are joined. The dashed line is the drift tolerance.</p>",
        _figure_html(charts.pareto_figure(trials, report.tolerance), "pareto"),
        html_table(front_table(report)),
        "<h2>Speedup of the top configs</h2>",
        _figure_html(charts.speedup_figure(trials, report.baseline, TOP), "speedup"),
        "<h2>Effect of each knob</h2>",
        _figure_html(charts.throughput_by_knob_figure(trials), "knobs"),
        f"<h2>All trials ({len(trials)})</h2>",
        html_table(table, ["" if t.feasible else "infeasible" for t in sorted(trials, key=lambda t: t.number)]),
        *(
            [
                "<h2>Profile: where a step's time goes</h2>",
                f"<p>{html.escape(profile_note(report))}</p>",
                html_table(profiled),
            ]
            if (profiled := profile_table(report))
            else []
        ),
        *(["<h2>Not searched</h2>", html_table(not_searched_table(report))] if report.not_searched else []),
        "<h2>Environment</h2>",
        html_table(environment_table(report)),
    ]
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>autotuner report: {html.escape(report.name)}</title>",
            f"<style>{STYLE}</style>",
            f'<script type="text/javascript">{_plotly_js()}</script>',
            "</head><body>",
            *sections,
            "</body></html>",
            "",
        ]
    )


# ------------------------------------------------------------------ markdown


def _md_cell(text: str) -> str:
    return html.escape(" ".join(text.split()), quote=False).replace("|", "\\|") or " "


def md_table(table: Table) -> str:
    headers, rows = table
    lines = ["| " + " | ".join(_md_cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_md_cell(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _md_details(summary: str, body: str) -> str:
    """A folded section: GitHub renders the table inside once a blank line sets it apart."""
    return f"<details><summary>{html.escape(summary)}</summary>\n\n{body}\n\n</details>"


def render_markdown(report: Report) -> str:
    front, top = front_table(report), top_table(report)
    parts = [
        f"## autotuner report: {_md_cell(report.name)}",
        f"**{_md_cell(headline(report))}**",
        md_table(summary_table(report)),
        f"### Pareto front (feasible trials, drift tolerance {percent(report.tolerance, 2)})",
        md_table(front) if front[1] else "No feasible trial.",
        f"### Top {TOP} speedups over the baseline",
        md_table(top) if top[1] else "No feasible trial.",
        "### Throughput by knob value (ok trials)",
    ]
    knobs = knob_tables(report)
    parts += [f"**{_md_cell(title)}**\n\n{md_table(table)}" for title, table in knobs] or ["No ok trial."]
    if (profiled := profile_table(report)) is not None:
        parts += ["### Profile: where a step's time goes", _md_cell(profile_note(report)), md_table(profiled)]
    parts += [
        _md_details(f"All trials ({len(report.trials)})", md_table(trial_table(report))),
        *([_md_details("Not searched", md_table(not_searched_table(report)))] if report.not_searched else []),
        _md_details("Environment", md_table(environment_table(report))),
    ]
    return "\n\n".join(parts) + "\n"
