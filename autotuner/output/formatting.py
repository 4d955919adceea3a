"""How numbers read wherever a study is shown: the console, the dashboard's note and the report
format throughputs, shares and a config's re-measured runs alike."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, SupportsFloat

from autotuner.config.knobs import ACCUMULATION, BATCH_SIZE

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


def percent(value: object, digits: int = 3) -> str:
    """A share as a percentage with `digits` decimals; one too small for them (a bf16 drift of
    6.5e-7) in two significant digits rather than as the 0.000% of an exact zero."""
    if value is None:
        return "-"
    if value == "inf" or value == float("inf"):
        return "inf"
    if not isinstance(value, SupportsFloat | str):
        raise TypeError(f"not a share: {value!r}")
    share = float(value)
    if share and abs(share) < 0.5 * 10 ** -(digits + 2):
        return f"{share * 100:.2g}%"
    return f"{share:.{digits}%}"


def runs(t: TrialRecord, separator: str = ", ") -> str:
    """Each process's median throughput for a config, and how far apart they came out once it was
    re-measured: `2,000/s, 2,150/s, 2,200/s (9.3% apart)`."""
    apart = f" ({t.run_spread:.1%} apart)" if t.run_spread is not None else ""
    return separator.join(rate(value) for value in t.throughputs) + apart


def _at_rest(name: str, value: object) -> bool:
    """A quiet knob at its reference value (`Knob.quiet`), which a config's one-line form and a
    table of configs leave out; the knob found in the registered backends' tables."""
    from autotuner.backends import knob_named

    knob = knob_named(name)
    return knob is not None and knob.quiet and knob.reference == value and type(knob.reference) is type(value)


def format_config(config: Mapping[str, object]) -> str:
    """`precision=bf16 batch=64x4 workers=2 compile=none optimizer=fused`: batch shown as
    micro-batch x accumulation, a quiet knob only away from its reference value."""
    parts = []
    for name, value in config.items():
        if name == ACCUMULATION.name or _at_rest(name, value):
            continue
        if name == BATCH_SIZE.name:
            parts.append(f"batch={value}x{config.get(ACCUMULATION.name, 1)}")
        else:
            parts.append(f"{name}={value}")
    return " ".join(parts)


def shown_knobs(configs: Sequence[Mapping[str, object]]) -> list[str]:
    """The knobs a table of `configs` has a column for: all but `accumulation` (shown with the
    batch), and a quiet knob only where some config is away from its reference value."""
    names = list(configs[0]) if configs else []
    return [
        name for name in names if name != ACCUMULATION.name and not all(_at_rest(name, c.get(name)) for c in configs)
    ]
