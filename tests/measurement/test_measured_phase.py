"""The drivers of a measured phase: a process measured alone, its windows far too short measured
again once, and a process of a lockstep group taking its turns; what their telemetry covers."""

from __future__ import annotations

import sys

import pytest

from autotuner.measurement.measured_phase import measure_in_lockstep, measure_solo
from autotuner.measurement.nvml import GpuSampler
from autotuner.measurement.telemetry import Telemetry
from autotuner.measurement.timing import Measuring, WindowTimer
from autotuner.measurement.turns import Release, SetupTurn, Turns, WindowsTurn
from tests.measurement.test_telemetry import FAST_UUID, FakeGpu, fake_pynvml
from tests.measurement.test_timing import Clock


class ScheduledClock(Clock):
    """A clock that only steps and waits move: steps take `step_s` each until `slow_steps` have
    been taken, then `fast_step_s`."""

    def __init__(self, step_s: float, slow_steps: int = 0, fast_step_s: float = 0.0) -> None:
        super().__init__(step_s)
        self.slow_steps, self.fast_step_s = slow_steps, fast_step_s

    def step(self) -> None:
        self.now += self.step_s if self.steps < self.slow_steps else self.fast_step_s
        self.steps += 1


def test_solo_windows_far_shorter_than_the_minimum_are_measured_again_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # the warm-up and the calibration (1 + 1 + 8 steps) at 1/64 s a step, the windows 16x faster
    clock = ScheduledClock(step_s=1 / 64, slow_steps=10, fast_step_s=1 / 1024)
    monkeypatch.setattr("autotuner.measurement.timing.time", clock)
    events: list[str] = []

    class Window:
        def __enter__(self) -> None:
            events.append("[")

        def __exit__(self, *exc: object) -> None:
            events.append("]")

    result = measure_solo(
        WindowTimer(clock.step, lambda: None),
        Measuring(warmup_steps=1, steps=1, windows=3, samples_per_step=2, min_window_s=0.5),
        telemetry=Window(),
        phase=events.append,
    )
    # calibrated at 32 steps (0.5 s at 1/64 s), the windows lasted 1/32 s: measured again at 512
    windows = [f"window {n} of 3" for n in (1, 2, 3)]
    assert events == ["warm-up, 1 steps", "calibration", "[", *windows, "]", "[", *windows, "]"]
    assert (result.steps, result.windows, result.stopped) == (512, 3, None)
    assert result.steps_taken == clock.steps == 1 + 1 + 8 + 3 * 32 + 3 * 512
    assert result.window_samples_per_s == [2048.0] * 3 and result.measured_s == 1.5
    # 10/64 s of warm-up and calibration, 3/32 s of the windows too short: the spans kept are the last
    assert result.window_spans == [(0.25, 0.75), (0.75, 1.25), (1.25, 1.75)]
    assert (result.warmup_s, result.calibration_s) == (1 / 64, 9 / 64)
    assert result.trained_s == 1.75  # from the warm-up's first step on


