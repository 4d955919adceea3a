"""A JAX study end to end: searched on the CPU (its environment recorded, TF32 refused), exported,
applied with `autotuner apply` and in the guide's own loop, and `autotuner env` describing the
backend. CPU only, real jax."""

from __future__ import annotations

import re
import runpy
from pathlib import Path
from typing import Any

import jax
import pytest
import yaml

from autotuner.backends.jax import JAX
from autotuner.backends.jax.apply import TunedTraining
from autotuner.backends.jax.workload import JaxWorkload, as_workload
from tests.support.studies import JAX_SPEC, ROOT, _write, assert_applied, load_study, run_cli

# ---------------------------------------------------------------- a JAX study from the command line


@pytest.fixture(scope="module")
def jax_study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, Any]]:
    """A tiny JAX study (its fp32 reference, then every config of its space): folder, spec
    and export."""
    workdir = tmp_path_factory.mktemp("jax-study")
    spec = _write(workdir, JAX_SPEC)
    done = run_cli("search", "--spec", str(spec), cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    export = yaml.safe_load((workdir / "runs" / "small-jax" / "best.yaml").read_text())
    return workdir, spec, export


def test_a_jax_study_records_the_jax_environment_and_refuses_tf32_on_the_cpu(
    jax_study: tuple[Path, Path, dict[str, Any]],
) -> None:

    workdir, _, export = jax_study
    assert set(export["params"]) == set(JAX.job_knobs(None))  # one device: no param_sharding
    assert export["params"]["jit"] == "on" and export["params"]["precision"] == "fp32"
    assert export["environment"]["backend"] == "jax" and "jax" in export["environment"]["versions"]
    assert export["metrics"]["drift"] < 1e-4  # against the reference (jitted, strict fp32): rounding only
    study = load_study(workdir, "small-jax")
    reference = study.user_attrs["reference"]
    assert reference["config"]["jit"] == "on" and reference["noise_floor"] == 0.0
    outcomes = sorted((t.params["precision"], t.user_attrs["outcome"]) for t in study.trials)
    assert outcomes == [("fp32", "ok"), ("tf32", "unsupported")]


def test_autotuner_apply_runs_a_jax_export(jax_study: tuple[Path, Path, dict[str, Any]]) -> None:
    workdir, spec, export = jax_study
    done = run_cli(
        "apply", "runs/small-jax/best.yaml", "--rounds", "2", "--spec", str(spec), "--steps", "6", cwd=workdir
    )
    assert_applied(done)
    assert f"{export['metrics']['throughput']:,.0f} samples/s in the study" in done.stdout
    assert "held-out loss after 2 steps" in done.stdout and "(identical)" in done.stdout  # CPU runs repeat bitwise
    assert "Traceback" not in done.stderr


def test_autotuner_env_describes_the_jax_backend(tmp_path: Path) -> None:
    done = run_cli("env", "--backend", "jax", "--device", "cpu", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {cells[0]: cells[1] for line in done.stdout.splitlines() if len(cells := line.strip("│ ").split(" │ ")) == 2}
    rows = {name.strip(): value.strip() for name, value in rows.items()}
    assert rows["backend"] == "jax" and rows["jax"] == jax.__version__ and rows["XLA jit"] == "yes", rows
    assert "torch.compile" not in done.stdout


GUIDES = ROOT / "docs" / "guides"


def _first_python_block(page: str, section: str) -> str:
    text = (GUIDES / page).read_text()
    blocks = re.findall(r"```python\n(.*?)```", text[text.index(section) :], re.S)
    assert blocks, f"docs/guides/{page}, {section}: no Python block"
    return blocks[0]


def test_the_guides_jax_factory_and_loop_run_against_an_exported_config(
    jax_study: tuple[Path, Path, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The JAX guide's workload factory and the apply guide's JAX loop, as a user copies them."""
    blocks = [
        _first_python_block("jax.md", "## The workload factory"),
        _first_python_block("apply.md", "## In your own training loop: JAX"),
    ]
    _, _, export = jax_study
    (tmp_path / "runs" / "quickstart-jax").mkdir(parents=True)
    (tmp_path / "runs" / "quickstart-jax" / "best.yaml").write_text(yaml.safe_dump(export))
    factory = tmp_path / "jax_job.py"
    factory.write_text(blocks[0])
    (tmp_path / "train.py").write_text(blocks[1])
    monkeypatch.chdir(tmp_path)
    built = as_workload(runpy.run_path(str(factory))["make_workload"](hidden=8), "jax_job:make_workload")
    assert isinstance(built, JaxWorkload)
    scope = runpy.run_path(str(tmp_path / "train.py"), run_name="__main__")
    tuned = scope["tuned"]
    assert isinstance(tuned, TunedTraining) and tuned.jit and tuned.batch_size == export["params"]["batch_size"]
    assert scope["steps"] > 0
