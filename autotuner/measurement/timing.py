"""Timing a training step honestly, the same way for every backend.

Warm-up steps run first (compilation, jit, allocator settling) and their wall time is kept as
`warmup_s`. With a minimum window duration, calibration windows follow (their wall time kept as
`calibration_s`), from one step until one (the second at least) lasts a quarter of the minimum:
when `steps` steps at that pace would last less than the minimum, every window gets
proportionally more steps, so a fast config is not timed over a few milliseconds of scheduler
noise. Then `windows` windows of
that many optimizer steps each are timed, with the device synchronized at both edges of every
window; whatever the step does (data loading included) is inside the window. Throughput is the
median over windows; the spread (max - min over median) is kept with it so a noisy measurement
is visible.

With `match_steps`, the windows (still of the calibrated length) are as many as it takes to match
that many optimizer steps, instead of `windows`: two configs of different speeds can be run over
the same stretch of training, each measured in windows of its own length. With `match_most_s` as
well, no more of them than last that long at the calibration's pace: a config many times slower
than the one it matches would otherwise run many times as long.

The pieces: `Measuring` holds what to measure (the caller builds it once); a `WindowTimer` takes
the caller's steps, counts them, runs the warm-up and times windows; `calibrate` sizes the
windows; `Throughput` is what a measured phase gives. The drivers that run the phase with them,
alone or in lockstep turns, are `autotuner.measurement.measured_phase`.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from autotuner.measurement.pruning import CALIBRATION, WARM_UP, WINDOW, Pruner


@dataclass(frozen=True)
class Throughput:
    """A trial's measured phase (`autotuner.measurement.measured_phase.measure_throughput`)."""

    samples_per_s: float
    """Median over windows."""
    spread: float
    """(max - min) / median over the windows' throughputs."""
    window_samples_per_s: list[float]
    warmup_s: float
    measured_s: float
    """Sum of the windows' wall time."""
    steps: int
    """Optimizer steps per window: the requested steps, raised to fill the minimum duration."""
    windows: int
    """Windows measured."""
    samples_per_step: int
    calibration_s: float = 0.0
    """Wall time of the calibration windows (0 without a minimum window duration)."""
    window_spans: list[tuple[float, float]] = field(default_factory=list)
    """When each window began and ended, by `time.monotonic` (one clock for every process of the
    machine: lockstep processes' windows can be set side by side)."""
    stopped: str | None = None
    """Why the measurement stopped before all its windows were measured (`autotuner.measurement.pruning`:
    the trial is pruned, its drift phase not run), or None. A pruned trial's `window_samples_per_s`
    are the rates of the stretches its rule judged behind, wherever they were (the warm-up, a
    calibration window, a window), and `samples_per_s` their median."""
    bound: float | None = None
    """A pruned trial's bound: the fastest of the stretches judged behind (`Pruner.bound_rate`)."""
    floor: float | None = None
    """A pruned trial's floor: the throughput it missed (`PruneBound.floor`)."""
    warmup_steps: int = 0
    """Optimizer steps of the warm-up, whose wall time is `warmup_s`."""
    steps_taken: int = 0
    """Every optimizer step the measured phase took: warm-up, calibration, the untimed step that
    opens each lockstep turn, the windows."""
    trained_s: float = 0.0
    """Wall time from the warm-up's first step to the last window's end, less the waits for other
    processes' turns in lockstep: the time those `steps_taken` steps took to train."""
    telemetry_samples: int = 0
    """Samples processed inside every span the driver entered its `telemetry` for: what the
    telemetry's per-sample figures (energy per sample) are over. The windows' samples, and in
    `measure_solo` those of windows measured again too, whose telemetry is kept (0 where a
    `Throughput` was built without it)."""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Throughput:
        """From `as_dict`'s form read back from JSON (the spans come back as lists)."""
        spans = [(float(start), float(end)) for start, end in data.get("window_spans", [])]
        return cls(**{**data, "window_spans": spans})


def relative_spread(values: list[float]) -> float:
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle > 0 else 0.0


@dataclass(frozen=True)
class Measuring:
    """What a measured phase measures (`autotuner.measurement.measured_phase`): the caller's
    settings, built once."""

    warmup_steps: int
    steps: int
    """Optimizer steps per window, raised by the calibration to fill `min_window_s`."""
    windows: int
    """Windows to measure, unless `match_steps` sets how many."""
    samples_per_step: int
    """Samples in one optimizer step."""
    min_window_s: float = 0.0
    """Shortest window; 0: no calibration, windows of `steps` steps."""
    match_steps: int = 0
    """When set, as many windows as it takes to match this many optimizer steps, not `windows`."""
    match_most_s: float = 0.0
    """When set, no more matching windows than last this long at the calibration's pace (without
    calibration, no bound)."""

    def windows_for(self, steps: int, step_s: float) -> int:
        """The windows to measure, of `steps` steps at `step_s` seconds a step (0: pace unknown):
        `windows`, or those that match `match_steps` within `match_most_s`."""
        if self.match_steps <= 0:
            return self.windows
        count = math.ceil(self.match_steps / steps)
        if self.match_most_s > 0 and step_s > 0:
            count = min(count, max(1, math.floor(self.match_most_s / (steps * step_s))))
        return count


STEP, SYNCHRONIZE, DONE = "step", "synchronize", "done"
"""What a measuring timer announces (`WindowTimer`'s `announce`) and a following one takes
(`WindowTimer.follow`): its public operations (with `WARM_UP` and `WINDOW`, the names of the
stretches they open), and the end of the measurement."""


