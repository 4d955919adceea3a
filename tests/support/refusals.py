"""Bad input, refused: a valid spec to break one thing of (`VALID`), and what every refusal must
look like (`assert_refused`: exit 2, one line, no traceback, nothing written)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.helpers import SMALL_MLP

VALID: dict[str, Any] = {
    "name": "hostile",
    "backend": "pytorch",
    "workload": "builtin:mlp",
    "workload_args": dict(SMALL_MLP),
    "device": "cpu",
    "global_batch": 8,
    "baseline": {"precision": "fp32", "batch_size": 8, "workers": 0, "compile": "none"},
    "space": {"precision": ["fp32"], "batch_size": [8], "workers": [0], "compile": ["none"]},
    "objective": {"max_drift": 0.01},
    "budget": {"trials": 1},
    "trial": {"warmup_steps": 1, "steps": 2, "windows": 1, "min_window_s": 0, "drift_steps": 1, "timeout": 60},
    "sampler": {"name": "random", "seed": 0},
    "run": {"steps": 100},
    "cost": {"per_hour": 2.5, "currency": "USD"},
    "profile": {"steps": 0, "artifacts": "artifacts"},
}
"""A spec that is valid, and cheap should it ever run: every test below breaks one thing in it."""


def files(folder: Path) -> set[Path]:
    return {p.relative_to(folder) for p in folder.rglob("*")}


def assert_refused(code: int, stdout: str, stderr: str, *fragments: str) -> str:
    """Exit 2, one line on stderr that names the problem, nothing on stdout; returns the line."""
    assert code == 2, (code, stdout, stderr)
    assert stderr.startswith("autotuner: error: "), stderr
    assert stderr.endswith("\n") and stderr.count("\n") == 1 and "\r" not in stderr, stderr
    assert "Traceback" not in stderr, stderr
    assert stdout == "", stdout
    assert len(stderr) < 600, stderr
    for fragment in fragments:
        assert fragment in stderr, (fragment, stderr)
    return stderr
