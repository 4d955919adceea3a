"""Lockstep measurement: trial processes measured together take turns, window by window, so
that a change in the machine's speed falls on every one of them alike."""

from __future__ import annotations

import dataclasses
import gc
import itertools
import multiprocessing.connection
from pathlib import Path

import pytest

from autotuner.measurement.measured_phase import measure_throughput
from autotuner.measurement.timing import Measuring, WindowTimer
from autotuner.measurement.turns import Release, SetupTurn, Turns, Waiting, WindowsTurn
from autotuner.spec.job import load_spec
from autotuner.trials import lockstep
from autotuner.trials.launcher import TrialLauncher
from autotuner.trials.lockstep import (
    SETTLE_MOST_S,
    SETTLED_S,
    STOPPED,
    _settle,
    _share,
    measure_together,
    run_in_lockstep,
)
from autotuner.trials.messages import send_message
from autotuner.trials.outcomes import Outcome
from autotuner.trials.request import TrialRequest
from tests.support.helpers import RUNNER, SMALL_MLP, request
from tests.support.studies import write_spec

MLP = "autotuner.backends.pytorch.builtin:mlp"


def _measured(**changes: object) -> TrialRequest:
    """The small mlp, 4 windows of at least 50 ms."""
    return dataclasses.replace(request(MLP, SMALL_MLP), **{"windows": 4, "min_window_s": 0.05, **changes})  # type: ignore[arg-type]


def _spans(result: object) -> list[tuple[float, float]]:
    return [tuple(span) for span in result.output.throughput.window_spans]  # type: ignore[attr-defined]


def test_processes_in_lockstep_measure_one_at_a_time_each_round_in_a_new_order(launcher: TrialLauncher) -> None:
    fp32 = _measured()
    bf16 = dataclasses.replace(fp32, config={**fp32.config, "precision": "bf16"})
    results = run_in_lockstep(launcher, RUNNER, "run", [fp32, bf16, fp32], 60)
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
        assert r.output.losses.heldout > 0 and r.output.telemetry["cpu_util_mean"] > 0


class _Clock:
    """`time` for `_settle`: a clock that moves only when it sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_turn_waits_until_the_group_has_stopped_using_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Group 1 burns CPU for 0.4 s and rests after; group 2 never rests. Scripted CPU readings
    and clock: what the wait decides, not how a loaded machine schedules two burners."""
    clock = _Clock()
    burning_until = {1: 0.4, 2: float("inf")}
    monkeypatch.setattr(lockstep, "time", clock)
    monkeypatch.setattr(
        lockstep, "groups_cpu_seconds", lambda groups: sum(min(clock.now, burning_until[g]) for g in groups)
    )
    _settle([1])
    assert 0.4 + SETTLED_S <= clock.now < 0.4 + SETTLED_S + 0.02  # settled once the burning was over
    started = clock.now
    _settle([2])
    assert clock.now - started == pytest.approx(SETTLE_MOST_S, abs=0.01)  # never resting: waited for at most


@pytest.mark.slow
def test_matching_the_first_the_others_measure_their_own_windows_over_its_steps(launcher: TrialLauncher) -> None:
    config, base = _measured(min_window_s=0.2), _measured(min_window_s=0.05)
    first, second = run_in_lockstep(launcher, RUNNER, "run", [config, base], 60, match_first=True)
    assert first.outcome is Outcome.OK and second.outcome is Outcome.OK
    ours, theirs = (r.output.throughput for r in (first, second))
    assert theirs.calibration_s > 0  # windows of its own length
    matched = ours.steps * ours.windows
    assert theirs.steps * (theirs.windows - 1) < matched <= theirs.steps * theirs.windows
    assert theirs.windows > ours.windows == 4  # shorter windows, more of them
    # One window a turn, in as many rounds as the other has windows: the first one's 4 spread
    # over them. When its k-th window began (in the round where its share reached k), the other
    # had measured one window a round before it, or that round's too (it went first), no other count.
    started = [start for start, _ in _spans(second)]
    for k, (begin, _) in enumerate(_spans(first), start=1):
        round_k = next(r for r in range(1, theirs.windows + 1) if _share(4, r, theirs.windows) >= k)
        before = sum(start < begin for start in started)
        assert round_k - 1 <= before <= round_k, (k, round_k, before)
    spans = sorted(_spans(first) + _spans(second))
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end <= start  # no two windows ran at once


def test_alone_a_trial_matches_the_steps_asked_in_windows_of_its_own_length(launcher: TrialLauncher) -> None:
    # how `measure_together` runs the others after the first where there is no lockstep (a GPU)
    result = launcher.call(RUNNER, "run", _measured(match_steps=1000), 60)
    assert result.outcome is Outcome.OK, result.reason
    measured = result.output.throughput
    assert measured.calibration_s > 0 and len(_spans(result)) == measured.windows
    assert measured.steps * (measured.windows - 1) < 1000 <= measured.steps * measured.windows


@pytest.mark.parametrize("device", ["cpu", "cuda"])  # in lockstep; one after another, as on a GPU
def test_matching_the_first_nothing_runs_on_once_it_has_failed(
    launcher: TrialLauncher, tmp_path: Path, device: str
) -> None:
    job = load_spec(write_spec(tmp_path))
    # the requests run on the CPU whatever `device` says: it only decides lockstep or not
    crashed, other = measure_together(
        launcher, job.backend.runner, [request("segfault"), _measured()], device, job.trial_timeout(), match_first=True
    )
    assert crashed.outcome is Outcome.CRASH
    assert other.outcome is Outcome.ERROR and other.reason == STOPPED and other.output is None


