"""Losing trials stop early: a trial whose first windows show it cannot reach the best feasible
throughput so far stops there, without its other windows and its drift phase, and is stored as
Optuna PRUNED.

The rule (`behind`): after `trial.prune_after` windows, the trial is pruned when even its fastest
window is more than `TRIAL_NOISE` (15%) below the best feasible trial's throughput. That margin is
how far apart two trials of one config came out in `benchmarks/fidelity.py`, the same margin
re-measurement uses to leave out a config that cannot win (`autotuner.results.records.to_remeasure`):
a config pruned by it would not have been re-measured had it run to its end. A fastest window
rather than the median, because the rule must not prune on one slow window.

It is decided inside the trial process, which knows the bound from its request (the search
process reads the best from the study as the trial starts): Optuna's `Trial.report` and
`should_prune` are single-objective only (the study has throughput and drift), and the trial's
windows are timed in another process. The trial is stored through Optuna all the same: its
windows as intermediate values and the state PRUNED, which optuna-dashboard shows; the
sampler (which sees the study as throughput alone, `autotuner.proposals.wrapped_sampler`) ranks pruned
trials by their last window with its worse group. The baseline is never pruned, nor a trial
while other work takes its CPU (`autotuner.measurement.contention`): slowed by it, it would look a loser (the
trial's `prune_held_off` keeps the share it took at each window the rule held off after)."""

from __future__ import annotations

TRIAL_NOISE = 0.15
"""How far below the best a config's trial may come out and still be a contender: two trials of
one config, measured one after another as a search runs them, came out up to 12.8% apart in
`benchmarks/fidelity.py`. A config further behind cannot win."""


def behind(rates: list[float], best: float, after: int) -> str | None:
    """Why a trial whose windows so far ran at `rates` samples/s cannot reach `best`, or None: only
    once `after` windows are measured (never with `after` 0), when even the fastest is more than
    `TRIAL_NOISE` below it."""
    if after <= 0 or len(rates) < after or best <= 0:
        return None
    fastest = max(rates)
    if fastest >= best * (1 - TRIAL_NOISE):
        return None
    return (
        f"its fastest of {len(rates)} windows, {fastest:,.0f}/s, is {1 - fastest / best:.0%} behind the best so far, "
        f"{best:,.0f}/s: more than the {TRIAL_NOISE:.0%} two trials of one config differ by"
    )
