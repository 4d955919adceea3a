"""The final table of `autotuner search` as it is printed: every value whole, no `…`, in an
80-column terminal, in a log or a pipe, and on a wide terminal."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
from rich.cells import cell_len
from rich.console import Console

import autotuner.backends  # noqa: F401  (defines the quiet knobs the configs below move)
from autotuner.output.console import Column, SearchReporter, whole_tables
from autotuner.results.evidence import Remeasurement
from autotuner.results.records import SearchSummary, TrialRecord


def _config(precision: str, batch: int, workers: int, compile: str, optimizer: str, **rest: Any) -> dict[str, Any]:
    config = {"precision": precision, "batch_size": batch, "accumulation": 256 // batch, "workers": workers}
    config |= {"compile": compile, "memory_format": "channels_last", "optimizer": optimizer, "pin_memory": True}
    return config | {"prefetch_factor": 4, "cudnn_benchmark": True, "checkpointing": "none", **rest}


def _trial(
    number: int,
    config: dict[str, Any],
    throughput: float,
    runs: list[float] | None = None,
    speedups: tuple[float, ...] = (),
) -> TrialRecord:
    metrics = {"throughput": throughput, "drift": 0.00041, "throughput_spread": 0.039, "warmup_s": 27.71}
    remeasured = (
        Remeasurement(throughputs=runs, windows=[[r] for r in runs], group=[0, number], speedups=list(speedups))
        if runs
        else None
    )
    role = "baseline" if number == 0 else "search"
    return TrialRecord(number, "COMPLETE", config, config, role, "ok", "", True, metrics, remeasured)


BASELINE = _trial(
    0, _config("fp32", 16, 0, "none", "as-given", pin_memory=False, cudnn_benchmark=False), 672.0, [644.0, 700.0]
)
TRIALS = [
    BASELINE,
    _trial(4, _config("bf16", 256, 4, "max-autotune", "fused"), 3390.0, [3400.0, 3310.0, 3390.0], (5.1, 4.9)),
    _trial(7, _config("bf16", 256, 4, "max-autotune", "foreach"), 3290.0),
    _trial(9, _config("fp16", 128, 4, "reduce-overhead", "fused", checkpointing="blocks"), 3105.0),
    _trial(11, _config("bf16", 256, 2, "default", "fused"), 1714.0),
    _trial(13, _config("bf16", 64, 4, "max-autotune", "fused", cudnn_benchmark=False), 1650.0),
]
SUMMARY = SearchSummary(TRIALS, TRIALS[1], BASELINE, "sqlite:///runs/resnet/study.db", "runs/resnet/best.yaml")
VALUES = ["max-autotune", "reduce-overhead", "channels_last", "256x1", "128x2", "64x4", "16x16", "as-given", "fused"]
VALUES += ["foreach", "blocks", "3,390/s", "672/s", "5.00x", "1.00x", "0.041%", "3.9%", "27.71s", "4, 2.7% apart"]
VALUES += ["4.40-5.69x"]  # #4's speedup, 90% interval from its two rounds


def _printed(width: int) -> str:
    out = io.StringIO()
    SearchReporter(Console(file=out, width=width, highlight=False, color_system=None)).finish(SUMMARY)
    return out.getvalue()


def _table_part(printed: str) -> str:
    return printed[: printed.index("outcomes:")]


def _assert_whole(printed: str, width: int) -> None:
    table = _table_part(printed)
    assert "…" not in printed
    assert all(cell_len(line) <= width for line in printed.splitlines()), printed
    for value in VALUES:
        # a value of several words ("4, 2.7% apart") may wrap between them, never inside one
        pattern = r"\s+".join(re.escape(word) for word in value.split())
        assert re.search(rf"(?<![\w,.-]){pattern}(?![\w-])", table), f"{value!r} is not whole in\n{printed}"
    for header in ("trial", "precision", "batch", "workers", "compile", "optimizer", "samples/s", "speedup"):
        assert re.search(rf"(?<!\S){re.escape(header)}(?!\S)", table), header


@pytest.mark.parametrize("width", [80, 100, 200])
def test_the_final_table_shows_every_value_whole_at_any_width(width: int) -> None:
    printed = _printed(width)
    _assert_whole(printed, width)
    tables = sum(line.startswith("─") for line in printed.splitlines())  # the rule under each header
    assert tables == 1 if width == 200 else tables > 1  # a narrow console splits the table, never cuts it


def test_knobs_the_same_in_every_row_are_said_once_under_the_table() -> None:
    printed = _printed(80)
    # memory_format and prefetch_factor are the same in every config shown: no column of their own
    assert "same in every row: memory_format=channels_last prefetch_factor=4\n" in printed
    assert "memory format" not in _table_part(printed).split("same in every row")[0]
    assert "prefetch" not in _table_part(printed).split("same in every row")[0]
    # the knobs that differ keep theirs, headed by their words apart so a header can wrap
    assert "checkpointing" in printed and "pin" in printed and "cudnn" in printed


def test_one_config_alone_keeps_its_knob_columns() -> None:
    summary = SearchSummary([BASELINE], None, BASELINE, "sqlite:///study.db", None)
    out = io.StringIO()
    SearchReporter(Console(file=out, width=80, highlight=False, color_system=None)).finish(summary)
    printed = out.getvalue()
    assert "same in every row" not in printed and "…" not in printed
    assert re.search(r"(?<!\S)16x16(?!\S)", printed) and re.search(r"(?<!\S)fp32(?!\S)", printed)


@pytest.mark.parametrize("columns", [None, "80"])
def test_in_a_log_or_a_pipe_the_table_is_whole(
    columns: str | None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where stdout is no terminal the console is 120 columns wide, or as wide as COLUMNS says."""
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    SearchReporter().finish(SUMMARY)
    _assert_whole(capsys.readouterr().out, int(columns or 120))


def test_a_column_wider_than_the_console_folds_its_longest_words_and_cuts_none() -> None:
    console = Console(file=io.StringIO(), width=24, color_system=None)
    remat = "dots_with_no_batch_dims_saveable"
    columns = [Column("trial", ["#1", "#0 base"]), Column("remat", [remat, "none"]), Column("speedup", ["2.00x", "-"])]
    for table in whole_tables(console, columns, knobs=1):
        console.print(table)
    printed = console.file.getvalue()  # type: ignore[attr-defined]
    assert "…" not in printed and all(cell_len(line) <= 24 for line in printed.splitlines())
    assert remat in re.sub(r"\s", "", printed)  # its pieces, one under the other
    assert "2.00x" in printed
