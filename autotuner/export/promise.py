"""`autotuner apply`: running a job with an exported config, and checking the export's promise.

`apply_config` checks that the config was tuned for this job and this hardware
(`autotuner.export.reader`), runs the job with it for N optimizer steps in a trial process, with the
export's baseline beside it, measured as the study measures; then it measures the speedup the way
the study's re-measurement did, in rounds of a fresh process of each beside the other, and states
it with its interval (`autotuner.measurement.interval`); `print_applied` sets the throughput and
the speedup it got next to the study's, says whether the promise was kept (the interval here within
the export's, widened by a tolerance: `judge`), and warns where they part.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import IO, TYPE_CHECKING

from autotuner.config.knobs import BATCH_SIZE, Config
from autotuner.errors import BackendError, HardwareMismatch, SpecError
from autotuner.export.reader import TunedConfig, job_mismatch, machine_mismatch
from autotuner.measurement.interval import (
    DRIFT,
    LEVEL,
    Interval,
    geometric_mean,
    log_interval,
    stated_interval,
)
from autotuner.measurement.rounds import ProcessCost, TimeBudget, windows_that_fit
from autotuner.measurement.timing import Throughput
from autotuner.output.formatting import format_config, percent, speedup_with_interval, times
from autotuner.results.run_time import predicted_run_s
from autotuner.study.fingerprint import thread_mismatch
from autotuner.trials.probe import Environment
from autotuner.trials.trial_output import Latency, OutputDrift

if TYPE_CHECKING:
    from autotuner.spec.job import Job
    from autotuner.trials.launcher import TrialLauncher
    from autotuner.trials.request import TrialRequest

AGREEMENT = 0.10
"""An applied throughput this far from the study's (relative) gets a warning."""
SLOWDOWN = 0.2
"""`autotuner apply` warns when the last quarter of the config's windows ran this much slower than
the first (medians): beyond the window-to-window noise of a busy machine."""
PROMISE = 0.05
"""Without intervals to compare (an export whose re-measurement ran one round), the speedup
`autotuner apply` delivers is within this of the export's (relative), or it warns."""
TOLERANCE = 0.10
"""`autotuner apply --tolerance`'s default: the promise is kept when the speedup here lies within
the export's interval widened by 10% either way, at the check's level (`Promised`, `judge`): what
an interval measured in one session cannot hold, a machine whose speed moved since (on a 2-core
VM, two sessions half an hour apart saw one speedup 8.5% apart)."""


class Verdict(str, Enum):
    """What `autotuner apply` says of the export's promise, and its exit code (`EXIT_CODES`)."""

    KEPT = "kept"
    NOT_KEPT = "not kept"
    UNDECIDED = "undecided"


EXIT_CODES = {Verdict.KEPT: 0, Verdict.NOT_KEPT: 1, Verdict.UNDECIDED: 3}
"""`autotuner apply`'s exit code for each verdict (2 is a bad input's); 0 where nothing was checked."""
EARLY_SHARE = 0.2
"""The share of the promise check's error (1 - LEVEL) spent on its looks before the last
(`look_level`)."""


def look_level(rounds: int, most: int, level: float = LEVEL) -> float:
    """The level the promise check judges at after `rounds` rounds of at most `most`. It looks
    after every round from the second and stops at the first that decides; each look can decide
    wrongly, and a wrong verdict needs that look's interval to miss, so the error 1 - `level` is
    spread over the looks (Bonferroni), whichever one the check stops at: `EARLY_SHARE` of it in
    equal parts over the looks before the last (rounds 2 to most - 1), the rest on the last. A
    check of two rounds at most looks once, at `level`. With five rounds: 99.3% at rounds 2 to 4,
    92% at the fifth: an early look decides only what is plain (a config twice as slow as
    promised), the last one is nearly as narrow as a single look's."""
    error = 1 - level
    early = most - 2
    if early <= 0:
        return level
    return 1 - (EARLY_SHARE * error / early if rounds < most else (1 - EARLY_SHARE) * error)


@dataclass(frozen=True)
class Promised:
    """The speedups the export's promise allows: its interval (its speedup alone where its
    re-measurement ran one round) widened by `tolerance` either way, for what an interval cannot
    hold (a machine that moved since)."""

    low: float
    high: float
    tolerance: float

    @classmethod
    def of(cls, export: Interval | None, export_speedup: float | None, tolerance: float) -> Promised | None:
        """None where the export states no speedup."""
        if export is not None:
            low, high = export.low, export.high
        elif export_speedup:
            low = high = export_speedup
        else:
            return None
        return cls(low / (1 + tolerance), high * (1 + tolerance), tolerance)

    def text(self) -> str:
        return f"{self.low:.2f}-{self.high:.2f}x"


