"""The console says what autotuner says: what a trial's processes print and warn goes to their own
logs under runs/<name>/logs/, the trial's line says "warned: ..." in a few words, `autotuner logs`
prints the rest, and nothing is left for the resource tracker to complain of at exit."""

from __future__ import annotations

from pathlib import Path

from tests.support.studies import run_cli, write_spec


def test_what_trials_print_goes_to_their_logs_and_the_console_says_they_warned(tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        name="noisy",
        workload="tests.support.study_workloads:noisy_mlp",
        budget={"trials": 2, "remeasure_top": 0},
    )
    # a process of its own: what the trial processes and the resource tracker write reaches its
    # file descriptors, not a test's captured streams
    done = run_cli("search", "--spec", str(spec), cwd=tmp_path, fresh=True)
    assert done.returncode == 0, done.stdout + done.stderr
    shown = done.stdout + done.stderr
    assert "hello from the factory" not in shown and "pass dtype= instead\n" not in shown
    assert "leaked semaphore" not in done.stderr and "resource_tracker" not in done.stderr, done.stderr
    trial_lines = [" ".join(line.split()) for line in done.stdout.split("\n[")[1:]]
    assert trial_lines and all(
        "warned: FutureWarning: a library's deprecation: pass dtype= instead" in line for line in trial_lines
    ), done.stdout
    assert "(autotuner logs 0)" in " ".join(done.stdout.split())

    logs = sorted(p.name.split(".")[0] for p in (tmp_path / "runs" / "noisy" / "logs").glob("*.log"))
    assert {"probe", "reference", "trial-0", "trial-1"} <= set(logs)
    printed = run_cli("logs", "1", "--spec", str(spec), cwd=tmp_path)
    assert printed.returncode == 0 and "hello from the factory" in printed.stdout
    assert "FutureWarning: a library's deprecation" in printed.stdout
    listed = run_cli("logs", "--spec", str(spec), cwd=tmp_path)
    assert listed.returncode == 0 and listed.stdout.split()[0] == "trial-0", listed.stdout
    for name in ("99", "../best"):
        missing = run_cli("logs", name, "--spec", str(spec), cwd=tmp_path)
        assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr
    reported = run_cli("report", "--spec", str(spec), "--format", "md", cwd=tmp_path)
    assert reported.returncode == 0, reported.stderr
    report = (tmp_path / "runs" / "noisy" / "report.md").read_text()
    assert "warned: FutureWarning" in report and "(autotuner logs 1)" in report
