"""What a search prints: progress while it runs, the top configs and the export at the end."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from autotuner.config.knobs import ACCUMULATION, BATCH_SIZE, Config, Value
from autotuner.measurement.interval import LEVEL
from autotuner.output.formatting import format_config, interval_range, percent, rate, shown_knobs, times
from autotuner.results.evidence import Reference
from autotuner.results.records import SearchSummary, TrialRecord, ranked, speedup, speedup_interval
from autotuner.results.run_time import Estimate, RunPlan, money, verdict
from autotuner.trials.probe import Environment
from autotuner.trials.progress import duration, phase_path, read_phase, time_left

if TYPE_CHECKING:
    from autotuner.spec.job import Job

TOP = 5


def runs_text(t: TrialRecord) -> str:
    """How many runs (processes) measured a config, and how far apart they were: `3, 1.2% apart`."""
    if t.run_spread is None:
        return "1"
    failed = " [red]a re-run failed[/]" if t.remeasure_error else ""
    return f"{len(t.throughputs)}, {t.run_spread:.1%} apart{failed}"


def dashboard_command(storage_url: str, artifacts: str | None = None) -> str:
    return f"optuna-dashboard {storage_url}" + (f" --artifact-dir {artifacts}" if artifacts else "")


PHASE_POLL_S = 0.25
"""How often the status line reads the running trial's phase."""


def _run_column(column: str, estimate: Estimate) -> str:
    if column == "run":
        return duration(estimate.run_s) if estimate.run_s is not None else "-"
    return money(estimate.run_cost, estimate.currency or "") if estimate.run_cost is not None else "-"


HEADERS = {BATCH_SIZE.name: "batch"}
"""Knob columns headed shorter than the knob's name; any other name is headed with its words apart
(`cudnn benchmark`), so a narrow table can wrap it."""


def knob_header(name: str) -> str:
    return HEADERS.get(name, name.replace("_", " "))


def knob_value(config: Config, name: str) -> str:
    """A knob's value as the final table shows it: the batch as micro-batch x accumulation."""
    if name == BATCH_SIZE.name:
        return f"{config[name]}x{config.get(ACCUMULATION.name, 1)}"
    return str(config.get(name))


def knob_setting(config: Config, name: str) -> str:
    """`batch=256x1`, `compile=max-autotune`: one knob as `format_config` writes it."""
    return f"{HEADERS.get(name, name)}={knob_value(config, name)}"


@dataclass
class Column:
    """One column of the final table: its header and its cells (rich markup), one per row; a
    `whole` column's cells are never wrapped between their words either."""

    header: str
    cells: list[str]
    whole: bool = False

    def widths(self) -> tuple[int, int]:
        """The narrowest width that breaks no word of the column (no line of a `whole` one) and
        the width that breaks no line."""
        texts = [Text.from_markup(markup) for markup in (escape(self.header), *self.cells)]
        words = [cell_len(word) for text in texts for word in text.plain.split()]
        lines = [cell_len(line) for text in texts for line in text.plain.splitlines()]
        return max(lines if self.whole else words, default=1), max(lines, default=1)