@pytest.mark.slow
def test_a_process_that_crashes_or_hangs_is_left_out_and_the_others_go_on(launcher: TrialLauncher) -> None:
    group = [_measured(), request("segfault"), request("hang"), _measured()]
    ok, crashed, hung, other = run_in_lockstep(launcher, RUNNER, "run", group, 8)
    assert crashed.outcome is Outcome.CRASH and "SIGSEGV" in crashed.reason
    assert hung.outcome is Outcome.TIMEOUT  # it hung in its turn: killed at the turn's timeout
    assert ok.outcome is Outcome.OK and other.outcome is Outcome.OK
    assert len(_spans(ok)) == len(_spans(other)) == 4


def test_a_process_that_measures_nothing_just_runs(launcher: TrialLauncher) -> None:
    reference = dataclasses.replace(_measured(), measure=False)  # the drift phase only: no turns
    done, measured = run_in_lockstep(launcher, RUNNER, "run", [reference, _measured()], 60)
    assert done.outcome is Outcome.OK and done.output.throughput is None
    assert measured.outcome is Outcome.OK and len(_spans(measured)) == 4


def test_the_measurement_waits_before_its_setup_each_turn_and_its_release() -> None:
    reports: list[Waiting] = []
    given = iter([SetupTurn(match_steps=9), WindowsTurn(2), WindowsTurn(1), WindowsTurn(1), WindowsTurn(1), Release()])
    turns = Turns(reports.append, lambda: next(given))
    result = measure_throughput(
        WindowTimer(lambda: None, lambda: None),
        Measuring(warmup_steps=1, steps=2, windows=3, samples_per_step=4),
        turns=turns,
    )
    assert result.windows == 5 and len(result.window_samples_per_s) == 5  # 9 steps matched, 2 a window
    # setup; a turn of 2 windows, then of 1 each; the release
    assert [r.measuring for r in reports] == [True, True, True, True, True, False]
    assert [(r.steps, r.windows) for r in reports[1:5]] == [(2, 5)] * 4
    assert [r.measured for r in reports[1:5]] == [0, 2, 3, 4]  # what the launcher plans the next turn by


def test_each_turn_begins_with_one_unmeasured_step() -> None:
    # Other processes ran since this one's last turn: the first step after the wait runs cold
    # (1.7-4.0% slower windows on the quickstart's baseline), so it is not timed.
    events: list[str] = []

    class Window:  # what the measurement enters around each timed window
        def __enter__(self) -> None:
            events.append("[")

        def __exit__(self, *exc: object) -> None:
            events.append("]")

    given = iter([SetupTurn(match_steps=9), WindowsTurn(2), WindowsTurn(1), WindowsTurn(1), WindowsTurn(1), Release()])
    measure_throughput(
        WindowTimer(lambda: events.append("s"), lambda: None),
        Measuring(warmup_steps=1, steps=2, windows=3, samples_per_step=4),
        telemetry=Window(),
        turns=Turns(lambda report: events.append("|"), lambda: next(given)),
    )
    # setup and warm-up; a turn of 2 windows, then 3 of 1; the release
    assert "".join(events) == "|s|s[ss][ss]|s[ss]|s[ss]|s[ss]|"


def test_what_is_no_turn_stops_the_trial_with_an_error_saying_what_came() -> None:
    turns = Turns(lambda report: None, lambda: {"run": 2})  # a bare dict, not a turn
    with pytest.raises(TypeError, match=r"the launcher sent \{'run': 2\} where a turn was due"):
        measure_throughput(
            WindowTimer(lambda: None, lambda: None),
            Measuring(warmup_steps=1, steps=2, windows=3, samples_per_step=4),
            turns=turns,
        )


def waits_or_sends_what_is_no_message(arg: str, turns: Turns) -> dict[str, int]:
    """Run in a lockstep trial process (`run_in_lockstep(launcher, __name__, ...)`): `foreign` sends
    the untyped form of `Waiting` on its result pipe, where the launcher reads its next message,
    and returns; anything else measures a step that does nothing, in its turns."""
    if arg == "foreign":
        pipe = next(
            obj
            for obj in gc.get_objects()
            if isinstance(obj, multiprocessing.connection.Connection) and obj.writable and not obj.closed
        )
        send_message(pipe, {"status": "waiting", "measuring": True})
        return {}
    measured = measure_throughput(
        WindowTimer(lambda: None, lambda: None),
        Measuring(warmup_steps=1, steps=2, windows=3, samples_per_step=1),
        turns=turns,
    )
    return {"windows": len(measured.window_samples_per_s)}


def test_a_process_that_sends_what_is_no_message_of_the_protocol_is_classified_and_the_others_go_on(
    launcher: TrialLauncher,
) -> None:
    foreign, measured = run_in_lockstep(
        launcher, __name__, "waits_or_sends_what_is_no_message", ["foreign", "measured"], 60
    )
    assert foreign.outcome is Outcome.CRASH and "unreadable result: {'status': 'waiting'" in foreign.reason
    assert measured.outcome is Outcome.OK and measured.output == {"windows": 3}


def test_the_share_of_windows_spreads_them_evenly_over_the_rounds() -> None:
    assert [_share(4, r, 4) for r in range(5)] == [0, 1, 2, 3, 4]  # equal windows: one a round
    assert [_share(10, r, 4) for r in range(5)] == [0, 2, 5, 7, 10]
    assert _share(10, 6, 4) == 10  # from the last planned round on: all that is left
    # planned over the most windows: a process with fewer gains one window a round at most
    shares = [_share(4, r, 10) for r in range(11)]
    assert shares == [0, 0, 0, 1, 1, 2, 2, 2, 3, 3, 4]
    assert all(b - a <= 1 for a, b in itertools.pairwise(shares))
