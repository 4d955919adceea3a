"""The documentation site: it builds with `mkdocs build --strict`, its reference is complete, and
the code its pages and the README show imports."""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from autotuner.cli import build_parser
from autotuner.spec.keys import JobSpec
from tests.support.studies import ROOT

USER_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as CI builds it: strict, so a broken link, a page left out of the nav, a
    generated part that fails or an API object that cannot be found fails the build."""
    folder = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(folder)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return folder


def page(site: Path, name: str) -> str:
    return (site / name / "index.html").read_text()


def spec_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        keys.append(prefix + name)
        for inner in getattr(field.annotation, "__args__", (field.annotation,)):
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                keys += spec_keys(inner, f"{prefix}{name}.")
    return keys


@pytest.mark.slow
def test_the_spec_reference_lists_every_key_with_its_description(site: Path) -> None:
    html = page(site, "reference/spec")
    keys = spec_keys(JobSpec)
    assert {"name", "budget.remeasure_windows", "trial.max_memory_mb", "sampler.seed"} <= set(keys)
    for key in keys:
        entry = re.search(rf"<dt><code>{re.escape(key)}</code></dt>\s*<dd>(.*?)</dd>", html, re.S)
        assert entry is not None, f"spec key {key} is missing from the reference"
        assert len(re.sub(r"<[^>]+>", "", entry.group(1)).split()) >= 5, f"spec key {key} has no description"


def test_the_cli_reference_lists_every_command_and_option(site: Path) -> None:
    html = page(site, "reference/cli")
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(commands) >= {"search", "apply", "export", "report", "dashboard", "env"}
    for name, command in commands.items():
        assert f"<code>autotuner {name}</code>" in html
        for action in command._actions:
            for option in action.option_strings:
                assert option in html, f"autotuner {name} {option} is missing from the reference"


def test_the_api_reference_documents_what_users_import(site: Path) -> None:
    html = page(site, "reference/api")
    for name in ("load_config", "TunedConfig", "TorchWorkload", "JaxWorkload", "load_spec"):
        assert f'id="{name}"' in html or re.search(rf'id="[\w.]*\.{name}"', html), name
    assert len(re.findall(r'id="[\w.]*\.apply\.TunedTraining"', html)) == 2  # PyTorch's and JAX's


def test_the_benchmark_page_holds_the_generated_tables(site: Path) -> None:
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    generated = readme[readme.index("<!-- results:") : readme.index("<!-- results end -->")]
    headings = re.findall(r"^### (.+)$", generated, re.M)
    assert headings
    html = page(site, "benchmarks")
    for heading in headings:
        assert re.sub(r"`([^`]*)`", r"<code>\1</code>", heading) in html


def _nav_pages() -> dict[str, list[str]]:
    """The pages of the MkDocs nav by group ("" for the top level), the home page left out: it is
    the page docs/index.md's list is on, and the README is its counterpart in the repository."""
    groups: dict[str, list[str]] = {"": []}
    for entry in yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]:
        ((title, target),) = entry.items()
        if isinstance(target, list):
            groups[title] = [page for item in target for page in item.values()]
        elif target != "index.md":
            groups[""].append(target)
    return groups


def _listed_pages(page: Path, heading: str, prefix: str) -> dict[str, list[str]]:
    """The pages the list under `heading` in `page` links, by the group a bullet starts with
    (`Guides:` or `**Guides**:`; "" for a bullet that names none), as paths under docs/."""
    text = page.read_text()
    match = re.search(rf"^## {heading}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match is not None, f"{page.name} has no section {heading!r}"
    groups: dict[str, list[str]] = {"": []}
    for bullet in re.split(r"^- ", match.group(1), flags=re.M)[1:]:
        label = re.match(r"\**(\w+)\**:", bullet)
        links = re.findall(r"\]\(([^)#\s]+)", bullet)
        # the README links the benchmarks' own README, which the site's benchmarks page is built from
        pages = ["benchmarks.md" if link == "benchmarks/README.md" else link.removeprefix(prefix) for link in links]
        groups.setdefault(label.group(1) if label else "", []).extend(pages)
    return groups


def test_the_readme_and_the_home_page_list_the_pages_of_the_nav_in_its_groups() -> None:
    nav = _nav_pages()
    assert {"Guides", "Concepts", "Reference"} <= set(nav) and "concepts/run-time.md" in nav["Concepts"]
    assert _listed_pages(ROOT / "README.md", "Documentation", "docs/") == nav
    assert _listed_pages(ROOT / "docs" / "index.md", "Where to go next", "") == nav


def _imports(code: str) -> list[tuple[str, list[str]]]:
    """(module, names) of every import statement at the top level of a code block."""
    found: list[tuple[str, list[str]]] = []
    for node in ast.parse(code).body:
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
    return found


@pytest.mark.parametrize("path", USER_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_code_a_page_shows_imports(path: Path) -> None:
    """Every import in a page's Python blocks names a module and names that exist, so a user who
    copies an example gets no ImportError (the autotuner.backends import as `autotuner.backends`)."""
    for code in re.findall(r"```python\n(.*?)```", path.read_text(), re.S):
        for module, names in _imports(code):
            imported = importlib.import_module(module)
            for name in names:
                assert hasattr(imported, name), f"{path.name}: {module} has no {name}"


def test_the_kubernetes_job_runs_one_search_worker_a_pod_on_the_secret_storage() -> None:
    """The guide's manifest is a batch/v1 Job of N pods, each running `autotuner search` against the
    database URL its Secret holds (Kubernetes expands `$(VAR)` in a command from the container's env)."""
    (block,) = re.findall(r"```yaml\n(.*?)```", (ROOT / "docs" / "guides" / "workers.md").read_text(), re.S)
    job = yaml.safe_load(block)
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    assert job["spec"]["parallelism"] == job["spec"]["completions"] > 1
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] in ("Never", "OnFailure")
    (container,) = pod["containers"]
    args = build_parser().parse_args(container["command"][1:])
    assert container["command"][0] == "autotuner" and args.command == "search" and args.spec
    variable = re.fullmatch(r"\$\((\w+)\)", args.storage)
    assert variable is not None, args.storage
    (env,) = [e for e in container["env"] if e["name"] == variable.group(1)]
    assert set(env["valueFrom"]["secretKeyRef"]) == {"name", "key"}
