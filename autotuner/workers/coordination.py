"""Many search processes on one study: which of them runs what.

Any number of `autotuner search` processes (the "workers" of the guides), on one machine or many,
may share a study through its storage. They agree through claims (`autotuner.study.claims`), never
through what one of them happens to have read:

* the fp32 reference runs once per study (`OncePerStudy.reference`): the process holding the
  `reference` claim runs it and the others wait for it in the storage; a claim whose holder died,
  failed or ran past its lease is taken over;
* a config runs once (`ConfigClaims`): after `ask()`, a trial claims its config
  (`config:<hash>`); a trial that loses it to a running or finished trial is given up without
  running a process (FAIL, with `duplicate_of`), and a config whose trial was cut off is taken
  over by its retry;
* the budget holds for the whole study (`BudgetSlots`): before a trial starts a process it claims
  one of the `budget.trials` slots (`slot:<k>`), which is spent for good once that trial
  completes and free again if it is cut off; no slot, no process;
* the re-measurement of a top config runs once per study (`OncePerStudy.remeasure`,
  `remeasure:<number>`): the process holding the claim runs it and stores the result in it, the
  others wait for it; a config is re-measured only once it holds one of the study's
  re-measurement slots (`remeasure-slot:<k>`), which caps how many are, whichever processes
  choose them.

Which process owns a running trial, and what becomes of a trial whose owner is gone (failed and
retried once, `retry:<number>`), is `autotuner.workers.ownership`.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import optuna
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState

from autotuner.config.knobs import Params, config_key
from autotuner.errors import BackendError
from autotuner.results.evidence import Reference, Remeasurement
from autotuner.results.records import stored_reference
from autotuner.study.claims import Claims, Held
from autotuner.study.names import (
    BASELINE,
    CLAIM_PREFIX,
    CONFIG_CLAIM,
    LIVE,
    OUTCOME,
    REFERENCE,
    REFERENCE_CLAIM,
    REMEASURE_CLAIM,
    REMEASURE_SLOT_CLAIM,
    ROLE,
    SLOT,
    SLOT_CLAIM,
)
from autotuner.study.optuna_adapter import trial_id
from autotuner.trials.outcomes import Outcome
from autotuner.workers.ownership import SearchProcess, still_running

"""Trial system attr: the budget slot the trial spent."""
POLL_S = 1.0
"""How often a waiting search process looks at the storage again."""


def _lease_expired(value: Mapping[str, object]) -> bool:
    """Whether the holder of a lease (`{"worker": SearchProcess.as_dict(), "until": ...}`) is
    gone from this machine or has run past it."""
    worker, until = value.get("worker", {}), value.get("until", 0)
    gone = still_running(worker if isinstance(worker, Mapping) else {}) is False
    return gone or time.time() > (until if isinstance(until, (int, float)) else 0)


class OncePerStudy:
    """The work done once per study, by whichever search process leases it: the fp32 reference and
    the re-measurement of the top configs. A lease names its holder and runs until a deadline;
    past that, or once the holder is gone, another process takes it over."""

    def __init__(self, study: optuna.Study, claims: Claims, process: SearchProcess):
        self.study, self.claims, self.process = study, claims, process

    def reference(self, run: Callable[[], Reference], lease_s: float, waiting: Callable[[], None]) -> Reference:
        """The study's fp32 reference: stored, or run here by the one process that claims it (within
        `lease_s` seconds), while the others wait for it (`waiting` is called once if this one does)."""
        seen_running = False
        while True:
            stored = stored_reference(self.study)
            if stored is not None:
                return stored
            mine = {"worker": self.process.as_dict(), "until": time.time() + lease_s}
            held = self.claims.claim(REFERENCE_CLAIM, mine)
            if held is not None:
                theirs = held.value
                if theirs.get("error") and seen_running:
                    raise BackendError(f"the fp32 reference failed on another worker: {theirs['error']}")
                if not (theirs.get("error") or theirs.get("released") or _lease_expired(theirs)):
                    if not seen_running:
                        waiting()
                    seen_running = True
                    time.sleep(POLL_S)
                    continue
                if not self.claims.take_over(held, mine):
                    continue
            ours = Held(CLAIM_PREFIX + REFERENCE_CLAIM, json.dumps(mine))
            try:
                reference = run()
            except KeyboardInterrupt:
                self.claims.take_over(ours, {**mine, "released": True})  # another process may take it at once
                raise
            except Exception as exc:
                self.claims.take_over(ours, {**mine, "error": str(exc)})
                raise
            self.study.set_user_attr(REFERENCE, reference.as_dict())
            return reference

    def remeasure_slots(self, numbers: list[int], slots: int) -> list[int]:
        """Those of trials `numbers` that hold one of the study's `slots` re-measurement slots
        (`remeasure-slot:<k>`, held for good), taking free ones: however many processes choose
        configs to re-measure, and whenever, the study re-measures at most `slots` configs."""
        allowed = []
        for number in numbers:
            for k in range(slots):
                held = self.claims.claim(f"{REMEASURE_SLOT_CLAIM}{k}", {"trial": number})
                if held is None or held.value.get("trial") == number:
                    allowed.append(number)
                    break
        return allowed

    def remeasure(
        self, numbers: list[int], run: Callable[[list[int]], dict[int, Remeasurement]], lease_s: float
    ) -> None:
        """Re-measure the configs of trials `numbers` once per study: those no other process has
        claimed are run here (`run` gets their numbers, returns each one's result, and has
        `lease_s` seconds per config before another process may take them over); those another
        live process is re-measuring are waited for. A result is stored in the claim
        (`remeasure:<number>`, status `done`), which `autotuner.results.records.records` reads."""
        todo = list(numbers)
        while todo:
            mine: list[tuple[int, Held, dict[str, object]]] = []
            others: list[int] = []
            for number in todo:
                until = time.time() + lease_s * len(todo)
                value = {"worker": self.process.as_dict(), "until": until, "status": "running"}
                held = self.claims.claim(f"{REMEASURE_CLAIM}{number}", value)
                if held is None:
                    mine.append((number, Held(f"{CLAIM_PREFIX}{REMEASURE_CLAIM}{number}", json.dumps(value)), value))
                    continue
                theirs = held.value
                if theirs.get("status") == "done":
                    continue
                gone = theirs.get("status") == "released" or _lease_expired(theirs)
                if gone and self.claims.take_over(held, value):
                    mine.append((number, Held(held.key, json.dumps(value)), value))
                else:
                    others.append(number)
            if mine:
                try:
                    results = run([number for number, _, _ in mine])
                except BaseException:
                    for _, held, value in mine:  # another process may take them at once
                        self.claims.take_over(held, {**value, "status": "released"})
                    raise
                for number, held, value in mine:
                    self.claims.take_over(held, {**value, **results[number].as_dict(), "status": "done"})
            todo = others
            if todo:
                time.sleep(POLL_S)


def _digest(params: Mapping[str, Any]) -> str:
    """The `<hash>` in a config's claim name: the same for one config in every process and run."""
    return hashlib.sha256(json.dumps(config_key(params), default=str).encode()).hexdigest()[:24]


