"""Timing a training step honestly, the same way for every backend.

Warm-up steps run first (compilation, jit, allocator settling) and their wall time is kept as
`warmup_s`. With a minimum window duration, one calibration window of `steps` steps follows
(kept as `calibration_s`): when it was shorter than the minimum, every window gets
proportionally more steps, so a fast config is not timed over a few milliseconds of scheduler
noise. Then `windows` windows of that many optimizer steps each are timed, with the device
synchronized at both edges of every window; whatever the step does (data loading included) is
inside the window. Throughput is the median over windows; the spread (max - min over median) is
kept with it so a noisy measurement is visible.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Throughput:
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
    samples_per_step: int
    calibration_s: float = 0.0
    """Wall time of the calibration window (0 without a minimum window duration)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


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
    after_window: Callable[[], None] | None = None,
    telemetry: contextlib.AbstractContextManager[Any] | None = None,
) -> Throughput:
    """Time `step` (one optimizer step of `samples_per_step` samples).

    `after_window` runs after each window's closing synchronization, outside the timed span
    (a backend checks there that the loss stayed finite). `telemetry` (an
    `autotuner.telemetry.Telemetry`) is entered around the timed windows only.
    """
    start = time.perf_counter()
    for _ in range(warmup_steps):
        step()
    synchronize()
    warmup_s = time.perf_counter() - start

    def window(count: int) -> float:
        synchronize()
        start = time.perf_counter()
        for _ in range(count):
            step()
        synchronize()
        elapsed = time.perf_counter() - start
        if after_window is not None:
            after_window()
        return elapsed

    calibration_s = 0.0
    if min_window_s > 0:
        calibration_s = window(steps)
        if calibration_s < min_window_s:
            steps = math.ceil(steps * min_window_s / max(calibration_s, 1e-9))
    with telemetry or contextlib.nullcontext():
        durations = [window(steps) for _ in range(windows)]
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
    )
