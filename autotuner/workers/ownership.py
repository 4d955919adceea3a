"""Who runs a trial, whether that search process still runs, and what becomes of its trial if not.

A running trial belongs to the search process that asked for it: `TrialOwnership` writes that
process's identity (`SearchProcess`) on the trial and records Optuna's RDB heartbeat for it while
a trial process runs it. When the owner is gone (Ctrl-C, kill -9, a lost machine), any search
process of the study notices (`Recovery`): at once on the owner's own machine, where
`still_running` looks its process up, else once the heartbeat is older than the grace period.
The cut-off trial is failed and its config enqueued again exactly once (the `retry:<number>`
claim, `autotuner.study.claims`; the retry carries `retry_of`), unless that config has been cut off
`MAX_CUT_OFFS` times in a row.
"""

from __future__ import annotations

import datetime
import functools
import os
import socket
import threading
import uuid
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import optuna
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState

from autotuner.config.knobs import config_key
from autotuner.results.tried import trial_params
from autotuner.study.claims import Claims
from autotuner.study.names import GIVEN_UP, LIVE, OWNER, RETRY_CLAIM, RETRY_OF, ROLE, SEARCH
from autotuner.study.optuna_adapter import trial_id
from autotuner.study.storage import GRACE_S

"""Trial system attr: the search process (`SearchProcess.as_dict`) that runs the trial."""
MAX_CUT_OFFS = 3
"""A config cut off this many times in a row (its search process died or was stopped each time)
is not retried again: it may be what kills the process."""


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
class SearchProcess:
    """The identity of one `autotuner search` process, as the others sharing its study recognise it."""

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
    def this(cls) -> SearchProcess:
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

    def as_dict(self) -> dict[str, str | int]:
        return asdict(self)


@functools.cache
def _this_machine() -> tuple[str, str, str] | None:
    """(host, boot id, pid namespace) of this process, or None where processes cannot be looked up."""
    here = SearchProcess.this()
    return (here.host, here.boot, here.pid_namespace) if here.boot and here.started else None


def still_running(process: Mapping[str, Any]) -> bool | None:
    """Whether the search process `process` (`SearchProcess.as_dict`) still runs: True or False
    when it ran on this machine (same host, boot and pid namespace), None when that cannot be told
    from here (then only its heartbeat tells)."""
    machine = _this_machine()
    if machine is None or (process.get("host"), process.get("boot"), process.get("pid_namespace")) != machine:
        return None
    found = _process_start(int(process.get("pid", 0)))
    return found is not None and found[0] != "Z" and found[1] == process.get("started")


class TrialOwnership:
    """While the block runs, `trial` is `process`'s: the trial names its owner (`OWNER`), and its
    heartbeat is recorded every `heartbeat_interval` seconds of the storage."""

    def __init__(self, storage: RDBStorage, process: SearchProcess, trial: optuna.Trial):
        self.storage, self.process, self.trial_id = storage, process, trial_id(trial)
        self.interval = storage.get_heartbeat_interval()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{self.trial_id}", daemon=True)

    def __enter__(self) -> TrialOwnership:
        self.storage.set_trial_system_attr(self.trial_id, OWNER, self.process.as_dict())
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
    while (previous := by_number.get(trial.user_attrs.get(RETRY_OF, -1))) is not None and previous.number not in seen:
        count, trial = count + 1, previous
        seen.add(trial.number)
    return count


class Recovery:
    """What any search process of the study does about trials whose owner is gone: fails them,
    and enqueues each cut-off config again, once for the study."""

    def __init__(self, study: optuna.Study, storage: RDBStorage, claims: Claims, process: SearchProcess):
        self.study, self.storage, self.claims, self.process = study, storage, claims, process

    def recover(self) -> None:
        """Fail the running trials whose owner is gone, and enqueue every cut-off config again."""
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
                if still_running(owner) is not False:
                    continue  # running, or on another machine: its heartbeat decides
                reason = f"its worker (pid {owner.get('pid')} on this machine) died while it ran; it is retried"
            elif t.datetime_start is not None and (now - t.datetime_start).total_seconds() > GRACE_S:
                reason = "no worker has owned it for a long time; it is retried"
            else:
                continue  # just asked for: its search process is about to take it
            try:
                self.storage.set_trial_user_attr(trial_id(t), "reason", reason)
                self.storage.set_trial_state_values(trial_id(t), TrialState.FAIL)
            except optuna.exceptions.UpdateFinishedTrialError:
                pass  # another search process failed it first, or its owner just finished it

    def _enqueue_retries(self) -> None:
        trials = self.study.get_trials(deepcopy=False)
        live = {config_key(trial_params(t)) for t in trials if t.state in LIVE}
        retried = {t.user_attrs.get(RETRY_OF) for t in trials} | {
            int(key.rsplit(":", 1)[1]) for key in self.claims.all("retry:")
        }
        by_number = {t.number: t for t in trials}
        for t in trials:
            if t.state is not TrialState.FAIL or not t.params or GIVEN_UP in t.user_attrs or t.number in retried:
                continue
            if config_key(t.params) in live:
                continue  # the config ran again anyway (proposed afresh)
            if _cut_offs(t, by_number) >= MAX_CUT_OFFS:
                continue  # it takes its search process down with it, or is stopped every time: not again
            if self.claims.claim(f"{RETRY_CLAIM}{t.number}", {"worker": self.process.token}) is None:
                role = t.user_attrs.get(ROLE, SEARCH)
                self.study.enqueue_trial(dict(t.params), user_attrs={ROLE: role, RETRY_OF: t.number})
                live.add(config_key(t.params))
