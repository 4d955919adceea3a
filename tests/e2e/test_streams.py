"""Streamed datasets end to end: a workload whose data has no length (an `IterableDataset`, as a
streaming corpus is read) is tuned, every config reading the same items in the same order; a
stream too short for one step is refused by the probe, before anything is stored."""

from __future__ import annotations

from pathlib import Path

from autotuner.results.records import records
from tests.support.studies import load_study, run_cli, write_spec

GPT = {"vocab": 64, "length": 16, "dim": 32, "layers": 1, "heads": 2, "samples": 512}


def test_a_streamed_corpus_is_tuned_end_to_end(tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        name="streamed",
        workload="tests.support.study_workloads:streamed_gpt",
        workload_args=GPT,
        global_batch=32,
        baseline={"precision": "fp32", "batch_size": 8, "workers": 0, "compile": "none"},
        space={"precision": ["fp32", "bf16"], "batch_size": [8, 32], "workers": [0, 2], "compile": ["none"]},
        budget={"trials": 4, "remeasure_top": 0},
    )
    done = run_cli("search", "--spec", str(spec), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    trials = records(load_study(tmp_path, "streamed"))
    ok = [t for t in trials if t.outcome == "ok"]
    assert len(ok) == 4, [(t.config, t.reason) for t in trials]
    assert all(t.throughput > 0 and t.metrics["drift"] is not None for t in ok)
    assert all("dataset_items" not in t.metrics for t in ok)  # a stream has no length to report
    # the same items in the same order for every config: fp32 at any batch and any workers drifts
    # by float rounding only
    assert all(t.metrics["drift"] < 1e-4 for t in ok if t.config["precision"] == "fp32")


def test_a_stream_that_ends_before_one_step_is_refused_in_seconds(tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        name="short",
        workload="tests.support.study_workloads:streamed_gpt",
        workload_args={**GPT, "ends_after": 10},
        global_batch=32,
        baseline={"precision": "fp32", "batch_size": 8, "workers": 0, "compile": "none"},
        space={"precision": ["fp32"], "batch_size": [8], "workers": [0], "compile": ["none"]},
    )
    done = run_cli("search", "--spec", str(spec), cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "the stream ended after 10 items, fewer than one global batch (32)" in done.stderr
    assert not (tmp_path / "runs" / "short" / "study.db").exists()
