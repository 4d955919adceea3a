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
import random
import resource
import signal
import struct
import time
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from autotuner import measure
from autotuner.outcomes import Classified, Outcome, ProcessEnd, classify_end, exception_message
from autotuner.telemetry import groups_cpu_seconds


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
    cover_steps: int = 0
    """When set, as many windows as cover this many optimizer steps are measured, not `windows`."""
    compile_cache: str | None = None
    """The folder of the study's compile caches (torch.compile's `TORCHINDUCTOR_CACHE_DIR`), so a
    trial's compile is warm or cold by this study's trials alone; None: the framework's default."""


Output = TypeVar("Output")


@dataclass
class TrialResult(Generic[Output]):
    """What one trial process produced, classified: `TrialResult[TrialOutput]` for a trial (the
    runner's `run`), `TrialResult[dict[str, Any]]` for a probe."""

    outcome: Outcome
    reason: str = ""
    traceback: str | None = None
    output: Output | None = None
    """What the process's function returned (a trial's `autotuner.results.TrialOutput`, a probe's
    environment) when it ended ok; else None."""
    startup_s: float | None = None
    """From asking for the process to the process running the trial's code."""
    wall_s: float = 0.0

    @classmethod
    def unsupported(cls, reason: str) -> TrialResult[Any]:
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
    turns: multiprocessing.connection.Connection | None = None,
) -> None:
    """Entry point of a trial process; with `turns` (the launcher's end of a lockstep group), its
    measurement waits for its turns there (`autotuner.measure.Turns`)."""
    os.setsid()  # own process group: the launcher kills it together with its workers
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the search's to handle
    _limit_memory(memory_limit_mb)
    _send(conn, {"status": "started", "at": time.time()})
    if turns is not None:
        measure.take_turns(measure.Turns(lambda message: _send(conn, message), turns.recv))
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


class _Running:
    """One trial process as the launcher sees it, from its start to its classified end."""

    def __init__(
        self,
        context: Any,
        runner: str,
        function: str,
        arg: Any,
        memory_limit_mb: float | None,
        timeout_s: float,
        lockstep: bool,
    ):
        self.timeout_s = timeout_s
        self.receive, send = context.Pipe(duplex=False)
        self.turns: multiprocessing.connection.Connection | None = None
        their_turns = None
        if lockstep:
            their_turns, self.turns = context.Pipe(duplex=False)
        self.asked_at = time.time()
        self.process = context.Process(
            target=_trial_main, args=(send, runner, function, arg, memory_limit_mb, their_turns)
        )
        self.process.start()
        send.close()
        if their_turns is not None:
            their_turns.close()
        self.startup_s: float | None = None
        self.message: Any = None
        self.read_error: str | None = None
        self.timed_out = False
        self.finished = False
        """It sent its result or closed its pipe: it is exiting on its own."""
        self.ended = False
        self.waiting: dict[str, Any] | None = None
        """The process's last `waiting` message while it waits for a turn (lockstep), else None."""
        self._result: TrialResult | None = None

    @property
    def windows(self) -> int:
        """The windows the waiting process measures in all, as it reported (lockstep)."""
        return int((self.waiting or {}).get("windows", 1))

    @property
    def measured(self) -> int:
        """The windows the waiting process has measured so far, as it reported (lockstep)."""
        return int((self.waiting or {}).get("measured", 0))

    def follow(self, deadline: float) -> None:
        """Read what the process sends until it waits for a turn or ends (then it is reaped)."""
        self.waiting = None
        while not self.ended:
            try:
                received = _receive(self.receive, deadline)
            except TimeoutError:
                self.timed_out = True
                break
            except EOFError:
                self.finished = True
                break
            except _Garbled as exc:
                self.read_error = str(exc)
                self.finished = True
                break
            status = received.get("status") if isinstance(received, dict) else None
            if status == "started" and self.startup_s is None:
                self.startup_s = max(0.0, float(received.get("at", self.asked_at)) - self.asked_at)
            elif status == "waiting" and self.turns is not None:
                self.waiting = received
                return
            else:
                self.message = received
                self.finished = True
                break
        self.end()

    def go(self, turn: dict[str, Any]) -> None:
        """Let the waiting process go on (its turn, or its release)."""
        assert self.turns is not None
        try:
            self.turns.send(turn)
        except OSError:
            pass  # it is gone: following it reads its end

    def give_turn(self, turn: dict[str, Any], deadline: float) -> None:
        """Let the waiting process run its turn, and follow it until it waits again or ends."""
        self.go(turn)
        self.follow(deadline)

    def end(self) -> TrialResult:
        """Reap the whole group (the process, its data-loader workers, anything it forked) and
        classify how the process ended; once. A process still running (timed out, or the search
        interrupted) is killed at once; one that is exiting gets a few seconds to do so."""
        if self._result is None:
            self.ended = True
            _kill_group(self.process, wait_s=5 if self.finished else 0)
            self.receive.close()
            if self.turns is not None:
                self.turns.close()
            end = ProcessEnd(self.message, self.process.exitcode, self.timed_out, self.timeout_s, self.read_error)
            classified: Classified = classify_end(end)
            self._result = TrialResult(
                classified.outcome,
                classified.reason,
                classified.traceback,
                classified.result,
                self.startup_s,
                time.time() - self.asked_at,
            )
        return self._result


