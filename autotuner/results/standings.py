"""Where each re-measured config stands: its speedup so far and its interval (`Standing`), the
configs that can still win (`contenders`), and how many configs the winner's interval is stated
jointly with (`joint_among`).

Re-measurement (`autotuner.search.remeasure`) decides with these after each round; the records
(`autotuner.results.records.remeasurements`) apply `joint_among` to what it stored, so that every
reader states the same intervals.

This module imports no framework and no Optuna.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from autotuner.measurement.interval import Interval, geometric_mean, ratio_interval
from autotuner.results.evidence import Remeasurement


@dataclass(frozen=True)
class Standing:
    """A config's speedup so far in a re-measurement: the geometric mean of its rounds' speedups
    (of its processes' throughputs, without a baseline), and its interval once it has two rounds
    (on its own: the one `contenders` compares)."""

    speedup: float
    interval: Interval | None


def standing(remeasurement: Remeasurement) -> Standing:
    """Where a config's `remeasurement` puts it (`Standing`): by its rounds' speedups; without a
    baseline beside it, by its processes' throughputs the same way."""
    rounds = remeasurement.speedups or remeasurement.throughputs
    return Standing(geometric_mean(rounds), ratio_interval(rounds))


def contenders(standings: Mapping[int, Standing]) -> list[int]:
    """The configs that can still win, leader first: `standings` maps a trial number to its
    `Standing`. A config is out once the leader's interval clears its own
    (`Interval.clears`: the leader's lower end above its upper end); one without an interval yet
    (one round) is never out, since one round says nothing of how far the next one can land."""
    if not standings:
        return []
    leader = max(standings, key=lambda n: (standings[n].speedup, -n))
    lead = standings[leader].interval
    kept = [leader]
    for number, other in sorted(standings.items(), key=lambda item: -item[1].speedup):
        if number == leader:
            continue
        if lead is None or other.interval is None or not lead.clears(other.interval):
            kept.append(number)
    return kept


def baseline_standing(runs: int) -> Standing:
    """The baseline's `Standing` after `runs` rounds: a speedup of 1 by definition, exactly (its
    interval a point, from two rounds on), so a config whose interval lies below 1 is out."""
    return Standing(1.0, Interval(1.0, 1.0, 1.0, runs) if runs >= 2 else None)


def joint_among(remeasurements: Mapping[int, Remeasurement]) -> dict[int, int]:
    """How many intervals each re-measured config's speedup interval is stated jointly with
    (`autotuner.measurement.interval.ratio_interval`'s `among`): the configs still in contention
    once every round is in (`contenders` over their speedups, the winner among them) are stated
    jointly, each with their number, since the winner is the best of them and the best of several
    estimates is biased upwards; every other config on its own (1). Configs without speedups (the
    baseline; any, where the baseline failed) and failed ones take no part."""
    rated = {number: standing(r) for number, r in remeasurements.items() if r.speedups and not r.error}
    still = contenders(rated)
    return {number: (len(still) if number in still else 1) for number in rated}
