"""benchmarks/search_efficiency.py's exact median of random search, against every order of a
small grid."""

from __future__ import annotations

import importlib.util
import itertools
import statistics
import sys
from types import ModuleType

from tests.support.studies import ROOT


def _import_search_efficiency() -> ModuleType:
    path = list(sys.path)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(
            "benchmarks_search_efficiency", ROOT / "benchmarks/search_efficiency.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path[:] = path


def test_random_searchs_median_is_the_median_over_every_order_of_the_grid() -> None:
    median = _import_search_efficiency().random_median_trials
    for others, good in ((5, 1), (5, 2), (6, 3), (7, 2)):
        grid = [True] * good + [False] * (others - good)
        firsts = sorted(1 + next(i for i, g in enumerate(order) if g) + 1 for order in itertools.permutations(grid))
        assert median(others, good) == statistics.median_low(firsts), (others, good)
    assert median(159, 6) == 19.0
