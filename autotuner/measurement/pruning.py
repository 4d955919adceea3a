"""Losing trials stop early, on the time their steps take: a config that cannot come within
`TRIAL_NOISE` of the best feasible throughput so far costs about what the best costs, not what it
costs itself. It is stopped without its other windows and its drift phase, and stored as Optuna
PRUNED with the bound it missed.

The rule (`Pruner`), with the best so far at `best` samples/s: the floor is `best * (1 -
TRIAL_NOISE)`, and the evidence length `E` is the best's window, the time it needs for a window
of the trial's steps (`steps * samples_per_step / best`, at least `trial.min_window_s`). The
trial's training is cut into stretches, each opened by a synchronization: the warm-up's steps after
its first (which pays for compiling, lazy initialisation and first touches), each calibration
window, each measured window. After every step, a stretch is judged behind

- when it has lasted `E` or longer and its rate so far is below the floor: the steps it has run
  show it, over as long as the best needs for a whole window; or
- when it is a whole measured window whose steps cannot finish at the floor any more (its elapsed
  time is past `steps * samples_per_step / floor`): the window will end behind whatever follows,
  the decision its end would make, made early.

A stretch judged behind is closed there and the next one opens at once, inside the same window. At
its end, a measured window not judged already is behind when its rate is below the floor and
*fast* otherwise, whatever its length; a warm-up or calibration stretch, or the rest of a window,
counts only when it lasted `E`. A step during which the framework compiled (torch.compile,
a CUDA graph recorded, an XLA executable built: the backend's `compilations` counter moved) is no
evidence: its stretch starts again after it. Compiling is a run's fixed cost, which the run-time
figure (`autotuner.results.run_time`) weighs, not its pace.

The trial is pruned as soon as `trial.prune_after` stretches are behind and none was fast: a
config ten times slower than the best is stopped about `prune_after * E` after its warm-up's first
step, one that measured a fast window never is. Its bound is the fastest rate of the stretches
judged behind (`Pruner.bound`, below the floor by construction): what it ran at, at most, where it
was judged, and what the search learns from (`autotuner.proposals`: the move that made it counts
as a loss of that size).

Why it stays sound on a noisy machine: a stretch counts only over as long as the best's own window
(a hiccup of a few milliseconds cannot sink it), two of them must be behind, and a fast one
exempts the trial for good, as the fastest-window rule it extends did; the margin is the spread of
two trials of one config (`TRIAL_NOISE`), the same re-measurement leaves a config out by
(`autotuner.results.records.to_remeasure`). The baseline is never pruned, nor a trial while other
work takes its CPU (`held_off`, `autotuner.measurement.contention`): slowed by it, it would look a
loser. On a GPU the host's clock is what a stretch is timed by between two synchronizations: a
step the host has enqueued has not run faster than the host gave it.

It is decided inside the trial process, which knows the bound from its request (the search reads
the best from the study as the trial starts): Optuna's `Trial.report` and `should_prune` are
single-objective only (the study has throughput and drift), and the trial's steps are timed in
another process. The trial is stored through Optuna all the same: its stretches' rates as
intermediate values and the state PRUNED, which optuna-dashboard shows.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

TRIAL_NOISE = 0.15
"""How far below the best a config's trial may come out and still be a contender: two trials of
one config, measured one after another as a search runs them, came out up to 12.8% apart in
`benchmarks/fidelity.py`. A config further behind cannot win."""

WARM_UP, CALIBRATION, WINDOW = "warm-up", "calibration", "window"
"""The kinds of stretch (`Pruner.begin`)."""


class Stopped(Exception):
    """Raised from inside a timer's step or window (`autotuner.measurement.timing.WindowTimer`):
    the measurement stops there, pruned for `reason`."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class PruneBound:
    """What a search trial is pruned against: the best feasible throughput so far and its rule's
    settings (the request's)."""

    best: float
    """Samples a second of the best feasible trial so far."""
    after: int
    """Stretches judged behind before the trial is pruned (`trial.prune_after`); 0 never prunes."""
    steps: int
    """Optimizer steps of a window (`trial.steps`): with `best`, how long the best's window lasts."""
    min_window_s: float = 0.0
    """The shortest window (`trial.min_window_s`): the best's windows last at least this long."""

    @property
    def floor(self) -> float:
        """The throughput a contender reaches: `TRIAL_NOISE` below the best."""
        return self.best * (1 - TRIAL_NOISE)

    def evidence_s(self, samples_per_step: int) -> float:
        """`E`: the best's window, the time it needs for `steps` steps (`min_window_s` at least)."""
        return max(self.min_window_s, self.steps * samples_per_step / self.best) if self.best > 0 else math.inf