def judge(here: Interval, promised: Promised) -> Verdict:
    """The promise's verdict from `here`, the interval of the speedup the check measured: kept when
    it lies within what was `promised`, not kept when it lies wholly outside, undecided otherwise
    (the rounds cannot yet tell). Where the speedup here is within the export's interval, a "not
    kept" needs `here` to miss it, and where it is beyond the tolerance, a "kept" does: either is
    as rare as the check's level says."""
    if promised.low <= here.low and here.high <= promised.high:
        return Verdict.KEPT
    if here.high < promised.low or here.low > promised.high:
        return Verdict.NOT_KEPT
    return Verdict.UNDECIDED


def session_drift(export: Interval | None) -> float:
    """The session's drift the promise check's own interval allows for: the export's interval's
    (the study's `budget.remeasure_drift`), or `DRIFT` where the export has no interval."""
    return export.drift if export is not None else DRIFT


def checked_interval(rounds: Sequence[float], export: Interval | None, level: float = LEVEL) -> Interval | None:
    """The speedup of the promise check's `rounds` with its `level` interval, allowing for the
    session's drift as the export's did (`stated_interval`, `session_drift`); None with fewer than
    two rounds."""
    return stated_interval(rounds, level, drift=session_drift(export))


def verdict_at(rounds: Sequence[float], export: Interval | None, promised: Promised, most: int) -> Verdict:
    """The promise check's verdict at its look after `rounds` (of at most `most`): `judge` of their
    interval at that look's level (`look_level`); undecided before two rounds."""
    here = checked_interval(rounds, export, look_level(len(rounds), most))
    return Verdict.UNDECIDED if here is None else judge(here, promised)


def first_decision(rounds: Sequence[float], export: Interval | None, promised: Promised, most: int) -> Verdict:
    """What the promise check says of `rounds` measured one after another: the verdict of the first
    look that decides (`verdict_at`, from the second round on), else undecided."""
    for n in range(2, len(rounds) + 1):
        if (verdict := verdict_at(rounds[:n], export, promised, most)) is not Verdict.UNDECIDED:
            return verdict
    return Verdict.UNDECIDED


def rounds_to_decide(
    rounds: Sequence[float], export: Interval | None, promised: Promised, most: int = 100
) -> int | None:
    """About how many rounds would decide the promise, were they to go on as `rounds` went (their
    geometric mean and log spread): the fewest, up to `most`, whose interval `judge` would call
    kept or not kept at the check's last look; None if none would (the speedup here at the edge of
    what was promised, within the session's drift)."""
    if len(rounds) < 2:
        return None
    logs = [math.log(r) for r in rounds]
    mean, spread = statistics.fmean(logs), statistics.stdev(logs)
    drift = session_drift(export)
    for n in range(len(rounds) + 1, most + 1):  # a check of n rounds at most, judged at its last look
        if judge(log_interval(mean, spread, n, look_level(n, n), drift=drift), promised) is not Verdict.UNDECIDED:
            return n
    return None


MIN_APPLY_STEPS = 50
BASELINE_MOST_S = 180.0
"""The baseline's windows in `autotuner apply` last at most this long, and at most as long as the
config's are expected to (`baseline_most_s`): matching the optimizer steps of a config many times
faster would take many times the config's run (the JAX quickstart's winner, jit, against its
op-by-op baseline at 0.45 s a step: an apply of over 9 minutes)."""


