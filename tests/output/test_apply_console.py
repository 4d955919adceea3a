"""What `autotuner apply` prints and warns of a run it measured (`autotuner.output.apply_console`,
the run given here as `autotuner.results.applied_run.AppliedRun`; `tests/e2e/test_apply.py` runs it)."""

from __future__ import annotations

import dataclasses
import io

import pytest

from autotuner.export.reader import parse_config
from autotuner.measurement.interval import DRIFT, stated_interval
from autotuner.measurement.timing import Throughput
from autotuner.output.apply_console import print_applied
from autotuner.results.applied_run import AppliedRun
from autotuner.results.promise import EXIT_CODES, look_level
from autotuner.trials.probe import Environment
from autotuner.trials.trial_output import Latency
from tests.support.helpers import EXPORTED


def _applied(
    tuned_samples_per_s: float, baseline_samples_per_s: float | None, windows: list[float] | None = None
) -> AppliedRun:
    """What `apply_config` returns, for a run that measured these throughputs (and window rates)."""
    tuned = parse_config(EXPORTED, "job.best.yaml")

    def measured(rate: float, windows: list[float] | None = None) -> Throughput:
        return Throughput(
            samples_per_s=rate,
            spread=0.01,
            window_samples_per_s=windows or [rate] * 5,
            warmup_s=0.1,
            measured_s=1.0,
            steps=10,
            windows=5,
            samples_per_step=16,
        )

    return AppliedRun(
        tuned=tuned,
        config=dict(tuned.params),
        environment=Environment("pytorch", "cpu", "test CPU", "6.1", {"python": "3.11"}, {"accelerator": False}),
        throughput=measured(tuned_samples_per_s, windows),
        heldout_loss=None,
        drift_steps=3,
        wall_s=1.0,
        baseline=measured(baseline_samples_per_s) if baseline_samples_per_s else None,
    )


@pytest.mark.parametrize(
    ("tuned", "baseline", "warned"),
    [
        (1234.5, 500.0, None),  # 2.469x, as the export says
        (1234.5, 520.0, None),  # 2.374x: 3.8% under, within the promise
        (1234.5, 560.0, "10.7% below"),  # 2.204x
        (1100.0, 400.0, "11.4% above"),  # 2.750x (the study's baseline was unlucky)
        (1234.5, 470.0, "6.4% above"),  # 2.627x: says by how much, not "5% (more than 5%)"
    ],
)
def test_apply_warns_when_the_speedup_it_delivers_is_not_the_exports(
    tuned: float, baseline: float, warned: str | None
) -> None:
    run = _applied(tuned, baseline)
    out, err = io.StringIO(), io.StringIO()
    print_applied(run, out, err)
    assert run.speedup == pytest.approx(tuned / baseline)
    assert f"speedup: {tuned / baseline:.2f}x here" in out.getvalue() and "2.47x in the export" in out.getvalue()
    assert ("the speedup here is" in err.getvalue()) is bool(warned), err.getvalue()
    assert warned is None or f"the speedup here is {warned} the export's (more than 5%)" in err.getvalue()
    assert run.keeps_promise is (not warned)


def _with_intervals(export: list[float] | None, rounds: list[float]) -> AppliedRun:
    """An applied run whose promise check measured `rounds` (as many as it could: its last look),
    of an export whose speedup's rounds were `export`."""
    run = _applied(1234.5, 500.0)
    study = stated_interval(export) if export else None
    tuned = dataclasses.replace(run.tuned, speedup=study.estimate if study else 2.469, speedup_interval=study)
    return dataclasses.replace(run, tuned=tuned, rounds=tuple(rounds), most_rounds=len(rounds))


EXPORT = [2.5, 2.4, 2.45]
"""An export's rounds: 2.45x, 90% interval 2.35-2.56x as stated; widened by 10%, 2.13-2.81x."""


@pytest.mark.parametrize(
    ("export", "rounds", "verdict", "code"),
    [
        (EXPORT, [2.45, 2.5, 2.42], "kept", 0),  # here 2.36-2.56x (92%): within 2.13-2.81x
        (EXPORT, [2.25, 2.28, 2.26], "kept", 0),  # 2.20-2.33x: 8% below the export's 2.45x, within its promise
        (EXPORT, [1.9, 1.95, 1.92], "not kept", 1),  # 1.85-1.99x: wholly below
        (EXPORT, [2.9, 2.95, 2.92], "not kept", 1),  # 2.83-3.02x: faster than promised is not the promise
        (EXPORT, [2.3, 2.6], "undecided", 3),  # two rounds far apart: 1.66-3.60x
        (None, [2.45, 2.5, 2.42], "kept", 0),  # an export of one round: its speedup widened, 2.24-2.72x
        (None, [1.9, 1.95, 1.92], "not kept", 1),
    ],
)
def test_apply_says_whether_the_promise_is_kept_not_kept_or_undecided(
    export: list[float] | None, rounds: list[float], verdict: str, code: int
) -> None:
    run = _with_intervals(export, rounds)
    out, err = io.StringIO(), io.StringIO()
    print_applied(run, out, err)
    here, checked, promised = stated_interval(rounds), run.checked, run.promised
    assert here is not None and run.interval == here and checked is not None and promised is not None
    assert checked.level == pytest.approx(look_level(len(rounds), len(rounds)))
    assert run.verdict is not None and run.verdict.value == verdict and EXIT_CODES[run.verdict] == code
    line = next(line for line in out.getvalue().splitlines() if line.startswith("promise:"))
    assert line.startswith(f"promise: {here.estimate:.2f}x, 90% interval {here.low:.2f}-{here.high:.2f}x here")
    assert f"{len(rounds)} rounds of the config beside the baseline" in line
    shown = f"here {checked.estimate:.2f}x, {checked.level:.0%} interval {checked.low:.2f}-{checked.high:.2f}x"
    assert f": {verdict} ({shown}, " in line and f"widened by 10%, {promised.low:.2f}-{promised.high:.2f}x)" in line
    if export:
        study = stated_interval(export)
        assert study is not None and (promised.low, promised.high) == (study.low / 1.1, study.high * 1.1)
        assert f"{study.estimate:.2f}x, 90% interval {study.low:.2f}-{study.high:.2f}x in the export" in line
        assert "the export's interval widened" in line
    else:
        assert "(no interval in the export)" in line and "the export's speedup widened" in line
    assert ("is outside the export's promise" in err.getvalue()) is (verdict == "not kept"), err.getvalue()
    if verdict == "undecided":
        needed = run.rounds_to_decide
        assert needed is not None and needed > len(rounds) and f"about {needed} rounds would decide it" in line


