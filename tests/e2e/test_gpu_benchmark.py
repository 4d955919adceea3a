"""benchmarks/gpu.py (the GPU benchmark) run dry on the CPU (`--device cpu --tiny`), so it cannot
rot where no GPU is: `--lease OUT`, the one command for a lent GPU, with its plan (every step,
budgets within 8 minutes), the files it writes into OUT and their tables; then the alternatives
part in the same work folder, which resumes the lease's gpt study; benchmarks/results/ left as it
was throughout. The dry run's budgets are seconds, so its JAX step (op-by-op on a CPU) shows a
step stopped at its budget and the next one run all the same; the JAX part run to its end has its
own test (`test_gpu_benchmark_jax.py`), so that the two run at once on two workers. Not a `gpu`
test: it runs in CI (about a minute on two cores).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.benchmarks import COMMON, STUDY_KEYS, digests, gpu_py, render_tables
from tests.support.studies import ROOT

LEASE_S = 480.0
"""The lease's whole time on the GPU: 8 minutes."""
STEPS = {"study": "gpu-study.json", "apply": "gpu-apply.json", "jax": "gpu-jax.json", "tests": "gpu-tests.json"}
LOGS = {"study.log", "apply.log", "jax.log", "tests.log", "tests.xml"}
LABELS = {"baseline", "finder (Lightning power)", "finder (Accelerate)", "rule of thumb", "tuned"}


@pytest.fixture(scope="module")
def lease(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], str]:
    folder = tmp_path_factory.mktemp("gpu-lease")
    out = folder / "out"
    before = digests()
    done = gpu_py("--lease", str(out), "--device", "cpu", "--tiny", "--work", str(folder / "work"), timeout=300)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert digests() == before, "the lease's dry run changed benchmarks/results/"
    return out, json.loads((out / "lease.json").read_text()), done.stdout


@pytest.fixture(scope="module")
def alternatives(lease: tuple[Path, dict[str, Any], str]) -> tuple[Path, dict[str, Any], str]:
    """The alternatives part in the lease's work folder (its default --out there)."""
    work = lease[0].parent / "work"
    before = digests()
    done = gpu_py("--part", "alternatives", "--device", "cpu", "--tiny", "--work", str(work))
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert digests() == before, "the dry run changed benchmarks/results/"
    out = work / "results"
    return out, json.loads((out / "gpu-alternatives.json").read_text()), done.stdout


def _load(out: Path, part: str) -> dict[str, Any]:
    return json.loads((out / f"gpu-{part}.json").read_text())


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


def test_the_study_part_reads_the_study_from_its_storage(lease: tuple[Path, dict[str, Any], str]) -> None:
    data = _load(lease[0], "study")
    assert STUDY_KEYS <= set(data), STUDY_KEYS - set(data)
    assert data["spec"] == "studies/gpu-gpt.yaml" and data["spec_used"]["space"]["preset"] == "pytorch"
    search = data["commands"][0]
    assert search["command"].startswith("python -m autotuner search --spec ") and search["exit_code"] == 0
    assert data["environment"]["device"] == "cpu" and data["environment"]["versions"]["torch"]
    # a CPU has no energy counter: energy is turned off, and the file says so
    assert data["spec_used"]["objective"]["energy"] is False and data["energy"]["objective"] is False
    assert any("objective.energy" in change for change in data["changes"])
    assert data["best"]["outcome"] == "ok" and data["best"]["config"]["batch_size"] in (4, 16)
    assert data["speedup"] > 0 and data["export"]["speedup"] == pytest.approx(data["speedup"])
    assert data["tokens_per_s"] > 0 and "mfu" in data["best"]  # no datasheet peak for a CPU: None
    assert data["trials_ran"] == len([t for t in data["trials"] if t["outcome"] != "unsupported"]) == 3


