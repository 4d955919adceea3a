"""Trial processes: every config runs in a fresh process, with a timeout, and a crash, a hang or
an out-of-memory error there never reaches the search.

Processes come from a fork server that has already imported the backend's runner (and with it
the framework) but never touched the accelerator, so a trial starts in tens of milliseconds
instead of re-importing torch, and no CUDA state is ever shared between configs. Each trial
process leads its own process group, so killing it also kills its data-loader workers, and it
dies with the fork server if the search process is killed.
"""

from __future__ import annotations

import ctypes
import importlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from autotuner.outcomes import Classified, Outcome, ProcessEnd, classify_end, exception_message


@dataclass(frozen=True)
class TrialRequest:
    """Everything a trial process needs to run one config. Plain data: it is pickled."""

    workload: str
    """Import path `package.module:function` of the workload factory."""
    workload_args: dict[str, Any]
    device: str
    config: dict[str, Any]
    global_batch: int
    seed: int
    warmup_steps: int
    steps: int
    windows: int
    drift_steps: int
    heldout_batch: int
    """Chunk size of the held-out evaluation: the baseline's micro-batch, which is known to fit."""
    measure: bool = True
    """False for the reference: only the drift phase runs."""
    min_window_s: float = 0.0
    """Shortest measured window (`autotuner.measure.measure_throughput`)."""


@dataclass
class TrialResult:
    """What one trial process produced, classified."""

    outcome: Outcome
    reason: str = ""
    traceback: str | None = None
    result: dict[str, Any] = field(default_factory=dict)
    startup_s: float | None = None
    """From asking for the process to the process running the trial's code."""
    wall_s: float = 0.0

    @classmethod
    def unsupported(cls, reason: str) -> TrialResult:
        return cls(Outcome.UNSUPPORTED, reason)


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent (the fork server) dies."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _trial_main(conn: multiprocessing.connection.Connection, runner: str, function: str, arg: Any) -> None:
    """Entry point of a trial process."""
    os.setsid()  # own process group: the launcher kills it together with its workers
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the search's to handle
    conn.send({"status": "started", "at": time.time()})
    is_oom = lambda exc: False  # noqa: E731 - replaced once the runner imports
    try:
        module = importlib.import_module(runner)
        is_oom = lambda exc: module.classify_exception(exc) == "oom"  # noqa: E731
        message = {"status": "ok", "result": getattr(module, function)(arg)}
    except BaseException as exc:  # everything the user's code raises is a trial outcome
        message = exception_message(exc, is_oom)
    conn.send(message)
    conn.close()
    # Skip interpreter teardown: data-loader workers and compile pools are killed with the group.
    os._exit(0)


class TrialLauncher:
    """Starts trial processes from a fork server that has `preload` imported."""

    def __init__(self, preload: list[str]):
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(preload)

    def call(self, runner: str, function: str, arg: Any, timeout_s: float) -> TrialResult:
        """Run `runner.function(arg)` in a fresh trial process and classify how it ended."""
        receive, send = self._context.Pipe(duplex=False)
        asked_at = time.time()
        process = self._context.Process(target=_trial_main, args=(send, runner, function, arg))
        process.start()
        send.close()
        startup_s = None
        deadline = time.monotonic() + timeout_s
        message: Any = None
        read_error = None
        timed_out = False
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not receive.poll(remaining):
                    timed_out = True
                    break
                try:
                    received = receive.recv()
                except EOFError:
                    break
                except Exception as exc:  # garbage on the pipe
                    read_error = f"{type(exc).__name__}: {exc}"
                    break
                if isinstance(received, dict) and received.get("status") == "started" and startup_s is None:
                    startup_s = max(0.0, float(received.get("at", asked_at)) - asked_at)
                    continue
                message = received
                break
        finally:
            # Always reap the whole group: the process, its data-loader workers, anything it forked.
            _kill_group(process, wait_s=0 if timed_out else 5)
            receive.close()
        end = ProcessEnd(message, process.exitcode, timed_out, timeout_s, read_error)
        classified: Classified = classify_end(end)
        return TrialResult(
            classified.outcome,
            classified.reason,
            classified.traceback,
            classified.result or {},
            startup_s,
            time.time() - asked_at,
        )


def _kill_group(process: multiprocessing.process.BaseProcess, wait_s: float) -> None:
    """Let the process exit on its own for `wait_s`, then SIGKILL its whole group."""
    process.join(timeout=wait_s)
    pid = process.pid
    if pid is not None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if process.is_alive():
        process.kill()
    process.join()
