"""A contended trial, decided: a trial whose windows other work took more than `CONTENDED_SHARE`
of the CPU in is run again once the machine is quiet (at most `trial.quiet_wait` seconds later),
and the run kept is flagged `contended` unless it ran on a quiet machine. The readings are given
here, so each case is decided the same way on any machine; tests/e2e/test_contention.py runs it
end to end beside real work."""

from __future__ import annotations

import io
import math
import types
from collections.abc import Iterator
from typing import Any, cast

import pytest
from rich.console import Console

from autotuner.measurement.contention import CONTENDED_SHARE
from autotuner.output.console import SearchReporter
from autotuner.search import dispatch
from autotuner.search.dispatch import TrialDispatch
from autotuner.trials.launcher import TrialResult
from autotuner.trials.outcomes import Outcome
from autotuner.trials.trial_output import Losses, TrialOutput

QUIET_WAIT_S = 60.0


def _run(share: float | None, outcome: Outcome = Outcome.OK) -> TrialResult[TrialOutput]:
    """A trial's result whose windows other work took `share` of the CPU in (None: too short to tell)."""
    telemetry = {"cpu_cores": 2.0} if share is None else {"cpu_cores": 2.0, "cpu_others_cores": 2.0 * share}
    if outcome is not Outcome.OK:
        return TrialResult(outcome, "it crashed")
    return TrialResult(Outcome.OK, output=TrialOutput(losses=Losses(math.nan, []), telemetry=telemetry))


class _Scripted(TrialDispatch):
    """A dispatch whose second run is given, not run."""

    again: TrialResult[TrialOutput]

    def _run(self, number: int, config: Any, best: float | None) -> TrialResult[TrialOutput]:
        return self.again


def _dispatch(again: TrialResult[TrialOutput]) -> _Scripted:
    job = types.SimpleNamespace(spec=types.SimpleNamespace(trial=types.SimpleNamespace(quiet_wait=QUIET_WAIT_S)))
    reporter = SearchReporter(Console(file=io.StringIO()))
    fields = dict.fromkeys(("study", "configs", "slots", "launcher", "capabilities", "environment", "reference"))
    scripted = _Scripted(job=cast(Any, job), reporter=reporter, max_trials=1, **cast(Any, fields))
    scripted.again = again
    return scripted


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """The load `wait_until_quiet` sees once it has waited (set `machine[0]`); the waits it was
    asked for land in `machine[1:]`."""
    seen: list[Any] = [0.0]

    def wait_until_quiet(max_wait_s: float, interval_s: float = 1.0) -> float | None:
        seen.append(max_wait_s)
        return seen[0]

    monkeypatch.setattr(dispatch, "wait_until_quiet", wait_until_quiet)
    yield seen


def test_a_trial_other_work_left_alone_is_kept_as_it_ran(machine: list[Any], capsys: pytest.CaptureFixture) -> None:
    for share in (None, 0.0, CONTENDED_SHARE):
        first = _run(share)
        kept, extra = _dispatch(_run(0.5))._when_contended(0, {}, first, "trial 1/1", None)
        assert kept is first and extra == {}
    assert len(machine) == 1 and capsys.readouterr().err == ""  # no wait, no second run, no line


def test_on_a_machine_that_became_quiet_the_second_run_is_kept_unflagged(
    machine: list[Any], capsys: pytest.CaptureFixture
) -> None:
    second = _run(0.02)
    kept, extra = _dispatch(second)._when_contended(3, {}, _run(0.55), "trial 2/4", None)
    assert kept is second and extra == {"contention_first_run": pytest.approx(0.55)}
    assert machine[1:] == [QUIET_WAIT_S]  # it waited for the quiet, at most trial.quiet_wait
    assert capsys.readouterr().err == (
        "autotuner: warning: trial 3: other work took 55% of the CPU during its windows; "
        "ran it again on a quiet machine (2%): that run is recorded\n"
    )


def test_a_second_run_other_work_took_too_is_kept_flagged(machine: list[Any], capsys: pytest.CaptureFixture) -> None:
    machine[0] = 0.5  # still busy after the wait
    second = _run(0.45)
    kept, extra = _dispatch(second)._when_contended(3, {}, _run(0.55), "trial 2/4", None)
    assert kept is second and extra == {"contention_first_run": pytest.approx(0.55), "contended": True}
    assert capsys.readouterr().err == (
        "autotuner: warning: trial 3: other work took 55% of the CPU during its windows; "
        "ran it again (45% after waiting 60 s): recorded, flagged contended\n"
    )


def test_a_second_run_too_short_to_tell_is_flagged_by_the_load_before_it(machine: list[Any]) -> None:
    """Its windows could not tell their own contention: the load the wait ended with decides."""
    machine[0] = 0.02
    assert _dispatch(_run(None))._when_contended(3, {}, _run(0.55), "t", None)[1] == {"contention_first_run": 0.55}
    machine[0] = 0.5
    extra = _dispatch(_run(None))._when_contended(3, {}, _run(0.55), "t", None)[1]
    assert extra == {"contention_first_run": 0.55, "contended": True}


def test_when_the_second_run_fails_the_first_is_kept_flagged(machine: list[Any], capsys: pytest.CaptureFixture) -> None:
    first = _run(0.55)
    kept, extra = _dispatch(_run(None, Outcome.CRASH))._when_contended(3, {}, first, "t", None)
    assert kept is first and extra == {"contention_first_run": 0.55, "contended": True}
    assert "its run again ended crash: the first run is recorded, flagged contended" in capsys.readouterr().err
