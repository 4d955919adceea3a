"""The report and the charts it draws: figures and tables built from trials stored by the real
`autotuner.results.store.record`, the ranking once the top is re-measured, and the storage's
password kept out. The command on a real study is tests/e2e/test_report.py's."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution

from autotuner.errors import SpecError
from autotuner.export.writer import export_data
from autotuner.measurement.interval import DRIFT, stated_interval
from autotuner.output import charts
from autotuner.output.dashboard import study_note
from autotuner.output.formatting import percent
from autotuner.output.pages import render_html, render_markdown
from autotuner.output.report import load_report
from autotuner.results.records import TrialRecord, baseline, best, records, speedup, to_remeasure
from autotuner.results.store import Yardstick, record
from autotuner.spec.job import parse_spec
from autotuner.study.claims import Claims
from autotuner.study.optuna_adapter import study_id
from autotuner.study.storage import open_storage, open_study
from autotuner.trials.launcher import TrialResult
from autotuner.trials.outcomes import Outcome
from autotuner.trials.probe import Environment
from autotuner.trials.trial_output import TrialOutput
from tests.support.helpers import HELD, measured, reference

ENVIRONMENT = Environment(
    backend="pytorch",
    device="cpu",
    device_name="test CPU",
    driver="test",
    versions={"python": "3.11", "torch": "2.x"},
    capabilities={"bf16": True, "fp16": True},
)
REFERENCE = reference(2.0, [2.5, 2.2], {"precision": "fp32"})
MARKUP = "<script>alert('reason')</script>"


def _ok(samples_per_s: float, heldout: float) -> TrialResult[TrialOutput]:
    return TrialResult(Outcome.OK, output=measured(samples_per_s, heldout, [2.5, heldout], spread=0.02))


# trial number -> (params, result); the fp32 baseline has drift 0, #2 drifts past the 1% tolerance,
# #3 diverges (measured throughput, infinite drift), #5 is dominated by #1, #6 ran out of memory.
TRIALS: list[tuple[dict[str, Any], TrialResult[TrialOutput]]] = [
    ({"precision": "fp32", "batch_size": 16}, _ok(1000.0, 2.0)),
    ({"precision": "bf16", "batch_size": 64}, _ok(3000.0, 2.002)),
    ({"precision": "fp16", "batch_size": 64}, _ok(4000.0, 2.5)),
    (
        {"precision": "fp16", "batch_size": 16},
        TrialResult(Outcome.NAN, "loss is nan", output=_ok(3500.0, 2.0).output),
    ),
    ({"precision": "bf16", "batch_size": 16}, _ok(2000.0, 2.001)),
    ({"precision": "fp32", "batch_size": 64}, _ok(1500.0, 2.004)),
    ({"precision": "fp16", "batch_size": 8}, TrialResult(Outcome.OOM, MARKUP)),
]
FRONT = [1, 4, 0]


def _job(name: str) -> Any:
    return parse_spec(
        {
            "name": name,
            "backend": "pytorch",
            "workload": "builtin:mlp",
            "global_batch": 64,
            "baseline": {"precision": "fp32", "batch_size": 16, "workers": 0, "compile": "none"},
            "space": {
                "precision": ["fp32", "bf16", "fp16"],
                "batch_size": [8, 16, 64],
                "workers": [0],
                "compile": ["none"],
                **HELD,
            },
        },
        f"{name}.yaml",
    )


def _store(url: str, name: str, trials: list[tuple[dict[str, Any], TrialResult[TrialOutput]]]) -> optuna.Study:
    job = _job(name)
    study = open_study(open_storage(url), job, ENVIRONMENT)
    study.set_user_attr("reference", REFERENCE.as_dict())
    space = {k: CategoricalDistribution(v) for k, v in job.space.items()}
    for number, (params, result) in enumerate(trials):
        study.enqueue_trial({"workers": 0, "compile": "none", "memory_budget": 1.0, **params})
        trial = study.ask(space)
        role = "baseline" if number == 0 else "search"
        record(
            study, trial, job.complete(trial.params), result, role=role, against=Yardstick(job, REFERENCE, ENVIRONMENT)
        )
    return study


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[TrialRecord]]:
    url = f"sqlite:///{tmp_path_factory.mktemp('report')}/studies.db"
    study = _store(url, "synthetic", TRIALS)
    return url, records(study)


def _trace(figure: Any, name: str) -> Any:
    return next(t for t in figure.data if t.name == name)


@pytest.mark.slow
def test_stored_trials_are_what_the_charts_expect(stored: tuple[str, list[TrialRecord]]) -> None:
    _, trials = stored
    assert [t.feasible for t in trials] == [True, True, False, False, True, True, False]
    assert trials[0].drift == 0 and math.isinf(trials[3].drift) and trials[3].throughput == 3500
    assert trials[6].outcome == "oom" and trials[6].throughput == 0


def test_pareto_front_is_the_non_dominated_feasible_set(stored: tuple[str, list[TrialRecord]]) -> None:
    _, trials = stored
    front = charts.pareto_front(trials)
    assert [t.number for t in front] == FRONT
    feasible = [t for t in trials if t.feasible]
    for t in feasible:
        dominated = any(
            u.throughput >= t.throughput and u.drift <= t.drift and (u.throughput, u.drift) != (t.throughput, t.drift)
            for u in feasible
        )
        assert (t in front) != dominated, t.number


def test_pareto_figure_shows_every_measured_trial_and_says_what_it_leaves_out(
    stored: tuple[str, list[TrialRecord]],
) -> None:
    _, trials = stored
    figure = charts.pareto_figure(trials, 0.01)
    assert figure.layout.xaxis.title.text == "throughput (samples/s)"
    assert figure.layout.yaxis.title.text == "drift (relative)"
    assert figure.layout.yaxis.type == "log"
    plotted = {name: list(_trace(figure, name).customdata) for name in (t.name for t in figure.data)}
    assert plotted["feasible"] == [1, 4, 5]
    assert plotted["infeasible"] == [2]  # drifted past the tolerance
    assert plotted["drift inf (drawn at the top)"] == [3]  # diverged: drawn, never dropped
    assert plotted["drift 0 (drawn at the axis floor)"] == [0]
    assert plotted["Pareto front (feasible)"] == FRONT
    assert plotted["baseline"] == [0]
    top = _trace(figure, "drift inf (drawn at the top)").y[0]
    assert top > max(t.drift for t in trials if math.isfinite(t.drift))
    assert any(shape.y0 == 0.01 for shape in figure.layout.shapes)  # the tolerance line
    notes = " ".join(a.text for a in figure.layout.annotations)
    assert "tolerance 1.00%" in notes and "oom 1" in notes  # the OOM trial had no throughput to plot
    assert "trial #2" in _trace(figure, "infeasible").text[0] and "drift" in _trace(figure, "infeasible").text[0]


def test_speedup_figure_ranks_the_feasible_configs_against_the_baseline(
    stored: tuple[str, list[TrialRecord]],
) -> None:
    _, trials = stored
    figure = charts.speedup_figure(trials, baseline(trials), top=3)
    (bars,) = figure.data
    assert bars.type == "bar"
    assert list(bars.customdata) == [1, 4, 5]
    assert list(bars.x) == pytest.approx([3.0, 2.0, 1.5])
    assert bars.y[0].startswith("#1 precision=bf16 batch=64x1")
    assert charts.speedup_figure(trials, None).data == ()  # no baseline: no bars, a note instead


def test_throughput_by_knob_figure_has_a_panel_per_knob_of_ok_trials(
    stored: tuple[str, list[TrialRecord]],
) -> None:
    _, trials = stored
    figure = charts.throughput_by_knob_figure(trials)
    assert [t.name for t in figure.data] == ["precision", "batch_size", "workers", "compile"]
    assert all(t.type == "box" for t in figure.data)
    batch = _trace(figure, "batch_size")
    assert set(batch.x) == {"16x4", "64x1"}  # micro-batch x accumulation
    assert sorted(batch.customdata) == [0, 1, 2, 4, 5]  # ok trials only: not the nan or the oom
    assert figure.layout.xaxis.categoryarray == ("fp32", "bf16", "fp16")
    assert figure.layout.yaxis.title.text == "throughput (samples/s)"


def test_report_content_from_the_storage(stored: tuple[str, list[TrialRecord]]) -> None:
    url, _ = stored
    report = load_report(url, "synthetic")
    page = render_html(report)
    assert MARKUP not in page and "&lt;script&gt;alert(" in page  # stored text is escaped
    assert page.count("<script") == 4  # plotly.js once, then one per chart
    assert "precision=bf16 batch=64x1 workers=0 compile=none" in page
    assert all(f'id="{chart}"' in page for chart in ("pareto", "speedup", "knobs"))
    markdown = render_markdown(report)
    assert "| speedup over baseline | 3.00x |" in markdown
    assert "| #1 | precision=bf16 batch=64x1 workers=0 compile=none | 3,000/s | 3.00x | 0.100% |" in markdown
    assert "| bf16 | 2 | 3,000/s | 2,500/s |" in markdown  # per-knob best and median
    assert "| #3 | search | precision=fp16 batch=16x4 workers=0 compile=none | nan | no |" in markdown
    assert "&lt;script&gt;" in markdown and MARKUP not in markdown


def test_a_study_without_a_feasible_trial_still_gets_a_report(stored: tuple[str, list[TrialRecord]]) -> None:
    url, _ = stored
    _store(url, "hopeless", [TRIALS[6], TRIALS[2]])
    report = load_report(url, "hopeless")
    assert report.best is None
    assert "No feasible config" in render_html(report)
    markdown = render_markdown(report)
    assert "No feasible config" in markdown and "No feasible trial." in markdown


def test_a_study_without_trials_still_gets_a_report(stored: tuple[str, list[TrialRecord]]) -> None:
    url, _ = stored
    _store(url, "empty", [])
    report = load_report(url, "empty")
    assert "No feasible config" in render_html(report)
    assert "No ok trial." in render_markdown(report)
    assert charts.throughput_by_knob_figure([]).data == ()


def test_bad_storage_or_study_is_one_spec_error(tmp_path: Path, stored: tuple[str, list[TrialRecord]]) -> None:
    url, _ = stored
    with pytest.raises(SpecError, match="no study 'nope'"):
        load_report(url, "nope")
    with pytest.raises(SpecError, match="no study database"):
        load_report(f"sqlite:///{tmp_path}/missing.db", "synthetic")
    assert not (tmp_path / "missing.db").exists()
    with pytest.raises(SpecError, match="not a SQLAlchemy database URL"):
        load_report("not a url", "synthetic")


def test_the_storage_password_stays_out_of_the_report(stored: tuple[str, list[TrialRecord]]) -> None:
    url, _ = stored
    report = dataclasses.replace(load_report(url, "synthetic"), storage_url="postgresql://tuner:s3cret@db/studies")
    for text in (render_html(report), render_markdown(report)):
        assert "s3cret" not in text and "postgresql://tuner:***@db/studies" in text


def test_the_storage_password_stays_out_of_the_export(stored: tuple[str, list[TrialRecord]]) -> None:
    url, _ = stored
    study = optuna.load_study(study_name="synthetic", storage=url)
    export = export_data(study, "postgresql://tuner:s3cret@db/studies").as_data()
    assert export["study"]["storage"] == "postgresql://tuner:***@db/studies"


def _remeasure(url: str, study: optuna.Study, number: int, value: dict[str, Any]) -> None:
    """What a worker stores once it has re-measured trial `number` (`OncePerStudy.remeasure`)."""
    Claims(open_storage(url), study_id(study)).claim(f"remeasure:{number}", {"status": "done", **value})


def test_a_lucky_trial_does_not_win_once_the_top_is_remeasured(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/lucky.db"
    study = _store(url, "lucky", TRIALS)
    assert best(records(study)).number == 1  # bf16 x64 at 3,000/s in its trial
    # Re-measured together with the baseline (a config's throughput: the median over the windows
    # of its re-measurement, the trial that got it chosen left out): #1 was lucky (two more
    # processes at 2,000 and 2,100/s), #4 steady near 2,175/s, the baseline steady at 1,000/s.
    beside = {"baseline_windows": [990.0] * 3 + [1010.0] * 3}
    _remeasure(url, study, 1, {"throughputs": [2000.0, 2100.0], "windows": [[2000.0] * 3, [2100.0] * 3], **beside})
    _remeasure(url, study, 4, {"throughputs": [2150.0, 2200.0], "windows": [[2150.0] * 3, [2200.0] * 3], **beside})
    _remeasure(url, study, 0, {"throughputs": [990.0, 1010.0], "windows": [[990.0] * 3, [1010.0] * 3], **beside})
    trials = records(study)
    winner = best(trials)
    assert winner.number == 4 and winner.throughput == 2175.0 and winner.throughputs == [2000.0, 2150.0, 2200.0]
    assert winner.trial_throughput == 2000.0 and winner.run_spread == pytest.approx(200.0 / 2150.0)
    lucky = next(t for t in trials if t.number == 1)
    assert lucky.throughput == 2050.0 and lucky.remeasured is not None and lucky.remeasure_error is None
    export = export_data(study, "sqlite:///x.db", top=2).as_data()
    assert export["study"]["trial"] == 4 and export["metrics"]["throughput"] == 2175.0
    assert export["metrics"]["throughput_runs"] == [2000.0, 2150.0, 2200.0] and export["metrics"]["remeasured"]
    assert export["baseline"]["throughput"] == 1000.0
    assert export["speedup"] == pytest.approx(2175.0 / 1000.0)
    assert [row["trial"] for row in export["top"]] == [4, 1]
    assert "Re-measured" in study_note(study) and "2,200/s" in study_note(study)
    assert "3: 2,000/s / 2,150/s / 2,200/s" in render_markdown(load_report(url, "lucky"))


def test_the_export_report_and_dashboard_note_state_the_speedup_with_its_interval(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/interval.db"
    study = _store(url, "interval", TRIALS)
    # three rounds of #4 beside the baseline: 2.2x, 2.1x, 2.15x; #1 one round only
    rounds = [2.2, 2.1, 2.15]
    windows = {"windows": [[2200.0] * 3, [2100.0] * 3, [2150.0] * 3], "baseline_windows": [1000.0] * 9}
    _remeasure(url, study, 4, {"throughputs": [2200.0, 2100.0, 2150.0], "speedups": rounds, **windows})
    _remeasure(url, study, 1, {"throughputs": [1900.0], "windows": [[1900.0] * 3], "speedups": [1.9]})
    _remeasure(url, study, 0, {"throughputs": [1000.0] * 3, "windows": [[1000.0] * 3] * 3})
    # #1, one round, has no interval, so #4's cannot clear it: both are in contention at the end,
    # and #4's interval is stated jointly with #1's (Sidak: each at 0.9^(1/2))
    interval = stated_interval(rounds, among=2)
    assert interval is not None and interval.half_width > stated_interval(rounds).half_width  # type: ignore[union-attr]
    shown = f"{interval.estimate:.2f}x, 90% interval {interval.low:.2f}-{interval.high:.2f}x"
    winner = best(records(study))
    assert winner.number == 4 and speedup(winner, None) == pytest.approx(interval.estimate)
    export = export_data(study, "sqlite:///x.db", top=2).as_data()
    assert export["speedup"] == pytest.approx(interval.estimate)
    assert export["speedup_interval"] == {
        "estimate": interval.estimate,
        "low": interval.low,
        "high": interval.high,
        "rounds": 3,
        "level": 0.9,
        "among": 2,
        "drift": DRIFT,
    }
    assert [row["speedup_interval"] for row in export["top"]] == [interval.as_dict(), None]  # #1: one round
    report = render_markdown(load_report(url, "interval"))
    assert f"#4 precision=bf16 batch=16x4 workers=0 compile=none: 2,150/s, {shown} the baseline's" in report
    note = study_note(study)
    assert f"**{shown}** the baseline" in note and f"; speedup {shown}" in note


def test_a_config_within_the_machines_noise_of_the_best_is_remeasured_too(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/unlucky.db"
    study = _store(url, "unlucky", TRIALS)
    # First the fastest (#1 at 3,000/s in its trial) and the baseline: nothing measured twice yet.
    assert [t.number for t in to_remeasure(records(study), 1)] == [1, 0]
    # Of the top 3, #4 (2,000/s) and #5 (1,500/s) are further behind than two trials of one config
    # come out (TRIAL_NOISE): they cannot win, and are not re-measured yet.
    assert [t.number for t in to_remeasure(records(study), 3)] == [1, 0]
    # #1's processes come out 3,000 / 2,150 / 2,250/s, the baseline's 1,000 / 900 / 1,100/s: the
    # machine's processes differ by about 29% (38% and 20%). #4's one trial at 2,000/s is within
    # that of #1's 2,200/s (its re-runs' median): the best, maybe, in an unlucky process. #5 (1,500/s) is not.
    _remeasure(url, study, 1, {"throughputs": [2150.0, 2250.0], "windows": [[2150.0] * 3, [2250.0] * 3]})
    _remeasure(url, study, 0, {"throughputs": [900.0, 1100.0], "windows": [[900.0] * 3, [1100.0] * 3]})
    assert [t.number for t in to_remeasure(records(study), 1)] == [1, 0, 4]
    # Re-measured, #4 is the best; #5 is not within the noise of its 2,300/s either.
    _remeasure(url, study, 4, {"throughputs": [2300.0, 2350.0], "windows": [[2300.0] * 3, [2350.0] * 3]})
    trials = records(study)
    assert best(trials).number == 4
    assert [t.number for t in to_remeasure(trials, 1)] == [4, 0]
    # A machine whose processes agree: nothing beyond the top and the baseline.
    steady = f"sqlite:///{tmp_path}/steady.db"
    study = _store(steady, "steady", TRIALS)
    _remeasure(steady, study, 1, {"throughputs": [2950.0, 3050.0], "windows": [[2950.0] * 3, [3050.0] * 3]})
    _remeasure(steady, study, 0, {"throughputs": [990.0, 1010.0], "windows": [[990.0] * 3, [1010.0] * 3]})
    assert [t.number for t in to_remeasure(records(study), 1)] == [1, 0]


def test_a_config_remeasured_later_is_compared_through_the_baseline_measured_beside_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/later.db"
    study = _store(url, "later", TRIALS)
    # #1 re-measured beside the baseline: 2,100/s against 1,000/s, 2.1x. #4 later, in another
    # group, while the machine ran 20% slower: 1,900/s against the baseline's 800/s beside it,
    # 2.375x. #4 is the faster config, though its figure in samples/s is lower.
    _remeasure(url, study, 1, {"throughputs": [2100.0], "windows": [[2100.0] * 3], "baseline_windows": [1000.0] * 3})
    _remeasure(url, study, 0, {"throughputs": [1000.0], "windows": [[1000.0] * 3], "baseline_windows": [1000.0] * 3})
    _remeasure(url, study, 4, {"throughputs": [1900.0], "windows": [[1900.0] * 3], "baseline_windows": [800.0] * 3})
    trials = records(study)
    winner = best(trials)
    assert winner.number == 4 and speedup(winner, baseline(trials)) == pytest.approx(2.375)
    export = export_data(study, "sqlite:///x.db", top=2).as_data()
    assert export["speedup"] == pytest.approx(2.375) and export["metrics"]["throughput"] == 1900.0
    assert [(row["trial"], row["speedup"]) for row in export["top"]] == [(4, pytest.approx(2.375)), (1, 2.1)]


def test_a_config_whose_remeasurement_failed_is_not_declared_best(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/flaky.db"
    study = _store(url, "flaky", TRIALS)
    _remeasure(
        url, study, 1, {"throughputs": [3000.0], "windows": [[3000.0]], "error": "re-run 2: crash: killed by SIGSEGV"}
    )
    trials = records(study)
    assert best(trials).number == 4
    flaky = next(t for t in trials if t.number == 1)
    assert flaky.remeasure_error == "re-run 2: crash: killed by SIGSEGV"
    assert flaky.feasible  # still feasible as a trial, on the front


def test_a_drift_too_small_for_three_decimals_is_not_shown_as_zero() -> None:
    assert [percent(v) for v in (0.0, 0.0123, 4e-7, 6.489e-7, -2e-7, None, "inf")] == [
        "0.000%",
        "1.230%",
        "4e-05%",
        "6.5e-05%",
        "-2e-05%",
        "-",
        "inf",
    ]
