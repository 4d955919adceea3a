"""Trial processes measured together, in lockstep, so that a slow change in the machine's speed (a
shared VM's neighbours, its clock) falls on every one of them alike; and `measure_together`, which
measures the trials whose throughputs are compared that way on a CPU and one after another
elsewhere.

The protocol (its messages are `autotuner.trials.messages`). Every process of a group is alive at once,
and only one of them runs at a time; the launcher (`run_in_lockstep`) reads from each until it
waits for a turn, then gives the turns:

1. Setup. Once it has built its workload, a process that measures reports `Waiting` before its
   warm-up. Each gets its `SetupTurn` in the order given and runs its warm-up and calibration
   while the others wait. With `match_first`, the others' setup turns carry the first one's
   optimizer steps (`SetupTurn.match_steps`), and each of them measures as many windows of its
   own calibrated length as it takes to match them.
2. Rounds. Before each turn of windows a process reports `Waiting` with its steps per window, its
   windows in all and those it has measured. The rounds are as many as the most windows a
   process measures, and every turn is one window: a process with fewer sits out rounds, its
   windows spread evenly over them (`_share`), so every process's windows are spread over the
   same stretch of time and each is measured the same way, after a wait, as the re-measurement's
   are. (A process that ran several windows a turn ran them under a longer stretch of load: in
   `autotuner apply` on a 2-core VM, the quickstart's baseline, five windows a turn, measured
   4,328 and 4,638 samples/s where one a turn measured 5,249 and 5,060.) Every round is in a fresh
   random order (seeded: the same every time), so that no process always follows the same one,
   and each turn (`WindowsTurn`) begins once the group's processes have settled (`_settle`): what
   one started in its turn (data-loader workers refilling their queues) does not run into the
   next one's window. A turn begins with one untimed step (`autotuner.measurement.timing`).
3. Release. After its last window a process reports `Waiting(measuring=False)`; when every one
   has measured its windows, all of them are released together (`Release`) and finish (the drift
   phase) together, so what one does next never runs during another's window.

A process that measures nothing (the reference) runs to its end without waiting. A process that
fails or overruns its turn is left out of the turns, and the others go on; with `match_first`,
once the first has failed there is nothing to match: the others are stopped (`STOPPED`).
"""

from __future__ import annotations

import dataclasses
import multiprocessing.connection
import random
import time
from typing import Any

from autotuner.measurement.telemetry import groups_cpu_seconds
from autotuner.measurement.turns import Release, SetupTurn, Waiting, WindowsTurn
from autotuner.trials.launcher import TrialLauncher, TrialProcess, TrialResult
from autotuner.trials.outcomes import Outcome
from autotuner.trials.request import TrialRequest
from autotuner.trials.trial_output import TrialOutput

STOPPED = "stopped: the trial whose optimizer steps it was to match failed"


def in_lockstep(device: str) -> bool:
    """Whether trials compared on `device` are measured in lockstep (`measure_together`)."""
    return device == "cpu"


def measure_together(
    launcher: TrialLauncher,
    runner: str,
    requests: list[TrialRequest],
    device: str,
    timeout_s: float,
    *,
    match_first: bool = False,
    lockstep: bool | None = None,
    rounds: int = 1,
) -> list[TrialResult[TrialOutput]]:
    """Run trials of `runner` (a backend's runner module) whose throughputs are to be compared,
    each within `timeout_s`. On a CPU, in lockstep (`run_in_lockstep`).
    On a GPU one after another, in the order given: there the device's memory is what processes
    would share, and a config that fits alone might not fit while another one runs. With
    `match_first`, all but the first measure as many windows (of their own calibrated length) as
    it takes to match the first one's optimizer steps, and none of them runs to its end once the
    first has failed. `lockstep` False: one after another on a CPU too. One after another, the
    requests are `rounds` rounds of equal length (re-measurement's runs), each run in a fresh
    random order (seeded: the same every time; `match_first` keeps the first one first), so that
    a device's clock and temperature, which change as it works, favour no config."""
    if in_lockstep(device) if lockstep is None else lockstep:
        return run_in_lockstep(launcher, runner, "run", requests, timeout_s, match_first=match_first)
    results: dict[int, TrialResult[TrialOutput]] = {}
    if match_first:  # the first one first: the others match its optimizer steps
        order = [0, *sequential_order(len(requests) - 1, 1, offset=1)]
    else:
        order = sequential_order(len(requests), rounds)
    for index in order:
        request = requests[index]
        if match_first and results:
            if results[0].outcome is not Outcome.OK:
                results[index] = TrialResult(Outcome.ERROR, STOPPED)
                continue
            first = results[0].output
            assert first is not None and first.throughput is not None  # it measured, and ended ok
            request = dataclasses.replace(request, match_steps=first.throughput.steps * first.throughput.windows)
        results[index] = launcher.call(runner, "run", request, timeout_s)
    return [results[index] for index in range(len(requests))]


