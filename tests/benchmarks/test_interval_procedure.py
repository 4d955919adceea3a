"""benchmarks/interval_procedure.py's simulation: one re-measurement through the real rule, and
the one case whose coverage is known exactly (one config, no stop on the width: the t interval
of normal log-ratios, nominal 90%)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from tests.support.benchmarks import import_benchmark


def test_a_draw_runs_the_rounds_until_the_rule_stops_them() -> None:
    bench = import_benchmark("interval_procedure")
    today, no_stop = bench.VARIANTS[0], bench.VARIANTS[2]
    rng = random.Random(0)
    covered, half_width, rounds = bench.draw(rng, 0.001, 1, today)  # noise far below the width: two rounds
    assert covered and half_width < bench.WIDTH and rounds == 2
    assert bench.draw(random.Random(0), 0.001, 1, no_stop)[2] == bench.RUNS


def test_with_no_stop_one_configs_interval_covers_at_its_level() -> None:
    bench = import_benchmark("interval_procedure")
    rng = random.Random(1)
    results = [bench.draw(rng, 0.05, 1, bench.VARIANTS[2]) for _ in range(2000)]
    coverage = sum(r[0] for r in results) / len(results)
    assert 0.87 <= coverage <= 0.93  # 90% nominal; 2,000 seeded draws, +-3% is 4.5 standard errors


def test_replayed_rounds_are_the_recorded_ones_residuals(tmp_path: Path) -> None:
    bench = import_benchmark("interval_procedure")
    (tmp_path / "coverage.json").write_text(json.dumps({"ratios": [2.0, 4.0, 8.0]}))
    residuals = bench.recorded_residuals(tmp_path / "coverage.json")
    assert residuals == pytest.approx([-math.log(2), 0.0, math.log(2)])
    drawn = bench.draw(random.Random(0), 0.0, 1, bench.VARIANTS[2], residuals)
    assert drawn is not None and drawn[2] == bench.RUNS  # every round a recorded one, to the cap
