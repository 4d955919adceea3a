"""benchmarks/interval_coverage.py's arithmetic: blocks of rounds checked both ways, and the drift
between blocks, on rounds made up with a known shape."""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import pytest

from tests.support.benchmarks import import_benchmark


def _phases(levels: list[float], n: int) -> list[float]:
    """Ratios around 2x whose consecutive blocks of `n` rounds sit at these log offsets, with a
    small alternating spread inside each block."""
    return [math.exp(math.log(2.0) + level + (0.01 if k % 2 else -0.01)) for level in levels for k in range(n)]


def test_the_drift_is_how_far_block_means_stand_apart_beyond_their_spread() -> None:
    bench = import_benchmark("interval_coverage")
    ratios = _phases([0.1, 0.0, -0.1], 5)
    logs = [math.log(r) for r in ratios]
    means = [statistics.fmean(logs[k : k + 5]) for k in (0, 5, 10)]
    expected = math.sqrt(statistics.variance(means) - statistics.variance(logs) / 5)
    assert bench.drift(ratios, 5) == pytest.approx(expected)
    assert bench.drift(ratios, 10) is None  # fewer than three blocks
    steady = _phases([0.0, 0.0, 0.0], 5)
    assert bench.drift(steady, 5) == 0.0  # block means no further apart than the spread gives


def test_blocks_in_phases_miss_with_the_rounds_own_interval_and_the_stated_one_allows_for_them() -> None:
    bench = import_benchmark("interval_coverage")
    ratios = _phases([0.02, -0.02, 0.02, -0.02, 0.02, -0.02], 4)
    own, stated = bench.coverage(ratios, 4), bench.coverage(ratios, 4, stated=True)
    assert own["blocks"] == stated["blocks"] == 6
    assert own["held"] == 0 and stated["held"] == 6  # 2% off with a 1% spread; the drift covers it
    assert stated["half_width"]["median"] > own["half_width"]["median"]
    found = bench.analysed(ratios)
    assert found["drift_allowed"] == bench.DRIFT and set(found["drift"]) == {"5"}
    assert found["coverage"]["4"] == own and found["stated_coverage"]["4"] == stated


def test_reread_works_a_recorded_file_out_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = import_benchmark("interval_coverage")
    path = tmp_path / "recorded.json"
    ratios = _phases([0.02, -0.02, 0.02, -0.02], 5)
    path.write_text(json.dumps({"machine": "a VM", "ratios": ratios, "conditions": {"threads": {}}}))
    monkeypatch.setattr(sys, "argv", ["interval_coverage.py", "--reread", str(path)])
    bench.main()
    data = json.loads(path.read_text())
    assert data["machine"] == "a VM" and data["conditions"] == {"threads": {}}  # kept as recorded
    assert data["stated_coverage"]["5"]["blocks"] == 4 and data["drift"]["5"] is not None
