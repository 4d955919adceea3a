"""What optuna-dashboard shows of a study, and `autotuner dashboard` to serve it.

The dashboard reads everything from the storage: the metric names (axes of its Pareto front),
each trial's user attrs (metrics, outcome, reason) and `constraints` system attr (infeasible
trials are drawn as infeasible). `publish` adds what the dashboard cannot compute itself: a
markdown study note with the summary, and charts saved into the study as plotly figures.
"""

from __future__ import annotations

import optuna

from autotuner.output.formatting import format_config, percent, rate, runs, speedup_with_interval
from autotuner.results.records import baseline, best, records, speedup, speedup_interval, stored_reference
from autotuner.results.run_time import run_plan, verdict
from autotuner.study.fingerprint import fingerprint
from autotuner.study.names import FINGERPRINT
from autotuner.study.storage import StudySettings, study_environment, study_settings

CHARTS = ("throughput-by-knob", "pareto-front")


def study_note(study: optuna.Study) -> str:
    """The markdown summary shown as the study's note."""
    trials = records(study)
    attrs = study.user_attrs
    plan = run_plan(attrs)
    winner, base = best(trials, plan), baseline(trials)
    settings, environment = study_settings(attrs) or StudySettings(), study_environment(attrs)
    reference = stored_reference(study)
    lines = [f"## autotuner: {study.study_name}", ""]
    if winner is None:
        lines.append("**No feasible config yet**: every trial so far failed or drifted past the tolerance.")
    else:
        ratio = speedup(winner, base)
        versus = f", **{speedup_with_interval(ratio, speedup_interval(winner))}** the baseline" if ratio else ""
        lines.append(
            f"**Best:** trial #{winner.number}, `{format_config(winner.config)}`: "
            f"{rate(winner.throughput)}{versus}, drift {percent(winner.metrics.get('drift'))}"
        )
        if plan is not None and (line := verdict(plan, trials, winner, base)):
            lines.append(f"\n**The run:** {line}")
    if base is not None:
        lines.append(
            f"\n**Baseline:** trial #{base.number}, `{format_config(base.config)}`: "
            f"{rate(base.throughput)} ({base.outcome})"
        )
    remeasured = [t for t in trials if t.remeasured is not None]
    if remeasured:
        lines += [
            "",
            "**Re-measured** before the best was declared (each process's median; the throughput is "
            "the median over every window of them; the speedup, the geometric mean of each round's "
            "speedup over the baseline beside it, with its 90% interval from two rounds on):",
            "",
        ]
        for t in sorted(remeasured, key=lambda t: -t.throughput):
            error = t.remeasure_error
            shown = f"- #{t.number} `{format_config(t.config)}`: {runs(t)}"
            if t.remeasured is not None and t.remeasured.speedups and not error:
                shown += f"; speedup {speedup_with_interval(speedup(t, base), speedup_interval(t))}"
            lines.append(shown + (f", **{error}**" if error else ""))
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.outcome] = counts.get(t.outcome, 0) + 1
    lines += [
        "",
        "| | |",
        "|---|---|",
        f"| drift tolerance | {percent(settings.max_drift)} |",
        f"| reference noise floor | {percent(reference.noise_floor if reference else None)} "
        f"(strict fp32, `{format_config(reference.config if reference else {})}`) |",
        f"| memory limit | {f'{limit:g} MiB' if (limit := settings.max_memory_mb) else 'none'} |",
        f"| trials ran | {sum(t.ran for t in trials)} |",
        f"| outcomes | {', '.join(f'{k} {v}' for k, v in sorted(counts.items()))} |",
        f"| workload | `{settings.workload}`, global batch {settings.global_batch} |",
        f"| device | {environment.device}: {environment.device_name} |",
        f"| versions | {', '.join(f'{k} {v}' for k, v in environment.versions.items() if v)} |",
        f"| fingerprint | `{attrs.get(FINGERPRINT) or fingerprint(environment)}` |",
        "",
        "Each trial's metrics, outcome and reason are its user attributes; infeasible trials "
        "(failed, or drift or memory over the limit) are marked infeasible in the plots. A pruned "
        "trial stopped after its first windows, which are its intermediate values; its drift was not measured.",
    ]
    return "\n".join(lines)


def publish(study: optuna.Study) -> None:
    """Write the note and the charts into the study (overwriting earlier versions)."""
    from optuna_dashboard import save_note, save_plotly_graph_object

    from autotuner.output.charts import pareto_figure, throughput_by_knob_figure

    save_note(study, study_note(study))
    trials = records(study)
    settings = study_settings(study.user_attrs)
    tolerance = float(settings.max_drift if settings is not None and settings.max_drift is not None else 0.01)
    figures = {
        "throughput-by-knob": throughput_by_knob_figure(trials),
        "pareto-front": pareto_figure(trials, tolerance),
    }
    for graph_id in CHARTS:
        save_plotly_graph_object(study, figures[graph_id], graph_object_id=graph_id)


def serve(storage_url: str, host: str, port: int) -> None:
    """Run the real optuna-dashboard on `host:port` until interrupted."""
    from optuna_dashboard import run_server

    from autotuner.study.storage import open_storage

    storage = open_storage(storage_url)
    print(f"optuna-dashboard for {storage_url} on http://{host}:{port}/ (Ctrl-C stops it)", flush=True)
    run_server(storage, host=host, port=port)
