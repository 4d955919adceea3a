"""`autotuner apply`'s run: an exported config run with this job on this machine, beside the
export's baseline, then its promise checked.

`apply_config` checks that the config was tuned for this job and this hardware
(`autotuner.export.reader`), runs the job with it for N optimizer steps in a trial process, with the
export's baseline beside it, measured as the study measures; then it measures the speedup the way
the study's re-measurement did, in rounds of a fresh process of each beside the other
(`promise_rounds`, run by the function the re-measurement's rounds run by,
`autotuner.search.paired_rounds.measure_rounds`), until they decide the export's promise
(`autotuner.results.promise`). What it gives is an `autotuner.results.applied_run.AppliedRun`,
which `autotuner.output.apply_console` prints.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from autotuner.config.knobs import BATCH_SIZE, Config
from autotuner.errors import BackendError, HardwareMismatch, SpecError
from autotuner.export.reader import TunedConfig, job_mismatch, machine_mismatch
from autotuner.measurement.rounds import ProcessCost, TimeBudget, windows_that_fit
from autotuner.measurement.timing import Throughput
from autotuner.results.applied_run import AppliedRun
from autotuner.results.promise import TOLERANCE, Promised, Verdict, verdict_at
from autotuner.search.paired_rounds import Pace, RoundAt, measure_rounds, round_speedups
from autotuner.study.fingerprint import thread_mismatch
from autotuner.trials.lockstep import in_lockstep, measure_together
from autotuner.trials.outcomes import Outcome
from autotuner.trials.probe import Environment
from autotuner.workers.nodes import lead

if TYPE_CHECKING:
    from autotuner.spec.job import Job
    from autotuner.trials.launcher import TrialLauncher
    from autotuner.trials.request import TrialRequest

MIN_APPLY_STEPS = 50
BASELINE_MOST_S = 180.0
"""The baseline's windows in `autotuner apply` last at most this long, and at most as long as the
config's are expected to (`baseline_most_s`): matching the optimizer steps of a config many times
faster would take many times the config's run (the JAX quickstart's winner, jit, against its
op-by-op baseline at 0.45 s a step: an apply of over 9 minutes)."""


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


@dataclass(frozen=True)
class ApplyOptions:
    """What `autotuner apply` is asked beside the config and the job: its command line's options."""

    steps: int | None = None
    """The optimizer steps the run's windows cover (None: `default_steps`)."""
    device: str | None = None
    """The device to run on (None: the spec's)."""
    force: bool = False
    """Run a config tuned for another job or other hardware, with a warning."""
    baseline: bool = True
    """Run the export's baseline beside the config, and check the promise."""
    tolerance: float = TOLERANCE
    """How far beyond the export's interval the speedup here may be (`Promised`)."""
    rounds: int | None = None
    """The most rounds the promise check runs (`check_rounds`)."""


def apply_config(
    tuned: TunedConfig,
    job: Job,
    options: ApplyOptions | None = None,
    *,
    warn: Callable[[str], None] = lambda text: print(f"autotuner: warning: {text}", file=sys.stderr),
    note: Callable[[str], None] = lambda text: None,
) -> AppliedRun:
    """Run `job` with `tuned` in a trial process, from a cold compile cache as a real run starts,
    measured as a trial is: warm-up, then windows as long as the study's (each lengthened to
    `trial.min_window_s` by the same calibration), their median and spread: as many windows as
    cover `options.steps` optimizer steps, or by default as many as `default_steps` fill at
    `trial.steps` a window (so at least 4x a trial's windows, enough for the median and for
    `slowdown`). With `options.baseline`, the export's baseline config runs over as many optimizer
    steps (its windows for as long as the config's at most, `baseline_most_s`), so the speedup
    delivered can be set beside the export's: on a CPU in lockstep with the config (turn by turn,
    `autotuner.trials.lockstep.measure_together`), elsewhere after it; then the promise check's
    rounds (`promise_rounds`) until they decide the promise within `options.tolerance` (`judge`,
    each look at its `look_level`), at most `options.rounds` of them (`check_rounds`), each
    round's progress told to `note`. A config tuned for another job or other hardware is refused
    unless `options.force`."""
    options = options or ApplyOptions()
    launcher = job.backend.launcher(job.spec.trial.max_memory_mb, job.workload_path())
    environment, config = _checked(tuned, job, launcher, options.device or job.spec.device, options.force, warn)
    requests, timeout = _requests(tuned, job, config, environment.device, options.steps, options.baseline)
    leading = lead(job, launcher, note) if job.spec.nodes > 1 else None
    try:
        return _apply_runs(tuned, job, options, leading or launcher, environment, config, requests, timeout, note)
    finally:
        if leading is not None:
            leading.finish(job.spec.nodes)


def _apply_runs(
    tuned: TunedConfig,
    job: Job,
    options: ApplyOptions,
    launcher: TrialLauncher,
    environment: Environment,
    config: Config,
    requests: list[TrialRequest],
    timeout: float,
    note: Callable[[str], None],
) -> AppliedRun:
    """`apply_config`'s runs of the config and its baseline, then its promise check's rounds."""
    # A compile cache of their own, empty: the warm-up is a real run's, whatever the study compiled.
    with tempfile.TemporaryDirectory(prefix="autotuner-apply-") as cold_cache:
        requests = [dataclasses.replace(r, compile_cache=cold_cache) for r in requests]
        results = measure_together(
            launcher, job.backend.runner, requests, environment.device, timeout, match_first=True
        )
        for what, result in zip(("config", "baseline config"), results, strict=False):
            if result.outcome is not Outcome.OK:
                raise BackendError(f"the {what} failed on this machine: {result.outcome}: {result.reason}")
        most = check_rounds(job, options.rounds)
        plan = CheckPlan(
            most=most,
            decided=_decides(tuned, options.tolerance, most),
            measured=tuple(r.output.throughput for r in results if r.output and r.output.throughput),
            seconds=max(r.wall_s for r in results),
        )
        configs = [r.config for r in requests]
        checked, rounds_error = (
            promise_rounds(job, launcher, configs, environment.device, cold_cache, note, plan)
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
        tolerance=options.tolerance,
        most_rounds=most,
    )


