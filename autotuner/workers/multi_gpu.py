"""`autotuner search --jobs N`: N search processes on this machine's GPUs, all on one study.

Each worker has a trial's GPUs to itself: one, or with `processes: P` in the spec, P of them
(its trials' ranks). Worker i is an `autotuner search` subprocess with `--device cuda:<i x P>`,
whose trials use cuda:<i x P> to cuda:<i x P + P - 1>; the processes share the
study through its storage exactly as search processes on separate machines do
(`autotuner.workers.coordination`), and each prints its lines prefixed with its device. The GPU count
comes from the backend's probe, in a trial process, so the engine never imports the framework.

On a machine without a GPU, `--jobs` above 1 is refused: search processes on the CPU would share
the same cores, and each trial's throughput would measure the contention rather than its config.
One search process per machine (`--storage postgresql://...`) is how a CPU study goes wider.

Each process gets its own share of the cores (`core_shares`: contiguous, as even as they go, set
as its CPU affinity, which its trial processes inherit). Otherwise one worker's trials would take
CPU time on the cores of another's, and each trial would be measured as contended by its siblings
(`autotuner.measurement.contention`) and run again.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import IO

from autotuner.errors import SpecError
from autotuner.measurement.hardware import core_shares
from autotuner.measurement.telemetry import usable_cpus
from autotuner.spec.job import Job
from autotuner.trials.launcher import die_with_parent
from autotuner.trials.request import ProbeRequest


def visible_gpus(job: Job) -> int:
    """How many GPUs a trial process of this job's backend sees."""
    environment = job.backend.probe(job.backend.launcher(), ProbeRequest("auto", job.workload_path()), job.source)
    return environment.device_count


def check_gpus(jobs: int, gpus: int, processes: int = 1) -> None:
    """Refuse `--jobs <jobs>` (search workers of `processes` GPUs each) where fewer than
    `jobs x processes` GPUs are visible."""
    if gpus == 0:
        raise SpecError(
            f"--jobs {jobs} starts one worker per GPU, and this machine has none visible; CPU workers would "
            "share the cores and skew each other's timings. Run one worker here, or one per machine "
            "on a shared --storage",
            key="--jobs",
        )
    if jobs * processes > gpus:
        each = "one GPU" if processes == 1 else f"{processes} GPUs (processes: {processes})"
        raise SpecError(
            f"--jobs {jobs} starts {jobs} workers of {each} each, and only {gpus} are visible "
            f"(at most {gpus // processes} workers here)",
            key="--jobs",
        )


def search_on_gpus(job: Job, jobs: int, passthrough: Sequence[str]) -> int:
    """`jobs` search processes, each on the first of its `processes` GPUs (cuda:0, cuda:P, ...);
    see `search_on_devices`."""
    processes = job.spec.processes
    check_gpus(jobs, visible_gpus(job), processes)
    return search_on_devices(job, [f"cuda:{index * processes}" for index in range(jobs)], passthrough)


def search_on_devices(job: Job, devices: Sequence[str], passthrough: Sequence[str]) -> int:
    """Start one search process per device (`autotuner search --spec ... --device <device>` plus
    `passthrough`) and wait for them, relaying their lines prefixed with their device. Ctrl-C is
    passed on to each process once; the exit code is the worst of theirs."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "autotuner", "search", "--spec", job.source, *passthrough]
    processes = []
    for device, cores in zip(devices, core_shares(usable_cpus(), len(devices)), strict=True):
        processes.append(
            subprocess.Popen(
                [*command, "--device", device],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
                start_new_session=True,  # Ctrl-C reaches this process only; it passes it on once
                preexec_fn=functools.partial(_in_child, cores),
            )
        )
    lock = threading.Lock()
    readers = [
        threading.Thread(target=_relay, args=(process.stdout, f"[{device}] ", lock), daemon=True)
        for process, device in zip(processes, devices, strict=True)
    ]
    for reader in readers:
        reader.start()
    interrupted = False
    try:
        for process in processes:
            process.wait()
    except KeyboardInterrupt:
        interrupted = True
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        for process in processes:
            process.wait()
    for reader in readers:
        reader.join()
    codes = [process.returncode for process in processes]
    if interrupted or 130 in codes:
        return 130
    if 2 in codes:
        return 2
    return 1 if any(codes) else 0


def _in_child(cores: set[int]) -> None:
    die_with_parent(signal.SIGINT)  # kill -9 of this one stops them cleanly
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)


def _relay(stream: IO[str] | None, prefix: str, lock: threading.Lock) -> None:
    assert stream is not None
    for line in stream:
        with lock:
            sys.stdout.write(prefix + line)
            sys.stdout.flush()