def test_the_lockstep_driver_takes_its_turns_and_leaves_the_waits_out(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(step_s=1 / 64)
    monkeypatch.setattr("autotuner.measurement.timing.time", clock)
    events: list[str] = []
    # a turn of no windows, or the release where windows are due, still measures one
    given = iter([SetupTurn(), WindowsTurn(0), WindowsTurn(3), Release(), Release()])

    def receive() -> object:
        clock.now += 100.0  # the other processes' turns
        return next(given)

    turns = Turns(lambda waiting: events.append(f"wait {waiting.measured}" if waiting.measuring else "done"), receive)
    result = measure_in_lockstep(
        WindowTimer(lambda: (clock.step(), events.append("s")), lambda: None),
        Measuring(warmup_steps=2, steps=2, windows=4, samples_per_step=1),
        turns,
        phase=lambda text: events.append(text.split(" of ")[0]),
    )
    assert events == [
        *["wait 0", "warm-up, 2 steps", "s", "s"],  # the setup turn
        *["wait 0", "s", "window 1", "s", "s"],
        *["wait 1", "s", "window 2", "s", "s", "window 3", "s", "s", "window 4", "s", "s"],
        "done",
    ]
    assert (result.windows, result.steps, result.stopped, result.calibration_s) == (4, 2, None, 0.0)
    assert result.steps_taken == clock.steps == 2 + 2 * 1 + 4 * 2
    assert result.trained_s == clock.steps / 64  # the steps' time: none of the waits
    assert len(result.window_spans) == 4 and result.measured_s == 4 * 2 / 64
    assert result.telemetry_samples == 4 * 2 * 1  # the windows' samples: not the untimed steps'


def _gpu_telemetry(monkeypatch: pytest.MonkeyPatch, clock: Clock, watts: float) -> Telemetry:
    """A trial's telemetry whose GPU is a fake NVML board, its energy counter advancing at `watts`
    on `clock` (which only steps move) and read on it."""
    board = FakeGpu(FAST_UUID, watts=watts, sampled_w=watts / 2)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([board], clock.perf_counter))
    measured = Telemetry(gpu_uuid=FAST_UUID)
    measured.gpu = GpuSampler(FAST_UUID, interval_s=0.001, clock=clock.perf_counter)
    return measured


def test_energy_per_sample_of_windows_measured_again_is_over_both_passes_samples(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The telemetry is entered around both passes and adds up their energy: its per-sample figure
    is over both passes' samples, the config's own (the watts times a step's time, over a step's
    samples), not both passes' energy over the second pass's samples."""
    clock = ScheduledClock(step_s=1 / 64, slow_steps=10, fast_step_s=1 / 1024)
    monkeypatch.setattr("autotuner.measurement.timing.time", clock)
    measured = _gpu_telemetry(monkeypatch, clock, watts=400.0)
    result = measure_solo(
        WindowTimer(clock.step, lambda: None),
        Measuring(warmup_steps=1, steps=1, windows=3, samples_per_step=2, min_window_s=0.5),
        telemetry=measured,
    )
    assert (result.steps, result.windows) == (512, 3)  # measured again: 3 windows of 32 steps first
    assert result.telemetry_samples == (3 * 32 + 3 * 512) * 2
    summary = measured.summary(result.telemetry_samples)
    energy_j = 400.0 * (3 * 32 + 3 * 512) / 1024  # over both passes' spans, nothing between them
    assert summary["energy_j_per_sample"] == pytest.approx(energy_j / result.telemetry_samples)
    assert summary["energy_j_per_sample"] == pytest.approx(400.0 / 1024 / 2)  # W x s a step / samples a step
    assert summary["power_w_mean"] == pytest.approx(400.0)


def test_energy_per_sample_in_lockstep_is_over_the_windows_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """In lockstep the telemetry is entered around each window: neither the other processes' turns
    nor the untimed step that opens each turn are in its energy or its samples."""
    clock = Clock(step_s=1 / 64)
    monkeypatch.setattr("autotuner.measurement.timing.time", clock)
    measured = _gpu_telemetry(monkeypatch, clock, watts=300.0)
    given = iter([SetupTurn(), WindowsTurn(1), WindowsTurn(2), Release()])

    def receive() -> object:
        clock.now += 100.0  # the other processes' turns: the counter runs on
        return next(given)

    result = measure_in_lockstep(
        WindowTimer(clock.step, lambda: None),
        Measuring(warmup_steps=2, steps=4, windows=3, samples_per_step=8),
        Turns(lambda waiting: None, receive),
        telemetry=measured,
    )
    assert result.steps_taken == 2 + 2 * 1 + 3 * 4 and result.telemetry_samples == 3 * 4 * 8
    summary = measured.summary(result.telemetry_samples)
    assert summary["energy_j_per_sample"] == pytest.approx(300.0 * 3 * 4 / 64 / (3 * 4 * 8))
    assert summary["energy_j_per_sample"] == pytest.approx(300.0 / 64 / 8)
