"""benchmarks/gpu.py's JAX part run dry on the CPU (`--part jax --device cpu --tiny`): the JAX gpt
study end to end through the real CLI, its result file (in its work folder: benchmarks/results/
left as it was), and its table. Apart from the PyTorch
parts (`test_gpu_benchmark.py`), so that the two run at once on two workers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.benchmarks import COMMON, STUDY_KEYS, digests, gpu_py, render_tables


@pytest.fixture(scope="module")
def jax_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("gpu-dry-run-jax")
    work = (folder / "work").resolve()
    out = work / "results"  # a dry run's default
    before = digests()
    done = gpu_py("--part", "jax", "--device", "cpu", "--tiny", "--work", str(work))
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert digests() == before, "the dry run changed benchmarks/results/"
    assert f"wrote {out / 'gpu-jax.json'}" in done.stdout
    return out, json.loads((out / "gpu-jax.json").read_text())


def test_the_jax_part_runs_the_jax_gpt_study(jax_run: tuple[Path, dict[str, Any]]) -> None:
    data = jax_run[1]
    assert STUDY_KEYS <= set(data)
    assert data["environment"]["versions"]["jax"] and data["spec"] == "studies/gpu-gpt-jax.yaml"
    assert data["best"]["config"]["jit"] in ("on", "off") and data["speedup"] > 0
    assert COMMON <= set(data) and data["part"] == "jax" and data["tiny"] is True
    assert data["status"] == "ok" and data["error"] is None, data["error"]


def test_tables_render_the_jax_result(jax_run: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    text = render_tables(jax_run[0], tmp_path)
    section = text[text.index("### On one GPU") : text.index("<!-- results end -->")]
    assert "#### The JAX gpt study" in section and jax_run[1]["machine"] in section
