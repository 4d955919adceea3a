"""`autotuner report` end to end: the command on a real small study writes the page."""

from __future__ import annotations

import re
from pathlib import Path

from autotuner.output.formatting import format_config
from autotuner.results.records import best, records
from tests.support.studies import load_study, run_cli, write_spec


def test_report_command_on_a_real_study(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, budget={"trials": 2})
    done = run_cli("search", "--spec", str(spec), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    study = load_study(tmp_path)
    numbers = [t.number for t in study.trials]
    assert len(numbers) >= 2

    html_run = run_cli("report", "--spec", str(spec), cwd=tmp_path)
    assert html_run.returncode == 0, html_run.stderr
    page_path = tmp_path / "runs" / "small" / "report.html"
    assert html_run.stdout.strip() == str(Path("runs") / "small" / "report.html")
    page = page_path.read_text()
    assert "autotuner report: small" in page
    assert 'id="pareto"' in page and "Plotly.newPlot" in page
    assert '<script src="http' not in page and "https://cdn" not in page
    assert not re.search(r"""<(?:link|script|img)[^>]+(?:href|src)=["']?https?:""", page)  # nothing to fetch
    winner = best(records(study))
    assert winner is not None and format_config(winner.config) in page
    table = page[page.index("All trials") :]
    for number in numbers:
        assert f"<td>#{number}</td>" in table

    md_run = run_cli("report", "--spec", str(spec), "--format", "md", cwd=tmp_path)
    assert md_run.returncode == 0, md_run.stderr
    markdown = (tmp_path / "runs" / "small" / "report.md").read_text()
    for heading in ("### Pareto front", "### Top 10 speedups", "### Throughput by knob value", "All trials"):
        assert heading in markdown
    assert "| trial | role | config | outcome | feasible |" in markdown
    assert "<script" not in markdown

    missing = run_cli("report", "--study", "nope", "--storage", "sqlite:///runs/small/study.db", cwd=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.strip() == "autotuner: error: name: no study 'nope' in sqlite:///runs/small/study.db"
    bad = run_cli("report", "--study", "small", "--storage", "nonsense://", cwd=tmp_path)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
