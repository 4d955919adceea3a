"""`autotuner apply` end to end on a study searched once: the guide's loop against the export, the
config and the baseline run and compared, and the refusals and warnings of a config tuned for
another job, other hardware or other thread settings. CPU only, real torch."""

from __future__ import annotations

import io
import re
import runpy
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotuner.backends.pytorch.apply import TunedTraining
from autotuner.export.reader import load_config
from autotuner.output.apply_console import print_applied
from autotuner.search.apply_run import apply_config
from autotuner.spec.job import load_spec
from tests.support.studies import ROOT, assert_applied, run_cli, write_spec

# ------------------------------------------------------------------ a real study, its export, the CLI


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, Any]]:
    """A one-trial study (the baseline, after the reference): its folder, spec and export."""
    workdir = tmp_path_factory.mktemp("apply")
    spec = write_spec(workdir, name="applied", budget={"trials": 1})
    done = run_cli("search", "--spec", str(spec), cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    export = workdir / "runs" / "applied" / "best.yaml"
    return workdir, spec, yaml.safe_load(export.read_text())


GUIDE = ROOT / "docs" / "guides" / "apply.md"
GUIDE_SECTION = "## In your own training loop: PyTorch"


@pytest.mark.parametrize("variant", ["exported", "bf16 with a loader worker"])
def test_the_guides_apply_example_runs_against_an_exported_config(
    study: tuple[Path, Path, dict[str, Any]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variant: str,
) -> None:
    guide = GUIDE.read_text()
    assert GUIDE_SECTION in guide
    code = re.search(r"```python\n(.*?)```", guide[guide.index(GUIDE_SECTION) :], re.S)
    assert code is not None
    _, _, export = study
    if variant != "exported":
        export = {**export, "params": {**export["params"], "precision": "bf16", "batch_size": 32, "accumulation": 2}}
        export["params"]["workers"] = 1
    (tmp_path / "runs" / "quickstart").mkdir(parents=True)
    (tmp_path / "runs" / "quickstart" / "best.yaml").write_text(yaml.safe_dump(export))
    (tmp_path / "train.py").write_text(code.group(1))
    monkeypatch.chdir(tmp_path)
    scope = runpy.run_path(str(tmp_path / "train.py"), run_name="__main__")
    tuned = scope["tuned"]
    assert isinstance(tuned, TunedTraining)
    assert tuned.precision == export["params"]["precision"] and tuned.batch_size == export["params"]["batch_size"]
    out = capsys.readouterr().out
    assert "optimizer steps" in out and "loss" in out


def test_apply_runs_the_config_and_prints_both_throughputs(study: tuple[Path, Path, dict[str, Any]]) -> None:
    workdir, spec, export = study
    done = run_cli("apply", "runs/applied/best.yaml", "--spec", str(spec), cwd=workdir)
    assert_applied(done)
    out = done.stdout
    assert f"{export['metrics']['throughput']:,.0f} samples/s in the study" in out
    assert re.search(r"[\d,]+ samples/s here \(spread", out)
    assert re.search(r"ratio \d+\.\d\d", out)
    # The default: 4x the 3 steps x 2 windows a trial measures, 50 steps at least, in windows of
    # (at least) 3 steps lengthened to trial.min_window_s as the study's are.
    ran = re.search(r"ran (\d+) optimizer steps of 64 samples \(17 windows of (\d+)", out)
    assert ran is not None, out
    assert int(ran[1]) == 17 * int(ran[2]) and int(ran[2]) >= 3
    assert "held-out loss after 3 steps" in out and "(identical)" in out  # CPU runs repeat bitwise
    # Then the baseline, over the same optimizer steps (or the first of them, in as long as the
    # config's windows take): the speedup delivered here, beside the export's.
    delivered = re.search(r"speedup: (\d+\.\d\d)x here \(over the baseline (.*?), ([\d,]+) samples/s", out)
    assert delivered is not None, out
    covered = re.search(
        r"run here for (\d+) optimizer steps (?:\(the first of (\d+): its windows capped at the config's time\) )?"
        r"in (\d+) windows of (\d+), in lockstep with it\)",
        out,
    )
    assert covered is not None, out
    # in windows of its own length, as many optimizer steps as the config's or the first of them
    assert int(covered[1]) == int(covered[3]) * int(covered[4])
    if covered[2] is None:
        assert int(covered[1]) - int(covered[4]) < int(ran[1]) <= int(covered[1])
    else:
        assert int(covered[2]) == int(ran[1]) and int(covered[1]) < int(ran[1])
    assert "batch=16x4" in delivered[2] and f"{export['speedup']:.2f}x in the export: ratio" in out
    # the run's time here against the study's prediction for as many optimizer steps: warm-up,
    # calibration and the untimed step of each lockstep turn are steps too
    timed = re.search(r"run time: ([\d,]+) optimizer steps took ([\d.]+) s here, start, build and warm-up", out)
    assert timed is not None, out
    assert int(timed[1].replace(",", "")) > int(ran[1]) + 1  # the warm-up's steps (2) and calibration's
    assert re.search(r"the study predicts [\d.]+ s for as many: ratio \d+\.\d\d", out)
    # the promise check: rounds of the config beside the baseline as the study re-measured them, an interval
    promise = re.search(r"promise: (\d+\.\d\d)x, 90% interval (\d+\.\d\d)-(\d+\.\d\d)x here \((\d+) rounds", out)
    assert promise is not None, out
    assert float(promise[2]) <= float(promise[1]) <= float(promise[3]) and 2 <= int(promise[4]) <= 5
    assert "checking the promise: round 1 of at most 5" in done.stderr
    assert "Traceback" not in done.stderr
    skipped = run_cli(
        "apply", "runs/applied/best.yaml", "--spec", str(spec), "--steps", "6", "--no-baseline", cwd=workdir
    )
    assert skipped.returncode == 0 and "speedup:" not in skipped.stdout, skipped.stdout + skipped.stderr
    # --steps 6: the windows cover 6 optimizer steps, as few as do
    few = re.search(r"ran (\d+) optimizer steps of 64 samples \((\d+) windows of (\d+)", skipped.stdout)
    assert few is not None and int(few[1]) >= 6 > int(few[1]) - int(few[3]), skipped.stdout


def test_a_baseline_bounded_in_time_covers_the_first_steps_and_says_so(
    study: tuple[Path, Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A baseline many times slower than the config would run many times as long: its windows
    # stop at `BASELINE_MOST_S` (here a tenth of a second: two windows of 0.05 s at most).
    workdir, spec, _ = study
    monkeypatch.setattr("autotuner.search.apply_run.BASELINE_MOST_S", 0.1)
    monkeypatch.chdir(workdir)
    run = apply_config(load_config("runs/applied/best.yaml"), load_spec(spec))
    assert run.baseline is not None and run.speedup is not None
    ours, base = run.throughput, run.baseline
    assert base.windows <= 2 < ours.windows and base.steps * base.windows < ours.steps * ours.windows
    out = io.StringIO()
    print_applied(run, out, io.StringIO())
    said = f"run here for {base.steps * base.windows} optimizer steps (the first of {ours.steps * ours.windows}: "
    assert said + "its windows capped at the config's time) in" in out.getvalue(), out.getvalue()


def test_apply_refuses_a_config_from_other_hardware_unless_forced(study: tuple[Path, Path, dict[str, Any]]) -> None:
    workdir, spec, export = study
    other = {**export, "environment": {**export["environment"], "fingerprint": "0123456789abcdef"}}
    (workdir / "other-hardware.best.yaml").write_text(yaml.safe_dump(other))
    refused = run_cli("apply", "other-hardware.best.yaml", "--spec", str(spec), "--steps", "6", cwd=workdir)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert "fingerprint 0123456789abcdef" in refused.stderr and "--force" in refused.stderr
    assert "samples/s" not in refused.stdout
    forced = run_cli("apply", "other-hardware.best.yaml", "--spec", str(spec), "--steps", "6", "--force", cwd=workdir)
    assert_applied(forced)
    assert "samples/s in the study" in forced.stdout
    assert "warning" in forced.stderr and "0123456789abcdef" in forced.stderr


def test_apply_warns_when_its_thread_settings_are_not_the_studys(
    study: tuple[Path, Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The export records the thread settings its trials ran with; a run under others is told."""
    workdir, spec, export = study
    threads = export["environment"]["threads"]
    assert threads["intra_op"] >= 1
    other = "ACTIVE" if threads.get("OMP_WAIT_POLICY") == "PASSIVE" else "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", other)
    args = ("apply", "runs/applied/best.yaml", "--spec", str(spec), "--steps", "6", "--no-baseline")
    done = run_cli(*args, cwd=workdir, fresh=True)  # the settings a new process starts with
    assert done.returncode == 0, done.stdout + done.stderr
    warning = next(line for line in done.stderr.splitlines() if "thread" in line)
    here = warning.split("this run has ", 1)[1]
    assert f"{threads['intra_op']} intra-op" in here and f"OMP_WAIT_POLICY={other}" in here, warning
    assert "on a CPU they change the throughput" in warning


def test_apply_refuses_a_config_tuned_for_another_job(study: tuple[Path, Path, dict[str, Any]]) -> None:
    workdir, spec, export = study
    changed = yaml.safe_load(spec.read_text())
    changed["global_batch"] = 128
    (workdir / "bigger").mkdir()
    bigger = workdir / "bigger" / "applied.yaml"
    bigger.write_text(yaml.safe_dump(changed))
    done = run_cli("apply", "runs/applied/best.yaml", "--spec", str(bigger), cwd=workdir)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "another job" in done.stderr and "spec.identity" in done.stderr
    edited = {**export, "spec": {**export["spec"], "identity": "0000000000000000"}}
    (workdir / "other-job.best.yaml").write_text(yaml.safe_dump(edited))
    done = run_cli("apply", "other-job.best.yaml", "--spec", str(spec), cwd=workdir)
    assert done.returncode == 2 and "identity 0000000000000000" in done.stderr, done.stderr
    shutil.rmtree(workdir / "bigger")
