"""`autotuner search --jobs N`: one search worker per GPU of this machine, all on one study.

Worker i is an `autotuner search` subprocess with `--device cuda:<i>`; the workers share the
study through its storage exactly as workers on separate machines do (`autotuner.workers`), and
each prints its lines prefixed with its device. The GPU count comes from the backend's probe,
in a trial process, so the engine never imports the framework.

On a machine without a GPU, `--jobs` above 1 is refused: CPU workers would share the same cores,
and each trial's throughput would measure the contention rather than its config. Workers on
several machines (one per machine, `--storage postgresql://...`) are how a CPU study goes wider.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import IO

from autotuner.errors import SpecError
from autotuner.search import make_launcher, probe_environment
from autotuner.spec import Job
from autotuner.trial import die_with_parent


def visible_gpus(job: Job) -> int:
    """How many GPUs a trial process of this job's backend sees."""
    environment = probe_environment(make_launcher(job.backend), job.backend, "auto", job.workload_path(), job.source)
    return int(environment.get("device_count") or 0)


def check_jobs(jobs: int, gpus: int) -> None:
    if gpus == 0:
        raise SpecError(
            f"--jobs {jobs} starts one worker per GPU, and this machine has none visible; CPU workers would "
            "share the cores and skew each other's timings. Run one worker here, or one per machine "
            "on a shared --storage",
            key="--jobs",
        )
    if jobs > gpus:
        raise SpecError(f"--jobs {jobs} starts one worker per GPU, and only {gpus} are visible", key="--jobs")


def run_jobs(job: Job, jobs: int, passthrough: Sequence[str]) -> int:
    """One worker per GPU, on cuda:0 to cuda:<jobs - 1>; see `run_workers`."""
    check_jobs(jobs, visible_gpus(job))
    return run_workers(job, [f"cuda:{index}" for index in range(jobs)], passthrough)


def run_workers(job: Job, devices: Sequence[str], passthrough: Sequence[str]) -> int:
    """Start one worker per device (`autotuner search --spec ... --device <device>` plus
    `passthrough`) and wait for them, relaying their lines prefixed with their device. Ctrl-C is
    passed on to each worker once; the exit code is the worst of theirs."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "autotuner", "search", "--spec", job.source, *passthrough]
    workers = []
    for device in devices:
        workers.append(
            subprocess.Popen(
                [*command, "--device", device],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
                start_new_session=True,  # Ctrl-C reaches this process only; it passes it on once
                preexec_fn=lambda: die_with_parent(signal.SIGINT),  # kill -9 of this one stops them cleanly
            )
        )
    lock = threading.Lock()
    readers = [
        threading.Thread(target=_relay, args=(worker.stdout, f"[{device}] ", lock), daemon=True)
        for worker, device in zip(workers, devices, strict=True)
    ]
    for reader in readers:
        reader.start()
    interrupted = False
    try:
        for worker in workers:
            worker.wait()
    except KeyboardInterrupt:
        interrupted = True
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGINT)
        for worker in workers:
            worker.wait()
    for reader in readers:
        reader.join()
    codes = [worker.returncode for worker in workers]
    if interrupted or 130 in codes:
        return 130
    if 2 in codes:
        return 2
    return 1 if any(codes) else 0


def _relay(stream: IO[str] | None, prefix: str, lock: threading.Lock) -> None:
    assert stream is not None
    for line in stream:
        with lock:
            sys.stdout.write(prefix + line)
            sys.stdout.flush()
