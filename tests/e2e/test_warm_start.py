"""A warm start: `autotuner search --warm-start runs/<other>/study.db` tries the earlier study's best
configs first, drops what this job cannot take, and counts nothing it measured; bad sources are
one line and exit 2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autotuner.results.records import ranked, records
from autotuner.search.warm_start import ORIGIN, WARM_START
from tests.support.studies import load_study, run_cli, write_spec

SPACE = {"precision": ["fp32", "bf16"], "batch_size": [16, 64], "workers": [0], "compile": ["none"]}


@pytest.fixture(scope="module")
def earlier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("earlier")
    spec = write_spec(folder, name="earlier", space=SPACE, budget={"trials": 4, "remeasure_top": 0})
    done = run_cli("search", "--spec", str(spec), cwd=folder)
    assert done.returncode == 0, done.stdout + done.stderr
    return folder


def test_the_earlier_studys_best_configs_run_first_and_are_measured_here(earlier: Path, tmp_path: Path) -> None:
    before = ranked(records(load_study(earlier, "earlier")))
    spec = write_spec(tmp_path, name="later", space=SPACE, budget={"trials": 3, "remeasure_top": 0})
    source = str(earlier / "runs" / "earlier" / "study.db")
    done = run_cli("search", "--spec", str(spec), "--warm-start", source, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warm start from earlier (sqlite:///" in done.stdout and "of its best configs are tried first" in done.stdout
    study = load_study(tmp_path, "later")
    assert study.user_attrs[WARM_START].startswith("earlier (")
    trials = sorted(records(study), key=lambda t: t.number)
    warm = [t for t in trials if ORIGIN in study.trials[t.number].user_attrs]
    assert warm and warm[0].number == 1  # right after the baseline
    best_params = {k: v for k, v in before[0].config.items() if k != "accumulation"}
    assert {k: v for k, v in warm[0].config.items() if k != "accumulation"} == best_params
    assert all(t.outcome != "unsupported" and t.throughput > 0 for t in warm)  # run and measured here
    assert study.trials[1].user_attrs[ORIGIN] == f"{study.user_attrs[WARM_START]} #{before[0].number}"


def test_configs_this_job_cannot_take_are_dropped_and_said(earlier: Path, tmp_path: Path) -> None:
    other = {**SPACE, "workers": [1]}  # every earlier config has workers=0: none is in this space
    spec = write_spec(
        tmp_path,
        name="other",
        space=other,
        baseline={"precision": "fp32", "batch_size": 16, "workers": 1, "compile": "none"},
        budget={"trials": 2, "remeasure_top": 0},
    )
    source = str(earlier / "runs" / "earlier" / "study.db")
    done = run_cli("search", "--spec", str(spec), "--warm-start", source, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    text = " ".join(done.stdout.split())
    assert re.search(r"0 of its best configs are tried first \(\d+ dropped: a knob value outside this space\)", text), (
        text
    )
    assert not any(ORIGIN in t.user_attrs for t in load_study(tmp_path, "other").trials)


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("nowhere/study.db", "is no study database"),
        ("sqlite:///{folder}/none.db", "--warm-start: no study database at"),
    ],
)
def test_a_bad_warm_start_is_one_line_and_exit_2(tmp_path: Path, source: str, fragment: str) -> None:
    spec = write_spec(tmp_path, name="cold", space=SPACE)
    done = run_cli("search", "--spec", str(spec), "--warm-start", source.format(folder=tmp_path), cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and fragment in done.stderr, done.stderr
    assert not (tmp_path / "runs" / "cold" / "study.db").exists()
