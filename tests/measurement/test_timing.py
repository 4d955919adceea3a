"""The timing protocol every backend shares: warm-up apart, windows between synchronizations,
a calibration window that lengthens windows too short to time."""

from __future__ import annotations

import ast
import subprocess
import sys
import time

import pytest

from autotuner.measurement.measured_phase import measure_throughput
from autotuner.measurement.timing import (
    Calibration,
    Measuring,
    Throughput,
    WindowTimer,
    calibrate,
    relative_spread,
)


class Recorder:
    def __init__(self, sleep_s: float = 0.0) -> None:
        self.sleep_s, self.events = sleep_s, []  # type: ignore[var-annotated]

    def step(self) -> None:
        self.events.append("step")
        if self.sleep_s:
            time.sleep(self.sleep_s)

    def sync(self) -> None:
        self.events.append("sync")

    def window_end(self) -> None:
        self.events.append("check")


def test_windows_are_bracketed_by_synchronizations_and_warmup_is_apart() -> None:
    rec = Recorder()
    result = measure_throughput(
        WindowTimer(rec.step, rec.sync, after_window=rec.window_end),
        Measuring(warmup_steps=2, steps=3, windows=2, samples_per_step=8),
    )
    window = ["sync", "step", "step", "step", "sync", "check"]
    # the warm-up synchronizes after its first step too: the steps after it start from an idle device
    assert rec.events == ["step", "sync", "step", "sync", *window, *window]
    assert (result.steps, result.windows, result.samples_per_step) == (3, 2, 8)
    assert result.calibration_s == 0.0 and len(result.window_samples_per_s) == 2
    assert result.samples_per_s > 0 and result.warmup_s >= 0


def test_a_calibration_window_lengthens_windows_shorter_than_the_minimum() -> None:
    rec = Recorder(sleep_s=0.001)
    result = measure_throughput(
        WindowTimer(rec.step, rec.sync),
        Measuring(warmup_steps=1, steps=2, windows=3, samples_per_step=4, min_window_s=0.05),
    )
    # each step sleeps at least 1 ms, so 2 steps last well under 50 ms: the window grows, at most 25x
    assert 2 < result.steps <= 50
    # calibration starts from one step, after the warm-up's step and synchronization ...
    assert rec.events[:5] == ["step", "sync", "sync", "step", "sync"]
    # ... and stops once a window lasts a quarter of 50 ms: fewer steps than one window of 50 ms
    calibration_steps = rec.events.count("step") - 1 - 3 * result.steps
    assert 1 < calibration_steps <= 50
    assert result.calibration_s > 0
    assert result.measured_s >= 3 * 0.001 * result.steps


def test_one_slow_step_in_a_short_calibration_window_does_not_shorten_the_windows() -> None:
    class Hiccup(Recorder):
        def step(self) -> None:
            super().step()
            if self.events.count("step") == 2:  # the calibration's first step, after the warm-up's
                time.sleep(0.01)

    rec = Hiccup(sleep_s=0.001)
    result = measure_throughput(
        WindowTimer(rec.step, rec.sync),
        Measuring(warmup_steps=1, steps=2, windows=3, samples_per_step=1, min_window_s=0.1),
    )
    # Timed from the first window alone (2 steps, 12 ms), windows would get 17 steps (about 20 ms).
    assert result.measured_s / 3 >= 0.1 * 0.75


def test_windows_already_long_enough_keep_their_steps() -> None:
    rec = Recorder(sleep_s=0.002)
    result = measure_throughput(
        WindowTimer(rec.step, rec.sync),
        Measuring(warmup_steps=0, steps=2, windows=2, samples_per_step=1, min_window_s=0.001),
    )
    assert result.steps == 2
    assert rec.events.count("step") == 2 + 2 * 2  # two windows of one step tell the pace


def test_a_slow_config_calibrates_on_one_step_not_a_whole_window() -> None:
    rec = Recorder(sleep_s=0.03)
    result = measure_throughput(
        WindowTimer(rec.step, rec.sync),
        Measuring(warmup_steps=0, steps=4, windows=2, samples_per_step=1, min_window_s=0.1),
    )
    # a 30 ms step lasts a quarter of 100 ms: two windows of one step tell the pace, and 4 steps
    # (120 ms) make a window, as the spec asks
    assert result.steps == 4 and rec.events.count("step") == 2 + 2 * 4
    assert result.calibration_s < 0.03 * 3


