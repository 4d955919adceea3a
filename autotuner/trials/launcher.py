"""Trial processes: every config runs in a fresh process, with a timeout, and a crash, a hang or
an out-of-memory error there never reaches the search.

Processes come from a fork server that has already imported the backend's runner (and with it
the framework) but never touched the accelerator, so a trial starts in tens of milliseconds
instead of re-importing torch, and no CUDA state is ever shared between configs. Each trial
process leads its own process group, so killing it also kills its data-loader workers. If the
search process dies, even by kill -9, the fork server ends and kills every trial process group
it started (`autotuner.trials._forkserver`); a trial process also dies with the fork server itself.

What a trial process and the launcher send each other is in `autotuner.trials.messages`; the launcher
reads it bounded by the trial's deadline. Several trial processes measured together take turns
(`autotuner.trials.lockstep`).
"""

from __future__ import annotations

import ctypes
import importlib
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import multiprocessing.forkserver
import multiprocessing.util
import os
import re
import resource
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from autotuner.measurement.turns import Turn, Turns, Waiting
from autotuner.trials.messages import GarbledMessage, Started, receive_message, send_message
from autotuner.trials.outcomes import Classified, EndMessage, Outcome, ProcessEnd, classify_end, exception_message
from autotuner.trials.request import log_of

Output = TypeVar("Output")


@dataclass
class TrialResult(Generic[Output]):
    """What one trial process produced, classified: `TrialResult[TrialOutput]` for a trial (the
    runner's `run`), `TrialResult[ProbeResult]` for a probe (`autotuner.trials.probe`)."""

    outcome: Outcome
    reason: str = ""
    traceback: str | None = None
    output: Output | None = None
    """What the process's function returned (a trial's `autotuner.trials.trial_output.TrialOutput`,
    a probe's `autotuner.trials.probe.ProbeResult`) when it ended ok; else None."""
    startup_s: float | None = None
    """From asking for the process to the process running the trial's code."""
    wall_s: float = 0.0
    log: str | None = None
    """The file the process's output went to (`TrialRequest.log`), when it wrote any."""
    warned: str | None = None
    """What the process wrote there, in a few words (`warning_summary`); None when it wrote nothing."""

    @classmethod
    def unsupported(cls, reason: str) -> TrialResult[Output]:
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


def log_file(log: str, pid: int) -> str:
    """The file process `pid` of the requests whose `log` is `log` writes its output to."""
    return f"{log}.{pid}.log"


