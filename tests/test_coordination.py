"""Many search processes (workers) on one study, and a search killed with kill -9: real processes, real storages.

The PostgreSQL tests need AUTOTUNER_TEST_POSTGRES_URL (e.g. postgresql://postgres@127.0.0.1:5432/test):
without it, or with the server unreachable, they are skipped, except where CI is set, where they fail.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy
import yaml
from optuna.trial import TrialState

from autotuner.config.knobs import config_key
from autotuner.errors import HardwareMismatch
from autotuner.spec.job import load_spec
from autotuner.study.claims import Claims
from autotuner.study.fingerprint import fingerprint
from autotuner.study.optuna_adapter import study_id, study_storage, trial_id
from autotuner.study.storage import open_storage, open_study
from autotuner.trials.probe import Environment
from autotuner.workers.coordination import BudgetSlots, ConfigClaims, OncePerStudy
from autotuner.workers.multi_gpu import core_shares, search_on_devices
from autotuner.workers.ownership import MAX_CUT_OFFS, OWNER, Recovery, SearchProcess, still_running
from tests.conftest import ROOT, run_cli, write_hang_spec, write_spec

# ---------------------------------------------------------------- storages


def postgres_url() -> str:
    url = os.environ.get("AUTOTUNER_TEST_POSTGRES_URL")
    in_ci = bool(os.environ.get("CI"))
    if not url:
        if in_ci:
            pytest.fail("CI is set but AUTOTUNER_TEST_POSTGRES_URL is not: the PostgreSQL tests must run in CI")
        pytest.skip("AUTOTUNER_TEST_POSTGRES_URL is not set")
    try:
        engine = sqlalchemy.create_engine(url)
        with engine.connect():
            pass
        engine.dispose()
    except Exception as exc:
        message = f"PostgreSQL at {url} is unreachable: {' '.join(str(exc).split())[:200]}"
        if in_ci:
            pytest.fail(message)
        pytest.skip(message)
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def storage_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(storage URL, a study name unique to this test run); the study is deleted afterwards."""
    name = f"workers_{uuid.uuid4().hex[:12]}"
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/shared.db", name
        return
    url = postgres_url()
    try:
        yield url, name
    finally:
        try:
            optuna.delete_study(study_name=name, storage=url)
        except KeyError:
            pass


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


