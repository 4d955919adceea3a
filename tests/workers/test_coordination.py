"""Many search processes (workers) on one study, decided through the storage: the study's identity
claimed once, the claims and the budget won by exactly as many workers as allowed, a config a
worker ran given up, the re-measurement's slots, a dead worker's trial failed and retried once,
and the cores shared between workers. Whole searches sharing a study are
tests/e2e/test_coordination.py's.

The PostgreSQL tests need AUTOTUNER_TEST_POSTGRES_URL (e.g. postgresql://postgres@127.0.0.1:5432/test):
without it, or with the server unreachable, they are skipped, except where CI is set, where they fail.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from autotuner.errors import HardwareMismatch
from autotuner.measurement.hardware import core_shares
from autotuner.spec.job import load_spec
from autotuner.study.claims import Claims
from autotuner.study.fingerprint import fingerprint
from autotuner.study.optuna_adapter import study_id, trial_id
from autotuner.study.storage import open_storage, open_study
from autotuner.trials.probe import Environment
from autotuner.workers.coordination import BudgetSlots, ConfigClaims, OncePerStudy
from autotuner.workers.ownership import MAX_CUT_OFFS, OWNER, Recovery, SearchProcess, still_running
from tests.support.helpers import OTHER_MACHINE, _stat
from tests.support.studies import write_spec

# ---------------------------------------------------------------- storages


# ---------------------------------------------------------------- four workers at once


# ---------------------------------------------------------------- other hardware


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


def _race(racer: Callable[..., None], *args: object, racers: int = 4) -> list[Any]:
    """What `racers` forked processes each put on the queue after `racer(*args, barrier, queue)`
    made them wait for one another at the barrier: workers that start at the same moment."""
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(racers), context.Queue()
    processes = [context.Process(target=racer, args=(*args, barrier, results)) for _ in range(racers)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
    return [results.get(timeout=5) for _ in processes]


def test_one_claim_and_the_budget_are_won_by_exactly_as_many_workers_as_allowed(
    storage_url: tuple[str, str],
) -> None:
    url, name = storage_url
    storage = open_storage(url)
    study = optuna.create_study(study_name=name, storage=storage)
    assert sorted(_race(_claim, url, name)) == [False, False, False, True]

    spent = dict(_race(_spend, url, name, 2))
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


def test_workers_get_disjoint_shares_of_the_cores() -> None:
    assert core_shares({0, 1, 2, 3, 4, 5, 6, 7}, 2) == [{0, 1, 2, 3}, {4, 5, 6, 7}]
    assert core_shares({3, 1, 2}, 2) == [{1}, {2, 3}]
    assert core_shares(range(16), 3) == [set(range(0, 5)), set(range(5, 10)), set(range(10, 16))]
    assert core_shares({0}, 2) == [{0}, {0}]  # fewer cores than workers: they share them


def _warm_start(url: str, study_name: str, barrier: Any, results: Any) -> None:
    from autotuner.search.warm_start import WarmStart, enqueue_warm_start

    storage = open_storage(url)
    study = optuna.load_study(study_name=study_name, storage=storage)
    warm = WarmStart("earlier", [(3, {"x": 1}), (5, {"x": 2})])
    barrier.wait()
    results.put(enqueue_warm_start(study, warm, _claims(storage, study)))


def test_workers_started_together_enqueue_an_earlier_studys_configs_once(storage_url: tuple[str, str]) -> None:
    url, name = storage_url
    study = optuna.create_study(study_name=name, storage=open_storage(url))
    assert sorted(_race(_warm_start, url, name)) == [False, False, False, True]
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert [t.system_attrs["fixed_params"] for t in waiting] == [{"x": 1}, {"x": 2}]
    assert study.user_attrs["warm_start"] == "earlier"
