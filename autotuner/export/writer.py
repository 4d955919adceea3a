"""The exported best config (`runs/<name>/best.yaml`, `autotuner.export.file.ExportFile`), built
from the storage alone, and written whole."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import optuna
import yaml

from autotuner.errors import AutotunerError
from autotuner.export.file import (
    EXPORT_VERSION,
    Baseline,
    Drift,
    EnvironmentSection,
    ExportFile,
    Metrics,
    Ranked,
    SpecRef,
    SpeedupInterval,
    StudyRef,
)
from autotuner.results.records import (
    TrialRecord,
    baseline,
    best,
    ranked,
    records,
    speedup,
    speedup_interval,
    stored_reference,
)
from autotuner.results.run_time import run_plan
from autotuner.spec.job import output_dir
from autotuner.study.names import ENVIRONMENT, FINGERPRINT
from autotuner.study.storage import StudySettings, shown_url, study_settings


class NoFeasibleConfig(AutotunerError):
    """The study has no trial that is feasible: there is nothing to export."""

    exit_code = 1


def export_data(study: optuna.Study, storage_url: str, top: int = 0) -> ExportFile:
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
    settings = study_settings(attrs) or StudySettings()
    reference = stored_reference(study)
    steps = plan.optimizer_steps(trials) if plan is not None else None

    def estimate(t: TrialRecord) -> dict[str, Any]:
        return plan.estimate(t, steps).as_dict() if plan is not None else {}

    return ExportFile(
        version=EXPORT_VERSION,
        params=winner.config,
        metrics=Metrics(**{**winner.metrics, **_measured(winner), **estimate(winner)}),
        baseline=Baseline(params=base.config, outcome=base.outcome, **_measured(base), **estimate(base))
        if base is not None
        else Baseline(),
        speedup=speedup(winner, base),
        speedup_interval=_interval(winner, base),
        drift=Drift(
            tolerance=settings.max_drift,
            reference_noise_floor=reference.noise_floor if reference else None,
            reference_config=reference.config if reference else None,
        ),
        environment=EnvironmentSection(**{**attrs.get(ENVIRONMENT, {}), FINGERPRINT: attrs.get(FINGERPRINT)}),
        spec=SpecRef(
            path=settings.spec_path,
            identity=settings.identity or "",
            workload=settings.workload,
            global_batch=settings.global_batch,
            processes=settings.processes or 1,
            nodes=settings.nodes,
            rendezvous=settings.rendezvous,
            parallel=settings.parallel,
            task=settings.task,
        ),
        study=StudyRef(
            name=study.study_name,
            storage=shown_url(storage_url),
            trial=winner.number,
            trials_ran=sum(t.ran for t in trials),
        ),
        run={**plan.as_dict(), "description": plan.describe(), "optimizer_steps": steps} if plan else None,
        top=[
            Ranked(
                rank=rank,
                trial=t.number,
                params=t.config,
                speedup=speedup(t, base),
                speedup_interval=_interval(t, base),
                drift=t.metrics.get("drift"),
                throughput_spread=t.metrics.get("throughput_spread"),
                **{**_measured(t), **estimate(t)},
            )
            for rank, t in enumerate(ranked(trials, plan)[:top], start=1)
        ]
        if top
        else None,
    )


def _interval(t: TrialRecord, base: TrialRecord | None) -> SpeedupInterval | None:
    """The interval of `t`'s speedup over the baseline (two rounds of re-measurement or more)."""
    interval = speedup_interval(t) if base is not None else None
    return SpeedupInterval.model_validate(interval.as_dict()) if interval is not None else None


def _measured(t: TrialRecord) -> dict[str, Any]:
    """A config's throughput (its trial's median window, or once re-measured, the median over
    every window of its re-measurement processes) and how it was measured: each process's median
    (the trial's first), and how far apart they are (`autotuner.export.file.Measured`)."""
    return {
        "throughput": t.throughput,
        "trial_throughput": t.trial_throughput,
        "throughput_runs": t.throughputs,
        "throughput_run_spread": t.run_spread,
        "remeasured": t.remeasured is not None,
    }


def export_path(name: str, fmt: str = "yaml") -> Path:
    """Where study `name`'s export goes unless told otherwise: `runs/<name>/best.<fmt>`."""
    return output_dir(name) / f"best.{fmt}"


def write_export(export: ExportFile, path: Path, fmt: str = "yaml") -> Path:
    """Write `export` to `path` as YAML or JSON (`fmt`), whole (`write_text`)."""
    data = export.as_data()
    text = json.dumps(data, indent=2) + "\n" if fmt == "json" else yaml.safe_dump(data, sort_keys=False)
    return write_text(text, path)


def write_text(text: str, path: Path) -> Path:
    """Write `text` to `path` whole: through a temporary file beside it, renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # workers of one study may write it at once
    tmp.write_text(text)
    tmp.replace(path)  # a reader never sees half a file
    return path
