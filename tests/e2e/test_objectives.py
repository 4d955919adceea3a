"""The optional third objective, energy per sample: the study it makes, what each trial gives it,
and its refusal on a device without an energy counter. The NVML side runs only on a GPU; what
the study does with the figure is checked here from a trial result as a GPU trial returns it."""

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