def test_the_checks_own_interval_allows_for_the_drift_the_export_does() -> None:
    """The check's rounds are a session too: its interval allows for the drift the export's
    interval allowed for (the study's `budget.remeasure_drift`); an export without an interval,
    for the default."""
    rounds = [2.45, 2.5, 2.42]
    run = _with_intervals(EXPORT, rounds)
    noisy = stated_interval(EXPORT, drift=0.05)
    assert noisy is not None
    on_noisy = dataclasses.replace(run, tuned=dataclasses.replace(run.tuned, speedup_interval=noisy))
    assert run.interval == stated_interval(rounds) and on_noisy.interval == stated_interval(rounds, drift=0.05)
    assert on_noisy.checked is not None and run.checked is not None
    assert on_noisy.checked.half_width > run.checked.half_width
    assert _with_intervals(None, rounds).interval == stated_interval(rounds, drift=DRIFT)


def test_apply_compares_its_run_time_with_the_studys_prediction_for_as_many_steps() -> None:
    run = _applied(1234.5, None)
    run = dataclasses.replace(
        run,
        tuned=dataclasses.replace(
            run.tuned,
            metrics={**run.tuned.metrics, "setup_s": 0.5, "warmup_s": 2.0, "warmup_steps": 3},
            environment={**run.tuned.environment, "framework_start_s": 1.5},
        ),
        throughput=dataclasses.replace(run.throughput, steps_taken=103, trained_s=4.0),
        setup_s=0.4,
        start_s=1.2,
    )
    # here: start 1.2 s + set-up 0.4 s + 4.0 s of steps;
    # the study: start 1.5 s + 0.5 s + 2.0 s + (103 - 3) steps x 16 samples / 1234.5 per s
    assert run.run_s == pytest.approx(5.6)
    assert run.predicted_run_s == pytest.approx(1.5 + 0.5 + 2.0 + 100 * 16 / 1234.5)
    out = io.StringIO()
    print_applied(run, out, io.StringIO())
    took = "run time: 103 optimizer steps took 5.6 s here, start, build and warm-up included (compile cache unused); "
    assert took in out.getvalue()
    assert f"the study predicts {run.predicted_run_s:.1f} s for as many: ratio {5.6 / run.predicted_run_s:.2f}" in (
        out.getvalue()
    )


def test_apply_without_the_baseline_says_nothing_of_the_speedup() -> None:
    run = _applied(1234.5, None)
    out, err = io.StringIO(), io.StringIO()
    print_applied(run, out, err)
    assert run.speedup is None and run.keeps_promise is None
    assert "speedup" not in out.getvalue() + err.getvalue()


@pytest.mark.parametrize(("p99_ms", "within"), [(8.0, True), (12.5, False)])
def test_apply_holds_an_inference_configs_p99_latency_to_the_jobs_limit(p99_ms: float, within: bool) -> None:
    run = dataclasses.replace(
        _applied(1234.5, 500.0), latency=Latency(p50_ms=6.0, p99_ms=p99_ms, mean_ms=6.5, calls=200), latency_limit_ms=10
    )
    out, err = io.StringIO(), io.StringIO()
    print_applied(run, out, err)
    assert run.within_latency_limit is within
    assert ("within the limit of 10 ms" in out.getvalue()) is within
    assert (f"the p99 latency here ({p99_ms:.2f} ms) is over the job's limit of 10 ms" in err.getvalue()) is not within
    assert dataclasses.replace(run, latency_limit_ms=None).within_latency_limit is None


@pytest.mark.parametrize(
    ("windows", "slowdown"),
    [
        # 16 windows: the last quarter 30% slower than the first (a step that slows as it trains)
        ([1000.0] * 4 + [980.0] * 8 + [700.0] * 4, 0.3),
        ([1000.0, 900.0, 1100.0] * 4 + [950.0] * 4, 0.05),  # noise around a level: no warning
        ([700.0] * 4 + [1000.0] * 12, -3 / 7),  # faster at the end: no warning
        ([1000.0] * 8 + [500.0] * 3, None),  # too few windows to tell
    ],
)
def test_apply_warns_when_the_step_gets_slower_as_the_job_trains(windows: list[float], slowdown: float | None) -> None:
    run = _applied(1234.5, 500.0, windows)
    out, err = io.StringIO(), io.StringIO()
    print_applied(run, out, err)
    assert run.slowdown == (None if slowdown is None else pytest.approx(slowdown))
    warned = "slower over the last quarter of the run" in err.getvalue()
    assert warned is (slowdown is not None and slowdown > 0.2), err.getvalue()
    if warned:
        assert "(700 samples/s) than over the first (1,000 samples/s)" in err.getvalue()
