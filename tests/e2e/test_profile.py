"""The profile of the winner against the baseline: after a search, each runs a few steps under the
framework's profiler; the traces are stored as the study's Optuna artifacts, their top operators
go into the report, and `--no-profile` skips it all."""

from __future__ import annotations

from pathlib import Path

import optuna
import optuna.artifacts
import yaml

from autotuner.measurement.traces import read_trace
from autotuner.results.profiles import stored_profiles
from tests.support.studies import load_study, run_cli, write_spec

PROFILED = {"steps": 2}


def test_the_best_and_the_baseline_are_profiled_and_their_traces_stored(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, profile=PROFILED)
    done = run_cli("search", "--spec", str(spec), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "USDT" not in done.stdout + done.stderr  # the profiler's own lines stay out of the console
    study = load_study(tmp_path, "small")
    best = yaml.safe_load((tmp_path / "runs" / "small" / "best.yaml").read_text())["study"]["trial"]
    profiles = stored_profiles(study)
    roles = {n: p.role for n, p in profiles.items()}
    assert roles == ({0: "baseline", best: "best"} if best != 0 else {0: "baseline"})
    lines = [line for line in done.stdout.splitlines() if line.startswith("profile: ")]
    assert len(lines) == len(profiles) and lines[0].startswith("profile: trial #0 (baseline): 2 steps profiled in ")
    artifacts = tmp_path / "runs" / "small" / "artifacts"
    assert "--artifact-dir runs/small/artifacts" in done.stdout
    metas = {m.artifact_id: m for m in optuna.artifacts.get_all_artifact_meta(study)}
    store = optuna.artifacts.FileSystemArtifactStore(str(artifacts))
    for number, profile in profiles.items():
        assert profile.where == "host" and profile.steps == 2 and profile.total_ms > 0
        assert any(op.name.startswith("aten::") for op in profile.operators)
        assert metas[profile.artifact].filename == f"profile-trial-{number}-{profile.role}.json"
        path = tmp_path / "trace.json"
        optuna.artifacts.download_artifact(artifact_store=store, file_path=str(path), artifact_id=profile.artifact)
        assert any(str(e.get("name", "")).startswith("aten::") for e in read_trace(path))
        path.unlink()
    assert not list((tmp_path / "runs" / "small").glob("profile-*"))  # the trial processes' folders are gone

    report = run_cli("report", "--spec", str(spec), "--format", "md", "-o", str(tmp_path / "r.md"), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "r.md").read_text()
    section = text.split("### Profile: where a step's time goes", 1)[1]
    assert "| operator (self time a step) | baseline #0 (host) |" in section
    assert "profile-trial-0-baseline.json" in section and "| aten::" in section

    again = run_cli("search", "--spec", str(spec), cwd=tmp_path)  # resumed: what is stored is not run again
    assert again.returncode == 0 and len(optuna.artifacts.get_all_artifact_meta(study)) == len(profiles)


def test_no_profile_skips_it(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, profile=PROFILED)
    done = run_cli("search", "--spec", str(spec), "--no-profile", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "profile:" not in done.stdout and "--artifact-dir" not in done.stdout
    assert not stored_profiles(load_study(tmp_path, "small"))
    assert not (tmp_path / "runs" / "small" / "artifacts").exists()


def test_a_jax_study_is_profiled_with_jax_profiler(tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        backend="jax",
        baseline={"precision": "fp32", "batch_size": 16, "workers": 0, "jit": "off"},
        space={"precision": ["fp32"], "batch_size": [64], "workers": [0], "jit": ["on"]},
        budget={"trials": 2},
        profile=PROFILED,
    )
    done = run_cli("search", "--spec", str(spec), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    profiles = stored_profiles(load_study(tmp_path, "small"))
    assert {p.role for p in profiles.values()} == {"baseline", "best"}
    baseline = next(p for p in profiles.values() if p.role == "baseline")
    assert baseline.artifact_name == "profile-trial-0-baseline.json.gz"
    assert any(op.name.startswith("PjitFunction(") for op in baseline.operators)  # op by op: each a dispatch
    # its trace holds the operators without Python's function calls (`$file:line`), as torch's does
    store = optuna.artifacts.FileSystemArtifactStore(str(tmp_path / "runs" / "small" / "artifacts"))
    path = tmp_path / "trace.json.gz"
    optuna.artifacts.download_artifact(artifact_store=store, file_path=str(path), artifact_id=baseline.artifact)
    names = [str(e.get("name", "")) for e in read_trace(path) if e.get("ph") == "X"]
    assert any(name.startswith("PjitFunction(") for name in names)
    assert not any(name.startswith("$") for name in names)
