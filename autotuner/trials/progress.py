"""Where a trial process is, for the console of the search that waits for it.

A trial process knows its phase (warm-up, calibration, window 3 of 5, drift step 2 of 5); the
search process, blocked on its result, does not. So a trial given a phase file
(`TrialRequest.progress`) rewrites it, one short line, at each change of phase, always outside
the timed windows (replaced whole: a reader never sees half a line), and the search's status
line reads it a few times a second (`autotuner.output.console.SearchReporter.running`). One file per
search process, in the study's folder: workers of one study never share it.

And how long the study has left: `time_left` extrapolates the trials still in the budget from
those that ran.
"""

from __future__ import annotations

import os
from pathlib import Path


class PhaseFile:
    """The trial side: `phase(text)` replaces the file's line; no path, nothing written."""

    def __init__(self, path: str | None):
        self.path = path

    def __call__(self, text: str) -> None:
        if self.path is None:
            return
        temporary = f"{self.path}.{os.getpid()}"
        try:
            with open(temporary, "w", encoding="utf-8") as out:
                out.write(text)
            os.replace(temporary, self.path)
        except OSError:  # progress is for the eye: it never fails a trial
            pass


def read_phase(path: Path) -> str | None:
    """The search side: the trial's phase, or None before it wrote one."""
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def phase_path(folder: Path) -> Path:
    """This search process's phase file in the study's folder `folder` (created here)."""
    (folder / "progress").mkdir(parents=True, exist_ok=True)
    return (folder / "progress" / f"{os.getpid()}.txt").resolve()


def time_left(elapsed_s: float, ran: int, budget: int) -> float | None:
    """The seconds the trials still in the budget should take at the pace of the `ran` that took
    `elapsed_s` (the search's own time between them included); None before one ran."""
    if ran <= 0:
        return None
    return elapsed_s / ran * max(0, budget - ran)


def duration(seconds: float) -> str:
    """`45s`, `3m05s`, `1h02m`."""
    total = round(seconds)
    if total < 60:
        return f"{total}s"
    if total < 3600:
        return f"{total // 60}m{total % 60:02d}s"
    return f"{total // 3600}h{total % 3600 // 60:02d}m"
