"""Many workers on one study: who runs what, and what happens to the work of a worker that died.

Any number of `autotuner search` processes, on one machine or many, may share a study through
its storage. They agree through claims (`autotuner.claims`), never through what one of them
happens to have read:

* the fp32 reference runs once per study: the worker holding the `reference` claim runs it and
  the others wait for it in the storage; a claim whose holder died, failed or ran past its lease
  is taken over;
* a config runs once: after `ask()`, a trial claims its config (`config:<hash>`); a trial that
  loses it to a running or finished trial is given up without running a process (FAIL, with
  `duplicate_of`), and a config whose trial was cut off is taken over by its retry;
* the budget holds for the whole study: before a trial starts a process it claims one of the
  `budget.trials` slots (`slot:<k>`), which is spent for good once that trial completes and
  free again if it is cut off; no slot, no process;
* the re-measurement of a top config runs once per study (`remeasure:<number>`): the worker
  holding the claim runs it and stores the result in it, the others wait for it; a config is
  re-measured only once it holds one of the study's re-measurement slots (`remeasure-slot:<k>`),
  which caps how many are, whichever workers choose them;
* a trial cut off (Ctrl-C, kill -9 of its worker, a lost machine) is failed and its config is
  enqueued again exactly once (`retry:<number>`, the retry carries `retry_of`), unless that
  config has been cut off `MAX_CUT_OFFS` times in a row.

A running trial belongs to a live worker as long as its heartbeat (Optuna's RDB heartbeat,
recorded by the search process, which owns the Optuna trial while a trial process runs it)
is fresh. A worker on the same machine as a trial's owner does not need to wait for the grace
period: it sees at once that the owner process is gone.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import json
import os
import socket
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import optuna
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState

from autotuner.claims import PREFIX, Claims, Held
from autotuner.errors import BackendError
from autotuner.knobs import config_key
from autotuner.optuna_adapter import trial_id
from autotuner.records import GIVEN_UP, stored_reference
from autotuner.results import Reference, Remeasurement
from autotuner.sampler import LIVE, trial_params
from autotuner.study import GRACE_S

OWNER = "autotuner:worker"
"""Trial system attr: the worker (`Worker.as_dict`) that runs the trial."""
SLOT = "autotuner:slot"
"""Trial system attr: the budget slot the trial spent."""
MAX_CUT_OFFS = 3
"""A config cut off this many times in a row (its worker died or was stopped each time) is not
retried again: it may be what kills its worker."""
POLL_S = 1.0
"""How often a waiting worker looks at the storage again."""


def _read(path: str) -> str:
    try:
        with open(path) as file:
            return file.read().strip()
    except OSError:
        return ""


def _process_start(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of a process on this machine, if it exists."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the name in parentheses may hold spaces
    return fields[0], fields[19]


@dataclass(frozen=True)
class Worker:
    """One search process, as other workers can recognise it."""

    token: str
    """Unique to this process: what a claim's holder is compared by."""
    host: str
    boot: str
    """Linux boot id: a rebooted machine has none of its old processes."""
    pid_namespace: str
    """Processes in other pid namespaces (containers) cannot be looked up from here."""
    pid: int
    started: str
    """Start time of the process (clock ticks since boot): a reused pid is another process."""

    @classmethod
    def this(cls) -> Worker:
        pid = os.getpid()
        start = _process_start(pid)
        try:
            namespace = os.readlink("/proc/self/ns/pid")
        except OSError:
            namespace = ""
        return cls(
            token=uuid.uuid4().hex,
            host=socket.gethostname(),
            boot=_read("/proc/sys/kernel/random/boot_id"),
            pid_namespace=namespace,
            pid=pid,
            started=start[1] if start else "",
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@functools.cache
def _this_machine() -> tuple[str, str, str] | None:
    """(host, boot id, pid namespace) of this process, or None where processes cannot be looked up."""
    here = Worker.this()
    return (here.host, here.boot, here.pid_namespace) if here.boot and here.started else None


def alive(owner: Mapping[str, Any]) -> bool | None:
    """Whether the worker `owner` still runs: True or False when it ran on this machine (same
    host, boot and pid namespace), None when that cannot be told from here (then only its
    heartbeat tells)."""
    machine = _this_machine()
    if machine is None or (owner.get("host"), owner.get("boot"), owner.get("pid_namespace")) != machine:
        return None
    found = _process_start(int(owner.get("pid", 0)))
    return found is not None and found[0] != "Z" and found[1] == owner.get("started")


class Heartbeat:
    """Records, every `heartbeat_interval` seconds, that this worker still runs `trial_id`."""

    def __init__(self, storage: RDBStorage, trial_id: int):
        self.storage, self.trial_id = storage, trial_id
        self.interval = storage.get_heartbeat_interval()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{trial_id}", daemon=True)

    def __enter__(self) -> Heartbeat:
        if self.interval:
            self.storage.record_heartbeat(self.trial_id)  # before anything else: a trial is never without one
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _beat(self) -> None:
        assert self.interval
        while not self._stop.wait(self.interval):
            try:
                self.storage.record_heartbeat(self.trial_id)
            except Exception:  # the storage is briefly unreachable: the next beat tries again
                pass


def _cut_offs(trial: FrozenTrial, by_number: Mapping[int, FrozenTrial]) -> int:
    """How many times in a row `trial`'s config was cut off: it, and the trials it retries."""
    count, seen = 1, {trial.number}
    while (previous := by_number.get(trial.user_attrs.get("retry_of", -1))) is not None and previous.number not in seen:
        count, trial = count + 1, previous
        seen.add(trial.number)
    return count


def _digest(params: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config_key(params), default=str).encode()).hexdigest()[:24]