def _holder(trial: optuna.Trial, process: SearchProcess) -> dict[str, object]:
    """The value of a claim a trial holds (its config, its budget slot)."""
    return {"trial": trial.number, "trial_id": trial_id(trial), "worker": process.token}


def _holder_trial(storage: RDBStorage, held: Held) -> FrozenTrial | None:
    """The trial holding `held`, None when it names none the storage has."""
    holder_id = held.value.get("trial_id")
    try:
        return storage.get_trial(holder_id) if isinstance(holder_id, int) else None
    except KeyError:
        return None


def _holder_state(storage: RDBStorage, held: Held) -> TrialState | None:
    """The state of the trial holding `held`, None when it names none the storage has."""
    holder = _holder_trial(storage, held)
    return holder.state if holder is not None else None


class ConfigClaims:
    """A config runs once per study: the trial that claims it (`config:<hash>`) runs it, unless
    that trial is cut off, when its retry takes the claim over."""

    def __init__(self, storage: RDBStorage, claims: Claims, process: SearchProcess):
        self.storage, self.claims, self.process = storage, claims, process

    def claim(self, trial: optuna.Trial) -> int | None:
        """Claim `trial`'s config for it: None when it may run it, else the number of the trial
        (running or finished) that has it."""
        mine = _holder(trial, self.process)
        name = CONFIG_CLAIM + _digest(trial.params)
        while True:
            held = self.claims.claim(name, mine)
            if held is None or held.value.get("trial_id") == trial_id(trial):
                return None  # (the second case: this very trial claimed it, e.g. before a retried write)
            if _holder_state(self.storage, held) is not TrialState.FAIL:
                return held.integer("trial")
            if self.claims.take_over(held, mine):  # its trial was cut off: this one runs it again
                return None


