"""The answer in the user's units end to end: a search with a `run:` and a `cost:` ranks, prints
and exports each config's predicted run time and cost."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support.studies import load_study, run_cli, write_spec


@pytest.fixture(scope="module")
def priced_search(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    workdir = tmp_path_factory.mktemp("run")
    spec = write_spec(workdir, budget={"trials": 2}, run={"epochs": 2}, cost={"per_hour": 3.0, "currency": "EUR"})
    done = run_cli("search", "--spec", str(spec), cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    return workdir, done.stdout


def test_a_search_with_a_run_and_a_cost_exports_and_prints_them(priced_search: tuple[Path, str]) -> None:
    workdir, stdout = priced_search
    export = yaml.safe_load((workdir / "runs" / "small" / "best.yaml").read_text())
    metrics, base = export["metrics"], export["baseline"]
    # the small spec's dataset: 1024 items, 2 epochs at 64 a step
    assert export["run"]["optimizer_steps"] == pytest.approx(2 * 1024 / 64)
    assert export["run"]["description"] == "a run of 2 epochs" and export["run"]["currency"] == "EUR"
    assert metrics["run_s"] > metrics["setup_s"] + metrics["warmup_s"] > 0
    for figures in (metrics, base):
        assert figures["run_s"] > 0
        assert figures["run_cost"] == pytest.approx(figures["run_s"] / 3600 * 3.0)
        assert figures["cost_per_million_samples"] == pytest.approx(1e6 / figures["throughput"] / 3600 * 3.0)
    assert metrics["dataset_items"] == 1024 and metrics["warmup_steps"] == 1
    # the framework's start, timed by the search's probe, is in every run_s
    start_s = export["environment"]["framework_start_s"]
    assert start_s > 0 and metrics["run_s"] > start_s + metrics["setup_s"] + metrics["warmup_s"]
    run_line = next(line for line in stdout.splitlines() if line.startswith("run: "))
    assert run_line.startswith("run: a run of 2 epochs: ") and "the tuned run costs" in run_line and "EUR" in run_line
    study = load_study(workdir)
    assert study.user_attrs["run"]["epochs"] == 2 and study.user_attrs["run"]["per_hour"] == 3.0
    # the export's best is the shortest run among the feasible trials
    trials = [t for t in study.trials if t.user_attrs.get("feasible")]
    assert export["study"]["trial"] in [t.number for t in trials]