def _table(columns: list[Column], widths: list[int]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    for column, width in zip(columns, widths, strict=True):
        # a fixed width no smaller than the column's longest word: rich wraps between words and
        # never needs to cut one; "fold" rather than "…" should a single word outgrow the console
        table.add_column(escape(column.header), width=width, overflow="fold")
    for row in zip(*(column.cells for column in columns), strict=True):
        table.add_row(*row)
    return table


def _room(console: Console, count: int) -> int:
    """How many of the console's columns `count` table columns leave to their text (the rest
    goes to padding and the space between columns)."""
    probe = _table([Column("", [])] * count, [1] * count)
    return console.width - (Measurement.get(console, console.options, probe).maximum - count)


def fit(columns: list[Column], console: Console) -> list[int] | None:
    """Widths for `columns` in one table as wide as the console at most, no word broken: every
    column as wide as its longest line, then the widest narrowed first; None if no such widths."""
    ranges = [column.widths() for column in columns]
    room = _room(console, len(columns))
    if sum(narrowest for narrowest, _ in ranges) > room:
        return None
    widths = [widest for _, widest in ranges]
    while sum(widths) > room:
        i = max((i for i, (narrowest, _) in enumerate(ranges) if widths[i] > narrowest), key=lambda i: widths[i])
        widths[i] -= 1
    return widths


def whole_tables(console: Console, columns: list[Column], knobs: int) -> list[Table]:
    """The final table, every value whole: one table where the console is wide enough, else the
    knobs (`columns[1 : 1 + knobs]`) and the figures in tables of their own, each starting with
    the first column (the trial) and as many of its columns as fit beside it."""
    if (widths := fit(columns, console)) is not None:
        return [_table(columns, widths)]
    first, rest = columns[0], columns[1:]
    groups, tables = [rest[:knobs], rest[knobs:]], []
    for group in (g for g in groups if g):
        part: list[Column] = []
        for column in group:
            if part and fit([first, *part, column], console) is None:
                tables.append([first, *part])
                part = []
            part.append(column)
        tables.append([first, *part])
    # a column too wide on its own still gets a table: its longest words fold, none is cut
    return [_table(table, fit(table, console) or _narrowed(table, console)) for table in tables]


def _narrowed(columns: list[Column], console: Console) -> list[int]:
    room = max(_room(console, len(columns)), len(columns))
    widths = [widest for _, widest in (column.widths() for column in columns)]
    while sum(widths) > room:
        widths[widths.index(max(widths))] -= 1
    return widths


def _milliseconds(value: Any) -> str:
    return "-" if value is None else f"{float(value):.1f} ms"


def pruned_status(metrics: dict[str, Any]) -> str:
    """How a pruned trial's line says what it missed: `after 1.2 s, 190/s at most (needed 6,350/s)`
    (a trial stored before the bound was kept: after its windows, at most its fastest)."""
    windows = metrics.get("throughput_windows") or [0.0]
    bound, floor, trained = metrics.get("prune_bound"), metrics.get("prune_floor"), metrics.get("trained_s")
    if bound is None or floor is None or trained is None:
        return f"after {len(windows)} windows, {rate(max(windows))} at most"
    return f"after {float(trained):.1f} s, {rate(bound)} at most (needed {rate(floor)})"


class SearchReporter:
    def __init__(self, console: Console | None = None):
        # A terminal's width, or COLUMNS where it is set; else (a log, a pipe) 120 columns rather
        # than rich's 80: the final table, whole at any width, splits into fewer parts there.
        sized = sys.stdout.isatty() or bool(os.environ.get("COLUMNS"))
        self.console = console or Console(highlight=False, width=None if sized else 120)
        self.phase_file: Path | None = None
        """Where the running trial writes its phase (`autotuner.trials.progress`): on a terminal only,
        where the status line shows it."""
        self.left_s: float | None = None
        """The trials' time left, as the last trial's line estimated it; None outside the trials."""
        self._trials_began: float | None = None
        """When the first trial this process reported began, in the search's elapsed seconds."""

    def start(self, job: Job, storage_url: str, environment: Environment, budget: int) -> None:
        if self.console.is_terminal:
            self.phase_file = phase_path(job.output_dir())
        ranks = f" x {job.spec.processes} processes ({job.parallel})" if job.parallel else ""
        if job.spec.nodes > 1:
            each = f"{job.spec.processes} process{'es' if job.spec.processes > 1 else ''}"
            ranks = f" x {job.spec.nodes} nodes x {each} ({job.parallel})"
        self.console.print(
            f"[bold]{job.name}[/]: {job.spec.workload} on {environment.device}{ranks} ({environment.device_name}), "
            f"global batch {job.spec.global_batch}, {budget} trials, storage {escape(storage_url)}"
        )

    def close(self) -> None:
        """Remove the phase file (and its folder, once no other worker's file is in it)."""
        if self.phase_file is not None:
            self.phase_file.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self.phase_file.parent.rmdir()
            self.phase_file = None

    @property
    def progress(self) -> str | None:
        """The phase file a trial request names, or None."""
        return str(self.phase_file) if self.phase_file is not None else None

    @contextlib.contextmanager
    def running(self, what: str, logged: bool = False) -> Iterator[None]:
        """A status line while `what` runs: with the phase its trial process writes, and during
        the trials the time they have left. `logged`: where there is no status line (a log, a
        pipe), `what` is printed as a line when it begins, so that a log shows the minutes a long
        phase (a round of re-measurement) takes."""
        if self.left_s is not None:
            what += f" (trials: about {duration(self.left_s)} left)"
        if logged and not self.console.is_terminal:
            self.console.print(what)
        with self.console.status(what) as status:
            if self.phase_file is None:
                yield
                return
            self.phase_file.unlink(missing_ok=True)
            done = threading.Event()

            def watch(path: Path) -> None:
                while not done.wait(PHASE_POLL_S):
                    if (phase := read_phase(path)) is not None:
                        status.update(f"{what}: {phase}")

            watcher = threading.Thread(target=watch, args=(self.phase_file,), daemon=True)
            watcher.start()
            try:
                yield
            finally:
                done.set()
                watcher.join()

    def not_searched(self, dropped: Mapping[str, Mapping[Value, str]]) -> None:
        """One line naming the knob values the device or the workload cannot use (`Job.narrow`);
        the report says why for each."""
        if dropped:
            values = "; ".join(f"{knob} {', '.join(map(str, reasons))}" for knob, reasons in dropped.items())
            self.console.print(f"not searched (this device or workload cannot use them): {escape(values)}")

    def note(self, text: str) -> None:
        self.console.print(text)

    def warn(self, text: str) -> None:
        """One line on stderr, as every warning of the command line."""
        print(f"autotuner: warning: {text}", file=sys.stderr, flush=True)

    def remeasured(self, t: TrialRecord) -> None:
        runs = ", ".join(rate(value) for value in t.throughputs)
        error = t.remeasure_error
        tail = f" [red]{escape(str(error))}[/]: not declared best" if error else f": median {rate(t.throughput)}"
        if not error and t.remeasured is not None and t.remeasured.speedups:
            interval = speedup_interval(t)
            rounds = len(t.remeasured.speedups)
            tail += f"; speedup {times(speedup(t, None))}" + (
                f", {interval.text()} ({rounds} rounds)" if interval else " (one round: no interval)"
            )
        tag = " (baseline)" if t.role == "baseline" else ""
        group, lockstep = (t.remeasured.group, t.remeasured.lockstep) if t.remeasured else ([], False)
        others = ", ".join(f"#{n}" for n in group if n != t.number)
        how = f" ({'in lockstep' if lockstep else 'interleaved'} with {others})" if others else ""
        self.console.print(f"re-measured #{t.number}{tag} {format_config(t.config)}{how}: {runs}{tail}")

    def reference(self, reference: Reference, tolerance: float) -> None:
        self.console.print(
            (
                "fp32 reference: the model's outputs in strict fp32 eager"
                if reference.outputs
                else f"fp32 reference: held-out loss {reference.heldout:.6g}"
            )
            + f"; drift tolerance {tolerance:.2%}, "
            f"reference noise floor {percent(reference.noise_floor)}"
        )

    def trial(
        self,
        done: TrialRecord,
        ran: int,
        budget: int,
        elapsed_s: float,
        best: TrialRecord | None,
        baseline: TrialRecord | None,
    ) -> None:
        config = format_config(done.config)
        reason = escape(done.reason)  # the user's exception text: "[/]" in it is not markup
        if done.outcome == "ok":
            status = f"{rate(done.throughput)} drift {percent(done.metrics.get('drift'))}"
            if (p99 := done.metrics.get("latency_p99_ms")) is not None:  # an inference trial
                status += f" p99 {p99:.1f} ms"
            if skipped := int(done.metrics.get("drift_skipped_steps") or 0):
                status += f" ({skipped} drift steps skipped by fp16 loss scaling)"
            status += "" if done.feasible else f" [yellow]infeasible: {reason}[/]"
        elif done.outcome == "pruned":  # the reason, with the rule's figures, is on the trial
            status = f"[yellow]pruned[/] {pruned_status(done.metrics)}"
        else:
            status = f"[red]{done.outcome}[/]: {reason}"
        best_text = ""
        if best is not None:
            ratio = speedup(best, baseline)
            best_text = f" | best #{best.number} {rate(best.throughput)}" + (f" ({times(ratio)})" if ratio else "")
        if warned := done.metrics.get("warned"):
            status += f" [dim]warned: {escape(str(warned))} (autotuner logs {done.number})[/]"
        tag = " (baseline)" if done.role == "baseline" else ""
        if self._trials_began is None:  # the pace leaves out the start-up and the reference
            self._trials_began = max(0.0, elapsed_s - float(done.metrics.get("wall_s") or 0.0))
        self.left_s = time_left(elapsed_s - self._trials_began, ran, budget)
        left = f" ({duration(self.left_s)} left)" if self.left_s else ""
        self.console.print(
            f"[{ran}/{budget}] {elapsed_s:5.0f}s{left} #{done.number}{tag} {config}: {status}{best_text}"
        )

    def finish(self, summary: SearchSummary, plan: RunPlan | None = None) -> None:
        """The final table and verdict; with `plan`, ranked by the run and priced."""
        base = summary.baseline
        feasible = ranked(summary.trials, plan)
        shown = feasible[:TOP] + ([base] if base is not None and base not in feasible[:TOP] else [])
        steps = plan.optimizer_steps(summary.trials) if plan is not None else None
        estimates = {t.number: plan.estimate(t, steps) for t in shown} if plan is not None else {}
        order = "shortest run first" if plan is not None and plan.has_length else "fastest first"
        self.console.print(f"Top configs (feasible, {order}; re-measured configs by their re-measurement):")
        knobs = shown_knobs([t.config for t in shown])
        # one config's knobs are all "the same in every row": a one-row table keeps its columns
        same = [k for k in knobs if len(shown) > 1 and len({knob_value(t.config, k) for t in shown}) == 1]
        varied = [k for k in knobs if k not in same]
        extra = [
            c
            for c, key in (("run", "run_s"), ("cost", "run_cost"))
            if any(getattr(e, key) is not None for e in estimates.values())
        ]
        intervals = [speedup_interval(t) for t in shown]
        columns = [
            Column("trial", [f"#{t.number}" + (" base" if t.role == "baseline" else "") for t in shown]),
            *(Column(knob_header(k), [escape(knob_value(t.config, k)) for t in shown]) for k in varied),
            Column("samples/s", [rate(t.throughput) for t in shown]),
            Column("speedup", [times(speedup(t, base)) for t in shown]),
            *(
                [Column(f"{LEVEL:.0%} interval", [interval_range(interval) for interval in intervals])]
                if any(intervals)
                else []
            ),
            Column("drift", [percent(t.metrics.get("drift")) for t in shown]),
            *(
                [Column("p99 latency", [_milliseconds(t.metrics.get("latency_p99_ms")) for t in shown])]
                if any(t.metrics.get("latency_p99_ms") is not None for t in shown)
                else []
            ),
            Column("spread", [percent(t.metrics.get("throughput_spread"), 1) for t in shown]),
            Column("runs", [runs_text(t) for t in shown], whole=True),  # "3, 1.2% apart" is one figure
            Column("warm-up", [f"{t.metrics.get('warmup_s', 0):.2f}s" for t in shown]),
            *(Column(c, [_run_column(c, estimates.get(t.number, Estimate())) for t in shown]) for c in extra),
        ]
        for i, table in enumerate(whole_tables(self.console, columns, knobs=len(varied))):
            if i:  # a table of more columns of the same rows
                self.console.print()
            self.console.print(table)
        if same:
            values = " ".join(knob_setting(shown[0].config, k) for k in same)
            self.console.print(f"same in every row: {escape(values)}")
        counts: dict[str, int] = {}
        for t in summary.trials:
            counts[t.outcome] = counts.get(t.outcome, 0) + 1
        self.console.print("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        if summary.interrupted:
            self.console.print("[yellow]interrupted[/]: finished trials are kept; run the same command again to resume")
        if summary.best is None:
            self.console.print("[red]no feasible config[/]: every trial failed or drifted past the tolerance")
        else:
            b = summary.best
            ratio = speedup(b, base)
            versus = f", {times(ratio)} the baseline" if ratio else ""
            if ratio and (interval := speedup_interval(b)) is not None:
                versus += f" ({interval.text()}, {interval.rounds} rounds)"
            self.console.print(
                f"[bold green]best[/]: trial #{b.number} {format_config(b.config)}: {rate(b.throughput)}{versus}"
                + _latency_versus(b, base)
            )
            if plan is not None and (line := verdict(plan, summary.trials, b, base)):
                self.console.print(f"run: {line}")
            self.console.print(f"exported: {summary.export}")
        self.console.print(f"dashboard: {escape(dashboard_command(summary.storage_url, summary.artifacts))}")


def _latency_versus(best: TrialRecord, base: TrialRecord | None) -> str:
    """An inference winner's latency of a call beside the baseline's (empty for training)."""
    p50 = best.metrics.get("latency_p50_ms")
    if not isinstance(p50, (int, float)):
        return ""
    text = f"; a batch of {best.config[BATCH_SIZE.name]} in {p50:.2f} ms at p50"
    base_p50 = base.metrics.get("latency_p50_ms") if base is not None else None
    if isinstance(base_p50, (int, float)) and base is not None and base.number != best.number:
        text += f" (the baseline's batch of {base.config[BATCH_SIZE.name]}: {base_p50:.2f} ms)"
    return text
