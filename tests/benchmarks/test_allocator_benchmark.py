"""benchmarks/allocator.py's arithmetic: an arm's figures from its blocks' recorded rounds."""

from __future__ import annotations

import math

import pytest

from tests.support.benchmarks import import_benchmark


def test_an_arms_figures_come_from_its_blocks_rounds() -> None:
    bench = import_benchmark("allocator")
    blocks = [
        {"ratios": [5.0, 5.0], "throughputs": {"winner": [15_000.0] * 2, "baseline": [3_000.0] * 2}},
        {"ratios": [4.0, 4.0], "throughputs": {"winner": [16_000.0] * 2, "baseline": [4_000.0] * 2}},
    ]
    found = bench.summary(blocks)
    assert found["rounds"] == 4 and found["speedup"] == pytest.approx(math.sqrt(20.0))
    assert found["block_speedups"] == pytest.approx([5.0, 4.0])
    assert found["blocks_apart"] == pytest.approx(1.0 / 4.5)  # (max - min) / median
    assert found["winner_per_s"] == pytest.approx(math.sqrt(15_000 * 16_000))
    assert found["baseline_per_s"] == pytest.approx(math.sqrt(3_000 * 4_000))
    assert found["round_log_sd"] == pytest.approx(statistics_stdev([math.log(5.0)] * 2 + [math.log(4.0)] * 2))


def statistics_stdev(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def test_the_defaults_arm_names_a_malloc_tunable_so_the_fork_server_leaves_glibcs_own() -> None:
    bench = import_benchmark("allocator")
    assert bench.ARMS["steady"] == {}
    assert "glibc.malloc." in bench.ARMS["defaults"]["GLIBC_TUNABLES"]
