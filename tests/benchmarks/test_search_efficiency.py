"""benchmarks/search_efficiency.py's exact median of random search, against every order of a
small grid."""

from __future__ import annotations

import itertools
import statistics

from tests.support.benchmarks import import_benchmark


def test_random_searchs_median_is_the_median_over_every_order_of_the_grid() -> None:
    median = import_benchmark("search_efficiency").random_median_trials
    for others, good in ((5, 1), (5, 2), (6, 3), (7, 2)):
        grid = [True] * good + [False] * (others - good)
        firsts = sorted(1 + next(i for i, g in enumerate(order) if g) + 1 for order in itertools.permutations(grid))
        assert median(others, good) == statistics.median_low(firsts), (others, good)
    assert median(159, 6) == 19.0
