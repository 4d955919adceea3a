"""`submit_workers` refuses what cannot work before it submits anything, and each job it submits
runs one `autotuner search` worker. The workers themselves, through submitit's local executor,
are tests/e2e/test_cluster.py's."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from typing import Any

import pytest

from autotuner.errors import SpecError
from autotuner.workers.cluster import SearchWorker, submit_workers
from tests.support.studies import write_spec


class Executor:
    """A stand-in for a submitit executor: it records what is submitted, one job a function."""

    def __init__(self, cluster: str):
        self.cluster = cluster
        self.submitted: list[Any] = []

    def submit_array(self, fns: list[Any]) -> list[Any]:
        self.submitted.extend(fns)
        return list(fns)


def test_a_worker_is_the_search_command_and_pickles(tmp_path: Path) -> None:
    worker = SearchWorker(str(tmp_path / "job.yaml"), "postgresql://db-host/studies")
    assert pickle.loads(pickle.dumps(worker)) == worker
    assert worker.command() == [
        sys.executable,
        *("-m", "autotuner", "search", "--spec", str(tmp_path / "job.yaml")),
        *("--storage", "postgresql://db-host/studies"),
    ]


def test_count_jobs_of_the_spec_by_its_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_spec(tmp_path)
    monkeypatch.chdir(tmp_path)
    executor = Executor(cluster="slurm")
    assert len(submit_workers("small.yaml", "postgresql://db-host/studies", 3, executor)) == 3  # type: ignore[arg-type]
    assert {worker.spec for worker in executor.submitted} == {str(tmp_path / "small.yaml")}
    on_this_machine = Executor(cluster="local")  # submitit's local executor: its workers may share a SQLite file
    submit_workers("small.yaml", f"sqlite:///{tmp_path}/shared.db", 2, on_this_machine)  # type: ignore[arg-type]
    assert len(on_this_machine.submitted) == 2


@pytest.mark.parametrize(
    ("spec", "storage", "count", "words"),
    [
        ("small.yaml", "sqlite:///shared.db", 2, ["cannot share a SQLite file", "postgresql://"]),
        ("small.yaml", "grpc://proxy:13000", 2, ["gRPC storage proxy"]),
        ("small.yaml", "not a url", 2, ["not a SQLAlchemy database URL"]),
        ("missing.yaml", "postgresql://db-host/studies", 2, ["missing.yaml"]),
        ("small.yaml", "postgresql://db-host/studies", 0, ["count must be positive"]),
    ],
    ids=["sqlite on slurm", "grpc", "bad url", "no spec", "no workers"],
)
def test_refused_before_anything_is_submitted(
    tmp_path: Path, spec: str, storage: str, count: int, words: list[str]
) -> None:
    write_spec(tmp_path)
    executor = Executor(cluster="slurm")
    with pytest.raises(SpecError) as refused:
        submit_workers(tmp_path / spec, storage, count, executor)  # type: ignore[arg-type]
    assert executor.submitted == [] and "\n" not in str(refused.value)
    for word in words:
        assert word in str(refused.value)
