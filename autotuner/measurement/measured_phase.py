"""The measured phase of a trial process: its warm-up, its calibration, then its timed windows,
measured alone or in the turns of a lockstep group, with the pieces of `autotuner.measurement.timing`.

With `turns`, the process is one of a lockstep group (`autotuner.trials.lockstep`): it waits for its turn
before its warm-up and calibration, before each turn of windows and, after its last window, to be
released.

`measure_solo` and `measure_in_lockstep` drive the windows of a process measured alone or in its
turns; `measure_throughput` picks between the two.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
from collections.abc import Callable
from dataclasses import replace

from autotuner.measurement.pruning import Stopped
from autotuner.measurement.timing import Calibration, Measuring, Throughput, WindowTimer, calibrate, relative_spread
from autotuner.measurement.turns import SetupTurn, Turns, Waiting, WindowsTurn


def _quiet(text: str) -> None:
    """A `phase` that tells no one."""


def _set_up(timer: WindowTimer, settings: Measuring, phase: Callable[[str], None]) -> Calibration:
    """The warm-up, then the calibration where there is a minimum window."""
    phase(f"warm-up, {settings.warmup_steps} steps")
    timer.warm_up(settings.warmup_steps)
    if settings.min_window_s <= 0:
        return Calibration(steps=settings.steps, step_s=0.0)
    phase("calibration")
    return calibrate(timer.calibration_window, settings.steps, settings.min_window_s)


def _throughput(
    timer: WindowTimer,
    settings: Measuring,
    calibration: Calibration,
    durations: list[float],
    *,
    trained_s: float,
    earlier_steps: int = 0,
    rates: list[float] | None = None,
) -> Throughput:
    """The measured windows, of `calibration.steps` steps each: the last `timer.spans` (the
    calibration's windows, and those measured again, come before them). `earlier_steps`: the
    steps of windows measured before these inside the telemetry's spans (`measure_solo`'s first
    pass), which its figures cover as well. `rates`: the windows' rates where they are not the
    windows' own (a pruned trial's judged stretches)."""
    if rates is None:
        rates = [calibration.steps * settings.samples_per_step / d for d in durations]
    sampled_steps = earlier_steps + calibration.steps * len(durations)
    return Throughput(
        samples_per_s=statistics.median(rates),
        spread=relative_spread(rates),
        window_samples_per_s=rates,
        warmup_s=timer.warmup_s,
        warmup_steps=settings.warmup_steps,
        measured_s=sum(durations),
        steps=calibration.steps,
        windows=len(durations),
        samples_per_step=settings.samples_per_step,
        calibration_s=calibration.seconds,
        window_spans=timer.spans[-len(durations) :] if durations else [],
        steps_taken=timer.taken,
        trained_s=trained_s,
        telemetry_samples=sampled_steps * settings.samples_per_step,
    )


def _solo_windows(
    timer: WindowTimer,
    settings: Measuring,
    calibration: Calibration,
    durations: list[float],
    phase: Callable[[str], None],
) -> None:
    """Measure the windows, their durations appended to `durations` as each ends (a watch may
    stop the measurement inside one: those before it are kept)."""
    steps = calibration.steps
    windows = settings.windows_for(steps, calibration.step_s)
    while len(durations) < windows:
        phase(f"window {len(durations) + 1} of {windows}")
        durations.append(timer.window(steps))


def measure_solo(
    timer: WindowTimer,
    settings: Measuring,
    *,
    telemetry: contextlib.AbstractContextManager[object] | None = None,
    phase: Callable[[str], None] = _quiet,
) -> Throughput:
    """Measure a process alone: `telemetry` is entered around the windows. A timer with a watch
    (`autotuner.measurement.pruning.Pruner`) may be stopped anywhere after its warm-up's first
    step: the `Throughput` is then the pruned trial's (`_pruned`).

    Windows measured again (far shorter than the minimum) are measured under `telemetry` as well,
    and it keeps both passes (its samplers add up every span they are entered for): the first pass
    is the same config taking the same steps, so its energy, power and utilisation are as true of
    the config as the second's. What is per sample is over both passes' samples, then:
    `Throughput.telemetry_samples` counts them, where `steps * windows` counts the second pass's
    alone (energy per sample over it would hold the first pass's energy too). Keeping the second
    pass's telemetry only would need samplers that forget, for a figure no truer."""
    durations: list[float] = []
    calibration, earlier_steps = Calibration(steps=settings.steps, step_s=0.0), 0
    telemetry = telemetry or contextlib.nullcontext()
    try:
        calibration = _set_up(timer, settings, phase)
        with telemetry:
            _solo_windows(timer, settings, calibration, durations, phase)
        # A calibration that other work slowed (a process starting beside it, say) sizes windows
        # many times shorter than the minimum once the machine is itself again: too short to time
        # well or to tell contention in. They are measured again, once, at the length their own
        # pace asks for.
        min_window_s = settings.min_window_s
        if min_window_s > 0 and statistics.median(durations) < min_window_s / 4:
            median, steps = statistics.median(durations), calibration.steps
            earlier_steps = steps * len(durations)  # inside the telemetry's spans too
            calibration = replace(calibration, steps=math.ceil(steps * min_window_s / median), step_s=median / steps)
            durations = []
            with telemetry:
                _solo_windows(timer, settings, calibration, durations, phase)
    except Stopped as stop:
        return _pruned(timer, settings, calibration, durations, stop.reason, earlier_steps)
    return _throughput(
        timer, settings, calibration, durations, trained_s=timer.trained_s(), earlier_steps=earlier_steps
    )


def _pruned(
    timer: WindowTimer,
    settings: Measuring,
    calibration: Calibration,
    durations: list[float],
    reason: str,
    earlier_steps: int,
) -> Throughput:
    """What a pruned trial measured: the rates of the stretches its rule judged behind (as its
    windows' rates, their median as its throughput), its bound and floor, and the windows it
    finished before it was stopped (their time and telemetry)."""
    watch = timer.watch
    assert watch is not None  # only a watch stops a measurement
    measured = _throughput(
        timer,
        settings,
        calibration,
        durations,
        trained_s=timer.trained_s(),
        earlier_steps=earlier_steps,
        rates=list(watch.behind),
    )
    return dataclasses.replace(measured, stopped=reason, bound=watch.bound_rate, floor=watch.floor)


def measure_in_lockstep(
    timer: WindowTimer,
    settings: Measuring,
    turns: Turns,
    *,
    telemetry: contextlib.AbstractContextManager[object] | None = None,
    phase: Callable[[str], None] = _quiet,
) -> Throughput:
    """Measure a process in its turns of a lockstep group: the setup turn (the warm-up and the
    calibration; it may carry the optimizer steps to match, another process's), then turns of
    windows, each opened by one untimed step and holding as many windows as it says,
    `telemetry` entered around each window (not the untimed step: `telemetry_samples` are the
    windows'); then wait to be released. The waits for other processes' turns are not in
    `trained_s`."""
    setup = turns.wait(Waiting(measuring=True))
    if isinstance(setup, SetupTurn) and setup.match_steps > 0:
        settings = replace(settings, match_steps=setup.match_steps)
    calibration = _set_up(timer, settings, phase)
    steps = calibration.steps
    windows = settings.windows_for(steps, calibration.step_s)
    telemetry = telemetry or contextlib.nullcontext()
    durations: list[float] = []
    waited = 0.0
    while len(durations) < windows:
        began = timer.trained_s()  # the timer's clock: the waits are taken out of its training time
        turn = turns.wait(Waiting(measuring=True, steps=steps, windows=windows, measured=len(durations)))
        waited += timer.trained_s() - began
        run = max(1, turn.windows) if isinstance(turn, WindowsTurn) else 1
        # The first step after the wait runs cold (the others' windows emptied the caches,
        # the CPU idled while the group settled): timed, windows that open a turn (every one,
        # in re-measurement) came out 1.7-4.0% slower than those after them on the quickstart's
        # baseline, and a speedup would depend on how many windows a turn holds.
        timer.step()
        timer.synchronize()
        for _ in range(min(run, windows - len(durations))):
            phase(f"window {len(durations) + 1} of {windows}")
            with telemetry:
                durations.append(timer.window(steps))
    trained_s = timer.trained_s() - waited
    turns.wait(Waiting(measuring=False))
    return _throughput(timer, settings, calibration, durations, trained_s=trained_s)


def measure_throughput(
    timer: WindowTimer,
    settings: Measuring,
    *,
    telemetry: contextlib.AbstractContextManager[object] | None = None,
    turns: Turns | None = None,
    phase: Callable[[str], None] = _quiet,
) -> Throughput:
    """Time `timer`'s step (one optimizer step of `settings.samples_per_step` samples): alone
    (`measure_solo`), or with `turns` in a lockstep group (`measure_in_lockstep`).

    `telemetry` (an `autotuner.measurement.telemetry.Telemetry`) is entered around the timed
    windows only (in lockstep, around each one). A timer with a watch (not in lockstep) may be
    stopped by it (`measure_solo`). `phase` is told each phase as it begins, outside the timed spans
    (`autotuner.trials.progress`).
    """
    if turns is None:
        return measure_solo(timer, settings, telemetry=telemetry, phase=phase)
    return measure_in_lockstep(timer, settings, turns, telemetry=telemetry, phase=phase)
