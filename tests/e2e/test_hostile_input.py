"""Hostile input through the installed command, in a fresh interpreter: one bad spec of each kind
is answered with exit code 2 and one line, and nothing is written. The cases themselves are
tests/spec/test_hostile_input.py's."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support.helpers import FAULTY
from tests.support.refusals import VALID, assert_refused, files
from tests.support.studies import run_cli

"""A spec that is valid, and cheap should it ever run: every test below breaks one thing in it."""
"""Given as --storage to every generated spec: were one valid after all, it could still not
write a database, and its error would name the storage instead of the spec (and fail the test)."""
"""Each key a spec may hold, and a test for the values that are never valid there (the storage
URL and the device are checked later, by the probe and the storage: any string passes here)."""
"""Numbers as YAML text: past every bound, past float, past Python's int-to-text limit."""
"""Ten lines of anchors that stand for 10**9 values."""


# ---------------------------------------------------------------- a handful through a real process


@pytest.mark.parametrize(
    ("content", "fragments"),
    [
        ('name: job\nworkload_args: !!python/object/apply:os.system ["touch pwned"]\n', ["not valid YAML"]),
        ("name: job\nglobal_batch: " + "9" * 5000 + "\n", ["not valid YAML"]),
        (yaml.safe_dump({**VALID, "name": "../escape"}), ["name", "letters, digits"]),
        (yaml.safe_dump({**VALID, "trial": {"timeout": float("inf")}}), ["trial.timeout", "finite"]),
        (yaml.safe_dump({**VALID, "workload": f"{FAULTY}:wrong_return", "workload_args": {}}), ["TorchWorkload"]),
    ],
    ids=["python tag", "huge int", "name escapes", "infinite timeout", "wrong return"],
)
def test_through_the_installed_command(tmp_path: Path, content: str, fragments: list[str]) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(content)
    before = files(tmp_path)
    done = run_cli("search", "--spec", str(spec), cwd=tmp_path, timeout=300)
    assert_refused(done.returncode, done.stdout, done.stderr, str(spec), *fragments)
    assert files(tmp_path) == before
