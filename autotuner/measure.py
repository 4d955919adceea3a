"""Timing a training step honestly, the same way for every backend.

Warm-up steps run first (compilation, jit, allocator settling) and their wall time is kept as
`warmup_s`. With a minimum window duration, one calibration window of `steps` steps follows
(kept as `calibration_s`): when it was shorter than the minimum, every window gets
proportionally more steps, so a fast config is not timed over a few milliseconds of scheduler
noise. Then `windows` windows of that many optimizer steps each are timed, with the device
synchronized at both edges of every window; whatever the step does (data loading included) is
inside the window. Throughput is the median over windows; the spread (max - min over median) is
kept with it so a noisy measurement is visible.

With `cover_steps`, the windows (still of the calibrated length) are as many as it takes to cover
that many optimizer steps, instead of `windows`: two configs of different speeds can be run over
the same stretch of training, each measured in windows of its own length.

In lockstep (`autotuner.trial.TrialLauncher.lockstep`), several trial processes are measured
together and take turns: this process waits for its turn before its warm-up and calibration and
before each turn of windows (one, or as many as the launcher gives), so only one of them runs at
a time and a slow change in the machine's speed falls on all of them alike. After its last window
it waits once more, so that what it does next (the drift phase) does not run beside another's
window.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

from autotuner.results import Throughput


class Turns:
    """This trial process's side of a lockstep group: `wait` tells the launcher that the process
    is ready for its next turn (with what it reports) and returns when the turn is given."""

    def __init__(self, send: Callable[[dict[str, Any]], None], receive: Callable[[], dict[str, Any]]):
        self._send, self._receive = send, receive

    def wait(self, *, measuring: bool, **report: Any) -> dict[str, Any]:
        """`measuring`: whether the turn asked for is a measured one (False: the process has
        measured everything and waits to be released)."""
        self._send({"status": "waiting", "measuring": measuring, **report})
        return self._receive()


_turns: Turns | None = None


def take_turns(turns: Turns | None) -> None:
    """Make every later `measure_throughput` of this process wait for its turns (None: never)."""
    global _turns
    _turns = turns


def relative_spread(values: list[float]) -> float:
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle > 0 else 0.0


def measure_throughput(
    step: Callable[[], None],
    synchronize: Callable[[], None],
    *,
    warmup_steps: int,
    steps: int,
    windows: int,
    samples_per_step: int,
    min_window_s: float = 0.0,
    cover_steps: int = 0,
    after_window: Callable[[], None] | None = None,
    after_warmup: Callable[[], None] | None = None,
    telemetry: contextlib.AbstractContextManager[Any] | None = None,
) -> Throughput:
    """Time `step` (one optimizer step of `samples_per_step` samples).

    `after_window` runs after each window's closing synchronization, outside the timed span
    (a backend checks there that the loss stayed finite); `after_warmup` once after the warm-up
    steps (a backend resets its peak-memory counters there, so compiling and autotuning are not
    counted). `telemetry` (an
    `autotuner.telemetry.Telemetry`) is entered around the timed windows only (in lockstep,
    around each one). In lockstep, the launcher may give `cover_steps` in the first turn (another
    process's optimizer steps), and with every later turn how many windows to `run` in it; each
    turn begins with one untimed step.
    """
    turns = _turns
    given = turns.wait(measuring=True) if turns is not None else {}
    start = time.perf_counter()
    for _ in range(warmup_steps):
        step()
    synchronize()
    warmup_s = time.perf_counter() - start
    if after_warmup is not None:
        after_warmup()

    spans: list[tuple[float, float]] = []

    def window(count: int) -> float:
        synchronize()
        began = time.monotonic()
        start = time.perf_counter()
        for _ in range(count):
            step()
        synchronize()
        elapsed = time.perf_counter() - start
        spans.append((began, time.monotonic()))
        if after_window is not None:
            after_window()
        return elapsed

    calibration_s = 0.0
    if min_window_s > 0:
        calibration_s = window(steps)
        if calibration_s < min_window_s:
            steps = math.ceil(steps * min_window_s / max(calibration_s, 1e-9))
    cover_steps = int(given.get("cover_steps", cover_steps))
    if cover_steps > 0:
        windows = math.ceil(cover_steps / steps)
    telemetry = telemetry or contextlib.nullcontext()
    if turns is None:
        with telemetry:
            durations = [window(steps) for _ in range(windows)]
    else:
        durations = []
        while len(durations) < windows:
            turn = turns.wait(measuring=True, steps=steps, windows=windows, measured=len(durations))
            run = max(1, int(turn.get("run", 1)))
            # The first step after the wait runs cold (the others' windows emptied the caches,
            # the CPU idled while the group settled): timed, windows that open a turn (every one,
            # in re-measurement) came out 1.7-4.0% slower than those after them on the quickstart's
            # baseline, and a speedup would depend on how many windows a turn holds.
            step()
            synchronize()
            for _ in range(min(run, windows - len(durations))):
                with telemetry:
                    durations.append(window(steps))
        turns.wait(measuring=False)
    rates = [steps * samples_per_step / d for d in durations]
    return Throughput(
        samples_per_s=statistics.median(rates),
        spread=relative_spread(rates),
        window_samples_per_s=rates,
        warmup_s=warmup_s,
        measured_s=sum(durations),
        steps=steps,
        windows=windows,
        samples_per_step=samples_per_step,
        calibration_s=calibration_s,
        window_spans=spans[-windows:],
    )
