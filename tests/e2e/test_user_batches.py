"""Jobs of users' own batches end to end: their batches and loss tune to an export, and data shapes
that cannot train are refused by the probe before a study exists (PyTorch and JAX), and by
`autotuner apply` as the search refuses them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.studies import run_cli, write_spec

# ---------------------------------------------------------------- end to end, through the CLI


def _spec(folder: Path, name: str, workload: str, **changes: Any) -> Path:
    return write_spec(
        folder,
        name=name,
        workload=workload,
        workload_args=changes.pop("workload_args", {}),
        global_batch=16,
        baseline={"precision": "fp32", "batch_size": 8, "workers": 0, "compile": "none"},
        space={"precision": ["fp32", "bf16"], "batch_size": [8, 16], "workers": [0], "compile": ["none"]},
        budget={"trials": 2},
        trial={"warmup_steps": 1, "steps": 2, "windows": 2, "min_window_s": 0.02, "drift_steps": 2, "timeout": 120},
        **changes,
    )


@pytest.mark.parametrize(
    "workload", ["tests.support.study_workloads:keyword_batches", "tests.support.study_workloads:own_step"]
)
def test_a_job_of_its_own_batches_and_loss_tunes_to_an_export(tmp_path: Path, workload: str) -> None:
    spec = _spec(tmp_path, "own", workload)
    done = run_cli("search", "--spec", str(spec), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    export = yaml.safe_load((tmp_path / "runs" / "own" / "best.yaml").read_text())
    assert export["params"]["batch_size"] * export["params"]["accumulation"] == 16
    assert export["metrics"]["throughput"] > 0 and export["metrics"]["drift"] <= 0.01


# ---------------------------------------------------------------- shapes refused by the probe


@pytest.mark.parametrize(
    ("workload", "args", "cause"),
    [
        (
            "tests.support.faulty_workloads:ok",
            {"samples": 12},
            "the dataset holds 12 items, fewer than one global batch (16)",
        ),
        ("tests.support.faulty_workloads:ok", {"samples": 0}, "the dataset is empty"),
        (
            "tests.support.study_workloads:keyword_batches",
            {"padded": False},
            "the collate function cannot batch the dataset's first 2 items: RuntimeError: stack expects",
        ),
        (
            "tests.support.study_workloads:keyword_batches",
            {"labels": False},
            "the model's output (KeywordOutput) carries no loss (no .loss or ['loss'] tensor), "
            "and the workload gives no loss_fn or train_step",
        ),
        (
            "tests.support.faulty_workloads:wrong_features",
            {},
            "the model fails on the first batch: RuntimeError: mat1 and mat2 shapes cannot be multiplied",
        ),
    ],
    ids=["smaller-than-global-batch", "empty", "uncollatable", "no-loss", "model-fails"],
)
def test_a_bad_shape_is_refused_by_the_probe_before_any_storage(
    tmp_path: Path, workload: str, args: dict[str, Any], cause: str
) -> None:
    spec = _spec(tmp_path, "bad", workload, workload_args=args)
    done = run_cli("search", "--spec", str(spec), cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("autotuner: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert f"{workload}: {cause}" in done.stderr
    assert not (tmp_path / "runs" / "bad" / "study.db").exists()


@pytest.mark.parametrize(
    ("workload", "cause"),
    [
        ("wrong_features", "loss_fn fails on the first batch: TypeError: dot_general requires contracting dimensions"),
        ("per_sample_loss", "loss_fn returned an array of shape (2,), not a scalar loss"),
    ],
)
def test_a_jax_job_whose_loss_fails_is_refused_by_the_probe(tmp_path: Path, workload: str, cause: str) -> None:
    spec = write_spec(
        tmp_path,
        name="bad",
        backend="jax",
        workload=f"tests.support.faulty_jax_workloads:{workload}",
        workload_args={},
        global_batch=16,
        baseline={"precision": "fp32", "batch_size": 8, "workers": 0, "jit": "on"},
        space={"precision": ["fp32"], "batch_size": [8, 16], "workers": [0], "jit": ["on"]},
        budget={"trials": 2},
    )
    done = run_cli("search", "--spec", str(spec), cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"tests.support.faulty_jax_workloads:{workload}: {cause}" in done.stderr
    assert not (tmp_path / "runs" / "bad" / "study.db").exists()


def test_apply_refuses_a_bad_shape_as_the_search_does(tmp_path: Path) -> None:
    """`autotuner apply` probes the job's data as the search does: a job whose output has no loss
    is refused in one line before anything runs."""
    good = _spec(tmp_path, "own", "tests.support.study_workloads:keyword_batches")
    assert run_cli("search", "--spec", str(good), cwd=tmp_path).returncode == 0
    bad = _spec(tmp_path, "own", "tests.support.study_workloads:keyword_batches", workload_args={"labels": False})
    done = run_cli("apply", "runs/own/best.yaml", "--spec", str(bad), "--force", cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "carries no loss" in done.stderr and "Traceback" not in done.stderr
