"""Safety: YAML is only ever loaded safely, a study name can never name a file outside its folder
in runs/, and what a study writes is git-ignored. The dashboard's address is tests/e2e/test_safety.py's."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from autotuner.apply import load_config
from autotuner.errors import SpecError
from autotuner.export.writer import export_path
from autotuner.output.pages import report_path
from autotuner.spec.job import load_spec
from autotuner.spec.keys import NAME
from tests.support.studies import ROOT

SOURCES = [
    p for folder in ("autotuner", "backends", "search_spaces", "benchmarks") for p in (ROOT / folder).rglob("*.py")
]
MINIMAL = {"name": "job", "backend": "pytorch", "workload": "builtin:mlp", "global_batch": 64}


# ---------------------------------------------------------------- YAML


def test_the_project_loads_yaml_only_with_safe_load() -> None:
    """yaml.load, full_load, unsafe_load or a Loader argument could build Python objects from a
    file's tags: none of them appears in the project's code."""
    assert SOURCES
    unsafe = re.compile(r"yaml\.(load|full_load|unsafe_load|load_all|full_load_all|unsafe_load_all)\(|Loader\s*=")
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in SOURCES
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if unsafe.search(line)
    ]
    assert found == []
    assert any("yaml.safe_load(" in p.read_text() for p in SOURCES)


@pytest.mark.parametrize("suffix", ["spec", "config"])
def test_a_python_tag_in_a_spec_or_an_exported_config_is_never_run(tmp_path: Path, suffix: str) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / f"{suffix}.yaml"
    path.write_text(f'name: job\nparams: !!python/object/apply:os.system ["touch {marker}"]\n')
    with pytest.raises(SpecError, match="not valid YAML"):
        (load_spec if suffix == "spec" else load_config)(path)
    assert not marker.exists()


# ---------------------------------------------------------------- study names


@pytest.mark.parametrize(
    "name", ["../x", "/etc/x", "a/b", "", ".", "..", "a\x00b", "x\n", "a\\b", ".hidden", "~root", "C:x", "x" * 65]
)
def test_a_study_name_that_is_a_path_is_refused(tmp_path: Path, name: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**MINIMAL, "name": name}))
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert caught.value.key == "name" and "letters, digits" in str(caught.value)


@settings(max_examples=200, deadline=None, database=None)
@given(name=st.from_regex(NAME, fullmatch=True) | st.text(max_size=70))
def test_every_name_a_spec_accepts_stays_inside_its_folder(name: str) -> None:
    """The database, the export, the report and the compile cache of any name a spec accepts lie in
    runs/<name>/, a folder of its own directly in runs/."""
    from autotuner.spec.job import parse_spec

    try:
        job = parse_spec({**MINIMAL, "name": name}, "inline")
    except SpecError:
        return
    folder = job.output_dir().resolve()
    assert folder.parent == Path("runs").resolve() and folder.name == name
    database = Path(job.storage_url().removeprefix("sqlite:///"))
    written = (database, export_path(job.name), export_path(job.name, "json"), report_path(job.name, "md"))
    for path in (*written, job.compile_cache_dir()):
        assert path.resolve().parent == folder, path
    assert "/" not in name and "\x00" not in name


# ---------------------------------------------------------------- what a study writes


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_study_databases_exports_and_reports_are_git_ignored() -> None:
    written = [
        "runs/job/study.db",
        "runs/job/study.db-journal",
        "runs/job/best.yaml",
        "runs/job/best.json",
        "runs/job/best.yaml.123.tmp",
        "runs/job/report.html",
        "runs/job/report.md",
        "runs/job/report.html.tmp",
        "runs/job/compile-cache/fxgraph",
        "elsewhere/job.db",
    ]
    done = subprocess.run(["git", "check-ignore", "--no-index", *written], cwd=ROOT, capture_output=True, text=True)
    assert sorted(done.stdout.split()) == sorted(written), done.stdout + done.stderr
    kept = ["studies/quickstart.yaml", "studies/my-job.yaml", "autotuner/spec/job.py"]
    done = subprocess.run(["git", "check-ignore", "--no-index", *kept], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1 and done.stdout == "", done.stdout  # 1: none of them is ignored
