"""Where a step's time goes, from a profiler's trace: operators ranked by self time.

Both profilers autotuner uses write Chrome trace JSON (`torch.profiler`'s `export_chrome_trace`,
`jax.profiler`'s Perfetto trace, gzipped): complete events (`"ph": "X"`) with a start and a
duration on a thread or GPU stream. An operator's self time is its duration less that of the
events nested directly in it on the same lane. Imports nothing but the standard library: trial
processes rank their own traces.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

TOP = 15
"""Operators kept per profile."""
DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
"""torch.profiler's categories of what ran on a GPU."""


class TraceEvent(TypedDict, total=False):
    """What `top_operators` reads of a Chrome trace event."""

    ph: str
    """The event's phase: `X` a complete event, `M` metadata (a process's name in `args`)."""
    name: str
    cat: str
    pid: int | str
    tid: int | str
    ts: float | str
    """Its start, in microseconds."""
    dur: float | str
    """Its duration, in microseconds."""
    args: dict[str, object]


@dataclass
class _Frame:
    """An event open on its lane while the events nested in it are read."""

    end: float
    name: str
    dur: float
    children: float
    """The duration of the events nested directly in it."""


@dataclass
class Operator:
    name: str
    self_ms: float
    """Self time per profiled step, in milliseconds."""
    calls: float
    """Calls per profiled step."""
    share: float
    """Of the self time of everything on the same side (device or host)."""


def read_trace(path: str | Path) -> list[TraceEvent]:
    """The events of a Chrome trace (JSON, or gzipped JSON as JAX writes it)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    return list(data["traceEvents"] if isinstance(data, dict) else data)


def top_operators(events: Iterable[TraceEvent], steps: int, limit: int = TOP) -> tuple[str, float, list[Operator]]:
    """(`where`, total self ms per step, the `limit` operators with the most self time per step).

    Self time: an event's duration less that of the events nested directly in it on the same
    thread (or GPU stream). Python frames (torch's `python_function`, JAX's `$file:line`) and
    events without a duration are left out. Where the trace holds device events (a GPU's kernels
    and copies: torch's categories, or JAX's `/device:` processes), only they are ranked."""
    events = list(events)
    device_pids = {
        e.get("pid")
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name" and "/device:" in str(e.get("args", {}).get("name"))
    }
    spans: dict[tuple[int | str | None, int | str | None], list[TraceEvent]] = {}
    for e in events:
        if e.get("ph") != "X" or not e.get("dur") or e.get("cat") == "python_function":
            continue
        if str(e.get("name", "")).startswith("$"):
            continue
        spans.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    on_device = any(
        e.get("cat") in DEVICE_CATEGORIES or e.get("pid") in device_pids for lane in spans.values() for e in lane
    )
    self_us: dict[str, float] = {}
    calls: dict[str, int] = {}
    for lane in spans.values():
        if (lane[0].get("cat") in DEVICE_CATEGORIES or lane[0].get("pid") in device_pids) != on_device:
            continue
        lane.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        stack: list[_Frame] = []
        for e in lane:
            start, dur = float(e["ts"]), float(e["dur"])
            while stack and stack[-1].end <= start:
                _close(stack.pop(), self_us)
            if stack:
                stack[-1].children += dur
            name = _named(str(e.get("name")))
            stack.append(_Frame(start + dur, name, dur, 0.0))
            calls[name] = calls.get(name, 0) + 1
        while stack:
            _close(stack.pop(), self_us)
    total = sum(self_us.values())
    ranked = sorted(self_us.items(), key=lambda item: -item[1])[:limit]
    operators = [
        Operator(name[:120], us / 1000 / steps, calls[name] / steps, us / total if total else 0.0)
        for name, us in ranked
    ]
    return ("device" if on_device else "host"), total / 1000 / steps, operators


OUTSIDE_OPERATORS = "(host time outside any operator)"
"""What torch.profiler's whole-profile span (`PyTorch Profiler (0)`) keeps as its self time: Python,
the data loader's own code, the framework's dispatch between operators."""


def _named(name: str) -> str:
    return OUTSIDE_OPERATORS if name.startswith("PyTorch Profiler (") else name


def _close(frame: _Frame, self_us: dict[str, float]) -> None:
    self_us[frame.name] = self_us.get(frame.name, 0.0) + max(0.0, frame.dur - frame.children)
