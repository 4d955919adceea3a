"""The README's promises that a newcomer copies: the set-up commands, the workload example, the
spec, what the quickstart prints, and the headline figures."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import yaml

from autotuner.backends.pytorch.workload import TorchWorkload, as_workload
from autotuner.export.writer import export_path
from autotuner.output.console import dashboard_command
from autotuner.search.profiling import artifact_dir
from autotuner.spec.job import load_spec, parse_spec
from tests.support.studies import ROOT

README = (ROOT / "README.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, re.S)


def section(heading: str) -> str:
    match = re.search(rf"^## {heading}\n(.*?)(?=^## |\Z)", README, re.S | re.M)
    assert match is not None, f"the README has no section {heading!r}"
    return match.group(1)


def test_readme_opens_with_the_two_commands_and_ci_runs_the_second_verbatim() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert first_block is not None and README.index("```bash") < README.index("\n## ")
    commands = first_block.group(1).strip().splitlines()
    assert len(commands) == 2
    assert "autotuner search --spec studies/quickstart.yaml" in commands[0]
    assert "pytest" in commands[1]
    assert commands[1] in (ROOT / ".ci" / "run").read_text()


def test_readme_is_a_users_page_not_a_manual() -> None:
    assert len(README.splitlines()) <= 160


def test_readme_workload_example_builds_a_workload(tmp_path: Path) -> None:
    module_path = tmp_path / "readme_workload.py"
    module_path.write_text(blocks("python")[0])
    spec = importlib.util.spec_from_file_location("readme_workload", module_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    workload = as_workload(module.make_workload(hidden=8), "readme_workload:make_workload")
    assert isinstance(workload, TorchWorkload)
    inputs, target = workload.dataset[0]
    loss = workload.loss_fn(workload.model(inputs.unsqueeze(0)), target.unsqueeze(0))
    loss.backward()
    workload.optimizer(workload.model.parameters()).step()


def test_readme_spec_is_a_valid_spec_for_that_workload() -> None:
    (text,) = blocks("yaml")
    job = parse_spec(yaml.safe_load(text), "README.md")
    assert job.spec.workload == "mypackage.train:make_workload"
    assert {k: job.baseline[k] for k in ("precision", "batch_size", "workers", "compile")} == {
        "precision": "fp32",
        "batch_size": 32,
        "workers": 0,
        "compile": "none",
    }


def test_readme_quickstart_output_ends_as_the_search_prints_it() -> None:
    """The abridged output keeps the lines a user acts on, as the code writes them today."""
    (output,) = blocks("text")
    job = load_spec(ROOT / "studies" / "quickstart.yaml")
    first = rf"^\[1/{job.spec.budget.trials}\] .* #0 \(baseline\) precision=fp32 batch=16x16 workers=0 compile=none"
    assert re.search(first, output, re.M)
    assert f"exported: {export_path(job.name)}" in output
    assert f"dashboard: {dashboard_command(job.storage_url(), str(artifact_dir(job)))}" in output
    best = re.search(
        r"^best: trial #(\d+) (.*): ([\d,]+)/s, ([\d.]+)x the baseline "
        r"\(90% interval ([\d.]+)-([\d.]+)x, \d+ rounds\)$",
        output,
        re.M,
    )
    assert best is not None
    assert re.search(
        rf"^\s+#{best.group(1)}\s.*\s{best.group(3)}/s\s+{best.group(4)}x\s+{best.group(5)}-{best.group(6)}x",
        output,
        re.M,
    )


def test_readme_headline_figures_are_the_generated_benchmark_tables() -> None:
    """Each figure the README's Results quote is in the tables `benchmarks/tables.py` writes, so a
    re-measured benchmark cannot leave a stale figure here."""
    benchmarks = (ROOT / "benchmarks" / "README.md").read_text()
    generated = benchmarks[benchmarks.index("<!-- results:") : benchmarks.index("<!-- results end -->")]
    results = section("Results")
    assert "benchmarks/README.md#results" in results
    figures = re.findall(r"\d[\d,]*(?:\.\d+)?(?:x\b|%| ms\b| s\b)", results)
    assert len(figures) >= 10
    for figure in figures:
        assert re.search(rf"(?<![\d.,]){re.escape(figure)}", generated), f"{figure} is not in the benchmark tables"
