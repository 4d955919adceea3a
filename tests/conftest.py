from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

# A study small enough to run end to end in seconds on two CPU cores.
SMALL_SPEC: dict[str, Any] = {
    "name": "small",
    "backend": "pytorch",
    "workload": "builtin:mlp",
    "workload_args": {"features": 32, "hidden": 64, "depth": 2, "samples": 1024},
    "device": "cpu",
    "global_batch": 64,
    "baseline": {"precision": "fp32", "batch_size": 16, "workers": 0, "compile": "none"},
    "space": {"precision": ["fp32", "bf16", "tf32"], "batch_size": [16, 64], "workers": [0], "compile": ["none"]},
    "budget": {"trials": 3},
    "trial": {"warmup_steps": 1, "steps": 3, "windows": 2, "min_window_s": 0.05, "drift_steps": 3, "timeout": 120},
    "sampler": {"name": "tpe", "seed": 0},
}


def write_spec(folder: Path, **changes: Any) -> Path:
    """SMALL_SPEC with `changes`; its best is not re-measured unless `budget` asks for it (the
    tests of re-measurement do), so that trial counts stay those of the search loop."""
    spec = {**SMALL_SPEC, **changes}
    spec["budget"] = {"remeasure_top": 0, **spec["budget"]}
    path = folder / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run_cli(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """The installed command as a user runs it, from `cwd` (where studies/ lands)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "COLUMNS": "200",
    }
    return subprocess.run(
        [sys.executable, "-m", "autotuner", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path
