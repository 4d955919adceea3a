"""benchmarks/gpu.py (the GPU benchmark) run dry on the CPU, so it cannot rot where no GPU is:
`--device cpu --tiny` runs its PyTorch parts end to end (the real CLI, the alternatives harness)
and writes their result files into its work folder, leaving the committed benchmarks/results/ as
they were, and benchmarks/tables.py renders them. The JAX part runs on its own
(`test_gpu_benchmark_jax.py`), so that the two run at once on two workers. Not a `gpu` test: it
runs in CI (about half a minute on two cores).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.benchmarks import COMMON, STUDY_KEYS, digests, gpu_py, render_tables
from tests.support.studies import ROOT

PARTS = ("study", "apply", "alternatives")


LABELS = {"baseline", "finder (Lightning power)", "finder (Accelerate)", "rule of thumb", "tuned"}


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The dry run as the docs give it (no --out: its default), the committed results hashed around it."""
    folder = tmp_path_factory.mktemp("gpu-dry-run")
    work = (folder / "work").resolve()
    parts = [arg for part in PARTS for arg in ("--part", part)]
    before = digests()
    done = gpu_py(*parts, "--device", "cpu", "--tiny", "--work", str(work))
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert digests() == before, "the dry run changed benchmarks/results/"
    return work / "results", done


def _load(out: Path, part: str) -> dict[str, Any]:
    return json.loads((out / f"gpu-{part}.json").read_text())


def test_every_part_dry_runs_on_the_cpu_and_writes_its_file(dry_run: tuple[Path, Any]) -> None:
    out, done = dry_run
    assert sorted(p.name for p in out.glob("gpu-*.json")) == sorted(f"gpu-{part}.json" for part in PARTS)
    for part in PARTS:
        data = _load(out, part)
        assert COMMON <= set(data), (part, COMMON - set(data))
        assert data["part"] == part and data["tiny"] is True
        assert data["status"] == "ok" and data["error"] is None, data["error"]
        assert data["device"] == "cpu" and data["device_name"] and data["machine"].startswith(data["device_name"])
        assert data["commands"] and all(c.get("wall_s") is not None for c in data["commands"])
    for part in PARTS:
        assert f"wrote {out / f'gpu-{part}.json'}" in done.stdout
        assert (out.parent / "logs" / f"gpu-{part}.json").exists()  # beside the commands' logs, too
    assert "tuned over baseline" in done.stdout  # the summary at the end


def test_the_study_part_reads_the_study_from_its_storage(dry_run: tuple[Path, Any]) -> None:
    data = _load(dry_run[0], "study")
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


def test_the_apply_part_measures_the_promise(dry_run: tuple[Path, Any]) -> None:
    data = _load(dry_run[0], "apply")
    command = data["commands"][0]
    applied, promise = data["apply"], data["promise"]
    assert command["command"].startswith("python -m autotuner apply ")
    # its exit code is the verdict it printed, whichever a dry run on a busy CPU gives
    assert command["exit_code"] == {"kept": 0, "not kept": 1, "undecided": 3}[promise["verdict"]]
    assert data["status"] == "ok" and promise["verdict"] == applied["promise_verdict"]
    assert applied["steps_run"] >= 50 and applied["throughput_here"] > 0 and applied["baseline_throughput_here"] > 0
    assert promise["export_speedup"] == pytest.approx(_load(dry_run[0], "study")["export"]["speedup"])
    assert promise["ratio"] == pytest.approx(promise["speedup_delivered"] / promise["export_speedup"])
    assert promise["within_5_percent"] == (abs(promise["ratio"] - 1) <= 0.05)


def test_the_alternatives_part_measures_the_four_configs_on_gpt_and_cnn(dry_run: tuple[Path, Any]) -> None:
    data = _load(dry_run[0], "alternatives")
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


def test_tables_render_the_gpu_results(dry_run: tuple[Path, Any], tmp_path: Path) -> None:
    out = dry_run[0]
    text = render_tables(out, tmp_path)
    section = text[text.index("### On one GPU") : text.index("<!-- results end -->")]
    study, apply = _load(out, "study"), _load(out, "apply")
    assert study["machine"] in section and "A `--tiny` dry run" in section
    assert f"| tuned over baseline | {study['speedup']:.2f}x | >= 3x (stretch 5x) |" in section
    assert f"| the promise: delivered over the export's | {apply['promise']['ratio']:.3f} | within 5% |" in section
    headings = ("The gpt study", "`autotuner apply`", "The tuned config against the alternatives")
    for heading in headings:
        assert f"#### {heading}" in section, heading
    for name in ("gpt", "cnn"):
        assert f"| {name} | rule of thumb |" in section
    # everything outside the results section is left as it was
    original = (ROOT / "benchmarks" / "README.md").read_text()
    assert text.split("<!-- results:")[0] == original.split("<!-- results:")[0]


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
