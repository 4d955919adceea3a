"""Never lose a trial, end to end: one `autotuner search` whose workload misbehaves in a different
way for each config meets every fault a trial can have (a segfault, an abort, a hang, the
framework's out-of-memory error, an allocation refused by the trial's memory limit, a NaN loss,
an exception in user code, an exit without a result, garbage where the result goes, a result
that never ends), records each with its outcome and reason, runs the next trial, and ends
normally. A second study has a factory that fails once. Everything is read back from the
storage, as the dashboard and `export` read it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from tests.support.helpers import ALLOCATE_MB, FAULTY, MEMORY_LIMIT_MB
from tests.support.studies import load_study, run_cli, write_spec

TIMEOUT_S = 5
"""The trial timeout of the fault study: a healthy trial here takes well under a second."""
"""The `allocate` fault asks for this much (never touched): granted without a limit, refused with it."""

FAULTS: dict[tuple[str, int], tuple[str, str, list[str]]] = {
    # (precision, micro-batch): (fault injected, outcome recorded, words of the reason). Each
    # faulty batch size is faulty in both precisions, so a forward outside autocast (which a
    # backend may add after the measured phase) meets a fault for that config, never another's.
    ("fp32", 2): ("error", "error", ["KeyError", "user code failed on a batch of 2 [/] (not markup)"]),
    ("bf16", 2): ("garbage", "crash", ["unreadable result", "message length"]),
    ("fp32", 4): ("segfault", "crash", ["killed by SIGSEGV"]),
    ("bf16", 4): ("hang", "timeout", [f"trial timeout of {TIMEOUT_S} s", "killed"]),
    ("fp32", 8): ("abort", "crash", ["killed by SIGABRT"]),
    ("bf16", 8): ("garbage_hang", "timeout", [f"trial timeout of {TIMEOUT_S} s"]),
    ("fp32", 32): ("nan", "nan", ["the loss became nan"]),
    ("bf16", 32): ("exit", "crash", ["exited with code 3 without a result"]),
    ("fp32", 64): ("oom", "oom", ["OutOfMemoryError: CUDA out of memory", "(injected)"]),
    ("bf16", 64): (
        "allocate",
        "oom",
        ["RuntimeError", "DefaultCPUAllocator: can't allocate memory", f"{MEMORY_LIMIT_MB} MiB: trial.max_memory_mb"],
    ),
}
HEALTHY = {("fp32", 16), ("bf16", 16)}
"""fp32/16 is the baseline (and the reference's batching, and the held-out chunk)."""
BATCHES = [2, 4, 8, 16, 32, 64]


def _key(trial: optuna.trial.FrozenTrial) -> tuple[str, int]:
    return trial.params["precision"], trial.params["batch_size"]


@pytest.fixture(scope="module")
def fault_study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """Every config of the space, one fault each (or none), in one search."""
    workdir = tmp_path_factory.mktemp("faults")
    spec = write_spec(
        workdir,
        name="faults",
        workload=f"{FAULTY}:by_config",
        workload_args={
            "faults": {f"{p}/{b}": fault for (p, b), (fault, _, _) in FAULTS.items()},
            "allocate_mb": ALLOCATE_MB,
        },
        global_batch=64,
        baseline={"precision": "fp32", "batch_size": 16, "workers": 0, "compile": "none"},
        space={"precision": ["fp32", "bf16"], "batch_size": BATCHES, "workers": [0], "compile": ["none"]},
        budget={"trials": 2 * len(BATCHES)},
        trial={
            "warmup_steps": 1,
            "steps": 2,
            "windows": 2,
            "min_window_s": 0,
            "drift_steps": 2,
            "timeout": TIMEOUT_S,
            "max_memory_mb": MEMORY_LIMIT_MB,
        },
        sampler={"name": "random", "seed": 0},
    )
    done = run_cli("search", "--spec", str(spec), cwd=workdir)
    return workdir, done


def test_the_study_ends_normally_and_exports(fault_study: tuple[Path, Any]) -> None:
    workdir, done = fault_study
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    export = yaml.safe_load((workdir / "runs" / "faults" / "best.yaml").read_text())
    assert (export["params"]["precision"], export["params"]["batch_size"]) in HEALTHY
    assert export["baseline"]["outcome"] == "ok"
    counts: dict[str, int] = {}
    for outcome in [o for _, o, _ in FAULTS.values()] + ["ok"] * len(HEALTHY):
        counts[outcome] = counts.get(outcome, 0) + 1
    assert "outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) in done.stdout


@pytest.mark.parametrize("config", list(FAULTS), ids=[f"{p}-{b}-{FAULTS[p, b][0]}" for p, b in FAULTS])
def test_each_fault_is_recorded_with_its_outcome_and_reason(fault_study: tuple[Path, Any], config: tuple) -> None:
    workdir, _ = fault_study
    fault, outcome, words = FAULTS[config]
    (trial,) = [t for t in load_study(workdir, "faults").get_trials() if _key(t) == config]
    attrs = trial.user_attrs
    assert trial.state is optuna.trial.TrialState.COMPLETE
    assert attrs["outcome"] == outcome, (fault, attrs["outcome"], attrs["reason"])
    assert attrs["feasible"] is False
    reason = attrs["reason"]
    assert "\n" not in reason and 0 < len(reason) <= 300, reason
    for word in words:
        assert word in reason, (fault, reason)
    assert trial.system_attrs["constraints"][1] > 0  # the "outcome" constraint is violated
    if outcome == "error":  # the user's traceback is kept on the trial
        assert attrs["traceback"].startswith("Traceback (most recent call last):")
        assert "faulty_workloads.py" in attrs["traceback"] and "KeyError" in attrs["traceback"]
    else:
        assert "traceback" not in attrs


def test_the_search_went_on_after_every_fault(fault_study: tuple[Path, Any]) -> None:
    """Every config of the space ran, one trial each, numbered without a gap: after each fault the
    next trial was asked for, run and recorded."""
    workdir, _ = fault_study
    trials = load_study(workdir, "faults").get_trials()
    assert [t.number for t in trials] == list(range(2 * len(BATCHES)))
    assert sorted(_key(t) for t in trials) == sorted(FAULTS.keys() | HEALTHY)
    assert all(t.state is optuna.trial.TrialState.COMPLETE for t in trials)
    assert trials[0].user_attrs["role"] == "baseline" and _key(trials[0]) == ("fp32", 16)
    for t in trials:
        if _key(t) in HEALTHY:
            assert t.user_attrs["outcome"] == "ok" and t.user_attrs["feasible"] is True, t.user_attrs
            assert t.user_attrs["throughput"] > 0


def test_a_factory_that_fails_once_is_an_error_and_the_next_trial_runs(tmp_path: Path) -> None:
    """The factory raises on its fifth call: after the probe, the two reference runs and the
    baseline, that is the first searched trial."""
    state = tmp_path / "state"
    state.mkdir()
    spec = write_spec(
        tmp_path,
        name="flaky",
        workload=f"{FAULTY}:by_config",
        workload_args={"faults": {}, "state_dir": str(state), "fail_call": 5},
        global_batch=64,
        baseline={"precision": "fp32", "batch_size": 16, "workers": 0, "compile": "none"},
        space={"precision": ["fp32"], "batch_size": [16, 32, 64], "workers": [0], "compile": ["none"]},
        budget={"trials": 3},
        trial={"warmup_steps": 1, "steps": 2, "windows": 2, "min_window_s": 0, "drift_steps": 2, "timeout": 60},
    )
    done = run_cli("search", "--spec", str(spec), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "runs" / "flaky" / "best.yaml").exists()
    trials = load_study(tmp_path, "flaky").get_trials()
    assert [t.user_attrs["outcome"] for t in trials] == ["ok", "error", "ok"], [t.user_attrs for t in trials]
    failed = trials[1].user_attrs
    assert failed["reason"] == "ValueError: the factory failed on call 5 (injected)"
    assert "in by_config" in failed["traceback"] and failed["feasible"] is False
    assert int((state / "calls").read_text()) == 6
