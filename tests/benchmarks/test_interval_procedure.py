"""benchmarks/interval_procedure.py's simulation: one re-measurement through the real rule, and
the one case whose coverage is known exactly (one config, no stop on the width: the t interval
of normal log-ratios, nominal 90%)."""

from __future__ import annotations

import importlib.util
import random
import sys
from types import ModuleType

from tests.support.studies import ROOT


def _import() -> ModuleType:
    path = list(sys.path)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(
            "benchmarks_interval_procedure", ROOT / "benchmarks/interval_procedure.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path[:] = path


def test_a_draw_runs_the_rounds_until_the_rule_stops_them() -> None:
    bench = _import()
    today, no_stop = bench.VARIANTS[0], bench.VARIANTS[2]
    rng = random.Random(0)
    covered, half_width, rounds = bench.draw(rng, 0.001, 1, today)  # noise far below the width: two rounds
    assert covered and half_width < bench.WIDTH and rounds == 2
    assert bench.draw(random.Random(0), 0.001, 1, no_stop)[2] == bench.RUNS


def test_with_no_stop_one_configs_interval_covers_at_its_level() -> None:
    bench = _import()
    rng = random.Random(1)
    results = [bench.draw(rng, 0.05, 1, bench.VARIANTS[2]) for _ in range(2000)]
    coverage = sum(r[0] for r in results) / len(results)
    assert 0.87 <= coverage <= 0.93  # 90% nominal; 2,000 seeded draws, +-3% is 4.5 standard errors
