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

With `turns`, the process is one of a lockstep group (`autotuner.trials.lockstep`): it waits for its turn
before its warm-up and calibration, before each turn of windows and, after its last window, to be
released.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from autotuner.measurement.turns import SetupTurn, Turns, Waiting, WindowsTurn


@dataclass(frozen=True)
class Throughput:
    """A trial's measured phase (`autotuner.measurement.timing.measure_throughput`)."""

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
    """Why the windows stopped before all were measured (`autotuner.measurement.pruning`: the trial is pruned,
    its drift phase not run), or None."""
    warmup_steps: int = 0
    """Optimizer steps of the warm-up, whose wall time is `warmup_s`."""
    steps_taken: int = 0
    """Every optimizer step the measured phase took: warm-up, calibration, the untimed step that
    opens each lockstep turn, the windows."""
    trained_s: float = 0.0
    """Wall time from the warm-up's first step to the last window's end, less the waits for other
    processes' turns in lockstep: the time those `steps_taken` steps took to train."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Throughput:
        """From `as_dict`'s form read back from JSON (the spans come back as lists)."""
        spans = [(float(start), float(end)) for start, end in data.get("window_spans", [])]
        return cls(**{**data, "window_spans": spans})


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
    match_steps: int = 0,
    match_most_s: float = 0.0,
    after_window: Callable[[], None] | None = None,
    after_warmup: Callable[[Callable[[], None]], None] | None = None,
    telemetry: contextlib.AbstractContextManager[Any] | None = None,
    turns: Turns | None = None,
    stop: Callable[[list[float]], str | None] | None = None,
    phase: Callable[[str], None] = lambda text: None,
) -> Throughput:
    """Time `step` (one optimizer step of `samples_per_step` samples).

    `after_window` runs after each window's closing synchronization, outside the timed span
    (a backend checks there that the loss stayed finite); `after_warmup` once after the warm-up
    steps, given the step to take any it needs (a backend resets its peak-memory counters there,
    so compiling and autotuning are not counted). `telemetry` (an
    `autotuner.measurement.telemetry.Telemetry`) is entered around the timed windows only (in lockstep,
    around each one). With `turns`, the setup turn may carry the optimizer steps to match (another
    process's), and every later turn how many windows to measure in it; each turn of windows
    begins with one untimed step. `match_most_s` bounds the matching windows' time (at the
    calibration's pace; without calibration, no bound). `stop` (not in lockstep) is asked after
    each window, with the windows' rates so far, whether to stop there; the reason it gives is
    kept as `stopped`.
    `phase` is told each phase as it begins, outside the timed spans (`autotuner.trials.progress`).
    """
    setup = turns.wait(Waiting(measuring=True)) if turns is not None else None
    taken, waited = 0, 0.0
    user_step = step

    def counted() -> None:
        nonlocal taken
        user_step()
        taken += 1

    step = counted  # every step below is counted in `steps_taken`

    def wait(waiting: Waiting) -> Any:
        nonlocal waited
        began = time.perf_counter()
        try:
            assert turns is not None
            return turns.wait(waiting)
        finally:
            waited += time.perf_counter() - began

    phase(f"warm-up, {warmup_steps} steps")
    start = trained_from = time.perf_counter()
    for _ in range(warmup_steps):
        step()
    synchronize()
    warmup_s = time.perf_counter() - start
    if after_warmup is not None:
        after_warmup(step)  # given the step, so that one it takes is counted

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

    calibration_s, step_s = 0.0, 0.0
    if min_window_s > 0:
        phase("calibration")
        # From one step, then windows sized at the last one's pace to last a quarter of the minimum,
        # until one does, two at least: a slow config learns its pace from a step or two, not from
        # a whole window, and a hiccup in the first step or in a window of a few milliseconds
        # cannot shorten every window after it many times over.
        quarter, count, timed = min_window_s / 4, 1, 1
        last = calibration_s = window(count)
        while timed < 2 or last < quarter:
            at_least = 2 * count if last < quarter else 1
            count = max(at_least, math.ceil(count * quarter / max(last, 1e-9)))
            last = window(count)
            calibration_s += last
            timed += 1
        steps = max(steps, math.ceil(count * min_window_s / last))
        step_s = last / count

    def matching(steps: int) -> int:
        """The windows of `steps` steps that match `match_steps`, within `match_most_s`."""
        count = math.ceil(match_steps / steps)
        if match_most_s > 0 and step_s > 0:
            count = min(count, max(1, math.floor(match_most_s / (steps * step_s))))
        return count

    if isinstance(setup, SetupTurn) and setup.match_steps > 0:
        match_steps = setup.match_steps
    if match_steps > 0:
        windows = matching(steps)
    telemetry = telemetry or contextlib.nullcontext()
    stopped = None
    durations: list[float] = []
    if turns is None:

        def measure_windows() -> None:
            nonlocal stopped
            with telemetry:
                while len(durations) < windows and stopped is None:
                    phase(f"window {len(durations) + 1} of {windows}")
                    durations.append(window(steps))
                    if stop is not None:
                        stopped = stop([steps * samples_per_step / d for d in durations])

        measure_windows()
        # A calibration that other work slowed (a process starting beside it, say) sizes windows
        # many times shorter than the minimum once the machine is itself again: too short to time
        # well or to tell contention in. They are measured again, once, at the length their own
        # pace asks for.
        if min_window_s > 0 and stopped is None and statistics.median(durations) < min_window_s / 4:
            step_s = statistics.median(durations) / steps
            steps = math.ceil(steps * min_window_s / statistics.median(durations))
            if match_steps > 0:
                windows = matching(steps)
            durations.clear()
            measure_windows()
    else:
        while len(durations) < windows:
            turn = wait(Waiting(measuring=True, steps=steps, windows=windows, measured=len(durations)))
            run = max(1, turn.windows) if isinstance(turn, WindowsTurn) else 1
            # The first step after the wait runs cold (the others' windows emptied the caches,
            # the CPU idled while the group settled): timed, windows that open a turn (every one,
            # in re-measurement) came out 1.7-4.0% slower than those after them on the quickstart's
            # baseline, and a speedup would depend on how many windows a turn holds.
            step()
            synchronize()
            for _ in range(min(run, windows - len(durations))):
                phase(f"window {len(durations) + 1} of {windows}")
                with telemetry:
                    durations.append(window(steps))
        trained_s = time.perf_counter() - trained_from - waited
        turns.wait(Waiting(measuring=False))
    if turns is None:
        trained_s = time.perf_counter() - trained_from
    rates = [steps * samples_per_step / d for d in durations]
    return Throughput(
        samples_per_s=statistics.median(rates),
        spread=relative_spread(rates),
        window_samples_per_s=rates,
        warmup_s=warmup_s,
        warmup_steps=warmup_steps,
        measured_s=sum(durations),
        steps=steps,
        windows=len(durations),
        samples_per_step=samples_per_step,
        calibration_s=calibration_s,
        window_spans=spans[-len(durations) :],
        stopped=stopped,
        steps_taken=taken,
        trained_s=trained_s,
    )
