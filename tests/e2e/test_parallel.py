"""A study of a job that runs as two processes (DDP over gloo, one core a rank), end to end
through the CLI as a user runs it: the search with its DDP knobs, the re-measurement, the export
that carries the processes and the strategy, and `autotuner apply` of the winner across the same
two ranks. What a trial of several processes does is tests/trials/test_ranks.py's."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.test_coordination import _children, _descendants, _running, start_cli
from tests.support.helpers import _stat
from tests.support.studies import SMALL_SPEC, TINY_TRIAL, assert_applied, load_study, ran, run_cli, write_spec

DDP_SPEC: dict[str, Any] = {
    "name": "ddp",
    "processes": 2,
    "parallel": "ddp",
    "space": {
        "precision": ["fp32", "bf16"],
        "batch_size": [8, 32],
        "workers": [0],
        "compile": ["none"],
        "bucket_cap_mb": [1, 25],
        "comm_hook": ["none", "fp16", "powersgd"],
    },
    "budget": {"trials": 5, "remeasure_top": 1, "remeasure_runs": 1, "remeasure_windows": 2},
    "trial": {**TINY_TRIAL, "quiet_wait": 0, "prune_after": 0},
    "profile": {"steps": 0},
    "sampler": {"name": "random", "seed": 3},
}


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    workdir = tmp_path_factory.mktemp("ddp")
    spec = write_spec(workdir, **DDP_SPEC)
    done = run_cli("search", "--spec", str(spec), cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    return workdir, spec, done.stdout


def test_a_ddp_study_searches_its_knobs_and_exports_its_ranks(study: tuple[Path, Path, str]) -> None:
    workdir, _, stdout = study
    assert "on cpu x 2 processes (ddp)" in stdout.splitlines()[0]
    assert "re-measured" in stdout
    trials = ran(load_study(workdir, "ddp").trials)
    tried = {(t.params.get("bucket_cap_mb", 25), t.params.get("comm_hook", "none")) for t in trials}
    assert len(tried) > 1  # the DDP knobs are searched, not held
    for trial in trials:  # every config keeps the global batch over the two ranks
        config = trial.user_attrs["config"]
        assert config["batch_size"] * config["accumulation"] * 2 == SMALL_SPEC["global_batch"]
    export = yaml.safe_load((workdir / "runs" / "ddp" / "best.yaml").read_text())
    assert export["spec"]["processes"] == 2 and export["spec"]["parallel"] == "ddp"
    assert {"bucket_cap_mb", "bucket_view", "static_graph", "comm_hook"} <= set(export["params"])
    assert not {"reshard_after_forward", "offload"} & set(export["params"])


def test_apply_runs_the_winner_on_the_same_two_ranks_and_checks_the_promise(study: tuple[Path, Path, str]) -> None:
    workdir, spec, _ = study
    done = run_cli("apply", "runs/ddp/best.yaml", "--rounds", "2", "--spec", str(spec), "--steps", "4", cwd=workdir)
    assert_applied(done)
    assert "samples/s here" in done.stdout and "ratio" in done.stdout
    assert "held-out loss after 2 steps" in done.stdout


def test_kill_9_of_the_search_leaves_no_rank_alive(tmp_path: Path) -> None:
    """The fp32 reference runs on two ranks, and rank 1 hangs in its forward (rank 0 waits in its
    all-reduce): kill -9 of the search ends both ranks, and the trial process above them."""
    spec = write_spec(
        tmp_path,
        **{**DDP_SPEC, "name": "killed", "space": {**DDP_SPEC["space"], "batch_size": [8]}},
        workload="tests.support.faulty_workloads:on_rank",
        workload_args={"fault": "hang"},
        global_batch=16,
        baseline={"precision": "fp32", "batch_size": 8, "workers": 0, "compile": "none"},
    )
    search = start_cli("search", "--spec", str(spec), cwd=tmp_path)
    try:
        ranks: dict[int, str] = {}
        deadline = time.monotonic() + 120
        while len(ranks) < 2 and time.monotonic() < deadline:  # search -> fork server -> trial -> ranks
            assert search.poll() is None, search.communicate()
            time.sleep(0.2)
            ranks = _level(search.pid, 3)
        assert len(ranks) == 2, f"no two ranks under the search: {_descendants(search.pid)}"
        processes = _descendants(search.pid)
        search.kill()
        search.communicate()
    finally:
        if search.poll() is None:
            search.kill()
            search.communicate()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_running(pid, started) for pid, started in processes.items()):
        time.sleep(0.1)
    assert not [pid for pid, started in processes.items() if _running(pid, started)]


def _level(pid: int, depth: int) -> dict[int, str]:
    """The processes `depth` generations below `pid`, with their start times."""
    level = {pid: ""}
    for _ in range(depth):
        tree = _children()
        level = {child: (_stat(child) or ("", 0, ""))[2] for parent in level for child in tree.get(parent, [])}
    return level
