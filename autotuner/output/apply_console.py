"""What `autotuner apply` prints of the run it measured (`autotuner.results.applied_run.AppliedRun`):
the throughput and the speedup here next to the study's, the promise's verdict, the run time, a
served config's latency and drift, the held-out loss; warnings where they part.
"""

from __future__ import annotations

import sys
from typing import IO

from autotuner.config.knobs import BATCH_SIZE
from autotuner.output.formatting import format_config, percent, speedup_with_interval, times
from autotuner.results.applied_run import AGREEMENT, PROMISE, AppliedRun
from autotuner.results.promise import Verdict

SLOWDOWN = 0.2
"""`autotuner apply` warns when the last quarter of the config's windows ran this much slower than
the first (medians): beyond the window-to-window noise of a busy machine."""


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
            f"speedup: {times(run.speedup)} here (over the baseline {format_config(tuned.baseline.params or {})}, "
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
            f"latency of a batch of {tuned.params[BATCH_SIZE.name]}: p50 {run.latency.p50_ms:.2f} ms, "
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
