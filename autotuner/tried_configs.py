"""The configs a study has tried, read from its stored trials: which are taken, which an
out-of-memory trial rules out, which trials are feasible.

A config is taken while a trial of it is live: finished, running in another worker, or queued
(`LIVE`); an interrupted (FAIL) trial leaves its config free to run again. An out-of-memory trial
rules out its config and every larger batch with the other knobs equal (`oom_rules_out`). All of
it comes from the storage alone, so workers sharing a study and a resumed study agree on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from autotuner.knobs import DERIVED, config_key

LIVE = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
"""The states of a trial whose config is taken."""
BATCH = "batch_size"


def trial_params(trial: FrozenTrial) -> dict[str, Any]:
    """The config a trial runs: its params, or for a trial still waiting in the queue, the params
    it was enqueued with (derived knobs left out, as in sampled params)."""
    if trial.params or trial.state is not TrialState.WAITING:
        return dict(trial.params)
    fixed = trial.system_attrs.get("fixed_params") or {}
    return {k: v for k, v in fixed.items() if k not in DERIVED}


def oom_rules_out(params: dict[str, Any], trials: Sequence[FrozenTrial]) -> FrozenTrial | None:
    """The out-of-memory trial that rules `params` out (same other knobs, a batch no larger), if any."""
    others = {k: v for k, v in params.items() if k != BATCH}
    for t in trials:
        if t.state is TrialState.COMPLETE and t.user_attrs.get("outcome") == "oom":
            if (
                t.params.get(BATCH, 0) <= params.get(BATCH, 0)
                and {k: v for k, v in t.params.items() if k != BATCH} == others
            ):
                return t
    return None


def feasible(trial: FrozenTrial) -> bool:
    """A complete trial within every constraint (as `autotuner.recording.record` stores them, and as
    Optuna's samplers read them)."""
    return (
        trial.state is TrialState.COMPLETE
        and bool(trial.values)
        and all(v <= 0 for v in trial.system_attrs.get("constraints") or ())
    )


def best_feasible(trials: Sequence[FrozenTrial]) -> float | None:
    """The highest throughput a feasible trial measured (the bound a search trial is pruned
    against, `autotuner.pruning`), or None before any."""
    rates = [float(t.values[0]) for t in trials if feasible(t)]
    return max(rates, default=None)


class TriedConfigs:
    """The study's configs as one ask sees them, built once: the live ones (`exclude`, the trial
    being asked for, left out) and the out-of-memory trials."""

    def __init__(self, trials: Sequence[FrozenTrial], exclude: int | None = None):
        live = (t for t in trials if t.state in LIVE and t.number != exclude)
        self.numbers = {config_key(trial_params(t)): t.number for t in live}
        """Each live config's trial number, by `config_key`."""
        self.ooms = [t for t in trials if t.state is TrialState.COMPLETE and t.user_attrs.get("outcome") == "oom"]

    def fresh(self, params: dict[str, Any]) -> bool:
        """Neither live nor ruled out by an out-of-memory trial: a config worth running."""
        return config_key(params) not in self.numbers and oom_rules_out(params, self.ooms) is None
