"""A lockstep group's turns, as a measuring process sees them (`autotuner.trials.lockstep` is the
protocol and the launcher's side): before each turn the process reports `Waiting`, with how far it
is, and is given a `SetupTurn` (its warm-up and calibration), a `WindowsTurn` (more windows) or the
`Release`. `Turns` is the process's side of that exchange, over whatever carries it (the trial's
pipes: `autotuner.trials.launcher`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


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
