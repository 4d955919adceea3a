"""The JAX backend's own knobs in a study end to end: a CPU search tries `remat`, `donate` and a
flag bundle, and records what each did. What each value does is tests/backends/test_jax_knobs.py's."""

from __future__ import annotations

from pathlib import Path

import yaml

from autotuner.backends.jax import JAX
from tests.support.helpers import CPU_BUNDLE, TINY_MLP
from tests.support.studies import load_study, run_cli

# ---------------------------------------------------------------- a study over them


def test_a_cpu_study_searches_remat_donate_and_a_flag_bundle(tmp_path: Path) -> None:
    spec = {
        "name": "jax-knobs",
        "backend": "jax",
        "workload": "builtin:mlp",
        "workload_args": TINY_MLP,
        "device": "cpu",
        "global_batch": 8,
        "baseline": {"precision": "fp32", "batch_size": 8, "workers": 0, "jit": "on"},
        "space": {
            "precision": ["fp32"],
            "batch_size": [8],
            "workers": [0],
            "jit": ["on"],
            "remat": ["none", "dots_saveable"],  # full: not searched, the mlp marks no block
            "donate": ["off", "on"],
            "xla_flags": ["default", CPU_BUNDLE],
        },
        "budget": {"trials": 4, "remeasure_top": 0},
        "trial": {
            "warmup_steps": 1,
            "steps": 2,
            "windows": 2,
            "min_window_s": 0.05,
            "drift_steps": 2,
            "timeout": 120,
            "quiet_wait": 0,
        },
        "sampler": {"name": "tpe", "seed": 0},
    }
    path = tmp_path / "jax-knobs.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    done = run_cli("search", "--spec", str(path), "--no-profile", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    export = yaml.safe_load((tmp_path / "runs" / "jax-knobs" / "best.yaml").read_text())
    assert {k: export["baseline"]["params"][k] for k in ("remat", "donate", "xla_flags")} == {
        "remat": "none",
        "donate": "off",
        "xla_flags": "default",
    }
    assert set(export["params"]) == set(JAX.job_knobs(None))  # one device: no param_sharding
    assert export["metrics"]["drift"] < 1e-3  # none of the three changes the numerics beyond rounding
    study = load_study(tmp_path, "jax-knobs")
    tried = [(t.user_attrs["config"], t.user_attrs["outcome"]) for t in study.trials]
    assert len(tried) == 4 and all(outcome in ("ok", "pruned") for _, outcome in tried), tried  # none refused
    assert {config["donate"] for config, _ in tried} == {"off", "on"}  # the guided start tries the recommended
