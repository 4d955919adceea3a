"""benchmarks/interval_procedure.py's simulation: one re-measurement through the real rule, and
the one case whose coverage is known exactly (one config, to the cap: the t interval of normal
log-ratios, nominal 90%)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from tests.support.benchmarks import import_benchmark


def test_a_draw_runs_the_rounds_until_the_rule_stops_them() -> None:
    bench = import_benchmark("interval_procedure")
    before, tool = bench.VARIANTS[0], bench.TOOL
    one = bench.SCENARIOS["one"]
    covered, half_width, rounds = bench.draw(random.Random(0), 0.001, one, before)  # far below the width
    assert covered and half_width < bench.WIDTH and rounds == 2
    assert bench.draw(random.Random(0), 0.001, one, tool)[2] == bench.RUNS  # the tool's: to the cap


def test_the_winner_among_tied_configs_is_stated_jointly_and_so_wider() -> None:
    bench = import_benchmark("interval_procedure")
    tied = bench.SCENARIOS["three tied"]
    alone = bench.draw(random.Random(3), 0.05, tied, bench.VARIANTS[1])
    joint = bench.draw(random.Random(3), 0.05, tied, bench.TOOL)  # the same rounds
    assert alone is not None and joint is not None and joint[1] > alone[1]


def test_with_no_stop_one_configs_interval_covers_at_its_level() -> None:
    bench = import_benchmark("interval_procedure")
    rng = random.Random(1)
    alone = bench.VARIANTS[1]  # to the cap, no drift allowed: the plain t interval
    results = [bench.draw(rng, 0.05, bench.SCENARIOS["one"], alone) for _ in range(2000)]
    coverage = sum(r[0] for r in results) / len(results)
    assert 0.87 <= coverage <= 0.93  # 90% nominal; 2,000 seeded draws, +-3% is 4.5 standard errors


def test_the_drift_allowed_for_keeps_the_level_where_sessions_drift() -> None:
    """Rounds whose session sits off the speedup by a normal draw of log sd DRIFT (every round of
    it): the plain interval misses far more than 10% of the time, the tool's stated one does not."""
    bench = import_benchmark("interval_procedure")
    rng = random.Random(2)
    held = {"plain": 0, "stated": 0}
    for _ in range(2000):
        session = rng.gauss(0.0, bench.DRIFT)
        ratios = [math.exp(math.log(2.0) + session + rng.gauss(0.0, 0.02)) for _ in range(bench.RUNS)]
        held["plain"] += bench.ratio_interval(ratios).contains(2.0)
        held["stated"] += bench.stated_interval(ratios).contains(2.0)
    assert held["plain"] / 2000 < 0.8 and held["stated"] / 2000 >= 0.87


def test_replayed_rounds_are_each_files_residuals_in_order(tmp_path: Path) -> None:
    bench = import_benchmark("interval_procedure")
    (tmp_path / "a.json").write_text(json.dumps({"ratios": [2.0, 4.0, 8.0, 4.0, 4.0, 4.0]}))
    (tmp_path / "b.json").write_text(json.dumps({"ratios": [3.0, 3.0]}))
    recorded = bench.recorded_residuals([tmp_path / "a.json", tmp_path / "b.json"])
    assert recorded[0] == pytest.approx([-math.log(2), 0.0, math.log(2), 0.0, 0.0, 0.0])
    assert recorded[1] == pytest.approx([0.0, 0.0])
    one = bench.SCENARIOS["one"]
    drawn = bench.draw(random.Random(0), 0.0, one, bench.TOOL, recorded)
    assert drawn is not None and drawn[2] == bench.RUNS  # every round a recorded one, to the cap
    # in order: five consecutive rounds of the one file that has five (a starts at 0 or 1)
    in_order = bench.draw(random.Random(0), 0.0, one, bench.TOOL, recorded[:1], in_order=True)
    assert in_order is not None and in_order[2] == bench.RUNS


def test_a_simulated_promise_check_decides_what_is_plain() -> None:
    bench = import_benchmark("interval_procedure")
    verdict = bench.Verdict
    for per_look in (False, True):
        assert bench.check(random.Random(0), 0.001, 1.0, per_look) == (verdict.KEPT, False)
        assert bench.check(random.Random(0), 0.001, 1.25, per_look) == (verdict.NOT_KEPT, False)
    # at a noisy machine's round noise, a wrong verdict stays as rare as the level says, either way
    rng = random.Random(0)
    for ratio in (1.0, 1.25):
        assert sum(bench.check(rng, 0.1, ratio, True)[1] for _ in range(500)) <= 50
