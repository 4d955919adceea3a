"""Many search processes (workers) on one study, end to end: four searches sharing it run nothing
twice, a locked database makes them wait, a search killed with kill -9 leaves no trial process
and its rerun resumes, workers on other hardware are refused, and `--jobs` starts one worker per
device. Real processes, real storages.

The PostgreSQL tests need AUTOTUNER_TEST_POSTGRES_URL (e.g. postgresql://postgres@127.0.0.1:5432/test):
without it, or with the server unreachable, they are skipped, except where CI is set, where they fail.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from autotuner.config.knobs import config_key
from autotuner.measurement.hardware import core_shares
from autotuner.spec.job import load_spec
from autotuner.study.optuna_adapter import study_id, study_storage
from autotuner.study.storage import open_storage, open_study
from autotuner.workers.multi_gpu import search_on_devices
from tests.support.helpers import OTHER_MACHINE, _stat
from tests.support.studies import (
    ROOT,
    TINY_TRIAL,
    load_study,
    ran,
    run_cli,
    trial_processes,
    write_hang_spec,
    write_spec,
)


def start_cli(*args: str, cwd: Path) -> subprocess.Popen[str]:
    """`autotuner ...` started, not waited for (as `run_cli` runs it)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen(
        [sys.executable, "-m", "autotuner", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_four_workers_share_one_study_without_running_anything_twice(
    tmp_path: Path, storage_url: tuple[str, str]
) -> None:
    url, name = storage_url
    budget = 6
    spec = write_spec(
        tmp_path,
        name=name,
        device="cuda:7",  # every worker is told --device cpu, which wins over the spec
        workload="tests.support.study_workloads:counted_mlp",
        workload_args={"folder": str(tmp_path), "features": 16, "hidden": 32, "depth": 2, "samples": 256},
        global_batch=32,
        baseline={"precision": "fp32", "batch_size": 8, "workers": 0, "compile": "none"},
        space={"precision": ["fp32", "bf16"], "batch_size": [4, 8, 16, 32], "workers": [0], "compile": ["none"]},
        budget={"trials": budget, "remeasure_top": 2, "remeasure_runs": 1},
        trial=TINY_TRIAL,
    )
    command = ["search", "--spec", str(spec), "--storage", url, "--device", "cpu"]
    workers = [start_cli(*command, cwd=tmp_path) for _ in range(4)]
    outputs = [worker.communicate(timeout=600) for worker in workers]
    for worker, (stdout, stderr) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, stdout + stderr
        assert "Traceback" not in stderr, stderr

    study = optuna.load_study(study_name=name, storage=url)
    trials = study.get_trials()
    done = ran(trials)
    assert len(done) == budget, [(t.number, t.state, t.user_attrs) for t in trials]
    keys = [config_key(t.params) for t in done]
    assert len(set(keys)) == len(keys), "a config ran twice"
    assert [t.user_attrs["role"] for t in done].count("baseline") == 1
    # Each config of the top 2 and the baseline re-measured once for the study, by one worker.
    stored = study_storage(study).get_study_system_attrs(study_id(study))
    remeasured = {k: v for k, v in stored.items() if "remeasure:" in k}
    # the best at least (the baseline beside it, unless it is the best); configs further behind than
    # pruning.TRIAL_NOISE are not; the top may change as re-measured figures come in
    assert 1 <= len(remeasured) <= 2 * 2 + 1
    assert all(v["status"] == "done" and len(v["throughputs"]) == 1 for v in remeasured.values()), remeasured
    # The processes that trained: the reference's two runs, once for the study, the trials, and
    # the re-measurement runs: one per config of each group a worker measured together, the
    # baseline beside them in every group.
    groups = {tuple(v["group"]) for v in remeasured.values()}
    assert all(0 in group for group in groups)
    trained = (tmp_path / "trained").read_text().splitlines()
    assert len(trained) == 2 + trial_processes(trials) + sum(len(group) for group in groups)
    assert len(study.user_attrs["reference"]["runs_heldout"]) == 2
    assert study.user_attrs["environment"]["device"] == "cpu"
    for t in trials:
        assert t.state in (TrialState.COMPLETE, TrialState.FAIL, TrialState.WAITING), t
        if t.state is TrialState.FAIL:  # given up without running: another trial had its config
            assert "given_up" in t.user_attrs, t.user_attrs
    export = yaml.safe_load((tmp_path / "runs" / name / "best.yaml").read_text())
    assert export["study"]["trials_ran"] == budget


def test_a_database_locked_by_another_writer_makes_the_workers_wait_not_fail(tmp_path: Path) -> None:
    budget = 3
    spec = write_spec(
        tmp_path,
        name="busy",
        workload="tests.support.study_workloads:counted_mlp",
        workload_args={"folder": str(tmp_path), "features": 16, "hidden": 32, "depth": 2, "samples": 256},
        budget={"trials": budget},
        trial=TINY_TRIAL,
    )
    database = tmp_path / "busy.db"
    command = ["search", "--spec", str(spec), "--storage", f"sqlite:///{database}"]
    workers = [start_cli(*command, cwd=tmp_path) for _ in range(2)]
    deadline = time.monotonic() + 300
    running = 0
    while time.monotonic() < deadline and not running and all(w.poll() is None for w in workers):
        time.sleep(0.2)
        try:
            reader = sqlite3.connect(database, timeout=60)
            running = reader.execute("SELECT count(*) FROM trials WHERE state = 'RUNNING'").fetchone()[0]
            reader.close()
        except sqlite3.OperationalError:  # the tables are not there yet
            continue
    assert running, [w.communicate() for w in workers]
    # Another program (a database browser, a backup) holds the write lock for longer than the 5 s
    # SQLite's driver waits by default.
    lock = sqlite3.connect(database, timeout=60, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    time.sleep(8)
    lock.execute("COMMIT")
    lock.close()
    for worker in workers:
        stdout, stderr = worker.communicate(timeout=600)
        assert worker.returncode == 0, stdout + stderr
        assert "database is locked" not in stdout + stderr and "Traceback" not in stderr
    trials = optuna.load_study(study_name="busy", storage=f"sqlite:///{database}").get_trials()
    done = ran(trials)
    assert len(done) == budget
    assert len({config_key(t.params) for t in done}) == budget
    assert len((tmp_path / "trained").read_text().splitlines()) == 2 + trial_processes(trials)


# ---------------------------------------------------------------- kill -9


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = _stat(int(entry))
            if found is not None:
                tree.setdefault(found[1], []).append(int(entry))
    return tree


def _descendants(pid: int) -> dict[int, str]:
    """Every process below `pid`, with its start time (a reused pid is another process)."""
    tree, found, todo = _children(), {}, [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            stat = _stat(child)
            if stat is not None:
                found[child] = stat[2]
                todo.append(child)
    return found


def _running(pid: int, started: str) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z" and stat[2] == started


def test_kill_9_leaves_no_trial_process_and_the_rerun_resumes(tmp_path: Path) -> None:
    budget = 4
    # Trial 2 (the fifth process that trains) hangs, its loader worker running.
    spec = write_hang_spec(tmp_path, "killed", hang_at=5, workers=1, trials=budget)
    search = start_cli("search", "--spec", str(spec), cwd=tmp_path)
    try:
        deadline = time.monotonic() + 300
        hung, loaders = None, []
        while time.monotonic() < deadline and not loaders:
            assert search.poll() is None, search.communicate()
            time.sleep(0.2)
            hung = next((int(p.name.split("-")[1]) for p in tmp_path.glob("hang-*")), None)
            if hung is not None:
                loaders = [int(p.name.split("-")[2]) for p in tmp_path.glob(f"loader-{hung}-*")]
        assert hung is not None and loaders, f"no trial hung with loader workers: {sorted(os.listdir(tmp_path))}"
        processes = _descendants(search.pid)  # the fork server, the trial, its loader workers, ...
        assert hung in processes and set(loaders) <= set(processes), processes
        study = load_study(tmp_path, "killed")
        (cut,) = study.get_trials(states=(TrialState.RUNNING,))
        finished = {t.number: (t.params, t.values, t.datetime_complete) for t in ran(study.get_trials())}
        assert finished, "no trial finished before the hang"

        search.kill()  # SIGKILL: no handler runs in the search process
        search.communicate()
    finally:
        if search.poll() is None:  # the test failed before the kill: leave nothing running
            leftovers = _descendants(search.pid)
            search.kill()
            search.communicate()
            for pid, started in leftovers.items():
                if _running(pid, started):
                    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_running(pid, started) for pid, started in processes.items()):
        time.sleep(0.1)
    left = {pid: _stat(pid) for pid, started in processes.items() if _running(pid, started)}
    assert not left, f"processes of the killed search still run: {left}"

    again = run_cli("search", "--spec", str(spec), cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    after = {t.number: t for t in study.get_trials()}
    assert {n: (after[n].params, after[n].values, after[n].datetime_complete) for n in finished} == finished
    assert after[cut.number].state is TrialState.FAIL
    assert "died" in after[cut.number].user_attrs["reason"]
    retries = [t for t in after.values() if t.user_attrs.get("retry_of") == cut.number]
    assert len(retries) == 1 and retries[0].params == cut.params and retries[0].state is TrialState.COMPLETE
    assert len(ran(list(after.values()))) == budget
    # Nothing that finished ran again: two reference runs, the trials that ran, and the killed one.
    assert len((tmp_path / "trained").read_text().splitlines()) == 2 + trial_processes(list(after.values())) + 1


def test_workers_on_other_hardware_refuse_to_join_and_run_nothing(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, name="elsewhere")
    url = f"sqlite:///{tmp_path}/elsewhere.db"
    theirs = open_study(open_storage(url), load_spec(spec), OTHER_MACHINE)  # started on another machine
    workers = [start_cli("search", "--spec", str(spec), "--storage", url, cwd=tmp_path) for _ in range(3)]
    for worker in workers:
        stdout, stderr = worker.communicate(timeout=300)
        assert worker.returncode == 2, stdout + stderr
        assert stderr.count("\n") == 1 and "Traceback" not in stderr
        assert f"fingerprint {theirs.user_attrs['fingerprint']}" in stderr and "H100" in stderr
    assert theirs.get_trials() == []
    assert "reference" not in theirs.user_attrs


# ---------------------------------------------------------------- --jobs and --device


def test_jobs_is_refused_without_a_gpu_and_with_device(tmp_path: Path) -> None:
    if os.path.exists("/dev/nvidia0"):
        pytest.skip("this machine has a GPU")
    spec = write_spec(tmp_path)
    done = run_cli("search", "--spec", str(spec), "--jobs", "2", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "--jobs 2" in done.stderr and "no" in done.stderr and "GPU" in done.stderr
    assert not (tmp_path / "runs").exists()
    both = run_cli("search", "--spec", str(spec), "--jobs", "2", "--device", "cpu", cwd=tmp_path)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_workers_started_together_share_the_study_and_relay_their_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `--jobs N` does on a machine with N GPUs, here with two CPU workers."""
    spec = write_spec(
        tmp_path,
        name="pair",
        workload="tests.support.study_workloads:counted_mlp",
        workload_args={"folder": str(tmp_path), "features": 16, "hidden": 32, "depth": 2, "samples": 256},
        trial=TINY_TRIAL,
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    assert search_on_devices(load_spec(spec), ["cpu", "cpu"], ["--trials", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(line.startswith("[cpu] ") for line in lines), lines
    assert sum("best: trial" in line for line in lines) == 2
    trials = load_study(tmp_path, "pair").get_trials()
    assert len(ran(trials)) == 2
    assert len((tmp_path / "trained").read_text().splitlines()) == 2 + trial_processes(trials)
    # each worker's trials ran on its own share of the cores (one of two on a 2-core machine)
    shares = {len(cores) for cores in core_shares(os.sched_getaffinity(0), 2)}
    assert all(t.user_attrs["cpu_cores"] in shares for t in ran(trials)), [t.user_attrs for t in trials]