@dataclass(frozen=True)
class AppliedRun:
    """What running a job with a tuned config gave, next to what the study measured."""

    tuned: TunedConfig
    config: Config
    """The config as run (accumulation derived from this job's global batch)."""
    environment: Environment
    throughput: Throughput
    """Its median, spread, windows, warm-up."""
    heldout_loss: float | None
    drift_steps: int
    wall_s: float
    baseline: Throughput | None = None
    """The export's baseline config, run here over as many optimizer steps (or as many as its
    windows cover in `baseline_most_s`) and measured the same way, in windows of its own length,
    so that the speedup delivered is a ratio taken on this machine now."""
    lockstep: bool = False
    """The baseline was measured in lockstep with the config (else after it)."""
    setup_s: float = 0.0
    """The config's trial process from its start to its warm-up: the workload built, the config applied."""
    start_s: float = 0.0
    """The framework's start here (the environment's `framework_start_s`, `autotuner.results.run_time`)."""
    compile_cache: str | None = None
    """`cold`, `warm` or `partial`: the compile cache as the config's warm-up found it (None: nothing compiled)."""
    rounds: tuple[float, ...] = ()
    """The promise check's rounds: each a fresh process of the config beside one of the baseline,
    measured as the study's re-measurement measures a round; the config's median window over the
    baseline's (`promise_rounds`)."""
    rounds_error: str | None = None
    """Why a round failed, ending the check early (what it measured before is kept)."""
    latency: Latency | None = None
    """An inference config's latency of a batch here (`task: inference`)."""
    output_drift: OutputDrift | None = None
    """An inference config's outputs here against the model's in strict fp32 (`task: inference`)."""
    latency_limit_ms: float | None = None
    """The job's `objective.max_latency_ms`, which the p99 here is held to (`task: inference`)."""
    warned: str | None = None
    """What the run's processes wrote (`autotuner.trials.launcher.warning_summary`), in `log`."""
    log: str | None = None
    tolerance: float = TOLERANCE
    """How far the speedup here may be from the export's, as a factor either way, for the promise
    to be kept (`judge`)."""
    most_rounds: int = 2
    """The most rounds the promise check could run (`promise_rounds`'s `most`): where its looks'
    levels come from (`look_level`)."""

    @property
    def within_latency_limit(self) -> bool | None:
        """Whether the p99 latency of a call here is within the job's limit; None without either."""
        if self.latency is None or self.latency_limit_ms is None:
            return None
        return self.latency.p99_ms <= self.latency_limit_ms

    @property
    def run_s(self) -> float:
        """What the config's optimizer steps here (`throughput.steps_taken`) took, the framework's
        start, set-up and warm-up included, waits for the baseline's turns left out: a run of
        that many steps."""
        return self.start_s + self.setup_s + self.throughput.trained_s

    @property
    def predicted_run_s(self) -> float | None:
        """What the study predicts for a run of as many steps (`autotuner.results.run_time`), from the
        export's framework start, set-up, warm-up and throughput."""
        if self.tuned.throughput <= 0 or self.throughput.steps_taken <= 0:
            return None
        steps = self.throughput.steps_taken
        start_s = self.tuned.machine.framework_start_s or 0.0
        return predicted_run_s(
            self.tuned.metrics, self.tuned.throughput, self.throughput.samples_per_step, steps, start_s
        )

    @property
    def samples_per_s(self) -> float:
        return self.throughput.samples_per_s

    @property
    def ratio(self) -> float:
        """Applied over study throughput (medians)."""
        return self.samples_per_s / self.tuned.throughput

    @property
    def agrees(self) -> bool:
        return abs(self.ratio - 1.0) <= AGREEMENT

    @property
    def speedup(self) -> float | None:
        """The tuned config's throughput over the baseline's, both run here."""
        return self.samples_per_s / self.baseline.samples_per_s if self.baseline else None

    @property
    def promise_ratio(self) -> float | None:
        """The speedup delivered here over the one in the export."""
        return self.speedup / self.tuned.speedup if self.speedup and self.tuned.speedup else None

    @property
    def quarters(self) -> tuple[float, float] | None:
        """The config's median throughput over the first and over the last quarter of its windows,
        or None with fewer than 12 windows."""
        rates = self.throughput.window_samples_per_s
        quarter = len(rates) // 4
        if quarter < 3:
            return None
        return statistics.median(rates[:quarter]), statistics.median(rates[-quarter:])

    @property
    def slowdown(self) -> float | None:
        """How much slower the last quarter of the config's windows ran than the first (negative
        when faster), or None with fewer than 12 windows."""
        return None if self.quarters is None else 1.0 - self.quarters[1] / self.quarters[0]

    @property
    def interval(self) -> Interval | None:
        """The speedup here and its interval, from the promise check's rounds (two or more), a
        session's drift allowed for as in the study's (`stated_interval`, `session_drift`)."""
        return stated_interval(self.rounds, drift=session_drift(self.tuned.speedup_interval))

    @property
    def checked_speedup(self) -> float | None:
        """The promise check's speedup: the geometric mean of its rounds (the interval's estimate)."""
        return geometric_mean(self.rounds) if self.rounds else None

    @property
    def checked(self) -> Interval | None:
        """The speedup here with its interval at the level of the look the check stopped at
        (`checked_interval`): what `judge` judged."""
        level = look_level(len(self.rounds), self.most_rounds)
        return checked_interval(self.rounds, self.tuned.speedup_interval, level)

    @property
    def promised(self) -> Promised | None:
        """What the export promised, widened by the tolerance (`Promised`)."""
        return Promised.of(self.tuned.speedup_interval, self.tuned.speedup, self.tolerance)

    @property
    def verdict(self) -> Verdict | None:
        """Whether the promise check kept the export's promise (`judge`); None where it did not run
        (no baseline here, fewer than two rounds, or an export without a speedup)."""
        checked, promised = self.checked, self.promised
        return None if checked is None or promised is None else judge(checked, promised)

    @property
    def rounds_to_decide(self) -> int | None:
        """About how many rounds an undecided check would need (`rounds_to_decide`)."""
        promised = self.promised
        return None if promised is None else rounds_to_decide(self.rounds, self.tuned.speedup_interval, promised)

    @property
    def keeps_promise(self) -> bool | None:
        """Without a `verdict` (no promise check's rounds to judge): whether the whole run's speedup
        is within `PROMISE` of the export's; None where nothing can tell (no baseline run)."""
        ratio = self.promise_ratio
        return None if ratio is None else abs(ratio - 1.0) <= PROMISE


