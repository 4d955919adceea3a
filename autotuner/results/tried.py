"""The configs a study has tried, read from its stored trials: which are taken, which an
out-of-memory trial rules out, which trials are feasible.

A config is taken while a trial of it is live: finished, running in another worker, or queued
(`LIVE`); an interrupted (FAIL) trial leaves its config free to run again. An out-of-memory trial
rules out every config that needs at least as much memory, knob by knob, in the order of memory
the backend's knobs declare (`oom_rules_out`, `autotuner.config.knobs.needs_as_much_memory`): out of
memory at micro-batch 512 without activation checkpointing rules out 512 and more without it, not
512 with it; out of memory at 256 with it rules out 256 and more, with or without. A knob that
declares no order must be equal. All of it comes from the storage alone, so workers sharing a
study and a resumed study agree on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from optuna.trial import FrozenTrial, TrialState

from autotuner.config.knobs import COMMON_TABLE, DERIVED, Knob, Params, config_key, needs_as_much_memory
from autotuner.study.names import FIXED_PARAMS, LIVE, OUTCOME, TRIAL_CONSTRAINTS
from autotuner.trials.outcomes import Outcome


def trial_params(trial: FrozenTrial) -> Params:
    """The config a trial runs: its params, or for a trial still waiting in the queue, the params
    it was enqueued with (derived knobs left out, as in sampled params)."""
    if trial.params or trial.state is not TrialState.WAITING:
        return dict(trial.params)
    fixed = trial.system_attrs.get(FIXED_PARAMS) or {}
    return {k: v for k, v in fixed.items() if k not in DERIVED}


def ran_out_of_memory(trial: FrozenTrial) -> bool:
    """A complete trial whose outcome is `oom`."""
    return trial.state is TrialState.COMPLETE and trial.user_attrs.get(OUTCOME) == Outcome.OOM.value


def oom_rules_out(
    params: Params, trials: Sequence[FrozenTrial], knobs: Mapping[str, Knob] = COMMON_TABLE
) -> FrozenTrial | None:
    """The out-of-memory trial that rules `params` out, if any: one whose config `params` needs at
    least as much memory as, knob by knob, by `knobs` (the backend's table; by default the knobs
    every backend has, where only the micro-batch declares an order)."""
    return next((t for t in trials if ran_out_of_memory(t) and needs_as_much_memory(params, t.params, knobs)), None)


def feasible(trial: FrozenTrial) -> bool:
    """A complete trial within every constraint (as `autotuner.results.store.record` stores them, and as
    Optuna's samplers read them)."""
    return (
        trial.state is TrialState.COMPLETE
        and bool(trial.values)
        and all(v <= 0 for v in trial.system_attrs.get(TRIAL_CONSTRAINTS) or ())
    )


def best_feasible(trials: Sequence[FrozenTrial]) -> float | None:
    """The highest throughput a feasible trial measured (the bound a search trial is pruned
    against, `autotuner.measurement.pruning`), or None before any."""
    rates = [float(t.values[0]) for t in trials if feasible(t)]
    return max(rates, default=None)


def pruned_bound(trial: FrozenTrial) -> float | None:
    """A pruned trial's bound: the fastest rate of the stretches its rule judged behind
    (`prune_bound`; for a trial stored before it was kept, its fastest window), which the config's
    throughput is below; None for any other trial, or a pruned one with nothing measured."""
    if trial.state is not TrialState.PRUNED:
        return None
    bound = trial.user_attrs.get("prune_bound")
    if bound is None:
        bound = max(trial.user_attrs.get("throughput_windows") or [0.0])
    return float(bound) if bound and bound > 0 else None


def evidence(trial: FrozenTrial) -> tuple[float, bool] | None:
    """What a trial says of its config's throughput, for the search's ranking of its moves: a
    feasible trial's throughput (False: measured), a pruned one's bound (True: at most that);
    None for any other trial."""
    if feasible(trial):
        return float(trial.values[0]), False
    bound = pruned_bound(trial)
    return (bound, True) if bound is not None else None


class TriedConfigs:
    """The study's configs as one ask sees them, built once: the live ones (`exclude`, the trial
    being asked for, left out) and the out-of-memory trials, whose configs rule out others by the
    order of memory of `knobs` (`oom_rules_out`)."""

    def __init__(
        self, trials: Sequence[FrozenTrial], exclude: int | None = None, knobs: Mapping[str, Knob] = COMMON_TABLE
    ):
        live = (t for t in trials if t.state in LIVE and t.number != exclude)
        self.numbers = {config_key(trial_params(t)): t.number for t in live}
        """Each live config's trial number, by `config_key`."""
        self.ooms = [t for t in trials if ran_out_of_memory(t)]
        self.knobs = knobs

    def fresh(self, params: Params) -> bool:
        """Neither live nor ruled out by an out-of-memory trial: a config worth running."""
        return config_key(params) not in self.numbers and oom_rules_out(params, self.ooms, self.knobs) is None