class WindowTimer:
    """Takes a process's optimizer steps and times them: one per measurement.

    Every step it takes (warm-up, calibration, windows, the untimed step that opens a lockstep
    turn) is counted in `taken`; each window's span, by `time.monotonic`, is kept in `spans`.
    `after_window` runs after each window's closing synchronization, outside the timed span (a
    backend checks there that the loss stayed finite); `after_warmup` once after the warm-up
    steps, given the step to take any it needs (a backend resets its peak-memory counters there,
    so compiling and autotuning are not counted). With `announce`, each public operation (a step,
    a synchronization, the warm-up, a window) is announced, with its count of steps, before it
    runs: the other ranks of a trial of several processes take the same steps (`follow`). With
    `watch` (`autotuner.measurement.pruning.Pruner`), each step and each window is told to the
    rule that stops a losing trial; it raises `Stopped` from inside them. The warm-up
    synchronizes after its first step (leader and followers alike), so that the steps after it,
    which the rule may judge, start from an idle device.
    """

    def __init__(
        self,
        step: Callable[[], None],
        synchronize: Callable[[], None],
        *,
        after_window: Callable[[], None] | None = None,
        after_warmup: Callable[[Callable[[], None]], None] | None = None,
        announce: Callable[[str, int], None] | None = None,
        watch: Pruner | None = None,
    ) -> None:
        self._step, self._synchronize = step, synchronize
        self.watch = watch
        self._after_window, self._after_warmup = after_window, after_warmup
        self._announce = announce or (lambda what, count: None)
        self.taken = 0
        self.spans: list[tuple[float, float]] = []
        self.started = 0.0
        """`time.perf_counter` when the warm-up began: the training's start."""
        self.warmup_s = 0.0
        """The warm-up's wall time."""

    def _take(self) -> None:
        self._step()
        self.taken += 1
        if self.watch is not None:
            self.watch.stepped()

    def step(self) -> None:
        """One step, counted."""
        self._announce(STEP, 1)
        self._take()

    def synchronize(self) -> None:
        """Wait for the device (and, in a trial of several processes, for every rank)."""
        self._announce(SYNCHRONIZE, 0)
        self._synchronize()

    def warm_up(self, steps: int) -> None:
        """Take `steps` steps and synchronize, timed as `warmup_s`; then `after_warmup`."""
        self._announce(WARM_UP, steps)
        self.started = start = time.perf_counter()
        try:
            for taken in range(steps):
                self._take()
                if taken == 0 and steps > 1:  # the first step pays for compiling: the rest may be judged
                    self._synchronize()
                    if self.watch is not None:
                        self.watch.begin(WARM_UP, steps - 1)
            self._synchronize()
        finally:  # a watch may stop it: what it took is still the warm-up's
            self.warmup_s = time.perf_counter() - start
        if self.watch is not None:
            self.watch.ended()
        if self._after_warmup is not None:
            self._after_warmup(self._take)  # given the step, so that one it takes is counted

    def window(self, count: int, kind: str = WINDOW) -> float:
        """Take `count` steps between two synchronizations; their wall time. `kind`: a measured
        window, or one of the calibration's (`CALIBRATION`), as the watch is told."""
        self._announce(WINDOW, count)
        self._synchronize()
        began = time.monotonic()
        start = time.perf_counter()
        if self.watch is not None:
            self.watch.begin(kind, count)
        for _ in range(count):
            self._take()
        self._synchronize()
        elapsed = time.perf_counter() - start
        self.spans.append((began, time.monotonic()))
        if self._after_window is not None:
            self._after_window()
        if self.watch is not None:
            self.watch.ended(elapsed)
        return elapsed

    def calibration_window(self, count: int) -> float:
        """A window of the calibration (`calibrate`): timed as any, told to the watch as such."""
        return self.window(count, CALIBRATION)

    def follow(self, command: Callable[[], tuple[str, int]]) -> bool:
        """Take the steps another rank's timer announces, as it announces them, until it is done:
        a rank of a trial of several processes (`autotuner.trials.training.RankGroup`) steps, and
        synchronizes, exactly as the rank that measures. Whether the measurement was stopped early."""
        while True:
            what, count = command()
            if what == DONE:
                return bool(count)
            if what == STEP:
                self._take()
            elif what == SYNCHRONIZE:
                self._synchronize()
            elif what == WARM_UP:
                self.warm_up(count)
            else:
                self.window(count)

    def trained_s(self) -> float:
        """Wall time since the warm-up began."""
        return time.perf_counter() - self.started


@dataclass(frozen=True)
class Calibration:
    """The windows' length and the pace it was set by."""

    steps: int
    """Optimizer steps per window."""
    step_s: float
    """Seconds a step (0 without calibration: the pace is unknown)."""
    seconds: float = 0.0
    """Wall time of the calibration windows."""


def calibrate(window: Callable[[int], float], steps: int, min_window_s: float) -> Calibration:
    """Size windows of at least `steps` steps to last `min_window_s` (> 0), timing windows of
    `window(count)` steps (`WindowTimer.window`)."""
    # From one step, then windows sized at the last one's pace to last a quarter of the minimum,
    # until one does, two at least: a slow config learns its pace from a step or two, not from
    # a whole window, and a hiccup in the first step or in a window of a few milliseconds
    # cannot shorten every window after it many times over.
    quarter, count, timed = min_window_s / 4, 1, 1
    last = seconds = window(count)
    while timed < 2 or last < quarter:
        at_least = 2 * count if last < quarter else 1
        count = max(at_least, math.ceil(count * quarter / max(last, 1e-9)))
        last = window(count)
        seconds += last
        timed += 1
    return Calibration(steps=max(steps, math.ceil(count * min_window_s / last)), step_s=last / count, seconds=seconds)
