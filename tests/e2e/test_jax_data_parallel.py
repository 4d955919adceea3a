"""A JAX study of a data-parallel job (`processes: 2`: one trial process over two host devices),
end to end through the CLI as a user runs it: the search over `param_sharding`, the export that
carries the processes and the way, and `autotuner apply` of the winner over the same two devices.
What a data-parallel trial does is tests/backends/test_jax_data_parallel.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.studies import JAX_SPEC, TINY_TRIAL, _write, assert_applied, load_study, ran, run_cli

DP_SPEC: dict[str, Any] = {
    **JAX_SPEC,
    "name": "jax-dp",
    "processes": 2,
    "baseline": {"precision": "fp32", "batch_size": 8, "workers": 0, "jit": "on"},
    "space": {
        "precision": ["fp32"],
        "batch_size": [4, 8],
        "workers": [0],
        "jit": ["on"],
        "remat": ["none"],
        "donate": ["off"],
        "xla_flags": ["default"],
        "param_sharding": ["replicated", "sharded"],
    },
    "budget": {"trials": 4, "remeasure_top": 0},
    "trial": {**TINY_TRIAL, "quiet_wait": 0, "prune_after": 0},
    "profile": {"steps": 0},
    "sampler": {"name": "random", "seed": 0},
}


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    workdir = tmp_path_factory.mktemp("jax-dp")
    spec = _write(workdir, DP_SPEC)
    done = run_cli("search", "--spec", str(spec), cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    return workdir, spec, done.stdout


def test_a_data_parallel_jax_study_searches_param_sharding_and_exports_its_devices(
    study: tuple[Path, Path, str],
) -> None:
    workdir, _, stdout = study
    assert "data_parallel" in stdout.splitlines()[0]
    trials = ran(load_study(workdir, "jax-dp").trials)
    assert len(trials) == 4 and all(t.user_attrs["outcome"] == "ok" for t in trials)
    assert {t.user_attrs["config"]["param_sharding"] for t in trials} == {"replicated", "sharded"}
    for trial in trials:  # every config keeps the global batch over the two devices
        config = trial.user_attrs["config"]
        assert config["batch_size"] * config["accumulation"] * 2 == DP_SPEC["global_batch"]
    export = yaml.safe_load((workdir / "runs" / "jax-dp" / "best.yaml").read_text())
    assert export["spec"]["processes"] == 2 and export["spec"]["parallel"] == "data_parallel"
    assert "param_sharding" in export["params"]
    assert export["metrics"]["drift"] < 1e-4  # jit and sharding against the strict fp32 reference: rounding only


def test_apply_runs_the_winner_over_the_same_two_devices(study: tuple[Path, Path, str]) -> None:
    workdir, spec, _ = study
    done = run_cli("apply", "runs/jax-dp/best.yaml", "--rounds", "2", "--spec", str(spec), "--steps", "4", cwd=workdir)
    assert_applied(done)
    assert "samples/s here" in done.stdout and "held-out loss after 2 steps" in done.stdout
