"""`benchmarks/code_shape.py` counts what it says it counts, on code written for the test."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.support.benchmarks import import_benchmark

SOURCE = '''\
"""A module."""
from typing import Any


def many(a, b, c, d, e, f, g, h, i, *rest: Any, **named: dict[str, Any]) -> dict[str, Any]:
    """Says "compile" in a docstring, which is no branch."""
    if knob == "compile" or spec.task != "inference":
        return {"precision": 1}  # type: ignore[return-value]
    return {}
'''


def test_the_shape_of_a_module_is_counted_from_its_syntax(tmp_path: Path) -> None:
    bench = import_benchmark("code_shape")
    path = tmp_path / "example.py"
    path.write_text(textwrap.dedent(SOURCE))
    shape = bench.shape_of(path, {"compile", "precision"}, relative="autotuner/example.py")
    assert shape["lines"] == SOURCE.count("\n") and shape["any"] == 3 and shape["dict_str_any"] == 2
    (function,) = shape["functions"]
    assert function["parameters"] == 11 and function["lines"] == 5
    assert shape["branches"] == ["autotuner/example.py:7 knob 'compile'", "autotuner/example.py:7 task 'inference'"]
    assert shape["knob_literals"] == 2 and shape["type_ignores"] == 1  # "compile" compared, "precision" a key
    backend = bench.shape_of(path, {"compile", "precision"}, relative="backends/example.py")
    assert backend["branches"] == [] and backend["knob_literals"] == 0  # a backend names its knobs
