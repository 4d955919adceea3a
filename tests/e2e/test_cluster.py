"""Workers that a cluster's scheduler starts (`autotuner.workers.cluster`), end to end through
submitit's local executor: two submitted jobs, each a real `autotuner search` worker, share one
PostgreSQL study as jobs on a Slurm cluster's nodes do, and run its budget once between them.

Needs AUTOTUNER_TEST_POSTGRES_URL (tests/conftest.py: skipped without it, failed in CI)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import optuna
import pytest

from autotuner.config.knobs import config_key
from autotuner.workers.cluster import submit_workers
from tests.conftest import postgres_url
from tests.support.helpers import ROOT
from tests.support.studies import TINY_TRIAL, ran, trial_processes, write_spec

submitit = pytest.importorskip("submitit")


def test_two_submitted_workers_share_one_study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url, name, budget = postgres_url(), f"cluster_{uuid.uuid4().hex[:12]}", 3
    spec = write_spec(
        tmp_path,
        name=name,
        workload="tests.support.study_workloads:counted_mlp",
        workload_args={"folder": str(tmp_path), "features": 16, "hidden": 32, "depth": 2, "samples": 256},
        global_batch=32,
        baseline={"precision": "fp32", "batch_size": 8, "workers": 0, "compile": "none"},
        space={"precision": ["fp32", "bf16"], "batch_size": [8, 16, 32], "workers": [0], "compile": ["none"]},
        budget={"trials": budget},
        trial=TINY_TRIAL,
    )
    monkeypatch.chdir(tmp_path)  # the jobs start here: runs/<name>/ lands in tmp_path
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    executor = submitit.LocalExecutor(folder=tmp_path / "submitit")
    executor.update_parameters(timeout_min=5)  # the local executor's default is 2 minutes
    try:
        jobs = submit_workers(spec, url, 2, executor)
        assert len(jobs) == 2
        for job in jobs:
            try:
                job.result()
            except Exception:
                pytest.fail(f"job {job.job_id} failed:\n{job.stdout()}\n{job.stderr()}")
        trials = optuna.load_study(study_name=name, storage=url).get_trials()
    finally:
        try:
            optuna.delete_study(study_name=name, storage=url)
        except KeyError:
            pass
    done = ran(trials)
    assert len(done) == budget, [(t.number, t.state, t.user_attrs) for t in trials]
    keys = [config_key(t.params) for t in done]
    assert len(set(keys)) == len(keys), "a config ran twice"
    assert [t.user_attrs["role"] for t in done].count("baseline") == 1
    # the reference's two runs, once for the study, and the trials: nothing ran twice across the jobs
    trained = (tmp_path / "trained").read_text().splitlines()
    assert len(trained) == 2 + trial_processes(trials)
    # each job's log is its worker's lines: both searched this study on the PostgreSQL server
    assert all(f"{name}: tests.support.study_workloads:counted_mlp" in (job.stdout() or "") for job in jobs)
