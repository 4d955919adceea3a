"""`python benchmarks/gpu.py --lease OUT` (one command for a lent GPU) run dry on the CPU
(`--device cpu --tiny`): its plan (every step, budgets within 8 minutes), the files it writes into
OUT, their tables, and benchmarks/results/ left as it was. The dry run's budgets are seconds, so its
JAX step (op-by-op on a CPU) shows a step stopped at its budget and the next one run all the same.
Not a `gpu` test: it runs in CI (under a minute on two cores)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.benchmarks import COMMON, digests, gpu_py, render_tables

LEASE_S = 480.0
"""The lease's whole time on the GPU: 8 minutes."""
STEPS = {"study": "gpu-study.json", "apply": "gpu-apply.json", "jax": "gpu-jax.json", "tests": "gpu-tests.json"}
LOGS = {"study.log", "apply.log", "jax.log", "tests.log", "tests.xml"}


@pytest.fixture(scope="module")
def lease(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], str]:
    folder = tmp_path_factory.mktemp("gpu-lease")
    out = folder / "out"
    before = digests()
    done = gpu_py("--lease", str(out), "--device", "cpu", "--tiny", "--work", str(folder / "work"), timeout=300)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert digests() == before, "the lease's dry run changed benchmarks/results/"
    return out, json.loads((out / "lease.json").read_text()), done.stdout


def test_the_plan_has_every_step_within_eight_minutes(lease: tuple[Path, dict[str, Any], str]) -> None:
    _, plan, stdout = lease
    assert plan["mode"] == "lease" and plan["tiny"] is True
    assert [step["step"] for step in plan["steps"]] == list(STEPS)
    assert plan["total_budget_s"] == LEASE_S
    total = sum(step["budget_s"] for step in plan["steps"]) + plan["script_reserve_s"]
    assert total == plan["budgets_sum_s"] <= LEASE_S
    assert all(step["budget_s"] > 0 and step["tiny_budget_s"] <= step["budget_s"] for step in plan["steps"])
    study, apply, jax, tests = plan["steps"]
    assert study["args"][0] == "--timeout" and float(study["args"][1]) < study["budget_s"] / 2  # room to re-measure
    assert jax["args"][:2] == ["--trials", "2"] and tests["args"] == ["quick"] and apply["part"] == "apply"
    for step in plan["steps"]:
        assert f"{step['step']:<6} {step['budget_s']:5.0f} s" in stdout  # the plan, printed first
        # every step ran within its budget: done, or stopped at it and recorded so
        assert step["status"] in ("ok", "stopped at the time limit"), step
        assert step["stopped_at_time_limit"] == (step["status"] == "stopped at the time limit")
    assert study["status"] == apply["status"] == tests["status"] == "ok"


def test_out_gets_a_handful_of_small_files(lease: tuple[Path, dict[str, Any], str]) -> None:
    out = lease[0]
    assert {p.name for p in out.iterdir() if p.is_file()} == {"lease.json", *STEPS.values()}
    assert {p.name for p in (out / "logs").iterdir()} == LOGS
    assert all(p.stat().st_size < 300_000 for p in out.rglob("*") if p.is_file())
    for step, name in STEPS.items():
        data = json.loads((out / name).read_text())
        assert COMMON <= set(data), (step, COMMON - set(data))
        assert data["part"] == step and data["tiny"] is True and data["commands"]
    study = json.loads((out / "gpu-study.json").read_text())
    assert "--timeout" in study["commands"][0]["command"] and study["best"]["outcome"] == "ok"
    apply = json.loads((out / "gpu-apply.json").read_text())
    assert "--steps 20" in apply["commands"][0]["command"] and apply["promise"]["speedup_delivered"] > 0
    jax = json.loads((out / "gpu-jax.json").read_text())
    assert "--trials 2" in jax["commands"][0]["command"]
    tests = json.loads((out / "gpu-tests.json").read_text())
    assert tests["selection"]["name"] == "quick" and tests["tests"]
    assert {t["outcome"] for t in tests["tests"]} == {"skipped"}  # no GPU here: every `gpu` test skips
    assert not any("out_of_memory" in t["test"] or "compile_mode" in t["test"] for t in tests["tests"])


def test_tables_render_the_lease(lease: tuple[Path, dict[str, Any], str], tmp_path: Path) -> None:
    out, plan, _ = lease
    text = render_tables(out, tmp_path)
    section = text[text.index("### On one GPU") : text.index("<!-- results end -->")]
    assert "#### The lease: `python benchmarks/gpu.py --lease " in section
    for step in plan["steps"]:
        assert f"| {step['step']} | {step['what']} |" in section
    for heading in ("The gpt study", "`autotuner apply`", "The JAX gpt study", "The `gpu` tests"):
        assert f"#### {heading}" in section, heading
    assert "| `test_mfu_is_a_fraction_of_a_known_gpus_peak` | skipped |" in section


def test_the_lease_refuses_the_committed_results_and_other_options(tmp_path: Path) -> None:
    before = digests()
    done = gpu_py("--lease", "benchmarks/results", "--device", "cpu", "--tiny", "--work", str(tmp_path), timeout=120)
    assert done.returncode == 2 and "never writes into" in done.stderr
    done = gpu_py("--lease", str(tmp_path / "o"), "--part", "study", "--tiny", timeout=120)
    assert done.returncode == 2 and "alone" in done.stderr
    assert digests() == before
