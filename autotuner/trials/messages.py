"""What a trial process and its launcher send each other on the result pipe, and its framing.

A trial process sends `Started` first, then, in a lockstep group, `Waiting` before each of its
turns (`autotuner.measurement.turns`: the turns and the launcher's answers, which go down a second
pipe), and last its result: `{"status": "ok", "result": ...}`, or the exception that stopped it
(`autotuner.trials.outcomes.exception_message`), which `autotuner.trials.outcomes.classify_end`
reads.

A message is an 8-byte big-endian length, then its pickle. The launcher reads it in pieces, each
bounded by the trial's deadline (`Connection.recv` would wait for a whole message however long it
takes: a process that wrote a broken length and hung would outlast its timeout).
"""

from __future__ import annotations

import multiprocessing.connection
import os
import pickle
import struct
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Started:
    """The trial process runs (before it imports the runner): what its start-up time ends at."""

    at: float
    """`time.time()` in the trial process."""


_LENGTH = struct.Struct("!Q")
MAX_MESSAGE_BYTES = 256 * 2**20
"""A trial's message is a few KiB (metrics, a traceback): a longer length is garbage."""


class GarbledMessage(Exception):
    """What came down the pipe is not a message."""


def send_message(conn: multiprocessing.connection.Connection, message: object) -> None:
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


def receive_message(conn: multiprocessing.connection.Connection, deadline: float) -> object:
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
