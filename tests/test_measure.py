"""The timing protocol every backend shares: warm-up apart, windows between synchronizations,
a calibration window that lengthens windows too short to time."""

from __future__ import annotations

import ast
import subprocess
import sys
import time

import pytest

from autotuner.measurement.timing import Throughput, measure_throughput, relative_spread


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
        rec.step, rec.sync, warmup_steps=2, steps=3, windows=2, samples_per_step=8, after_window=rec.window_end
    )
    window = ["sync", "step", "step", "step", "sync", "check"]
    assert rec.events == ["step", "step", "sync", *window, *window]
    assert (result.steps, result.windows, result.samples_per_step) == (3, 2, 8)
    assert result.calibration_s == 0.0 and len(result.window_samples_per_s) == 2
    assert result.samples_per_s > 0 and result.warmup_s >= 0


def test_a_calibration_window_lengthens_windows_shorter_than_the_minimum() -> None:
    rec = Recorder(sleep_s=0.001)
    result = measure_throughput(
        rec.step, rec.sync, warmup_steps=1, steps=2, windows=3, samples_per_step=4, min_window_s=0.05
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
        rec.step, rec.sync, warmup_steps=1, steps=2, windows=3, samples_per_step=1, min_window_s=0.1
    )
    # Timed from the first window alone (2 steps, 12 ms), windows would get 17 steps (about 20 ms).
    assert result.measured_s / 3 >= 0.1 * 0.75


def test_windows_already_long_enough_keep_their_steps() -> None:
    rec = Recorder(sleep_s=0.002)
    result = measure_throughput(
        rec.step, rec.sync, warmup_steps=0, steps=2, windows=2, samples_per_step=1, min_window_s=0.001
    )
    assert result.steps == 2
    assert rec.events.count("step") == 2 + 2 * 2  # two windows of one step tell the pace


def test_a_slow_config_calibrates_on_one_step_not_a_whole_window() -> None:
    rec = Recorder(sleep_s=0.03)
    result = measure_throughput(
        rec.step, rec.sync, warmup_steps=0, steps=4, windows=2, samples_per_step=1, min_window_s=0.1
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
        rec.step, rec.sync, warmup_steps=1, steps=2, windows=3, samples_per_step=1, min_window_s=0.1
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
        rec.step, rec.sync, warmup_steps=1, steps=1, windows=3, samples_per_step=1, min_window_s=0.1, phase=rec.phase
    )
    assert result.windows == 3 and len(result.window_spans) == 3
    assert result.measured_s / 3 >= 0.1 * 0.75


def test_every_step_is_counted_and_the_training_timed_from_the_warmup_on() -> None:
    rec = Recorder(sleep_s=0.002)
    result = measure_throughput(
        rec.step, rec.sync, warmup_steps=2, steps=3, windows=2, samples_per_step=1, min_window_s=0.02
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
    from tests.helpers import SMALL_MLP, request

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
            clock.step, lambda: None, warmup_steps=1, steps=1, windows=3, samples_per_step=1, min_window_s=0.5, **match
        )

    # calibration: 1 step, then 8 (125 ms, a quarter of 0.5 s): windows of 32 steps, 0.5 s
    unbounded = measured(match_steps=1000)
    assert (unbounded.steps, unbounded.windows) == (32, 32)
    bounded = measured(match_steps=1000, match_most_s=3.0)  # 3 s: six windows of 0.5 s
    assert (bounded.steps, bounded.windows) == (32, 6)
    assert measured(match_steps=1000, match_most_s=0.1).windows == 1  # one window at least
    assert measured(match_steps=100, match_most_s=3.0).windows == 4  # the steps matched first
    assert measured(match_most_s=0.1).windows == 3  # nothing to match: the windows asked