def test_a_hiccup_in_the_first_calibration_step_does_not_shorten_the_windows() -> None:
    class FirstStepHiccup(Recorder):
        def step(self) -> None:
            super().step()
            if self.events.count("step") == 2:  # the calibration's first step, after the warm-up's
                time.sleep(0.04)  # longer than a quarter of the minimum window

    rec = FirstStepHiccup(sleep_s=0.001)
    result = measure_throughput(
        WindowTimer(rec.step, rec.sync),
        Measuring(warmup_steps=1, steps=2, windows=3, samples_per_step=1, min_window_s=0.1),
    )
    # Taken at its word, the first step (41 ms) would leave the windows at 3 steps (about 3 ms).
    assert result.measured_s / 3 >= 0.1 * 0.75


def test_windows_far_shorter_than_the_minimum_are_measured_again_at_their_pace() -> None:
    """Other work slowed the whole calibration (20x), then stopped: the windows sized at that
    pace would last a twentieth of the minimum, too short to time or to tell contention in."""

    class SlowCalibration(Recorder):
        windows_began = False

        def step(self) -> None:
            super().step()
            if not self.windows_began:  # the warm-up and the calibration's steps
                time.sleep(0.02)

        def phase(self, text: str) -> None:
            self.windows_began = self.windows_began or text.startswith("window")

    rec = SlowCalibration(sleep_s=0.001)
    result = measure_throughput(
        WindowTimer(rec.step, rec.sync),
        Measuring(warmup_steps=1, steps=1, windows=3, samples_per_step=1, min_window_s=0.1),
        phase=rec.phase,
    )
    assert result.windows == 3 and len(result.window_spans) == 3
    assert result.measured_s / 3 >= 0.1 * 0.75


def test_every_step_is_counted_and_the_training_timed_from_the_warmup_on() -> None:
    rec = Recorder(sleep_s=0.002)
    result = measure_throughput(
        WindowTimer(rec.step, rec.sync),
        Measuring(warmup_steps=2, steps=3, windows=2, samples_per_step=1, min_window_s=0.02),
    )
    assert result.steps_taken == rec.events.count("step")  # warm-up, calibration and windows
    assert result.steps_taken > 2 + result.steps * result.windows  # calibration took some
    spent = result.warmup_s + result.calibration_s + result.measured_s
    assert spent <= result.trained_s <= spent + 0.05


def test_spread_is_range_over_median() -> None:
    assert relative_spread([90.0, 100.0, 110.0]) == 0.2
    assert relative_spread([5.0]) == 0.0


BUSY = """
import os, sys, time
from autotuner.measurement.telemetry import Telemetry
child = os.fork()
if child == 0:  # a second process of the group, like a data-loader worker
    deadline = time.perf_counter() + 5
    while time.perf_counter() < deadline:
        pass
    os._exit(0)
telemetry = Telemetry()
with telemetry:
    deadline = time.perf_counter() + 0.5
    while time.perf_counter() < deadline:
        pass
os.kill(child, 9)
os.waitpid(child, 0)
print(telemetry.summary(100))
"""


