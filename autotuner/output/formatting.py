"""How numbers read wherever a study is shown: the console, the dashboard's note and the report
format throughputs, shares and a config's re-measured runs alike."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotuner.measurement.interval import Interval
    from autotuner.results.records import TrialRecord


def rate(value: float | None) -> str:
    """A throughput in samples a second: `15,789/s`; `-` for none (or none measured: 0)."""
    return "-" if not value else f"{value:,.0f}/s"


def times(value: float | None) -> str:
    """How many times another figure a figure is (a speedup over the baseline, one time over
    another) in two decimals: `5.29x`; `-` for none."""
    return "-" if not value else f"{value:.2f}x"


def interval_range(interval: Interval | None) -> str:
    """A speedup's interval as its two ends: `4.62-5.47x`; `-` for none (one round, or none)."""
    return "-" if interval is None else f"{interval.low:.2f}-{interval.high:.2f}x"


def speedup_with_interval(value: float | None, interval: Interval | None) -> str:
    """`5.03x, 90% interval 4.62-5.47x`, or `5.03x` without an interval; `-` for none."""
    return times(value) + (f", {interval.text()}" if value and interval is not None else "")


def percent(value: Any, digits: int = 3) -> str:
    """A share as a percentage with `digits` decimals; one too small for them (a bf16 drift of
    6.5e-7) in two significant digits rather than as the 0.000% of an exact zero."""
    if value is None:
        return "-"
    if value == "inf" or value == float("inf"):
        return "inf"
    share = float(value)
    if share and abs(share) < 0.5 * 10 ** -(digits + 2):
        return f"{share * 100:.2g}%"
    return f"{share:.{digits}%}"


def runs(t: TrialRecord, separator: str = ", ") -> str:
    """Each process's median throughput for a config, and how far apart they came out once it was
    re-measured: `2,000/s, 2,150/s, 2,200/s (9.3% apart)`."""
    apart = f" ({t.run_spread:.1%} apart)" if t.run_spread is not None else ""
    return separator.join(rate(value) for value in t.throughputs) + apart