@dataclass
class _Stretch:
    kind: str
    planned: int
    """Steps the stretch is to run (a window's steps; the warm-up's left)."""
    start: float
    taken: int = 0
    compiled: int = 0
    whole: bool = True
    """Whether it began with its window (not after a stretch judged inside the same window)."""


class Pruner:
    """The rule (the module docstring) over one trial's steps, told of them by its timer: `begin`
    when a stretch opens after a synchronization, `stepped` after each step inside it, `ended` when
    its window or warm-up closes. Both of the last two raise `Stopped` once the trial is pruned.

    `compilations`: the framework's count of compilations in this process (a step that moved it is
    no evidence); `held_off`: the share of the CPU other work took, when it took more than a trial
    may lose to it (None otherwise): the trial is not pruned then, and the share is kept in
    `held_off_shares`."""

    def __init__(
        self,
        bound: PruneBound,
        samples_per_step: int,
        *,
        clock: Callable[[], float] = time.perf_counter,
        compilations: Callable[[], int] = lambda: 0,
        held_off: Callable[[], float | None] = lambda: None,
    ):
        self.bound, self.samples = bound, samples_per_step
        self.floor = bound.floor
        self.evidence_s = bound.evidence_s(samples_per_step)
        self._clock, self._compilations = clock, compilations
        self.held_off = held_off
        self.behind: list[float] = []
        """The rates of the stretches judged behind, in order: what the trial is stored with."""
        self.fast = False
        """Whether a stretch came out at the floor or above: such a trial is never pruned."""
        self.held_off_shares: list[float] = []
        self.began: float | None = None
        """When the first stretch opened (the clock's time): what `trained_s` is counted from."""
        self._stretch: _Stretch | None = None

    @property
    def bound_rate(self) -> float | None:
        """The fastest rate of the stretches judged behind: what the trial ran at, at most, where it
        was judged; None before one was."""
        return max(self.behind, default=None)

    def begin(self, kind: str, planned: int) -> None:
        """A stretch of `kind` (`WARM_UP`, `CALIBRATION`, `WINDOW`) opens now, right after a
        synchronization, to run `planned` steps."""
        now = self._clock()
        if self.began is None:
            self.began = now
        self._stretch = _Stretch(kind, planned, now, compiled=self._compilations())

    def stepped(self) -> None:
        """After a step: judge the open stretch (none open: nothing to judge)."""
        stretch = self._stretch
        if stretch is None:
            return
        now = self._clock()
        stretch.taken += 1
        compiled = self._compilations()
        if compiled != stretch.compiled:  # it compiled: no evidence, the stretch starts after it
            self._reopen(stretch, now, compiled)
            return
        elapsed = now - stretch.start
        rate = stretch.taken * self.samples / elapsed if elapsed > 0 else math.inf
        shown = elapsed >= self.evidence_s and rate < self.floor
        certain = stretch.kind == WINDOW and stretch.whole and elapsed * self.floor > stretch.planned * self.samples
        if shown or certain:
            self._reopen(stretch, now, compiled)
            self._judge_behind(rate)

    def ended(self, seconds: float | None = None) -> None:
        """The open stretch's window (or the warm-up) closes, after its synchronization: `seconds`,
        the window's own timing where it has one."""
        stretch, self._stretch = self._stretch, None
        if stretch is None or stretch.taken == 0:
            return
        elapsed = seconds if seconds is not None and stretch.whole else self._clock() - stretch.start
        rate = stretch.taken * self.samples / elapsed if elapsed > 0 else math.inf
        counts = (stretch.kind == WINDOW and stretch.whole) or elapsed >= self.evidence_s
        if not counts:
            return
        if rate >= self.floor:
            self.fast = True
        else:
            self._judge_behind(rate)

    def _reopen(self, stretch: _Stretch, now: float, compiled: int) -> None:
        """The rest of `stretch`'s planned steps as a stretch of its own, from `now`."""
        self._stretch = _Stretch(
            stretch.kind, max(1, stretch.planned - stretch.taken), now, compiled=compiled, whole=False
        )

    def _judge_behind(self, rate: float) -> None:
        self.behind.append(rate)
        if self.fast or self.bound.after <= 0 or len(self.behind) < self.bound.after:
            return
        share = self.held_off()
        if share is not None:
            self.held_off_shares.append(share)
            return
        raise Stopped(self.reason())

    def reason(self) -> str:
        """Why the trial was pruned, with the rule's figures."""
        fastest = self.bound_rate or 0.0
        count = len(self.behind)
        return (
            f"its fastest of {count} stretches judged, {fastest:,.0f}/s, is {1 - fastest / self.bound.best:.0%} behind "
            f"the best so far, {self.bound.best:,.0f}/s: more than the {TRIAL_NOISE:.0%} two trials of one config "
            "differ by"
        )
