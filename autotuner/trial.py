"""Trial processes: every config runs in a fresh process, with a timeout, and a crash, a hang or
an out-of-memory error there never reaches the search.

Processes come from a fork server that has already imported the backend's runner (and with it
the framework) but never touched the accelerator, so a trial starts in tens of milliseconds
instead of re-importing torch, and no CUDA state is ever shared between configs. Each trial
process leads its own process group, so killing it also kills its data-loader workers. If the
search process dies, even by kill -9, the fork server ends and kills every trial process group
it started (`autotuner._forkserver`); a trial process also dies with the fork server itself.
"""

from __future__ import annotations

import ctypes
import importlib
import multiprocessing
import multiprocessing.connection
import os
import pickle
import resource
import signal
import struct
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


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """Ask Linux to send this process `signum` when its parent dies (a no-op elsewhere)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signum)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _limit_memory(limit_mb: float | None) -> None:
    """Cap what this process may allocate at `limit_mb` MiB (RLIMIT_DATA: its heap and private
    writable mappings, where tensors live): past it an allocation fails, and the trial is `oom`."""
    if limit_mb is not None:
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        limit = int(limit_mb * 2**20)
        resource.setrlimit(resource.RLIMIT_DATA, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))


# A message on the pipe: an 8-byte big-endian length, then the pickle. The launcher reads it in
# pieces, each bounded by the trial's deadline (Connection.recv would wait for a whole message
# however long it takes: a process that wrote a broken length and hung would outlast its timeout).
_LENGTH = struct.Struct("!Q")
MAX_MESSAGE_BYTES = 256 * 2**20
"""A trial's message is a few KiB (metrics, a traceback): a longer length is garbage."""


class _Garbled(Exception):
    """What came down the pipe is not a message."""


def _send(conn: multiprocessing.connection.Connection, message: Any) -> None:
    data = pickle.dumps(message)
    view = memoryview(_LENGTH.pack(len(data)) + data)
    while view:
        view = view[os.write(conn.fileno(), view) :]


def _read(conn: multiprocessing.connection.Connection, size: int, deadline: float) -> bytes:
    """`size` bytes, or fewer where the pipe closed first; TimeoutError at `deadline`."""
    data = bytearray()
    while len(data) < size:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not conn.poll(remaining):
            raise TimeoutError
        chunk = os.read(conn.fileno(), size - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def _receive(conn: multiprocessing.connection.Connection, deadline: float) -> Any:
    """The next message: EOFError when the pipe closed first, TimeoutError at `deadline`,
    `_Garbled` when what came is not a message."""
    header = _read(conn, _LENGTH.size, deadline)
    if not header:
        raise EOFError
    if len(header) < _LENGTH.size:
        raise _Garbled(f"the pipe closed after {len(header)} bytes of a message")
    (size,) = _LENGTH.unpack(header)
    if size > MAX_MESSAGE_BYTES:
        raise _Garbled(f"a message length of {size} bytes")
    data = _read(conn, size, deadline)
    if len(data) < size:
        raise _Garbled(f"the pipe closed after {len(data)} of a message's {size} bytes")
    try:
        return pickle.loads(data)
    except Exception as exc:  # whatever unpickling garbage raises
        raise _Garbled(f"{type(exc).__name__}: {exc}") from None


def _trial_main(
    conn: multiprocessing.connection.Connection,
    runner: str,
    function: str,
    arg: Any,
    memory_limit_mb: float | None = None,
) -> None:
    """Entry point of a trial process."""
    os.setsid()  # own process group: the launcher kills it together with its workers
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the search's to handle
    _limit_memory(memory_limit_mb)
    _send(conn, {"status": "started", "at": time.time()})
    is_oom = lambda exc: False  # noqa: E731 - replaced once the runner imports
    try:
        module = importlib.import_module(runner)
        is_oom = lambda exc: module.classify_exception(exc) == "oom"  # noqa: E731
        message = {"status": "ok", "result": getattr(module, function)(arg)}
    except BaseException as exc:  # everything the user's code raises is a trial outcome
        message = exception_message(exc, is_oom)
        if memory_limit_mb is not None and message["kind"] == Outcome.OOM.value:
            message["reason"] += f" (a trial process may allocate {memory_limit_mb:g} MiB: trial.max_memory_mb)"
    _send(conn, message)
    conn.close()
    # Skip interpreter teardown: data-loader workers and compile pools are killed with the group.
    os._exit(0)


class TrialLauncher:
    """Starts trial processes from a fork server that has `preload` imported."""

    def __init__(self, preload: list[str], memory_limit_mb: float | None = None):
        self.memory_limit_mb = memory_limit_mb
        """Host memory each trial process may allocate (`_limit_memory`); None: no limit."""
        self._context = multiprocessing.get_context("forkserver")
        # autotuner._forkserver kills every trial's process group when the fork server ends.
        self._context.set_forkserver_preload(["autotuner._forkserver", *preload])

    def call(self, runner: str, function: str, arg: Any, timeout_s: float) -> TrialResult:
        """Run `runner.function(arg)` in a fresh trial process and classify how it ended."""
        receive, send = self._context.Pipe(duplex=False)
        asked_at = time.time()
        process = self._context.Process(target=_trial_main, args=(send, runner, function, arg, self.memory_limit_mb))
        process.start()
        send.close()
        startup_s = None
        deadline = time.monotonic() + timeout_s
        message: Any = None
        read_error = None
        timed_out = False
        try:
            while True:
                try:
                    received = _receive(receive, deadline)
                except TimeoutError:
                    timed_out = True
                    break
                except EOFError:
                    break
                except _Garbled as exc:
                    read_error = str(exc)
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
