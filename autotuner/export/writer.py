"""The exported best config (`runs/<name>/best.yaml`), built from the storage alone."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import yaml

from autotuner.errors import AutotunerError
from autotuner.results.records import TrialRecord, baseline, best, ranked, records, speedup, stored_reference
from autotuner.results.run_time import RunPlan, run_plan
from autotuner.spec.job import output_dir
from autotuner.study.storage import shown_url

EXPORT_VERSION = 1


class NoFeasibleConfig(AutotunerError):
    """The study has no trial that is feasible: there is nothing to export."""

    exit_code = 1


def _plain(value: Any) -> Any:
    """YAML- and JSON-safe: infinities become the string 'inf'."""
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def export_data(study: optuna.Study, storage_url: str, top: int = 0) -> dict[str, Any]:
    """Everything `best.yaml` holds, read from the study; with `top`, the `top` best feasible
    configs too (rank 1 is the best)."""
    trials = records(study)
    plan = run_plan(study.user_attrs)
    winner = best(trials, plan)
    if winner is None:
        ran = sum(t.ran for t in trials)
        raise NoFeasibleConfig(f"study {study.study_name!r} has no feasible config yet ({ran} trials ran)")
    base: TrialRecord | None = baseline(trials)
    attrs = study.user_attrs
    settings = attrs.get("autotuner", {})
    reference = stored_reference(study)
    steps = plan.optimizer_steps(trials) if plan is not None else None
    estimate: Callable[[TrialRecord], dict[str, Any]] = (
        (lambda t: plan.estimate(t, steps)) if plan is not None else (lambda t: {})
    )
    metrics = {**winner.metrics, **_measurements(winner), **estimate(winner)}
    return _plain(
        {
            "version": EXPORT_VERSION,
            "params": winner.config,
            "metrics": metrics,
            "baseline": {
                "params": base.config if base else None,
                "outcome": base.outcome if base else None,
                **(_measurements(base) if base else {"throughput": None}),
                **(estimate(base) if base else {}),
            },
            "speedup": speedup(winner, base),
            "drift": {
                "tolerance": settings.get("max_drift"),
                "reference_noise_floor": reference.noise_floor if reference else None,
                "reference_config": reference.config if reference else None,
            },
            "environment": {**attrs.get("environment", {}), "fingerprint": attrs.get("fingerprint")},
            "spec": {
                "path": settings.get("spec_path"),
                "identity": settings.get("identity"),
                "workload": settings.get("workload"),
                "global_batch": settings.get("global_batch"),
            },
            "study": {
                "name": study.study_name,
                "storage": shown_url(storage_url),
                "trial": winner.number,
                "trials_ran": sum(t.ran for t in trials),
            },
            **({"run": {**plan.as_dict(), "description": plan.describe(), "optimizer_steps": steps}} if plan else {}),
            **({"top": _top(trials, base, top, plan, estimate)} if top else {}),
        }
    )


def _measurements(t: TrialRecord) -> dict[str, Any]:
    """A config's throughput (its trial's median window, or once re-measured, the median over
    every window of its re-measurement processes) and how it was measured: each process's median
    (the trial's first), and how far apart they are."""
    return {
        "throughput": t.throughput,
        "trial_throughput": t.trial_throughput,
        "throughput_runs": t.throughputs,
        "throughput_run_spread": t.run_spread,
        "remeasured": t.remeasured is not None,
    }


def _top(
    trials: list[TrialRecord],
    base: TrialRecord | None,
    count: int,
    plan: RunPlan | None,
    estimate: Callable[[TrialRecord], dict[str, Any]],
) -> list[dict[str, Any]]:
    return [
        {
            "rank": rank,
            "trial": t.number,
            "params": t.config,
            "throughput": t.throughput,
            "speedup": speedup(t, base),
            "drift": t.metrics.get("drift"),
            "throughput_spread": t.metrics.get("throughput_spread"),
            "throughput_runs": t.throughputs,
            "throughput_run_spread": t.run_spread,
            **estimate(t),
        }
        for rank, t in enumerate(ranked(trials, plan)[:count], start=1)
    ]


def export_path(name: str, fmt: str = "yaml") -> Path:
    """Where study `name`'s export goes unless told otherwise: `runs/<name>/best.<fmt>`."""
    return output_dir(name) / f"best.{fmt}"


def write_export(data: dict[str, Any], path: Path, fmt: str = "yaml") -> Path:
    text = json.dumps(data, indent=2) + "\n" if fmt == "json" else yaml.safe_dump(data, sort_keys=False)
    return write_text(text, path)


def write_text(text: str, path: Path) -> Path:
    """Write `text` to `path` whole: through a temporary file beside it, renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # workers of one study may write it at once
    tmp.write_text(text)
    tmp.replace(path)  # a reader never sees half a file
    return path