def _gave_slot_back(trial: FrozenTrial) -> bool:
    """Whether a trial holding a budget slot gave it back: it was cut off (FAIL), or its process
    found the config unsupported (`autotuner.trials.outcomes.Unsupported`), which the budget does not
    count, as it counts no unsupported config."""
    return trial.state is TrialState.FAIL or (
        trial.state is TrialState.COMPLETE and trial.user_attrs.get(OUTCOME) == Outcome.UNSUPPORTED.value
    )


class BudgetSlots:
    """The study's `budget` trials, as slots (`slot:<k>`) a trial claims before it starts a
    process: spent for good once that trial completes, free again if it is cut off or its
    process found the config unsupported."""

    def __init__(self, study: optuna.Study, storage: RDBStorage, claims: Claims, process: SearchProcess, budget: int):
        self.study, self.storage, self.claims, self.process = study, storage, claims, process
        self.budget = budget

    def claim(self, trial: optuna.Trial) -> int | None:
        """Spend one of the budget's trials on `trial`: its slot, or None when every slot is spent
        or held by a running trial."""
        trials = self.study.get_trials(deepcopy=False)
        held_slots = self.claims.all(SLOT_CLAIM)
        mine = _holder(trial, self.process)
        for k in range(_unslotted(trials), self.budget):
            held = held_slots.get(f"{CLAIM_PREFIX}{SLOT_CLAIM}{k}")
            if held is None:
                held = self.claims.claim(f"{SLOT_CLAIM}{k}", mine)
                if held is None:
                    break
            holder = _holder_trial(self.storage, held)
            if holder is not None and _gave_slot_back(holder) and self.claims.take_over(held, mine):
                break
        else:
            return None
        self.storage.set_trial_system_attr(trial_id(trial), SLOT, k)
        return k

    def any_free(self) -> bool:
        """Whether a slot of the budget is free now (unclaimed, or held by a cut-off trial)."""
        trials = self.study.get_trials(deepcopy=False)
        released = {t.number for t in trials if _gave_slot_back(t)}
        held_slots = self.claims.all(SLOT_CLAIM)
        for k in range(_unslotted(trials), self.budget):
            held = held_slots.get(f"{CLAIM_PREFIX}{SLOT_CLAIM}{k}")
            if held is None or held.integer("trial") in released:
                return True
        return False


def _unslotted(trials: list[FrozenTrial]) -> int:
    """Trials that ran before budget slots existed (studies made by an older autotuner)."""
    return sum(
        t.state is TrialState.COMPLETE
        and t.user_attrs.get(OUTCOME) != Outcome.UNSUPPORTED.value
        and SLOT not in t.system_attrs
        for t in trials
    )


def enqueue_baseline(study: optuna.Study, params: Params) -> None:
    """Trial 0 is the baseline. Two search processes starting together may both enqueue it: the
    config claim lets one of them run."""
    trials = study.get_trials(deepcopy=False)
    if not any(t.user_attrs.get(ROLE) == BASELINE for t in trials if t.state in LIVE):
        study.enqueue_trial(params, user_attrs={ROLE: BASELINE})
