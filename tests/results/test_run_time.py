"""The answer in the user's units: a config's predicted wall time for the real run (`run:`), its
cost (`cost:`), and the ranking they give, from the formula to what is exported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autotuner.results.records import TrialRecord, best, ranked, to_remeasure, with_cold_warmups
from autotuner.results.run_time import RunPlan, verdict
from autotuner.spec.job import load_spec
from autotuner.study.names import COLD_WARMUP
from tests.support.studies import write_spec

GLOBAL_BATCH = 100


def _trial(
    number: int, throughput: float, setup_s: float, warmup_s: float, config: dict[str, Any] | None = None, **more: Any
) -> TrialRecord:
    role = "baseline" if number == 0 else "search"
    measured = {"throughput": throughput, "setup_s": setup_s, "warmup_s": warmup_s, "warmup_steps": 2, **more}
    return TrialRecord(number, "COMPLETE", config or {}, config or {}, role, "ok", "", True, measured)


# The study data of a compile trade-off: #1 compiles for a minute and then runs twice as fast as
# #2, which compiles nothing. Per step (100 samples): #1 0.05 s, #2 0.1 s; the baseline 0.2 s.
BASELINE = _trial(0, 500.0, setup_s=0.5, warmup_s=0.4)
COMPILED = _trial(1, 2000.0, setup_s=0.5, warmup_s=60.0, compile_cache="cold")
EAGER = _trial(2, 1000.0, setup_s=0.5, warmup_s=0.2)
TRIALS = [BASELINE, COMPILED, EAGER]


def test_the_run_time_is_set_up_and_warm_up_then_the_other_steps_at_the_measured_pace() -> None:
    plan = RunPlan(global_batch=GLOBAL_BATCH, steps=1002)
    # 0.5 s set-up + 60 s warm-up (2 steps, compilation) + 1000 steps x 100 samples / 2000 per s
    assert plan.run_s(COMPILED, 1002) == pytest.approx(0.5 + 60.0 + 1000 * 100 / 2000)
    assert plan.run_s(EAGER, 1002) == pytest.approx(0.5 + 0.2 + 1000 * 100 / 1000)
    assert plan.run_s(EAGER, 1) == pytest.approx(0.7)  # a run shorter than the warm-up is the warm-up
    assert plan.run_s(EAGER, None) is None
    assert plan.run_s(_trial(3, 0.0, 0.5, 0.2), 1002) is None  # no throughput measured
    # the framework's start (interpreter, import) comes first, for every config alike
    started = RunPlan(global_batch=GLOBAL_BATCH, steps=1002, start_s=2.5)
    assert started.run_s(EAGER, 1002) == pytest.approx(2.5 + 0.5 + 0.2 + 1000 * 100 / 1000)


def test_a_trial_that_found_its_compiles_cached_is_predicted_with_the_cold_warm_up() -> None:
    def config(workers: int, precision: str = "bf16") -> dict[str, Any]:
        return {"precision": precision, "batch_size": 50, "accumulation": 2, "workers": workers, "compile": "default"}

    cold = _trial(1, 2000.0, 0.5, 60.0, config(0), compile_cache="cold")
    # the same graphs, other loader workers: its warm-up found them compiled
    warm = _trial(2, 2100.0, 0.5, 3.0, config(2), compile_cache="warm")
    # other graphs (another precision): nothing of #1's stands in for its warm-up
    other = _trial(3, 1900.0, 0.5, 4.0, config(2, "fp16"), compile_cache="partial")
    done = with_cold_warmups([BASELINE, cold, warm, other])
    assert done[2].metrics[COLD_WARMUP] == 60.0
    assert COLD_WARMUP not in done[1].metrics and COLD_WARMUP not in done[3].metrics
    plan = RunPlan(global_batch=GLOBAL_BATCH, steps=1002)
    assert plan.run_s(done[2], 1002) == pytest.approx(0.5 + 60.0 + 1000 * 100 / 2100)
    # a short run: the warm trial no longer wins by its cached compiles
    short = RunPlan(GLOBAL_BATCH, steps=100)
    assert [t.number for t in ranked([BASELINE, cold, warm, other], short)] == [2, 3, 0, 1]
    assert [t.number for t in ranked(done, short)] == [3, 0, 2, 1]


def test_a_short_run_picks_the_config_that_compiles_nothing_a_long_one_the_compiled_one() -> None:
    # break-even: 60.5 - 0.7 s of extra warm-up = (N - 2) x (0.1 - 0.05) s, N = 1198 steps
    short, long = RunPlan(GLOBAL_BATCH, steps=1000), RunPlan(GLOBAL_BATCH, steps=1400)
    assert [t.number for t in ranked(TRIALS, short)] == [2, 1, 0]
    assert [t.number for t in ranked(TRIALS, long)] == [1, 2, 0]
    # without a run length, by throughput (speedup over the baseline)
    assert [t.number for t in ranked(TRIALS)] == [1, 2, 0]
    assert best(TRIALS, RunPlan(GLOBAL_BATCH, per_hour=3.0)) is COMPILED  # a price alone ranks nothing


def test_the_configs_that_can_win_the_run_are_the_ones_re_measured() -> None:
    short = RunPlan(GLOBAL_BATCH, steps=1000)
    assert [t.number for t in to_remeasure(TRIALS, 1, short)] == [2, 0]  # the eager one wins a short run
    assert [t.number for t in to_remeasure(TRIALS, 1)] == [1, 0]  # by pace, the compiled one
    # #1 runs 1000 steps in 110.4 s, #2 in 100.5 s: 9% behind, within pruning.TRIAL_NOISE of it
    assert [t.number for t in to_remeasure(TRIALS, 2, short)] == [2, 1, 0]


def test_with_a_run_length_a_trial_is_pruned_by_the_pace_that_could_still_win() -> None:
    short = RunPlan(GLOBAL_BATCH, steps=1002)
    # the best run: #2's, 100.7 s; its 1000 timed steps in 100.7 s need 993 samples/s at least ...
    assert short.pace_to_win(TRIALS, warmup_steps=2) == pytest.approx(1000 * 100 / 100.7)
    # ... below the best throughput (#1's 2000/s): a config as slow as #2 is not pruned against #1
    assert RunPlan(GLOBAL_BATCH, per_hour=1.0).pace_to_win(TRIALS, 2) is None  # no run length
    assert short.pace_to_win([], 2) is None


def test_epochs_are_the_datasets_samples_and_hours_the_baselines_steps_in_that_time() -> None:
    with_items = [_trial(0, 500.0, 0.5, 0.4, dataset_items=5000), COMPILED]
    assert RunPlan(GLOBAL_BATCH, epochs=3).optimizer_steps(with_items) == pytest.approx(150)
    assert RunPlan(GLOBAL_BATCH, epochs=3).optimizer_steps([COMPILED]) is None  # no dataset size known
    hours = RunPlan(GLOBAL_BATCH, hours=1)
    steps = hours.optimizer_steps(TRIALS)
    # the baseline's hour: 0.9 s of set-up and warm-up, then steps at 5 a second
    assert steps == pytest.approx(2 + (3600 - 0.9) * 5)
    assert hours.run_s(BASELINE, steps) == pytest.approx(3600)
    assert RunPlan(GLOBAL_BATCH, hours=1).optimizer_steps([COMPILED]) is None  # no baseline measured


def test_the_cost_of_the_run_a_million_samples_and_tokens_and_the_energy() -> None:
    plan = RunPlan(GLOBAL_BATCH, steps=3602, per_hour=2.5, currency="EUR")
    tokens = _trial(4, 1000.0, 0.5, 0.5, tokens_per_s=128_000.0, energy_j_per_sample=0.36)
    estimate = plan.estimate(tokens, 3602)
    assert estimate.run_s == pytest.approx(1 + 3600 * 100 / 1000) and estimate.run_steps == 3602
    assert estimate.run_cost == pytest.approx(estimate.run_s / 3600 * 2.5)
    assert estimate.cost_per_million_samples == pytest.approx(1e6 / 1000 / 3600 * 2.5)
    assert estimate.cost_per_million_tokens == pytest.approx(1e6 / 128_000 / 3600 * 2.5)
    assert estimate.run_energy_kwh == pytest.approx(0.36 * 3602 * 100 / 3.6e6)
    assert estimate.currency == "EUR"
    unpriced = RunPlan(GLOBAL_BATCH, steps=10).estimate(tokens, 10)  # no price, no cost
    assert unpriced.run_cost is None and "run_cost" not in unpriced.as_dict() and "run_s" in unpriced.as_dict()


def test_the_verdict_says_what_the_tuned_run_takes_and_costs_against_the_baseline() -> None:
    plan = RunPlan(GLOBAL_BATCH, steps=10_002, per_hour=2.5)
    line = verdict(plan, TRIALS, COMPILED, BASELINE)
    # compiled: 60.5 + 10,000 x 0.05 = 560.5 s; baseline: 0.9 + 10,000 x 0.2 = 2000.9 s
    assert line == "a run of 10,002 steps: 9m20s instead of 33m21s, the tuned run costs 0.39 USD instead of 1.39 USD"
    assert verdict(RunPlan(GLOBAL_BATCH, per_hour=2.5), TRIALS, COMPILED, BASELINE) == "0.35 USD per million samples"


def test_the_run_and_its_cost_do_not_change_the_studys_identity(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain = load_spec(write_spec(tmp_path / "a"))
    priced = load_spec(write_spec(tmp_path / "b", run={"steps": 10}, cost={"per_hour": 1.0}))
    assert plain.identity() == priced.identity()