def ran(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    """The trials that ran a process."""
    return [
        t
        for t in trials
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and t.user_attrs["outcome"] != "unsupported"
    ]


# ---------------------------------------------------------------- four workers at once


def trial_processes(trials: list[optuna.trial.FrozenTrial]) -> int:
    """The processes the trials that ran trained in: one each, and one more for a trial measured
    while other work took the CPU (on a busy 2-core machine, the other workers' trials), which is
    run again once the machine is quiet (`autotuner.search.dispatch`)."""
    done = ran(trials)
    return len(done) + sum("contention_first_run" in t.user_attrs for t in done)


TINY_TRIAL = {"warmup_steps": 1, "steps": 2, "windows": 2, "drift_steps": 2, "timeout": 120, "min_window_s": 0}


def test_four_workers_share_one_study_without_running_anything_twice(
    tmp_path: Path, storage_url: tuple[str, str]
) -> None:
    url, name = storage_url
    budget = 6
    spec = write_spec(
        tmp_path,
        name=name,
        device="cuda:7",  # every worker is told --device cpu, which wins over the spec
        workload="tests.study_workloads:counted_mlp",
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
        workload="tests.study_workloads:counted_mlp",
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


def _stat(pid: int) -> tuple[str, int, str] | None:
    """(state, parent pid, start time) of a process, or None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), fields[19]


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
        study = optuna.load_study(study_name="killed", storage=f"sqlite:///{tmp_path}/runs/killed/study.db")
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


# ---------------------------------------------------------------- other hardware

OTHER_MACHINE = Environment(
    backend="pytorch",
    device="cuda:0",
    device_name="NVIDIA H100 80GB HBM3",
    driver="550.54.15",
    versions={"python": "3.11.7", "torch": "2.3.0", "cuda": "12.1", "cudnn": 8902},
    capabilities={"accelerator": True, "bf16": True, "fp16": True, "tf32": True},
)


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


def _open_with(url: str, spec: str, environment: Environment, barrier: Any, results: Any) -> None:
    job = load_spec(spec)
    storage = open_storage(url)
    barrier.wait()
    try:
        open_study(storage, job, environment)
        results.put("joined")
    except HardwareMismatch:
        results.put("refused")


def test_two_machines_creating_one_study_at_once_cannot_both_join(tmp_path: Path) -> None:
    """The study's fingerprint is claimed atomically: of two workers on different hardware that
    create the study at the same moment, exactly one is refused."""
    spec = write_spec(tmp_path, name="race")
    url = f"sqlite:///{tmp_path}/race.db"
    open_storage(url)  # the tables exist; the study does not
    here = dataclasses.replace(OTHER_MACHINE, device_name="another GPU")
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(2), context.Queue()
    workers = [
        context.Process(target=_open_with, args=(url, str(spec), environment, barrier, results))
        for environment in (OTHER_MACHINE, here)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert sorted(results.get(timeout=5) for _ in workers) == ["joined", "refused"]


def test_a_worker_joining_while_the_study_is_being_created_is_not_refused(tmp_path: Path) -> None:
    # The creator has claimed the study's identity and written the first of its attrs when a
    # worker on the same hardware loads it (seen under load): that worker joins, others do not.
    spec = write_spec(tmp_path, name="halfway")
    job = load_spec(spec)
    storage = open_storage(f"sqlite:///{tmp_path}/halfway.db")
    study = optuna.create_study(study_name="halfway", storage=storage, directions=["maximize", "minimize"])
    creator = {
        "fingerprint": fingerprint(OTHER_MACHINE),
        "identity": job.identity(),
        "environment": OTHER_MACHINE.as_dict(),
    }
    assert Claims(storage, study_id(study)).claim("identity", creator) is None
    study.set_user_attr("autotuner", {"identity": job.identity()})
    with pytest.raises(HardwareMismatch):
        open_study(storage, job, dataclasses.replace(OTHER_MACHINE, device_name="another GPU"))
    joined = open_study(storage, job, OTHER_MACHINE)
    assert joined.user_attrs["fingerprint"] == fingerprint(OTHER_MACHINE)


# ---------------------------------------------------------------- claims and the budget, across processes


def _claim(url: str, study_name: str, barrier: Any, results: Any) -> None:
    storage = open_storage(url)
    claims = Claims(storage, storage.get_study_id_from_name(study_name))
    barrier.wait()
    results.put(claims.claim("only-one", {"pid": os.getpid()}) is None)


def _claims(storage: optuna.storages.RDBStorage, study: optuna.Study) -> Claims:
    return Claims(storage, study_id(study))


def _budget_slots(storage: optuna.storages.RDBStorage, study: optuna.Study, budget: int) -> BudgetSlots:
    """The budget slots of `study`, as a new search process claims them."""
    return BudgetSlots(study, storage, _claims(storage, study), SearchProcess.this(), budget)


def _recover(storage: optuna.storages.RDBStorage, study: optuna.Study) -> None:
    """What a new search process does first: fail stale trials, enqueue retries."""
    Recovery(study, storage, _claims(storage, study), SearchProcess.this()).recover()


def _spend(url: str, study_name: str, budget: int, barrier: Any, results: Any) -> None:
    storage = open_storage(url)
    study = optuna.load_study(study_name=study_name, storage=storage)
    slots = _budget_slots(storage, study, budget)
    trial = study.ask()
    barrier.wait()
    results.put((trial.number, slots.claim(trial)))


def test_one_claim_and_the_budget_are_won_by_exactly_as_many_workers_as_allowed(
    storage_url: tuple[str, str],
) -> None:
    url, name = storage_url
    storage = open_storage(url)
    study = optuna.create_study(study_name=name, storage=storage)
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(4), context.Queue()
    racers = [context.Process(target=_claim, args=(url, name, barrier, results)) for _ in range(4)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(120)
    assert sorted(results.get(timeout=5) for _ in racers) == [False, False, False, True]

    barrier = context.Barrier(4)
    spenders = [context.Process(target=_spend, args=(url, name, 2, barrier, results)) for _ in range(4)]
    for spender in spenders:
        spender.start()
    for spender in spenders:
        spender.join(120)
    spent = dict(results.get(timeout=5) for _ in spenders)
    assert sorted(slot for slot in spent.values() if slot is not None) == [0, 1]
    # A trial that held a slot and was cut off frees it, for one later trial only.
    holder = next(number for number, slot in spent.items() if slot == 0)
    storage.set_trial_state_values(trial_id(study.trials[holder]), TrialState.FAIL)
    slots = _budget_slots(storage, study, 2)
    assert slots.claim(study.ask()) == 0
    assert slots.claim(study.ask()) is None


def test_a_worker_handed_a_config_it_ran_itself_gives_it_up(tmp_path: Path) -> None:
    # With four workers, a sampler that finds no fresh config left (the others are running them)
    # proposes one this worker already ran: its claim is this worker's, but not this trial's.
    storage = open_storage(f"sqlite:///{tmp_path}/again.db")
    study = optuna.create_study(study_name="again", storage=storage)
    space = {"x": optuna.distributions.CategoricalDistribution([1, 2])}
    configs = ConfigClaims(storage, _claims(storage, study), SearchProcess.this())
    first = study.ask(space)
    assert configs.claim(first) is None
    assert configs.claim(first) is None  # the same trial claiming again keeps it
    study.tell(first, 1.0)
    study.enqueue_trial(first.params)
    again = study.ask(space)
    assert again.params == first.params
    assert configs.claim(again) == first.number


def test_the_study_re_measures_at_most_its_slots_of_configs_whichever_workers_choose_them(tmp_path: Path) -> None:
    # Two workers that read the study at different times choose different configs to re-measure:
    # the slots are the study's, so together they re-measure no more than it allows.
    url = f"sqlite:///{tmp_path}/slots.db"
    study = optuna.create_study(study_name="slots", storage=open_storage(url))
    one, two = (OncePerStudy(study, _claims(open_storage(url), study), SearchProcess.this()) for _ in range(2))
    assert one.remeasure_slots([4, 7, 9], 3) == [4, 7, 9]
    assert two.remeasure_slots([7, 2, 5], 3) == [7]  # 7 holds a slot already; none is left for 2 or 5
    assert one.remeasure_slots([9, 2], 4) == [9, 2]  # a larger cap: the fourth slot is free
    assert two.remeasure_slots([5], 4) == []


# ---------------------------------------------------------------- stale trials


def _dead_process() -> dict[str, Any]:
    """This machine's worker identity, for a process that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    stat = _stat(child.pid)
    child.wait()
    assert stat is not None
    return {**SearchProcess.this().as_dict(), "pid": child.pid, "started": stat[2]}


def test_a_trial_whose_worker_died_on_this_machine_is_failed_at_once_and_retried_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/stale.db"
    storage = open_storage(url, heartbeat=True)
    study = optuna.create_study(study_name="stale", storage=storage)
    dead, live = study.ask({"x": optuna.distributions.CategoricalDistribution([1, 2])}), study.ask()
    storage.set_trial_system_attr(trial_id(dead), OWNER, _dead_process())
    storage.set_trial_system_attr(trial_id(live), OWNER, SearchProcess.this().as_dict())
    assert still_running(SearchProcess.this().as_dict()) is True
    for _ in range(2):  # two workers recovering one after the other: one retry
        _recover(open_storage(url, heartbeat=True), study)
    trials = study.get_trials()
    assert trials[dead.number].state is TrialState.FAIL and "died" in trials[dead.number].user_attrs["reason"]
    assert trials[live.number].state is TrialState.RUNNING
    (retry,) = [t for t in trials if t.user_attrs.get("retry_of") == dead.number]
    assert retry.state is TrialState.WAITING and retry.system_attrs["fixed_params"] == {"x": dead.params["x"]}


def test_a_config_cut_off_three_times_in_a_row_is_not_retried_again(tmp_path: Path) -> None:
    storage = open_storage(f"sqlite:///{tmp_path}/cut.db", heartbeat=True)
    study = optuna.create_study(study_name="cut", storage=storage)
    space = {"x": optuna.distributions.CategoricalDistribution([1, 2])}
    previous = None
    for cut_offs in range(1, MAX_CUT_OFFS + 1):
        trial = study.ask(space)
        if previous is not None:
            assert trial.params == previous.params and trial.user_attrs["retry_of"] == previous.number
        study.tell(trial, state=TrialState.FAIL)  # cut off: its worker died
        _recover(storage, study)
        waiting = study.get_trials(states=(TrialState.WAITING,))
        assert len(waiting) == (1 if cut_offs < MAX_CUT_OFFS else 0), cut_offs
        previous = trial


def test_a_trial_of_another_machine_is_failed_when_its_heartbeat_stops(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/heartbeat.db"
    open_storage(url)
    # A grace period of one second, so the test need not wait for the real one.
    storage = optuna.storages.RDBStorage(url, heartbeat_interval=1, grace_period=1)
    study = optuna.create_study(study_name="heartbeat", storage=storage)
    trial = study.ask({"x": optuna.distributions.CategoricalDistribution([1, 2])})
    elsewhere = {**SearchProcess.this().as_dict(), "host": "another-machine", "boot": "another-boot"}
    storage.set_trial_system_attr(trial_id(trial), OWNER, elsewhere)
    storage.record_heartbeat(trial_id(trial))
    _recover(storage, study)
    assert study.trials[trial.number].state is TrialState.RUNNING  # its heartbeat is fresh
    time.sleep(2.5)
    _recover(storage, study)
    _recover(storage, study)
    trials = study.get_trials()
    assert trials[trial.number].state is TrialState.FAIL
    assert [t.number for t in trials if t.user_attrs.get("retry_of") == trial.number] == [trial.number + 1]


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
        workload="tests.study_workloads:counted_mlp",
        workload_args={"folder": str(tmp_path), "features": 16, "hidden": 32, "depth": 2, "samples": 256},
        trial=TINY_TRIAL,
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    assert search_on_devices(load_spec(spec), ["cpu", "cpu"], ["--trials", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(line.startswith("[cpu] ") for line in lines), lines
    assert sum("best: trial" in line for line in lines) == 2
    trials = optuna.load_study(study_name="pair", storage=f"sqlite:///{tmp_path}/runs/pair/study.db").get_trials()
    assert len(ran(trials)) == 2
    assert len((tmp_path / "trained").read_text().splitlines()) == 2 + trial_processes(trials)
    # each worker's trials ran on its own share of the cores (one of two on a 2-core machine)
    shares = {len(cores) for cores in core_shares(os.sched_getaffinity(0), 2)}
    assert all(t.user_attrs["cpu_cores"] in shares for t in ran(trials)), [t.user_attrs for t in trials]


def test_workers_get_disjoint_shares_of_the_cores() -> None:
    assert core_shares({0, 1, 2, 3, 4, 5, 6, 7}, 2) == [{0, 1, 2, 3}, {4, 5, 6, 7}]
    assert core_shares({3, 1, 2}, 2) == [{1}, {2, 3}]
    assert core_shares(range(16), 3) == [set(range(0, 5)), set(range(5, 10)), set(range(10, 16))]
    assert core_shares({0}, 2) == [{0}, {0}]  # fewer cores than workers: they share them
