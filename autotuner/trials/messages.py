"""What a trial process and its launcher send each other: the messages, typed, and their framing.

A trial process sends on its result pipe `Started` first, then, in a lockstep group, `Waiting`
before each of its turns, and last its result: `{"status": "ok", "result": ...}`, or the
exception that stopped it (`autotuner.trials.outcomes.exception_message`), which
`autotuner.trials.outcomes.classify_end` reads. In a lockstep group the launcher answers each `Waiting`
down a second pipe with a turn: a `SetupTurn`, a `WindowsTurn` or the `Release`; `Turns` is the
process's side of that exchange. When each is sent, and why, is the lockstep protocol
(`autotuner.trials.lockstep`).

On the result pipe a message is an 8-byte big-endian length, then its pickle. The launcher reads
it in pieces, each bounded by the trial's deadline (`Connection.recv` would wait for a whole
message however long it takes: a process that wrote a broken length and hung would outlast its
timeout).
"""

from __future__ import annotations

import multiprocessing.connection
import os
import pickle
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Started:
    """The trial process runs (before it imports the runner): what its start-up time ends at."""

    at: float
    """`time.time()` in the trial process."""


@dataclass(frozen=True)
class Waiting:
    """The process waits for its next turn in a lockstep group, and reports how far it is."""

    measuring: bool
    """Whether it waits for a measured turn (its setup or windows); False: it has measured all its
    windows and waits to be released."""
    steps: int = 0
    """Optimizer steps per window, once calibrated (0 while it waits for its setup turn)."""
    windows: int = 1
    """The windows it measures in all."""
    measured: int = 0
    """The windows it has measured so far."""


@dataclass(frozen=True)
class SetupTurn:
    """Run the warm-up and the calibration."""

    match_steps: int = 0
    """When set, measure as many windows (of the calibrated length) as it takes to match this many
    optimizer steps (another process's), not the request's windows."""


@dataclass(frozen=True)
class WindowsTurn:
    """Measure this many more windows."""

    windows: int = 1


@dataclass(frozen=True)
class Release:
    """Go on to the end (the drift phase), together with the rest of the group."""


Turn = SetupTurn | WindowsTurn | Release


class Turns:
    """A trial process's side of a lockstep group: `wait` tells the launcher that the process is
    ready for its next turn (and how far it is) and returns the turn once it is given."""

    def __init__(self, send: Callable[[Waiting], None], receive: Callable[[], object]):
        self._send, self._receive = send, receive

    def wait(self, waiting: Waiting) -> Turn:
        self._send(waiting)
        turn = self._receive()
        if not isinstance(turn, Turn):
            raise TypeError(f"the launcher sent {turn!r} where a turn was due")
        return turn


_LENGTH = struct.Struct("!Q")
MAX_MESSAGE_BYTES = 256 * 2**20
"""A trial's message is a few KiB (metrics, a traceback): a longer length is garbage."""


class GarbledMessage(Exception):
    """What came down the pipe is not a message."""


def send_message(conn: multiprocessing.connection.Connection, message: Any) -> None:
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


def receive_message(conn: multiprocessing.connection.Connection, deadline: float) -> Any:
    """The next message: EOFError when the pipe closed first, TimeoutError at `deadline`,
    `GarbledMessage` when what came is not a message."""
    header = _read(conn, _LENGTH.size, deadline)
    if not header:
        raise EOFError
    if len(header) < _LENGTH.size:
        raise GarbledMessage(f"the pipe closed after {len(header)} bytes of a message")
    (size,) = _LENGTH.unpack(header)
    if size > MAX_MESSAGE_BYTES:
        raise GarbledMessage(f"a message length of {size} bytes")
    data = _read(conn, size, deadline)
    if len(data) < size:
        raise GarbledMessage(f"the pipe closed after {len(data)} of a message's {size} bytes")
    try:
        return pickle.loads(data)
    except Exception as exc:  # whatever unpickling garbage raises
        raise GarbledMessage(f"{type(exc).__name__}: {exc}") from None