def _decides(tuned: TunedConfig, tolerance: float, most: int) -> Callable[[list[float]], bool]:
    """Whether the promise check's rounds so far decide `tuned`'s promise within `tolerance`: the
    look after them, of at most `most`, is not undecided (`verdict_at`); never where the export
    promises no speedup."""
    promised = Promised.of(tuned.speedup_interval, tuned.speedup, tolerance)

    def decided(speedups: list[float]) -> bool:
        return promised is not None and verdict_at(speedups, tuned.speedup_interval, promised, most) is not (
            Verdict.UNDECIDED
        )

    return decided


def check_rounds(job: Job, most: int | None) -> int:
    """The most rounds the promise check runs: `most` (`autotuner apply --rounds`), by default
    `budget.remeasure_runs`; two at least (one gives no interval)."""
    return max(2, most or job.spec.budget.remeasure_runs)


@dataclass(frozen=True)
class CheckPlan:
    """How the promise check's rounds run (`promise_rounds`)."""

    most: int | None = None
    """At most `check_rounds(job, most)` rounds."""
    decided: Callable[[list[float]], bool] | None = None
    """Whether the rounds so far decide the promise (`_decides`), asked from the second round on:
    the rounds stop once it says so, and never for time."""
    measured: tuple[Throughput, ...] = ()
    """The configs' throughputs as the run before measured them, whose windows (their steps) and
    costs the rounds take."""
    seconds: float | None = None
    """The run before's time: each process measures as many windows as let three rounds fit in it
    (`autotuner.measurement.rounds`, `budget.remeasure_windows` at most); without `decided`, from
    the third on the rounds run only while the next fits in it."""
    clock: Callable[[], float] = time.monotonic
    """What a round's seconds are read on."""


def promise_rounds(
    job: Job,
    launcher: TrialLauncher,
    configs: list[Config],
    device: str,
    compile_cache: str,
    note: Callable[[str], None],
    plan: CheckPlan | None = None,
) -> tuple[list[float], str | None]:
    """The speedup of `configs[0]` over `configs[1]` (the export's baseline), measured the way the
    study's re-measurement measures a round, by the rounds function they share
    (`autotuner.search.paired_rounds.measure_rounds`): a fresh trial process of each, together (in
    lockstep on a CPU), the round's speedup the config's median window over the baseline's; the
    rounds as `plan` says (`CheckPlan`), each told to `note`. Each round's speedup, and why a round
    failed (None: none did)."""
    plan = plan or CheckPlan()
    budget = job.spec.budget
    costs = [ProcessCost(t.warmup_s, t.measured_s / max(1, t.windows)) for t in plan.measured]
    windows = windows_that_fit(costs, plan.seconds, budget.remeasure_windows) if costs else budget.remeasure_windows
    requests = []
    for index, config in enumerate(configs):
        request = dataclasses.replace(
            job.trial_request(config, device, log=job.log_path("apply")),
            windows=windows,
            drift=False,
            compile_cache=compile_cache,
        )
        if index < len(plan.measured):  # the window the run calibrated: no calibration again
            request = dataclasses.replace(request, steps=plan.measured[index].steps, min_window_s=0.0)
        requests.append(request)
    timeout = job.trial_timeout(*configs)
    check = _PromiseRounds(job, launcher, device, requests, timeout, windows, note, plan.decided)
    allowance = TimeBudget(plan.seconds) if plan.seconds is not None else None
    measure_rounds(check, Pace(check_rounds(job, plan.most), allowance, plan.decided is None, plan.clock))
    return check.speedups, check.error


@dataclass
class _PromiseRounds:
    """The promise check's rounds, as `measure_rounds` runs them (a `PairedRound`): each a process
    of the config and one of the baseline (`requests`), measured together; they stop at the first
    that fails, or once `decided` says the rounds so far decide the promise."""

    job: Job
    launcher: TrialLauncher
    device: str
    requests: list[TrialRequest]
    timeout_s: float
    windows: int
    note: Callable[[str], None]
    decided: Callable[[list[float]], bool] | None
    speedups: list[float] = field(default_factory=list)
    error: str | None = None
    """Why a round failed, ending the check (what it measured before is kept)."""

    def processes(self) -> int:
        return len(self.requests)

    def measure(self, at: RoundAt) -> bool:
        self.note(f"checking the promise: {at.progress(self.windows, ', the config beside the baseline')}")
        results = measure_together(self.launcher, self.job.backend.runner, self.requests, self.device, self.timeout_s)
        failed = next((r for r in results if r.outcome is not Outcome.OK), None)
        if failed is not None:
            self.error = f"round {at.number}: {failed.outcome.value}: {failed.reason}"
            return False
        speedup = round_speedups(results)[0]
        assert speedup is not None  # both ended ok, so both measured
        self.speedups.append(speedup)
        return not (self.decided is not None and len(self.speedups) >= 2 and self.decided(self.speedups))


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
    base_params = tuned.baseline.params
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