def sequential_order(count: int, rounds: int, offset: int = 0) -> list[int]:
    """The order to run `count` requests in, one after another: `rounds` consecutive rounds of
    equal length, each shuffled (seeded), the indices shifted by `offset`."""
    order = random.Random(0)
    size = count // rounds if rounds > 0 and count % rounds == 0 else count
    indices: list[int] = []
    for start in range(0, count, max(size, 1)):
        part = list(range(start + offset, start + offset + min(size, count - start)))
        order.shuffle(part)
        indices += part
    return indices


def run_in_lockstep(
    launcher: TrialLauncher,
    runner: str,
    function: str,
    args: list[Any],
    timeout_s: float,
    *,
    match_first: bool = False,
) -> list[TrialResult]:
    """Run `runner.function(arg, turns=...)` for every arg, each in its own trial process, all
    alive at once and measured in turns, as the protocol above says. `timeout_s` bounds the
    start-up, each turn, and the finish."""
    group = [launcher.start(runner, function, arg, timeout_s, turns=True) for arg in args]
    stopped: list[TrialProcess] = []
    try:
        deadline = time.monotonic() + timeout_s
        for process in group:
            process.read_until_waiting(deadline)
        setup = SetupTurn()
        for process, _ in _measuring(group):  # warm-up and calibration, in the order given
            _settle(_live_groups(group))
            process.run_turn(setup, time.monotonic() + timeout_s)
            first = process.waiting
            if match_first and process is group[0] and first is not None:
                setup = SetupTurn(match_steps=first.steps * first.windows)
        planned = max((waiting.windows for _, waiting in _measuring(group)), default=0)
        order = random.Random(0)
        rounds = 0
        while measuring := _measuring(group):
            if match_first and group[0].ended:
                stopped = [p for p in group if p.waiting is not None]
                break
            rounds += 1
            order.shuffle(measuring)
            for process, waiting in measuring:
                count = _share(waiting.windows, rounds, planned) - waiting.measured
                if count <= 0:
                    continue  # fewer windows than the most: it sits this round out
                _settle(_live_groups(group))
                process.run_turn(WindowsTurn(count), time.monotonic() + timeout_s)
        to_release = [p for p in group if p.waiting is not None and p not in stopped]
        for process in to_release:  # released together: what is left is not measured
            process.send_turn(Release())
        deadline = time.monotonic() + timeout_s
        while pending := [p for p in to_release if not p.ended]:
            ready = multiprocessing.connection.wait([p.receive for p in pending], max(0.0, deadline - time.monotonic()))
            for process in pending:
                if process.receive in ready or not ready:
                    process.read_until_waiting(deadline)
    finally:
        ends = [process.end() for process in group]
    return [TrialResult(Outcome.ERROR, STOPPED) if p in stopped else e for p, e in zip(group, ends, strict=True)]


def _measuring(group: list[TrialProcess]) -> list[tuple[TrialProcess, Waiting]]:
    """The processes of a lockstep group that wait for a measured turn, with what they reported."""
    return [(p, p.waiting) for p in group if p.waiting is not None and p.waiting.measuring]


def _live_groups(group: list[TrialProcess]) -> list[int]:
    """The process groups of the group's processes that have not ended (each leads its own)."""
    return [p.process.pid for p in group if not p.ended and p.process.pid is not None]


def _share(windows: int, rounds: int, planned: int) -> int:
    """How many of a process's `windows` it has measured by the end of round `rounds` of
    `planned`, spread evenly (all of them from the last planned round on)."""
    return windows if rounds >= planned else rounds * windows // planned


SETTLED_S = 0.03
"""The processes of a lockstep group have settled once they used no CPU for this long."""
SETTLE_MOST_S = 1.0
"""The longest a turn waits for them to settle (a loader that never rests must not stall it)."""


def _settle(groups: list[int]) -> None:
    """Wait until the processes of process groups `groups` have used no CPU for `SETTLED_S`, or
    `SETTLE_MOST_S` at most. In a lockstep group, data-loader workers refill their queues after
    their process's window ends, and libgomp's threads spin a while before they sleep: in the next
    process's window, they would slow it, and always the one that follows."""
    start = time.monotonic()
    used, since = groups_cpu_seconds(groups), start
    while (now := time.monotonic()) - start < SETTLE_MOST_S:
        time.sleep(0.005)
        latest = groups_cpu_seconds(groups)
        if latest != used:
            used, since = latest, time.monotonic()
        elif now - since >= SETTLED_S:
            return
