"""The rounds of one batch of re-measured configs (`autotuner.search.remeasure`), as
`autotuner.search.paired_rounds.measure_rounds` runs them: in each, a fresh process of every config
still in contention and one of the baseline, measured together (split into groups the memory
holds, `remeasure_groups`, the baseline in each), each config's speedup over the baseline beside
it; from the second round on, a config whose interval the leader's clears is out
(`autotuner.results.standings.contenders`), and the rounds run until none is left (`settled`) or
`measure_rounds` stops them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from autotuner.output.console import SearchReporter
from autotuner.results.evidence import Remeasurement
from autotuner.results.records import TrialRecord
from autotuner.results.standings import Standing, baseline_standing, contenders, standing
from autotuner.search.paired_rounds import RoundAt, round_speedups
from autotuner.spec.job import Job
from autotuner.trials.launcher import TrialLauncher, TrialResult
from autotuner.trials.lockstep import measure_together
from autotuner.trials.outcomes import Outcome
from autotuner.trials.trial_output import TrialOutput


def calibrated(t: TrialRecord) -> dict[str, Any]:
    """A re-measurement process's window as its config's trial calibrated it (its steps a window,
    no calibration again: half a second a process), where the trial kept it; else nothing (the
    process calibrates)."""
    steps = t.metrics.get("window_steps")
    return {"steps": int(steps), "min_window_s": 0.0} if steps else {}


def settled(alive: bool) -> bool:
    """Whether the rounds stop before the cap: only once no config is left to measure (`alive`
    false). Never on the leader's interval: stopping on the first narrow interval keeps the
    rounds whose spread happened to be small, and the interval then holds less often than its
    level says (`benchmarks/interval_procedure.py`)."""
    return not alive


def remeasure_groups(
    configs: list[TrialRecord], baseline: TrialRecord | None, most: int | None
) -> list[list[TrialRecord]]:
    """The groups of processes one round of a re-measurement measures together, one after
    another: a process of every config and of the baseline. One group when it has at most `most`
    processes (None: no limit); else the configs in parts of `most - 1` with the baseline in each,
    so that every config's speedup is over the baseline's windows measured beside it."""
    in_every_group = [baseline] if baseline is not None else []
    everyone = [*configs, *in_every_group]
    if most is None or len(everyone) <= most:
        return [everyone]
    size = max(1, most - len(in_every_group))
    return [[*configs[k : k + size], *in_every_group] for k in range(0, len(configs), size)]


@dataclass(frozen=True)
class Grouping:
    """How a batch's processes are measured: at most `most` together (None: no limit), in lockstep
    or not, `windows` windows each."""

    most: int | None
    lockstep: bool
    windows: int


@dataclass
class BatchRounds:
    """The rounds of one batch of re-measured configs, as `measure_rounds` runs them (a
    `PairedRound`): each a process of every config still in contention and one of the baseline, on
    `device` through `launcher`, in the groups the memory holds (`grouping`), each config judged
    against the others and those re-measured before (`earlier`). What they measure is each
    config's `Remeasurement` (`found`)."""

    job: Job
    launcher: TrialLauncher
    device: str
    reporter: SearchReporter
    configs: list[TrialRecord]
    baseline: TrialRecord | None
    grouping: Grouping
    earlier: dict[int, Standing]
    found: dict[int, Remeasurement] = field(init=False)
    beside: dict[int, list[float]] = field(init=False)
    """Each config's share of the baseline's windows: those measured in its groups."""
    groups: dict[int, set[int]] = field(init=False)
    alive: list[TrialRecord] = field(init=False)
    """The configs still measured."""
    still: list[int] = field(init=False)
    """The trial numbers still in contention, the leader first (`contenders`)."""
    parts: list[list[TrialRecord]] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        everyone = [*self.configs, *([self.baseline] if self.baseline is not None else [])]
        drift = self.job.spec.budget.remeasure_drift
        self.found = {t.number: Remeasurement(drift=drift) for t in everyone}
        self.beside = {t.number: [] for t in everyone}
        self.groups = {t.number: set() for t in everyone}
        self.alive, self.still = self.configs, [t.number for t in everyone]

    def processes(self) -> int:
        self.parts = remeasure_groups(self.alive, self.baseline, self.grouping.most)
        return sum(len(part) for part in self.parts)

    def measure(self, at: RoundAt) -> bool:
        """One round, in its groups; then the configs whose interval the leader's clears are out
        (`contenders`), and the rounds go on while any is left (`settled`)."""
        alive, baseline, parts = self.alive, self.baseline, self.parts
        what = ", ".join(f"#{t.number}" for t in alive) + (" beside the baseline" if alive and baseline else "")
        how = f" in {len(parts)} groups" if len(parts) > 1 else ""
        with self.reporter.running(
            f"re-measuring {what or 'the baseline'}{how}: {at.progress(self.grouping.windows)}", logged=True
        ):
            for part in parts:
                self._measure_group(part)
        found = self.found
        alive = [t for t in alive if not found[t.number].error]
        standings = dict(self.earlier)
        standings.update({t.number: standing(found[t.number]) for t in alive})
        if baseline is not None and not found[baseline.number].error:
            standings[baseline.number] = baseline_standing(len(found[baseline.number].throughputs))
        self.still = contenders(standings)
        self.alive = [t for t in alive if t.number in self.still]
        return not settled(bool(self.alive))

    def finished(self, t: TrialRecord) -> Remeasurement:
        """`t`'s re-measurement once the rounds are done: with its groups, how they were measured,
        and the baseline's windows beside it (where the baseline's did not fail)."""
        found, baseline = self.found[t.number], self.baseline
        found.group = sorted(self.groups[t.number])
        found.lockstep = self.grouping.lockstep
        if baseline is not None and not self.found[baseline.number].error:
            found.baseline_windows = self.beside[t.number]
        return found

    def _measure_group(self, part: list[TrialRecord]) -> None:
        """One process of each of `part`'s configs, measured together; their runs added to `found`,
        each config's speedup over the baseline beside it (`round_speedups`), and the baseline's
        windows to `beside` of each config measured with it."""
        job, device, found, baseline = self.job, self.device, self.found, self.baseline
        requests = [
            dataclasses.replace(
                job.trial_request(
                    t.config, device, progress=self.reporter.progress, log=job.log_path(f"trial-{t.number}")
                ),
                windows=self.grouping.windows,
                drift=False,  # its trial measured it: the same config, seed and data
                **calibrated(t),
            )
            for t in part
        ]
        timeout_s = job.trial_timeout(*(r.config for r in requests))
        results = measure_together(
            self.launcher, job.backend.runner, requests, device, timeout_s, lockstep=self.grouping.lockstep
        )
        for t, result in zip(part, results, strict=True):
            _add_run(found[t.number], result)
            self.groups[t.number].update(other.number for other in part)
        if baseline is not None and not found[baseline.number].error:
            for t, speedup in zip(part, round_speedups(results), strict=True):  # over the baseline beside it
                if t.number != baseline.number and speedup is not None and not found[t.number].error:
                    found[t.number].speedups.append(speedup)
            measured = found[baseline.number].windows[-1]
            for t in part:  # its windows in this group (the baseline's: its own)
                self.beside[t.number].extend(measured)


def _add_run(remeasurement: Remeasurement, result: TrialResult[TrialOutput]) -> None:
    """Add one re-measurement process's result to its config's `remeasurement`, or its error."""
    if remeasurement.error:
        return
    run = len(remeasurement.throughputs) + 1
    if result.outcome is not Outcome.OK:
        remeasurement.error = f"re-run {run}: {result.outcome.value}: {result.reason}"
        return
    output = result.output
    assert output is not None and output.throughput is not None  # it measured, and ended ok
    remeasurement.throughputs.append(output.throughput.samples_per_s)
    remeasurement.windows.append(output.throughput.window_samples_per_s)
    remeasurement.measured_s.append(output.throughput.measured_s)