def default_steps(job: Job) -> int:
    """4x the optimizer steps a trial of the study measures (`trial.steps` x `trial.windows`), at
    least 50: windows enough for a median and for `slowdown` (12 at least). Like the trial's, each
    window is lengthened to last `trial.min_window_s`."""
    return max(MIN_APPLY_STEPS, 4 * job.spec.trial.steps * job.spec.trial.windows)


def baseline_most_s(tuned: TunedConfig, job: Job, steps: int, windows: int) -> float:
    """How long the baseline's windows may last beside the config's: as long as the config's
    `windows` of `steps` steps are expected to (at the export's throughput, each `trial.min_window_s`
    at least), `BASELINE_MOST_S` at most, so the run takes about twice the config's."""
    if tuned.throughput <= 0:
        return BASELINE_MOST_S
    window_s = max(job.spec.trial.min_window_s, steps * job.spec.global_batch / tuned.throughput)
    return min(BASELINE_MOST_S, windows * window_s)


def apply_config(
    tuned: TunedConfig,
    job: Job,
    *,
    steps: int | None = None,
    device: str | None = None,
    force: bool = False,
    baseline: bool = True,
    tolerance: float = TOLERANCE,
    rounds: int | None = None,
    warn: Callable[[str], None] = lambda text: print(f"autotuner: warning: {text}", file=sys.stderr),
    note: Callable[[str], None] = lambda text: None,
) -> AppliedRun:
    """Run `job` with `tuned` in a trial process, from a cold compile cache as a real run starts,
    measured as a trial is: warm-up, then windows as long as the study's (each lengthened to
    `trial.min_window_s` by the same calibration), their median and spread: as many windows as
    cover `steps` optimizer steps, or by default as many as `default_steps` fill at `trial.steps`
    a window (so at least 4x a trial's windows, enough for the median and for `slowdown`). With
    `baseline`, the export's baseline config runs over as many optimizer steps (its windows for as
    long as the config's at most, `baseline_most_s`), so the speedup delivered can be set beside
    the export's: on a CPU in lockstep with the config (turn by turn,
    `autotuner.trials.lockstep.measure_together`), elsewhere after it; then the promise check's
    rounds (`promise_rounds`) until they decide the promise within `tolerance` (`judge`, each look
    at its `look_level`), at most `rounds` of them (`check_rounds`), each round's progress told to `note`. A
    config tuned for another job or other hardware is refused unless `force`."""
    from autotuner.trials.lockstep import in_lockstep, measure_together
    from autotuner.trials.outcomes import Outcome

    launcher = job.backend.launcher(job.spec.trial.max_memory_mb, job.workload_path())
    environment, config = _checked(tuned, job, launcher, device or job.spec.device, force, warn)
    requests, timeout = _requests(tuned, job, config, environment.device, steps, baseline)
    # A compile cache of their own, empty: the warm-up is a real run's, whatever the study compiled.
    with tempfile.TemporaryDirectory(prefix="autotuner-apply-") as cold_cache:
        requests = [dataclasses.replace(r, compile_cache=cold_cache) for r in requests]
        results = measure_together(
            launcher, job.backend.runner, requests, environment.device, timeout, match_first=True
        )
        for what, result in zip(("config", "baseline config"), results, strict=False):
            if result.outcome is not Outcome.OK:
                raise BackendError(f"the {what} failed on this machine: {result.outcome}: {result.reason}")

        most = check_rounds(job, rounds)

        promised = Promised.of(tuned.speedup_interval, tuned.speedup, tolerance)

        def decided(speedups: list[float]) -> bool:
            return promised is not None and verdict_at(speedups, tuned.speedup_interval, promised, most) is not (
                Verdict.UNDECIDED
            )

        checked, rounds_error = (
            promise_rounds(
                job,
                launcher,
                [r.config for r in requests],
                environment.device,
                cold_cache,
                note,
                measured=[r.output.throughput for r in results if r.output and r.output.throughput],
                seconds=max(r.wall_s for r in results),
                decided=decided,
                most=most,
            )
            if len(requests) > 1
            else ([], None)
        )
    result = results[0]
    output = result.output
    assert output is not None and output.throughput is not None  # it measured, and ended ok
    base = results[1].output if len(results) > 1 else None
    return AppliedRun(
        tuned=tuned,
        config=config,
        environment=environment,
        throughput=output.throughput,
        heldout_loss=output.losses.heldout,
        drift_steps=job.spec.trial.drift_steps,
        wall_s=result.wall_s,
        baseline=base.throughput if base is not None else None,
        lockstep=base is not None and in_lockstep(environment.device),
        setup_s=output.setup_s or 0.0,
        start_s=environment.framework_start_s or 0.0,
        compile_cache=output.compile_cache,
        latency=output.latency,
        output_drift=output.output_drift,
        latency_limit_ms=job.spec.objective.max_latency_ms,
        warned=result.warned,
        log=result.log,
        rounds=tuple(checked),
        rounds_error=rounds_error,
        tolerance=tolerance,
        most_rounds=most,
    )