def test_the_apply_part_measures_the_promise(lease: tuple[Path, dict[str, Any], str]) -> None:
    data = _load(lease[0], "apply")
    command = data["commands"][0]
    applied, promise = data["apply"], data["promise"]
    assert command["command"].startswith("python -m autotuner apply ")
    # its exit code is the verdict it printed, whichever a dry run on a busy CPU gives
    assert command["exit_code"] == {"kept": 0, "not kept": 1, "undecided": 3}[promise["verdict"]]
    assert data["status"] == "ok" and promise["verdict"] == applied["promise_verdict"]
    assert applied["steps_run"] >= 20 and applied["throughput_here"] > 0 and applied["baseline_throughput_here"] > 0
    assert promise["export_speedup"] == pytest.approx(_load(lease[0], "study")["export"]["speedup"])
    assert promise["ratio"] == pytest.approx(promise["speedup_delivered"] / promise["export_speedup"])
    assert promise["within_5_percent"] == (abs(promise["ratio"] - 1) <= 0.05)


def test_the_alternatives_part_measures_four_configs_on_gpt_and_cnn(
    alternatives: tuple[Path, dict[str, Any], str],
) -> None:
    out, data, stdout = alternatives
    assert COMMON <= set(data) and data["part"] == "alternatives" and data["tiny"] is True
    assert data["status"] == "ok" and data["error"] is None, data["error"]
    assert data["device"] == "cpu" and data["commands"] and all(c.get("wall_s") is not None for c in data["commands"])
    assert f"wrote {out / 'gpu-alternatives.json'}" in stdout, stdout[-3000:]
    assert set(data["workloads"]) == {"gpt", "cnn"}
    for name, workload in data["workloads"].items():
        assert set(workload["configs"]) == LABELS, name
        assert workload["configs"]["baseline"]["over_baseline"] == pytest.approx(1.0)
        for label, row in workload["configs"].items():
            assert row["throughput"] > 0 and row["outcomes"] == ["ok"], (name, label, row)
        assert workload["configs"]["rule of thumb"]["config"]["compile"] == "none"  # a dry run leaves compile out
        assert workload["finders"]["lightning_power"]["batch_size"] == 16
    assert data["workloads"]["gpt"]["search"]["resumed"] is True  # the study part's study
    assert data["workloads"]["cnn"]["search"]["resumed"] is False


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
    study, apply = _load(out, "study"), _load(out, "apply")
    assert study["machine"] in section and "A `--tiny` dry run" in section
    assert f"| tuned over baseline | {study['speedup']:.2f}x | >= 3x (stretch 5x) |" in section
    assert f"| the promise: delivered over the export's | {apply['promise']['ratio']:.3f} | within 5% |" in section


def test_tables_render_the_alternatives(alternatives: tuple[Path, dict[str, Any], str], tmp_path: Path) -> None:
    text = render_tables(alternatives[0], tmp_path)
    section = text[text.index("### On one GPU") : text.index("<!-- results end -->")]
    assert alternatives[1]["machine"] in section and "A `--tiny` dry run" in section
    assert "#### The tuned config against the alternatives" in section
    for name in ("gpt", "cnn"):
        assert f"| {name} | rule of thumb |" in section
    # everything outside the results section is left as it was
    original = (ROOT / "benchmarks" / "README.md").read_text()
    assert text.split("<!-- results:")[0] == original.split("<!-- results:")[0]


def test_the_lease_refuses_the_committed_results_and_other_options(tmp_path: Path) -> None:
    before = digests()
    done = gpu_py("--lease", "benchmarks/results", "--device", "cpu", "--tiny", "--work", str(tmp_path), timeout=120)
    assert done.returncode == 2 and "never writes into" in done.stderr
    done = gpu_py("--lease", str(tmp_path / "o"), "--part", "study", "--tiny", timeout=120)
    assert done.returncode == 2 and "alone" in done.stderr
    assert digests() == before


def test_a_part_that_cannot_run_writes_its_error(tmp_path: Path) -> None:
    """The full sizes refuse a CPU; apply without the study's export says what to run first."""
    out = tmp_path / "results"
    done = gpu_py("--part", "study", "--device", "cpu", "--out", str(out), "--work", str(tmp_path / "work"))
    assert done.returncode == 1
    study = _load(out, "study")
    assert study["status"] == "error" and "--tiny" in study["error"] and study["commands"] == []
    done = gpu_py("--part", "apply", "--device", "cpu", "--tiny", "--out", str(out), "--work", str(tmp_path / "w"))
    assert done.returncode == 1
    apply = _load(out, "apply")
    assert apply["status"] == "error" and "--part study" in apply["error"]