class Coordinator:
    """This worker's side of the agreement between the workers of one study."""

    def __init__(self, study: optuna.Study, storage: RDBStorage, worker: Worker | None = None):
        self.study, self.storage = study, storage
        self.worker = worker or Worker.this()
        self.claims = Claims(storage, storage.get_study_id_from_name(study.study_name))

    # ------------------------------------------------------------ the reference

    def reference(self, run: Callable[[], Reference], lease_s: float, waiting: Callable[[], None]) -> Reference:
        """The study's fp32 reference: stored, or run here by the one worker that claims it (within
        `lease_s` seconds), while the others wait for it (`waiting` is called once if this one does)."""
        seen_running = False
        while True:
            stored = stored_reference(self.study)
            if stored is not None:
                return stored
            mine = {"worker": self.worker.as_dict(), "until": time.time() + lease_s}
            held = self.claims.claim("reference", mine)
            if held is not None:
                theirs = held.value
                if theirs.get("error") and seen_running:
                    raise BackendError(f"the fp32 reference failed on another worker: {theirs['error']}")
                gone = (
                    theirs.get("error")
                    or theirs.get("released")
                    or alive(theirs.get("worker", {})) is False
                    or time.time() > float(theirs.get("until", 0))
                )
                if not gone:
                    if not seen_running:
                        waiting()
                    seen_running = True
                    time.sleep(POLL_S)
                    continue
                if not self.claims.take_over(held, mine):
                    continue
            ours = Held(PREFIX + "reference", json.dumps(mine))
            try:
                reference = run()
            except KeyboardInterrupt:
                self.claims.take_over(ours, {**mine, "released": True})  # another worker may take it at once
                raise
            except Exception as exc:
                self.claims.take_over(ours, {**mine, "error": str(exc)})
                raise
            self.study.set_user_attr("reference", reference.as_dict())
            return reference

    # ------------------------------------------------------------ re-measuring the best

    def remeasure_slots(self, numbers: list[int], slots: int) -> list[int]:
        """Those of trials `numbers` that hold one of the study's `slots` re-measurement slots
        (`remeasure-slot:<k>`, held for good), taking free ones: however many workers choose
        configs to re-measure, and whenever, the study re-measures at most `slots` configs."""
        allowed = []
        for number in numbers:
            for k in range(slots):
                held = self.claims.claim(f"remeasure-slot:{k}", {"trial": number})
                if held is None or held.value.get("trial") == number:
                    allowed.append(number)
                    break
        return allowed

    def remeasure(
        self, numbers: list[int], run: Callable[[list[int]], dict[int, Remeasurement]], lease_s: float
    ) -> None:
        """Re-measure the configs of trials `numbers` once per study: those no other worker has
        claimed are run here (`run` gets their numbers, returns each one's result, and has
        `lease_s` seconds per config before another worker may take them over); those another live
        worker is re-measuring are waited for. A result is stored in the claim
        (`remeasure:<number>`, status `done`), which `autotuner.records.records` reads."""
        todo = list(numbers)
        while todo:
            mine: list[tuple[int, Held, dict[str, Any]]] = []
            others: list[int] = []
            for number in todo:
                until = time.time() + lease_s * len(todo)
                value = {"worker": self.worker.as_dict(), "until": until, "status": "running"}
                held = self.claims.claim(f"remeasure:{number}", value)
                if held is None:
                    mine.append((number, Held(f"{PREFIX}remeasure:{number}", json.dumps(value)), value))
                    continue
                theirs = held.value
                if theirs.get("status") == "done":
                    continue
                gone = (
                    theirs.get("status") == "released"
                    or alive(theirs.get("worker", {})) is False
                    or time.time() > float(theirs.get("until", 0))
                )
                if gone and self.claims.take_over(held, value):
                    mine.append((number, Held(held.key, json.dumps(value)), value))
                else:
                    others.append(number)
            if mine:
                try:
                    results = run([number for number, _, _ in mine])
                except BaseException:
                    for _, held, value in mine:  # another worker may take them at once
                        self.claims.take_over(held, {**value, "status": "released"})
                    raise
                for number, held, value in mine:
                    self.claims.take_over(held, {**value, **results[number].as_dict(), "status": "done"})
            todo = others
            if todo:
                time.sleep(POLL_S)

    # ------------------------------------------------------------ the queue

    def enqueue_baseline(self, params: dict[str, Any]) -> None:
        """Trial 0 is the baseline. Two workers starting together may both enqueue it: the config
        claim lets one of them run."""
        trials = self.study.get_trials(deepcopy=False)
        if not any(t.user_attrs.get("role") == "baseline" for t in trials if t.state in LIVE):
            self.study.enqueue_trial(params, user_attrs={"role": "baseline"})

    def recover(self) -> None:
        """Fail the running trials whose worker is gone, and enqueue every cut-off config again."""
        self._fail_stale_trials()
        self._enqueue_retries()

    def _fail_stale_trials(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)  # no heartbeat for the grace period
        now = datetime.datetime.now()
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            owner = t.system_attrs.get(OWNER)
            if owner is not None:
                if alive(owner) is not False:
                    continue  # alive, or on another machine: its heartbeat decides
                reason = f"its worker (pid {owner.get('pid')} on this machine) died while it ran; it is retried"
            elif t.datetime_start is not None and (now - t.datetime_start).total_seconds() > GRACE_S:
                reason = "no worker has owned it for a long time; it is retried"
            else:
                continue  # just asked for: its worker is about to take it
            try:
                self.storage.set_trial_user_attr(trial_id(t), "reason", reason)
                self.storage.set_trial_state_values(trial_id(t), TrialState.FAIL)
            except optuna.exceptions.UpdateFinishedTrialError:
                pass  # another worker failed it first, or its owner just finished it

    def _enqueue_retries(self) -> None:
        trials = self.study.get_trials(deepcopy=False)
        live = {config_key(trial_params(t)) for t in trials if t.state in LIVE}
        retried = {t.user_attrs.get("retry_of") for t in trials} | {
            int(key.rsplit(":", 1)[1]) for key in self.claims.all("retry:")
        }
        by_number = {t.number: t for t in trials}
        for t in trials:
            if t.state is not TrialState.FAIL or not t.params or GIVEN_UP in t.user_attrs or t.number in retried:
                continue
            if config_key(t.params) in live:
                continue  # the config ran again anyway (proposed afresh)
            if _cut_offs(t, by_number) >= MAX_CUT_OFFS:
                continue  # it takes its worker down with it, or is stopped every time: not again
            if self.claims.claim(f"retry:{t.number}", {"worker": self.worker.token}) is None:
                role = t.user_attrs.get("role", "search")
                self.study.enqueue_trial(dict(t.params), user_attrs={"role": role, "retry_of": t.number})
                live.add(config_key(t.params))

    # ------------------------------------------------------------ one trial

    @contextlib.contextmanager
    def owning(self, trial: optuna.Trial) -> Iterator[None]:
        """Mark `trial` as this worker's and keep its heartbeat while the block runs."""
        self.storage.set_trial_system_attr(trial_id(trial), OWNER, self.worker.as_dict())
        with Heartbeat(self.storage, trial_id(trial)):
            yield

    def _holder(self, trial: optuna.Trial) -> dict[str, Any]:
        return {"trial": trial.number, "trial_id": trial_id(trial), "worker": self.worker.token}

    def _state(self, held: Held) -> TrialState | None:
        trial_id = held.value.get("trial_id")
        try:
            return self.storage.get_trial(int(trial_id)).state if trial_id is not None else None
        except KeyError:
            return None

    def claim_config(self, trial: optuna.Trial) -> int | None:
        """Claim `trial`'s config for it: None when it may run it, else the number of the trial
        (running or finished) that has it."""
        mine = self._holder(trial)
        name = "config:" + _digest(trial.params)
        while True:
            held = self.claims.claim(name, mine)
            if held is None or held.value.get("trial_id") == trial_id(trial):
                return None  # (the second case: this very trial claimed it, e.g. before a retried write)
            if self._state(held) is not TrialState.FAIL:
                return int(held.value.get("trial", -1))
            if self.claims.take_over(held, mine):  # its trial was cut off: this one runs it again
                return None

    def claim_slot(self, trial: optuna.Trial, budget: int) -> int | None:
        """Spend one of the study's `budget` trials on `trial`: its slot, or None when every slot
        is spent or held by a running trial."""
        trials = self.study.get_trials(deepcopy=False)
        held_slots = self.claims.all("slot:")
        mine = self._holder(trial)
        for k in range(self._unslotted(trials), budget):
            held = held_slots.get(f"{PREFIX}slot:{k}")
            if held is None:
                held = self.claims.claim(f"slot:{k}", mine)
                if held is None:
                    break
            if self._state(held) is TrialState.FAIL and self.claims.take_over(held, mine):
                break
        else:
            return None
        self.storage.set_trial_system_attr(trial_id(trial), SLOT, k)
        return k

    def slots_left(self, budget: int) -> bool:
        """Whether a slot of the budget is free now (unclaimed, or held by a cut-off trial)."""
        trials = self.study.get_trials(deepcopy=False)
        states = {t.number: t.state for t in trials}
        held_slots = self.claims.all("slot:")
        for k in range(self._unslotted(trials), budget):
            held = held_slots.get(f"{PREFIX}slot:{k}")
            if held is None or states.get(int(held.value.get("trial", -1))) is TrialState.FAIL:
                return True
        return False

    @staticmethod
    def _unslotted(trials: list[FrozenTrial]) -> int:
        """Trials that ran before budget slots existed (studies made by an older autotuner)."""
        return sum(
            t.state is TrialState.COMPLETE
            and t.user_attrs.get("outcome") != "unsupported"
            and SLOT not in t.system_attrs
            for t in trials
        )