def check_rounds(job: Job, most: int | None) -> int:
    """The most rounds the promise check runs: `most` (`autotuner apply --rounds`), by default
    `budget.remeasure_runs`; two at least (one gives no interval)."""
    return max(2, most or job.spec.budget.remeasure_runs)


def promise_rounds(
    job: Job,
    launcher: TrialLauncher,
    configs: list[Config],
    device: str,
    compile_cache: str,
    note: Callable[[str], None],
    *,
    measured: list[Throughput] | None = None,
    seconds: float | None = None,
    decided: Callable[[list[float]], bool] | None = None,
    most: int | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[list[float], str | None]:
    """The speedup of `configs[0]` over `configs[1]` (the export's baseline), measured the way the
    study's re-measurement measures a round (`autotuner.search.remeasure`): a fresh trial process
    of each, together (in lockstep on a CPU), the round's speedup the config's median window over
    the baseline's. From the second round on, the rounds stop once `decided` says the rounds so far
    decide the promise (`judge`, at the look's level, `look_level`); without it, with `seconds`,
    from the third on only while the next round fits in them. At most `check_rounds(job, most)`
    rounds. With `seconds`, each process measures as many windows as let three rounds fit in
    them (`autotuner.measurement.rounds`, `budget.remeasure_windows` at most). `measured`: the
    configs' throughputs as the run before measured them, whose windows (their steps) and costs
    the rounds take. Each round's speedup, and why a round failed (None: none did)."""
    from autotuner.trials.lockstep import measure_together
    from autotuner.trials.outcomes import Outcome

    budget = job.spec.budget
    allowance = TimeBudget(seconds) if seconds is not None else None
    costs = [ProcessCost(t.warmup_s, t.measured_s / max(1, t.windows)) for t in measured or []]
    windows = windows_that_fit(costs, seconds, budget.remeasure_windows) if costs else budget.remeasure_windows
    requests = []
    for index, config in enumerate(configs):
        request = dataclasses.replace(
            job.trial_request(config, device, log=job.log_path("apply")),
            windows=windows,
            drift=False,
            compile_cache=compile_cache,
        )
        if measured and index < len(measured):  # the window the run calibrated: no calibration again
            request = dataclasses.replace(request, steps=measured[index].steps, min_window_s=0.0)
        requests.append(request)
    timeout = job.trial_timeout(*configs)
    most = check_rounds(job, most)
    speedups: list[float] = []
    last_s = None
    for number in range(1, most + 1):
        timed_out = allowance is not None and last_s is not None and number > 2 and not allowance.holds(last_s)
        if decided is None and timed_out:
            break
        left = f", {allowance.left:.0f} s left" if allowance is not None else ""
        note(
            f"checking the promise: round {number} of at most {most}, the config beside the baseline, "
            f"{windows} windows a process{left}"
        )
        began = clock()
        results = measure_together(launcher, job.backend.runner, requests, device, timeout)
        last_s = clock() - began
        if allowance is not None:
            allowance.spent += last_s
        failed = next((r for r in results if r.outcome is not Outcome.OK), None)
        if failed is not None:
            return speedups, f"round {number}: {failed.outcome.value}: {failed.reason}"
        ours, base = (r.output.throughput.samples_per_s for r in results if r.output and r.output.throughput)
        speedups.append(ours / base)  # both ended ok, so both measured
        if decided is not None and len(speedups) >= 2 and decided(speedups):
            break
    return speedups, None


def _checked(
    tuned: TunedConfig, job: Job, launcher: TrialLauncher, device: str, force: bool, warn: Callable[[str], None]
) -> tuple[Environment, Config]:
    """The machine `device` is (probed as the search probes it) and the config `tuned` makes of
    `job`, once nothing refuses them: another backend, another job or other hardware (unless
    `force`, then a warning), a micro-batch that does not divide the job's global batch, a config
    the machine cannot run. Other thread settings than the study's are a warning."""
    from autotuner.study.storage import check_trial_limits  # it imports Optuna: only here

    if tuned.backend != job.backend.name:
        raise SpecError(
            f"the config is for the {tuned.backend} backend, the job for {job.backend.name}",
            source=tuned.source,
            key="environment.backend",
        )
    other_job = job_mismatch(tuned, job)
    if other_job and not force:
        raise SpecError(f"{other_job}. Use --force to run it anyway", source=tuned.source, key="spec.identity")
    environment = job.probe(launcher, device)
    check_trial_limits(job, environment)
    other_machine = machine_mismatch(tuned, environment)
    if other_machine and not force:
        raise HardwareMismatch(f"{tuned.source}: {other_machine}. Use --force to run it anyway")
    for problem in filter(None, (other_job, other_machine)):
        warn(f"{tuned.source}: {problem} (--force)")
    other_threads = thread_mismatch(tuned.machine, environment)
    if other_threads:
        warn(f"{tuned.source}: {other_threads}: on a CPU they change the throughput")
    batch = tuned.params[BATCH_SIZE.name]
    if job.rank_batch % batch:
        raise SpecError(
            f"batch_size {batch} does not divide the job's global_batch per rank ({job.rank_batch})",
            source=tuned.source,
            key="params.batch_size",
        )
    config = job.complete(tuned.params)
    unsupported = job.backend.unsupported_reason(config, job.backend.capabilities(environment.capabilities))
    if unsupported:
        raise SpecError(f"this machine cannot run it: {unsupported}", source=tuned.source, key="params")
    return environment, config


def _requests(
    tuned: TunedConfig, job: Job, config: Config, device: str, steps: int | None, baseline: bool
) -> tuple[list[TrialRequest], float]:
    """The config's request (and the baseline's, with `baseline` and a baseline in the export) and
    the timeout they run under: as many times a trial's as the run has times a trial's steps."""
    settings = job.spec.trial
    total = steps or default_steps(job)
    per_window = min(settings.steps, total)
    windows = math.ceil(total / per_window)
    request = dataclasses.replace(
        job.trial_request(config, device, log=job.log_path("apply")),
        steps=per_window,
        windows=windows,
        # `steps` asked: as many windows as cover them; by default, as many windows as that many
        # steps would fill at the study's window length, each lengthened as the study's are
        match_steps=steps or 0,
    )
    requests = [request]
    base_params = tuned.baseline.get("params")
    if baseline and base_params and tuned.speedup:
        # As many optimizer steps as the config's: a job's step can get slower as it trains (e.g.
        # Adam's moments of weights whose gradient is zero decay into subnormal floats, slow on
        # Intel CPUs), so both runs cover the same stretch of training. In windows of its own
        # calibrated length, as the study measured it: a median over windows of another length
        # is another estimate (longer windows keep more of a busy machine's stalls in them).
        most_s = baseline_most_s(tuned, job, per_window, windows)
        requests.append(dataclasses.replace(request, config=dict(job.complete(base_params)), match_most_s=most_s))
    timeout = job.trial_timeout(*(r.config for r in requests)) * max(
        1.0, per_window * windows / (settings.steps * settings.windows)
    )
    return requests, timeout


def _rounds_text(run: AppliedRun) -> str:
    count = len(run.rounds)
    return (
        f"{count} round{'s' if count > 1 else ''} of the config beside the baseline, each a fresh process of both, "
        "measured as the study re-measured them"
    )


def print_applied(run: AppliedRun, out: IO[str] | None = None, err: IO[str] | None = None) -> None:
    """What running the config here gave, next to the study's: its throughput, the speedup over
    the baseline beside it, the promise's verdict, the run time, a served config's latency and
    drift, the held-out loss; warnings where they part."""
    out, err = out or sys.stdout, err or sys.stderr
    for line in _run_lines(run):
        print(line, file=out)
    if (promise := _promise_line(run)) is not None:
        print(promise, file=out)
    if run.warned:
        print(f"the run's output (warned: {run.warned}) is in {run.log}", file=out)
    if run.rounds_error:
        print(f"autotuner: warning: the promise check stopped early: {run.rounds_error}", file=err)
    if (predicted := run.predicted_run_s) is not None:
        print(
            f"run time: {run.throughput.steps_taken:,} optimizer steps took {run.run_s:.1f} s here, start, build "
            f"and warm-up included (compile cache {run.compile_cache or 'unused'}); the study predicts "
            f"{predicted:.1f} s for as many: ratio {run.run_s / predicted:.2f}",
            file=out,
        )
    _print_served(run, out, err)
    study_loss = run.tuned.metrics.get("heldout_loss")
    if run.heldout_loss is not None and isinstance(study_loss, (int, float)) and study_loss:
        gap = abs(run.heldout_loss - study_loss) / abs(study_loss)
        print(
            f"held-out loss after {run.drift_steps} steps: {run.heldout_loss:.6g} here, {study_loss:.6g} in the study "
            f"({'identical' if gap == 0 else f'{gap:.3%} apart'})",
            file=out,
        )
    for warning in _warnings(run):
        print(f"autotuner: warning: {warning}", file=err)


def _run_lines(run: AppliedRun) -> list[str]:
    """The config, the steps it ran, its throughput against the study's, and the whole run's
    speedup over the baseline beside it."""
    tuned, measured = run.tuned, run.throughput
    study_spread = tuned.metrics.get("throughput_spread")
    lines = [
        f"{tuned.source}: {format_config(run.config)} (trial #{tuned.study.get('trial')} of {tuned.study['name']})",
        f"ran {measured.steps * measured.windows} optimizer steps of {measured.samples_per_step} samples "
        f"({measured.windows} windows of {measured.steps}, after {measured.warmup_s:.2f} s of warm-up) "
        f"on {run.environment.device} ({run.environment.device_name})",
        f"throughput: {run.samples_per_s:,.0f} samples/s here (spread {measured.spread:.1%}), "
        f"{tuned.throughput:,.0f} samples/s in the study"
        + (f" (spread {float(study_spread):.1%})" if isinstance(study_spread, (int, float)) else "")
        + f": ratio {run.ratio:.2f}",
    ]
    if run.baseline and run.promise_ratio is not None:
        base_steps, steps = run.baseline.steps * run.baseline.windows, measured.steps * measured.windows
        lines.append(
            f"speedup: {times(run.speedup)} here (over the baseline {format_config(tuned.baseline['params'])}, "
            f"{run.baseline.samples_per_s:,.0f} samples/s, run here for {base_steps} optimizer steps"
            + (f" (the first of {steps}: its windows capped at the config's time)" if base_steps < steps else "")
            + f" in {run.baseline.windows} windows of {run.baseline.steps}, "
            f"{'in lockstep with' if run.lockstep else 'after'} it), "
            f"{times(tuned.speedup)} in the export: ratio {run.promise_ratio:.2f}"
        )
    return lines


def _promise_line(run: AppliedRun) -> str | None:
    """The promise check's speedup here and the export's, with the verdict and what it judged;
    None where no check ran."""
    if not run.rounds:
        return None
    tuned, here, there = run.tuned, run.interval, run.tuned.speedup_interval
    text = f"promise: {speedup_with_interval(run.checked_speedup, here)} here ({_rounds_text(run)})"
    text += f", {speedup_with_interval(tuned.speedup, there)} in the export"
    if there is None:
        text += " (no interval in the export)"
    promised, verdict, checked = run.promised, run.verdict, run.checked
    if verdict is None or checked is None or promised is None:
        return text
    where = {Verdict.KEPT: "within", Verdict.NOT_KEPT: "wholly outside"}.get(
        verdict, "not yet within or wholly outside"
    )
    text += (
        f": {verdict.value} (here {speedup_with_interval(checked.estimate, checked)}, {where} the export's "
        f"{'interval' if there is not None else 'speedup'} widened by {run.tolerance:.0%}, {promised.text()})"
    )
    if verdict is Verdict.UNDECIDED:
        needed = run.rounds_to_decide
        text += (
            f"; about {needed} rounds would decide it (--rounds {needed})"
            if needed is not None
            else "; no number of rounds here would decide it: the speedup here is at the edge of what the "
            "export promised, within the session's drift (a wider --tolerance, or re-measure the study)"
        )
    return text


def _print_served(run: AppliedRun, out: IO[str], err: IO[str]) -> None:
    """An inference config's latency of a batch (and its limit) and its outputs' drift."""
    tuned = run.tuned
    if run.latency is not None:  # its batches, each timed alone
        study_p99 = tuned.metrics.get("latency_p99_ms")
        print(
            f"latency of a batch of {tuned.params['batch_size']}: p50 {run.latency.p50_ms:.2f} ms, "
            f"p99 {run.latency.p99_ms:.2f} ms here over {run.latency.calls} calls"
            + (f"; p99 {float(study_p99):.2f} ms in the study" if isinstance(study_p99, (int, float)) else "")
            + (f"; within the limit of {run.latency_limit_ms:g} ms" if run.within_latency_limit else ""),
            file=out,
        )
        if run.within_latency_limit is False:
            print(
                f"autotuner: warning: the p99 latency here ({run.latency.p99_ms:.2f} ms) is over the job's limit "
                f"of {run.latency_limit_ms:g} ms (objective.max_latency_ms): the machine may be busier or "
                "different now",
                file=err,
            )
    if run.output_drift is not None:
        served = run.output_drift
        agrees = f", top-1 agreement {served.top1_agreement:.2%}" if served.top1_agreement is not None else ""
        print(
            f"output drift from the fp32 model here: {served.relative_error:.3%}{agrees}; "
            f"{percent(tuned.metrics.get('drift'))} in the study",
            file=out,
        )


def _warnings(run: AppliedRun) -> list[str]:
    """Where the run here parts from the study: a promise not kept (or, unchecked, a speedup more
    than `PROMISE` away), a step that slows as it trains, a throughput more than `AGREEMENT` away."""
    tuned, promise, warnings = run.tuned, run.promise_ratio, []
    if run.verdict is Verdict.NOT_KEPT and run.interval is not None:
        warnings.append(
            f"the speedup here ({times(run.interval.estimate)}, {run.interval.text()}) is "
            f"outside the export's promise ({speedup_with_interval(tuned.speedup, tuned.speedup_interval)}) "
            f"widened by {run.tolerance:.0%}: the machine may be busier or different now, or the job has changed"
        )
    elif promise is not None and run.verdict is None and run.keeps_promise is False:
        warnings.append(
            f"the speedup here is {abs(promise - 1):.1%} {'below' if promise < 1 else 'above'} the export's "
            f"(more than {PROMISE:.0%}): the machine may be busier now, or the study's measurements were noisy"
        )
    if run.quarters and (run.slowdown or 0.0) > SLOWDOWN:
        first, last = run.quarters
        warnings.append(
            f"the config ran {run.slowdown:.0%} slower over the last quarter of the run "
            f"({last:,.0f} samples/s) than over the first ({first:,.0f} samples/s): the job's step gets "
            "slower as it trains, which the study's short trials do not see"
        )
    if not run.agrees:
        warnings.append(
            f"the throughput here is {abs(run.ratio - 1):.1%} {'below' if run.ratio < 1 else 'above'} the "
            f"study's (more than {AGREEMENT:.0%}): the machine may be busier or different, or the study's short "
            "windows were noisy"
        )
    return warnings