def test_cpu_telemetry_counts_the_whole_process_group() -> None:
    done = subprocess.run(
        [sys.executable, "-c", BUSY], capture_output=True, text=True, start_new_session=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    summary = ast.literal_eval(done.stdout.strip())
    assert summary["processes"] == 2  # the process and its child, nothing outside the group
    assert summary["cpu_cores"] >= 1 and summary["peak_rss_mb"] > 0
    assert summary["cpu_util_mean"] > 0
    assert "gpu_util_mean" not in summary  # no GPU sampler without a GPU UUID


def test_training_flops_are_counted_for_a_workload_that_does_not_declare_them() -> None:
    from autotuner.backends.pytorch import runner
    from tests.support.helpers import SMALL_MLP, request

    result = runner.TRIAL_BACKEND.run(request("autotuner.backends.pytorch.builtin:mlp", SMALL_MLP))
    # 16 -> 32 -> 32 -> 10: forward 2*in*out per layer, backward the weight gradient of every layer
    # and the input gradient of all but the first (the inputs need none).
    layers = [(16, 32), (32, 32), (32, 10)]
    forward = sum(2 * i * o for i, o in layers)
    assert result.flops_per_sample == forward + forward + sum(2 * i * o for i, o in layers[1:])
    assert (
        runner.TRIAL_BACKEND.run(
            request("autotuner.backends.pytorch.builtin:mlp", SMALL_MLP, measure=False)
        ).flops_per_sample
        is None
    )


class Clock:
    """A clock that only steps move: each step takes exactly `step_s`."""

    def __init__(self, step_s: float) -> None:
        self.now, self.step_s, self.steps = 0.0, step_s, 0

    def perf_counter(self) -> float:
        return self.now

    monotonic = perf_counter

    def step(self) -> None:
        self.now += self.step_s
        self.steps += 1


def test_matching_steps_the_windows_last_at_most_the_time_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """A baseline many times slower than the config it matches (`autotuner apply`) would run many
    times as long: with `match_most_s`, it matches as many of the steps as its windows cover in
    that time, at the calibration's pace."""
    clock = Clock(step_s=1 / 64)  # exact in binary: no rounding in the clock's sums
    monkeypatch.setattr("autotuner.measurement.timing.time", clock)

    def measured(**match: float) -> Throughput:
        return measure_throughput(
            WindowTimer(clock.step, lambda: None),
            Measuring(warmup_steps=1, steps=1, windows=3, samples_per_step=1, min_window_s=0.5, **match),
        )

    # calibration: 1 step, then 8 (125 ms, a quarter of 0.5 s): windows of 32 steps, 0.5 s
    unbounded = measured(match_steps=1000)
    assert (unbounded.steps, unbounded.windows) == (32, 32)
    bounded = measured(match_steps=1000, match_most_s=3.0)  # 3 s: six windows of 0.5 s
    assert (bounded.steps, bounded.windows) == (32, 6)
    assert measured(match_steps=1000, match_most_s=0.1).windows == 1  # one window at least
    assert measured(match_steps=100, match_most_s=3.0).windows == 4  # the steps matched first
    assert measured(match_most_s=0.1).windows == 3  # nothing to match: the windows asked


def test_calibration_starts_from_one_step_and_sizes_windows_at_the_last_ones_pace() -> None:
    asked: list[int] = []

    def window(count: int) -> float:  # 1/1024 s a step: exact in binary
        asked.append(count)
        return count / 1024

    calibration = calibrate(window, steps=4, min_window_s=1.0)
    # one step, then 256 (a quarter of a second): windows of 1024 steps last the whole second
    assert asked == [1, 256]
    assert calibration == Calibration(steps=1024, step_s=1 / 1024, seconds=1 / 1024 + 256 / 1024)
    assert calibrate(window, steps=2048, min_window_s=1.0).steps == 2048  # already long enough


def test_calibration_times_a_second_window_after_a_slow_first_step() -> None:
    asked: list[int] = []

    def window(count: int) -> float:
        asked.append(count)
        return 1.0 if len(asked) == 1 else count / 1024  # the first step hiccups for a whole second

    calibration = calibrate(window, steps=1, min_window_s=1.0)
    # taken at its word, the first step would leave windows of one step: a second window of one
    # step tells the pace, and a third one of a quarter of a second confirms it
    assert asked == [1, 1, 256]
    assert (calibration.steps, calibration.step_s) == (1024, 1 / 1024)


def test_calibration_on_a_sleeping_step_times_windows_of_the_timer() -> None:
    synced: list[int] = []
    timer = WindowTimer(lambda: time.sleep(0.002), lambda: synced.append(timer.taken))
    asked: list[int] = []

    def window(count: int) -> float:
        asked.append(count)
        return timer.window(count)

    calibration = calibrate(window, steps=1, min_window_s=0.04)
    assert asked[0] == 1 and len(asked) >= 2  # from one step, two windows at least
    assert timer.taken == sum(asked) and len(timer.spans) == len(asked)
    assert all(began <= ended for began, ended in timer.spans)
    assert len(synced) == 2 * len(asked)  # both edges of every window
    assert calibration.steps >= 1 and calibration.step_s > 0 and calibration.seconds > 0


def test_the_window_timer_counts_every_step_and_keeps_each_windows_span() -> None:
    events: list[str] = []
    timer = WindowTimer(
        lambda: events.append("step"),
        lambda: events.append("sync"),
        after_window=lambda: events.append("check"),
        after_warmup=lambda step: (events.append("after_warmup"), step()),
    )
    timer.warm_up(2)
    assert events == ["step", "sync", "step", "sync", "after_warmup", "step"]  # the step it was given counts
    assert timer.taken == 3 and timer.spans == []
    events.clear()
    timer.window(2)
    timer.window(1)
    assert events == ["sync", "step", "step", "sync", "check", "sync", "step", "sync", "check"]
    assert timer.taken == 6 and len(timer.spans) == 2
    assert timer.trained_s() >= timer.warmup_s >= 0


def test_the_windows_measured_are_the_asked_or_those_that_match_the_steps() -> None:
    settings = Measuring(warmup_steps=0, steps=1, windows=3, samples_per_step=1)
    assert settings.windows_for(steps=10, step_s=0.1) == 3
    matching = Measuring(warmup_steps=0, steps=1, windows=3, samples_per_step=1, match_steps=95, match_most_s=2.0)
    assert matching.windows_for(steps=10, step_s=0.0) == 10  # no pace known: no bound
    assert matching.windows_for(steps=10, step_s=1 / 64) == 10  # 10 windows of 10 steps: 1.6 s
    assert matching.windows_for(steps=10, step_s=1 / 16) == 3  # 2 s hold 3 windows of 0.625 s
    assert matching.windows_for(steps=10, step_s=1.0) == 1  # one window at least
