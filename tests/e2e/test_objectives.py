"""The energy objective end to end: a search on a device without an energy counter is refused in
one line, before anything is stored."""

from __future__ import annotations

from pathlib import Path

from tests.support.studies import run_cli, write_spec


def test_the_energy_objective_on_a_device_without_an_energy_counter_is_refused(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, name="cpu-energy", objective={"max_drift": 0.01, "energy": True})
    done = run_cli("search", "--spec", str(spec), cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "objective.energy" in done.stderr and "energy counter" in done.stderr
    assert not (tmp_path / "runs" / "cpu-energy" / "study.db").exists()  # nothing stored
