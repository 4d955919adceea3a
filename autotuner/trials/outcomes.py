"""How a trial ended: the outcome classes, and the one place that decides which one it was.

A trial process either sends a message (its result, or the exception that stopped it) or it
ends without one (a signal, an exit, a hang the launcher killed). `exception_message` turns an
exception into a message inside the trial process; `classify_end` turns whatever the launcher saw
into an outcome, a one-line reason and, for `error`, the traceback.
"""

from __future__ import annotations

import signal
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypedDict

from autotuner.trials.probe import ProbeResult
from autotuner.trials.trial_output import NodePart, ProfileOutput, TrialOutput

OUTPUTS = (TrialOutput, ProbeResult, ProfileOutput, NodePart, dict)
"""What a trial process's entry point may return: a trial's, a probe's or a profile's output, a
node's part of a trial across nodes, or a mapping (a test's helper function)."""


class Outcome(str, Enum):
    OK = "ok"
    OOM = "oom"
    NAN = "nan"
    UNSUPPORTED = "unsupported"
    TIMEOUT = "timeout"
    CRASH = "crash"
    ERROR = "error"
    PRUNED = "pruned"
    """Stored only: the trial process ran to its end, stopping early (`autotuner.measurement.pruning`)."""

    def __str__(self) -> str:
        return self.value


class NonFiniteLoss(ArithmeticError):
    """The training loss became NaN or infinite: the config diverged."""


class Unsupported(RuntimeError):
    """The workload cannot honour a knob value of the config (an optimizer without a fused
    variant, a model with no blocks to checkpoint): raised while the config is applied, it makes
    the trial `unsupported` with this message as the reason, as the engine's own checks do."""


class EndMessage(TypedDict, total=False):
    """What a trial process (or one rank of a trial) sends as it ends: `status` `ok` with its
    `result`, or `raised` with its `kind` (an `Outcome` value), one-line `reason` and, for an
    error, its `traceback`; a rank adds when it failed (`at`, to tell which failed first) and
    whether rank 0's trial was pruned (`pruned`)."""

    status: str
    result: object
    kind: str
    reason: str
    traceback: str
    at: float
    pruned: bool


class RankFailed(Exception):
    """A rank of a trial of several processes ended it (`autotuner.backends.pytorch.ranks`): `end`
    is that rank's message, as `exception_message` made it there (or a crash's), its reason naming
    the rank. The trial ends with it as if its own process had sent it."""

    def __init__(self, end: EndMessage):
        super().__init__(end.get("reason", ""))
        self.end = end


@dataclass(frozen=True)
class Classified:
    outcome: Outcome
    reason: str
    traceback: str | None = None
    result: TrialOutput | ProbeResult | ProfileOutput | NodePart | dict[str, Any] | None = None
    """What the process's function returned: a trial's output, a node's part of one, or a mapping
    (a probe's environment)."""


@dataclass(frozen=True)
class ProcessEnd:
    """What the launcher saw of a trial process."""

    message: object
    """What the process sent, or None when it sent nothing."""
    exitcode: int | None
    timed_out: bool = False
    timeout_s: float = 0.0
    read_error: str | None = None
    """Why the message could not be read, when it could not."""


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def exception_message(exc: BaseException, is_oom: Callable[[BaseException], bool]) -> EndMessage:
    """The message a trial process sends when `exc` stopped it. `is_oom` is the backend's test
    for its framework's out-of-memory errors; Python's own MemoryError (the host, or the trial's
    memory limit, refused an allocation) is one everywhere."""
    if isinstance(exc, RankFailed):
        return exc.end
    summary = _one_line(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, MemoryError) or is_oom(exc):
        return {"status": "raised", "kind": Outcome.OOM.value, "reason": summary}
    if isinstance(exc, NonFiniteLoss):
        return {"status": "raised", "kind": Outcome.NAN.value, "reason": _one_line(str(exc))}
    if isinstance(exc, Unsupported):
        return {"status": "raised", "kind": Outcome.UNSUPPORTED.value, "reason": _one_line(str(exc))}
    return {
        "status": "raised",
        "kind": Outcome.ERROR.value,
        "reason": summary,
        "traceback": "".join(traceback.format_exception(exc)),
    }


def classify_end(end: ProcessEnd) -> Classified:
    """Map the end of a trial process to its outcome. Every trial goes through here."""
    if end.timed_out:
        return Classified(
            Outcome.TIMEOUT, f"no result within the trial timeout of {end.timeout_s:g} s; the process was killed"
        )
    if end.read_error is not None:
        return Classified(Outcome.CRASH, _one_line(f"the trial process sent an unreadable result: {end.read_error}"))
    message = end.message
    if message is None:
        code = end.exitcode
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return Classified(Outcome.CRASH, f"the trial process was killed by {name}")
        return Classified(Outcome.CRASH, f"the trial process exited with code {code} without a result")
    if not isinstance(message, dict) or message.get("status") not in ("ok", "raised"):
        return Classified(Outcome.CRASH, _one_line(f"the trial process sent an unreadable result: {message!r}"))
    if message["status"] == "ok":
        result = message.get("result")
        if not isinstance(result, OUTPUTS):
            return Classified(Outcome.CRASH, "the trial process sent a result that no entry point returns")
        return Classified(Outcome.OK, "", result=result)
    try:
        outcome = Outcome(message.get("kind"))
    except ValueError:
        return Classified(Outcome.CRASH, _one_line(f"the trial process sent an unknown outcome: {message!r}"))
    return Classified(outcome, _one_line(message.get("reason", "")), message.get("traceback"))
