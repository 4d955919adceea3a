"""Workers that a cluster's scheduler starts: `submit_workers` submits `count` jobs through
submitit (Slurm, or its local executor on this machine), each one `autotuner search` worker of
the same spec on the same storage.

Nothing here coordinates them: they share the study through its storage exactly as workers
started by hand on several machines do (`autotuner.workers.coordination`), so a job that starts
late, is preempted or dies only changes who runs the next trial. The executor, with the cluster's
own settings (partition, time limit, GPUs a job), is the caller's: submitit's API, not re-spelled
here. submitit (`pip install 'autotuner[cluster]'`) is the caller's import; this module reads it
only to tell a Slurm executor from one on this machine.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autotuner.errors import SpecError
from autotuner.spec.job import load_spec
from autotuner.study.storage import check_storage_url

if TYPE_CHECKING:
    import submitit


class WorkerFailed(RuntimeError):
    """A submitted worker's `autotuner search` exited with another code than 0: the job fails, so
    the scheduler (Slurm's `sacct`, submitit's `job.result()`) shows it."""


@dataclass(frozen=True)
class SearchWorker:
    """One `autotuner search` worker, as a submitted job runs it (pickled by submitit)."""

    spec: str
    storage: str

    def command(self) -> list[str]:
        """The worker's command line, with the job's own Python (submitit's, on the node)."""
        return [sys.executable, "-m", "autotuner", "search", "--spec", self.spec, "--storage", self.storage]

    def __call__(self) -> None:
        # A process of its own, as `--jobs` starts its workers: its lines go to the job's log as it
        # writes them, and its exit code is the command's.
        code = subprocess.run(self.command()).returncode
        if code != 0:
            raise WorkerFailed(f"autotuner search exited with code {code}; its lines are in this job's log")


def submit_workers(
    spec_path: str | Path, storage_url: str, count: int, executor: submitit.Executor
) -> list[submitit.Job[None]]:
    """Submit `count` jobs to `executor`, each running one search worker of the spec at
    `spec_path` on the storage at `storage_url` (one array job on Slurm). The spec and the URL are
    checked first, so bad input is one SpecError line before anything is submitted; a SQLite file
    is refused where the jobs run on a cluster's nodes, which cannot share one."""
    if count < 1:
        raise SpecError(f"count must be positive, got {count}", key="count")
    spec = str(Path(spec_path).resolve())  # the job may start in another folder
    load_spec(spec)
    parsed = check_storage_url(storage_url)
    if parsed.get_backend_name() == "sqlite" and _on_cluster_nodes(executor):
        raise SpecError(
            f"{storage_url!r}: workers on a cluster's nodes cannot share a SQLite file; give a database server's "
            "URL they all reach, e.g. postgresql://user@db-host/studies",
            key="storage",
        )
    return executor.submit_array([SearchWorker(spec, storage_url)] * count)


def _on_cluster_nodes(executor: submitit.Executor) -> bool:
    """Whether `executor` runs its jobs on a cluster's nodes (Slurm), not on this machine."""
    import submitit

    return getattr(executor, "cluster", None) == "slurm" or isinstance(executor, submitit.SlurmExecutor)
