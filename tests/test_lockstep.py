"""Lockstep measurement: trial processes measured together take turns, window by window, so
that a change in the machine's speed falls on every one of them alike."""

from __future__ import annotations

import dataclasses
import itertools
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotuner.measure import Turns, measure_throughput, take_turns
from autotuner.outcomes import Outcome
from autotuner.trial import SETTLE_MOST_S, TrialLauncher, TrialRequest, _settle
from tests.helpers import RUNNER, SMALL_MLP, request

MLP = "backends.pytorch.workloads:mlp"


@pytest.fixture(scope="module")
def launcher() -> TrialLauncher:
    return TrialLauncher([RUNNER])


def _measured(**changes: object) -> TrialRequest:
    """The small mlp, 4 windows of at least 50 ms."""
    return dataclasses.replace(request(MLP, SMALL_MLP), **{"windows": 4, "min_window_s": 0.05, **changes})  # type: ignore[arg-type]


def _spans(result: object) -> list[tuple[float, float]]:
    return [tuple(span) for span in result.result["throughput"]["window_spans"]]  # type: ignore[attr-defined]


def test_processes_in_lockstep_measure_one_at_a_time_each_round_in_a_new_order(launcher: TrialLauncher) -> None:
    fp32 = _measured()
    bf16 = dataclasses.replace(fp32, config={**fp32.config, "precision": "bf16"})
    results = launcher.lockstep(RUNNER, "run", [fp32, bf16, fp32], 60)
    assert [r.outcome for r in results] == [Outcome.OK] * 3, [r.reason for r in results]
    spans = sorted((start, end, k) for k, r in enumerate(results) for start, end in _spans(r))
    for (_, end, _), (start, _, _) in itertools.pairwise(spans):
        assert end <= start  # no two windows ran at once
    order = [k for _, _, k in spans]
    rounds = [order[i : i + 3] for i in range(0, 12, 3)]
    assert all(sorted(r) == [0, 1, 2] for r in rounds)  # each one window a round
    # No process always follows the same one within a round (a neighbour's leftovers would always
    # fall on it): in a fixed rotation each process has one predecessor inside a round, ever.
    before: dict[int, set[int]] = {}
    for r in rounds:
        for previous, k in itertools.pairwise(r):
            before.setdefault(k, set()).add(previous)
    assert any(len(p) > 1 for p in before.values()), rounds
    for r in results:  # each drifted and was measured as a trial alone would be
        assert r.result["losses"]["heldout"] > 0 and r.result["telemetry"]["cpu_util_mean"] > 0


BURNER = """
import os, pathlib, sys, time
os.setpgrp()
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    pass
pathlib.Path(sys.argv[2]).write_text("done")
time.sleep(60)
"""


def test_a_turn_waits_until_the_group_has_stopped_using_the_cpu(tmp_path: Path) -> None:
    marker = tmp_path / "done"
    busy = subprocess.Popen([sys.executable, "-c", BURNER, "0.4", str(marker)])
    forever = subprocess.Popen([sys.executable, "-c", BURNER, "3600", str(tmp_path / "never")])
    try:
        time.sleep(0.1)
        _settle([busy.pid])
        assert marker.exists()  # it settled once the burning was over, not before
        started = time.monotonic()
        _settle([forever.pid])
        assert time.monotonic() - started < SETTLE_MOST_S + 2  # never resting: waited for at most
    finally:
        busy.kill()
        forever.kill()


def test_with_the_same_steps_the_others_take_the_first_ones_calibration(launcher: TrialLauncher) -> None:
    config, base = _measured(), _measured(min_window_s=0.2)
    first, second = launcher.lockstep(RUNNER, "run", [config, base], 60, same_steps=True)
    assert first.outcome is Outcome.OK and second.outcome is Outcome.OK
    assert first.result["throughput"]["calibration_s"] > 0
    assert second.result["throughput"]["calibration_s"] == 0  # not calibrated: told
    assert second.result["throughput"]["steps"] == first.result["throughput"]["steps"]


def test_a_process_that_crashes_or_hangs_is_left_out_and_the_others_go_on(launcher: TrialLauncher) -> None:
    group = [_measured(), request("segfault"), request("hang"), _measured()]
    ok, crashed, hung, other = launcher.lockstep(RUNNER, "run", group, 8)
    assert crashed.outcome is Outcome.CRASH and "SIGSEGV" in crashed.reason
    assert hung.outcome is Outcome.TIMEOUT  # it hung in its turn: killed at the turn's timeout
    assert ok.outcome is Outcome.OK and other.outcome is Outcome.OK
    assert len(_spans(ok)) == len(_spans(other)) == 4


def test_a_process_that_measures_nothing_just_runs(launcher: TrialLauncher) -> None:
    reference = dataclasses.replace(_measured(), measure=False)  # the drift phase only: no turns
    done, measured = launcher.lockstep(RUNNER, "run", [reference, _measured()], 60)
    assert done.outcome is Outcome.OK and "throughput" not in done.result
    assert measured.outcome is Outcome.OK and len(_spans(measured)) == 4


@pytest.fixture
def turns() -> Iterator[list[dict[str, object]]]:
    """Turns given at once, with what the measurement reported each time."""
    reports: list[dict[str, object]] = []
    given = iter([{"steps": 7}])
    take_turns(Turns(reports.append, lambda: next(given, {})))
    yield reports
    take_turns(None)


def test_the_measurement_waits_before_its_setup_each_window_and_its_release(turns: list[dict[str, object]]) -> None:
    result = measure_throughput(
        lambda: None, lambda: None, warmup_steps=1, steps=2, windows=3, samples_per_step=4, min_window_s=1.0
    )
    assert result.steps == 7 and result.calibration_s == 0  # the first turn set the steps
    assert [r["measuring"] for r in turns] == [True, True, True, True, False]
    assert [r.get("steps") for r in turns[1:4]] == [7, 7, 7]