def _redirect_output(log: str | None) -> None:
    """This process's stdout and stderr (file descriptors 1 and 2, which its children inherit)
    written to its own file of `log` (`log_file`)."""
    if log is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.makedirs(os.path.dirname(log) or ".", exist_ok=True)
    fd = os.open(log_file(log, os.getpid()), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


WARNING = re.compile(r"^(?:.*?:\d+: )?((?:\w+Warning|WARNING|Warning|warning)\b.*)$")
"""A warning line: Python's `file.py:12: UserWarning: ...` (from the category on), a logger's
`WARNING ...`, or any line that starts with the word."""
SUMMARY_CHARS = 90


def warning_summary(text: str) -> str | None:
    """What a process wrote, in a few words: its first warning line (`WARNING`), else its first
    line, shortened to `SUMMARY_CHARS`, with how many more lines there were; None for nothing."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    found = next((m.group(1) for line in lines if (m := WARNING.match(line))), lines[0])
    found = found if len(found) <= SUMMARY_CHARS else found[: SUMMARY_CHARS - 3] + "..."
    return found + (f" (+{len(lines) - 1} lines)" if len(lines) > 1 else "")


def _trial_main(
    conn: multiprocessing.connection.Connection,
    runner: str,
    function: str,
    arg: object,
    memory_limit_mb: float | None = None,
    turns: multiprocessing.connection.Connection | None = None,
) -> None:
    """Entry point of a trial process: `runner.function(arg)`, its result (or the exception that
    stopped it) sent on `conn`. A backend's runner module holds its `autotuner.trials.training.TrainingBackend`
    as `TRIAL_BACKEND`: then the function is that object's, and its `classify_exception` tells which
    exceptions are out-of-memory errors; in any other module (a test's helper) it is the module's
    own. With `turns` (the end of a lockstep group's turn pipe the launcher sends down), the call is
    `runner.function(arg, turns=...)`: its measurement waits there for its turns
    (`autotuner.measurement.turns.Turns`)."""
    os.setsid()  # own process group: the launcher kills it together with its workers
    die_with_parent()
    _redirect_output(log_of(arg))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the search's to handle
    _limit_memory(memory_limit_mb)
    send_message(conn, Started(time.time()))
    extra = {} if turns is None else {"turns": Turns(lambda waiting: send_message(conn, waiting), turns.recv)}
    is_oom = lambda exc: False  # noqa: E731 - replaced once a runner module imports
    try:
        module = importlib.import_module(runner)
        trial = getattr(module, "TRIAL_BACKEND", None)
        if trial is not None:
            is_oom = lambda exc: trial.classify_exception(exc) == "oom"  # noqa: E731
        message: EndMessage = {
            "status": "ok",
            "result": getattr(module if trial is None else trial, function)(arg, **extra),
        }
    except BaseException as exc:  # everything the user's code raises is a trial outcome
        message = exception_message(exc, is_oom)
        if memory_limit_mb is not None and message["kind"] == Outcome.OOM.value:
            message["reason"] += f" (a trial process may allocate {memory_limit_mb:g} MiB: trial.max_memory_mb)"
    send_message(conn, message)
    conn.close()
    # The teardown skipped below would unlink the named semaphores that pools made here (a compile
    # pool's); left, the search's resource tracker finds them at its exit and warns on its console.
    try:  # the result is sent: nothing that fails here may change the trial's outcome
        multiprocessing.util._run_finalizers(0)  # type: ignore[attr-defined]
    except BaseException:  # the process ends either way, on the next line
        pass
    # Skip interpreter teardown: data-loader workers and compile pools are killed with the group.
    os._exit(0)


class TrialProcess:
    """One trial process as the launcher sees it, from its start to its classified end. Started
    with `turns` (a member of a lockstep group, `autotuner.trials.lockstep`), it has a second pipe that
    the launcher sends its turns down, and between its turns it waits (`waiting`)."""

    def __init__(
        self,
        context: multiprocessing.context.ForkServerContext,
        runner: str,
        function: str,
        arg: object,
        memory_limit_mb: float | None,
        timeout_s: float,
        turns: bool,
    ):
        self.timeout_s = timeout_s
        self.receive, send = context.Pipe(duplex=False)
        self.turns: multiprocessing.connection.Connection | None = None
        their_turns = None
        if turns:
            their_turns, self.turns = context.Pipe(duplex=False)
        self.asked_at = time.time()
        self.process = context.Process(
            target=_trial_main, args=(send, runner, function, arg, memory_limit_mb, their_turns)
        )
        self.process.start()
        log = log_of(arg)
        self.log = log_file(log, self.process.pid) if log is not None and self.process.pid else None
        """Where the process's output goes (`_redirect_output`); removed at its end if it is empty."""
        send.close()
        if their_turns is not None:
            their_turns.close()
        self.startup_s: float | None = None
        self.message: object = None
        self.read_error: str | None = None
        self.timed_out = False
        self.finished = False
        """It sent its result or closed its pipe: it is exiting on its own."""
        self.ended = False
        self.waiting: Waiting | None = None
        """What the process last reported while it waits for a turn (lockstep), else None."""
        self.on_end: Callable[[], None] | None = None
        """Called once the process is reaped (a trial across nodes: its ranks elsewhere told)."""
        self._result: TrialResult | None = None

    def read_until_waiting(self, deadline: float) -> None:
        """Read what the process sends until it waits for a turn (`waiting`) or ends (then it is
        reaped). Whatever it sends that is neither `Started` nor, with turns, `Waiting` is its
        result, which `autotuner.trials.outcomes.classify_end` judges."""
        self.waiting = None
        while not self.ended:
            try:
                received = receive_message(self.receive, deadline)
            except TimeoutError:
                self.timed_out = True
                break
            except EOFError:
                self.finished = True
                break
            except GarbledMessage as exc:
                self.read_error = str(exc)
                self.finished = True
                break
            if isinstance(received, Started) and self.startup_s is None:
                self.startup_s = max(0.0, received.at - self.asked_at)
            elif isinstance(received, Waiting) and self.turns is not None:
                self.waiting = received
                return
            else:
                self.message = received
                self.finished = True
                break
        self.end()

    def send_turn(self, turn: Turn) -> None:
        """Let the waiting process go on: its turn, or its release."""
        assert self.turns is not None
        try:
            self.turns.send(turn)
        except OSError:
            pass  # it is gone: reading from it reads its end

    def run_turn(self, turn: Turn, deadline: float) -> None:
        """Let the waiting process run its turn, and read until it waits again or ends."""
        self.send_turn(turn)
        self.read_until_waiting(deadline)

    def end(self) -> TrialResult:
        """Reap the whole group (the process, its data-loader workers, anything it forked) and
        classify how the process ended; once. A process still running (timed out, or the search
        interrupted) is killed at once; one that is exiting gets a few seconds to do so."""
        if self._result is None:
            self.ended = True
            _kill_group(self.process, wait_s=5 if self.finished else 0)
            if self.on_end is not None:
                self.on_end()
            self.receive.close()
            if self.turns is not None:
                self.turns.close()
            end = ProcessEnd(self.message, self.process.exitcode, self.timed_out, self.timeout_s, self.read_error)
            classified: Classified = classify_end(end)
            warned = warning_summary(_read_log(self.log)) if self.log else None
            self._result = TrialResult(
                classified.outcome,
                classified.reason,
                classified.traceback,
                classified.result,
                self.startup_s,
                time.time() - self.asked_at,
                log=self.log if warned is not None else None,
                warned=warned,
            )
        return self._result


class TrialLauncher:
    """Starts trial processes from a fork server that has `preload` imported."""

    def __init__(self, preload: list[str], memory_limit_mb: float | None = None):
        self.memory_limit_mb = memory_limit_mb
        """Host memory each trial process may allocate (`_limit_memory`); None: no limit."""
        self._context = multiprocessing.get_context("forkserver")
        # autotuner.trials._forkserver kills every trial's process group when the fork server ends.
        self._context.set_forkserver_preload(["autotuner.trials._forkserver", *preload])

    def ensure_running(self) -> None:
        """Start the fork server now, from this thread. Linux ends the fork server, and with it every
        trial process, when the thread that started it ends (PR_SET_PDEATHSIG is a thread's): a
        caller that starts trial processes from short-lived threads starts the server first."""
        multiprocessing.forkserver.ensure_running()

    def start(self, runner: str, function: str, arg: object, timeout_s: float, *, turns: bool = False) -> TrialProcess:
        """Start `runner.function(arg)` in a fresh trial process; with `turns`, as a member of a
        lockstep group (`autotuner.trials.lockstep.run_in_lockstep`)."""
        return TrialProcess(self._context, runner, function, arg, self.memory_limit_mb, timeout_s, turns)

    def call(self, runner: str, function: str, arg: object, timeout_s: float) -> TrialResult:
        """Run `runner.function(arg)` in a fresh trial process and classify how it ended."""
        process = self.start(runner, function, arg, timeout_s)
        try:
            process.read_until_waiting(time.monotonic() + timeout_s)  # without turns: to its end
        finally:
            result = process.end()
        return result


def _read_log(path: str, most: int = 1 << 20) -> str:
    """What a process wrote to its log (its first MiB); an empty log is removed."""
    try:
        if os.path.getsize(path) == 0:
            os.remove(path)
            return ""
        with open(path, "rb") as file:
            return file.read(most).decode(errors="replace")
    except OSError:
        return ""


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