class TrialLauncher:
    """Starts trial processes from a fork server that has `preload` imported."""

    def __init__(self, preload: list[str], memory_limit_mb: float | None = None):
        self.memory_limit_mb = memory_limit_mb
        """Host memory each trial process may allocate (`_limit_memory`); None: no limit."""
        self._context = multiprocessing.get_context("forkserver")
        # autotuner._forkserver kills every trial's process group when the fork server ends.
        self._context.set_forkserver_preload(["autotuner._forkserver", *preload])

    def _start(self, runner: str, function: str, arg: Any, timeout_s: float, lockstep: bool = False) -> _Running:
        return _Running(self._context, runner, function, arg, self.memory_limit_mb, timeout_s, lockstep)

    @staticmethod
    def _pids(group: list[_Running]) -> list[int]:
        return [r.process.pid for r in group if not r.ended and r.process.pid is not None]

    def call(self, runner: str, function: str, arg: Any, timeout_s: float) -> TrialResult:
        """Run `runner.function(arg)` in a fresh trial process and classify how it ended."""
        running = self._start(runner, function, arg, timeout_s)
        try:
            running.follow(time.monotonic() + timeout_s)
        finally:
            result = running.end()
        return result

    def lockstep(
        self, runner: str, function: str, args: list[Any], timeout_s: float, *, cover: bool = False
    ) -> list[TrialResult]:
        """Run `runner.function(arg)` for every arg, each in its own trial process, all alive at
        once and measured in turns (`autotuner.measure.Turns`): when each process has built its
        workload, the first runs its warm-up and calibration while the others wait, then the
        second, and so on; then they take turns window by window, so that a slow change in the
        machine's speed falls on every one of them alike. Every round is in a fresh random order
        (seeded: the same every time), so that no process always follows the same one, and each
        turn begins once the group's processes have settled (`_settle`): what one started in its
        turn (data-loader workers refilling their queues) does not run into the next one's window.
        When every one has measured its windows, all of them finish (the drift phase) together.

        The rounds are as many as the fewest windows a process measures; one with more windows
        runs its share of them in each round's turn (`_share`), so every process's windows are
        spread over the same stretch of time. With `cover`, the others measure windows of their
        own calibrated length, as many as cover the first one's optimizer steps; if the first one
        fails, there is nothing to cover: they are stopped (`STOPPED`).
        `timeout_s` bounds the start-up, each turn, and the finish; a process that fails or times
        out is left out of the turns and the others go on."""
        group = [self._start(runner, function, arg, timeout_s, lockstep=True) for arg in args]
        stopped: list[_Running] = []
        try:
            deadline = time.monotonic() + timeout_s
            for running in group:
                running.follow(deadline)
            setup_turn: dict[str, Any] = {}
            for running in _measuring(group):  # warm-up and calibration, in the order given
                _settle(self._pids(group))
                running.give_turn(setup_turn, time.monotonic() + timeout_s)
                if cover and running is group[0] and running.waiting is not None:
                    setup_turn = {"cover_steps": running.waiting["steps"] * running.waiting["windows"]}
            planned = min((r.windows for r in _measuring(group)), default=0)
            order = random.Random(0)
            rounds = 0
            while measuring := _measuring(group):
                if cover and group[0].ended:
                    stopped = [r for r in group if r.waiting is not None]
                    break
                rounds += 1
                order.shuffle(measuring)
                for running in measuring:
                    _settle(self._pids(group))
                    run = _share(running.windows, rounds, planned) - running.measured
                    running.give_turn({"run": run}, time.monotonic() + timeout_s)
            waiting = [r for r in group if r.waiting is not None and r not in stopped]
            for running in waiting:  # released together: what is left is not measured
                running.go({})
            deadline = time.monotonic() + timeout_s
            while pending := [r for r in waiting if not r.ended]:
                ready = multiprocessing.connection.wait(
                    [r.receive for r in pending], max(0.0, deadline - time.monotonic())
                )
                for running in pending:
                    if running.receive in ready or not ready:
                        running.follow(deadline)
        finally:
            ends = [running.end() for running in group]
        return [TrialResult(Outcome.ERROR, STOPPED) if r in stopped else e for r, e in zip(group, ends, strict=True)]


STOPPED = "stopped: the trial whose optimizer steps it was to cover failed"


def _measuring(group: list[_Running]) -> list[_Running]:
    """The processes of a lockstep group that wait for a measured turn."""
    return [r for r in group if r.waiting is not None and r.waiting.get("measuring")]


def _share(windows: int, rounds: int, planned: int) -> int:
    """How many of a process's `windows` it has measured by the end of round `rounds` of
    `planned`, spread evenly (all of them from the last planned round on)."""
    return windows if rounds >= planned else rounds * windows // planned


SETTLED_S = 0.03
"""The processes of a lockstep group have settled once they used no CPU for this long."""
SETTLE_MOST_S = 1.0
"""The longest a turn waits for them to settle (a loader that never rests must not stall it)."""


def _settle(groups: list[int]) -> None:
    """Wait until the processes of process groups `groups` have used no CPU for `SETTLED_S`, or
    `SETTLE_MOST_S` at most. In a lockstep group, data-loader workers refill their queues after
    their process's window ends, and libgomp's threads spin a while before they sleep: in the next
    process's window, they would slow it, and always the one that follows."""
    start = time.monotonic()
    used, since = groups_cpu_seconds(groups), start
    while (now := time.monotonic()) - start < SETTLE_MOST_S:
        time.sleep(0.005)
        latest = groups_cpu_seconds(groups)
        if latest != used:
            used, since = latest, time.monotonic()
        elif now - since >= SETTLED_S:
            return


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
