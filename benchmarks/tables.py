"""The tables of benchmarks/README.md, written from the result files alone.

    python benchmarks/tables.py [--results benchmarks/results] [--readme benchmarks/README.md]

Every figure in the README's results section comes from a file under benchmarks/results/ that a
benchmark script wrote; this rewrites that section (between its two markers) from them, so no
figure is typed by hand. A result file that is missing leaves its table out (the GPU tables
appear once `python benchmarks/gpu.py` has written `gpu-*.json` there).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _harness import RESULTS

from autotuner.backends import knob_named
from autotuner.output.formatting import percent, rate, times

README = Path(__file__).parent / "README.md"
START = "<!-- results: written by python benchmarks/tables.py from benchmarks/results/; do not edit by hand -->"
END = "<!-- results end -->"


def _load(name: str, folder: Path = RESULTS) -> dict[str, Any] | None:
    path = folder / name
    return json.loads(path.read_text()) if path.exists() else None


def _seconds(value: float) -> str:
    return f"{value * 1000:,.0f} ms" if value < 1 else f"{value:,.1f} s"


def _config(config: dict[str, Any] | None) -> str:
    if not config:
        return "-"
    batch = f"{config['batch_size']}x{config.get('accumulation', 1)}"
    first = f"{config['precision']}, batch {batch}, workers {config['workers']}, compile {config['compile']}"
    # the knobs added after the first four, where a config moved them from their reference value
    rest = [
        f"{k} {v}"
        for k, v in config.items()
        if (knob := knob_named(k)) is not None and knob.quiet and v != knob.reference
    ]
    return ", ".join([first, *rest])


def _load_note(data: dict[str, Any]) -> str:
    """The machine's load average when the file was written (other people's jobs shared it)."""
    load = (data.get("conditions") or {}).get("load_avg_when_written")
    return f" (load average {load[0]:.1f} when written)" if load else ""


def _yes(value: bool) -> str:
    return "yes" if value else "**no**"


def search_efficiency(data: dict[str, Any]) -> list[str]:
    grids = data["grids"]
    share = next(iter(grids.values()))["budget_share"]
    lines = [
        "### Search efficiency: `python benchmarks/search_efficiency.py`",
        "",
        f"Trials a sampler needs until a feasible trial reaches {data['target']:.0%} of the grid's best feasible "
        f"throughput (and, read off the same replays, {next(iter(grids.values()))['close_bar_share']:.0%}), "
        f"median and quartiles over {data['seeds']} seeds, replayed against grids of real trials "
        "(`results/grid-<name>.json`); trials counted as `budget.trials` counts them, the baseline being the "
        f"first. Target: the default sampler's median within {share:.0%} of the grid's size, and below random "
        "search's exact median (on a grid of 150 configs or more that run: within 5%, and at most a third of it). "
        "The samplers are built as `autotuner search` builds them for the spec's `sampler` name "
        "(`autotuner.proposals.sampler.make_sampler`); variants change one thing in the default.",
        "",
    ]
    for name, grid in grids.items():
        best = grid["best"]
        lines += [
            f"**{name}** (`{grid['spec']}`: {grid['grid_configs']} configs, {grid['grid_configs_run']} run; "
            f"recorded on {grid['machine']}, load average {grid['load_1m_median']:.1f} (median over its trials), "
            f"each config the median of {grid['repeats']} sweep(s), in {_seconds(grid['record_wall_s'])}). "
            f"Best: {_config(best['config'])}, {rate(best['throughput'])}, "
            f"{times(grid['best_over_baseline'])} the baseline, drift {percent(best['drift'])}. Configs at "
            f"{data['target']:.0%} of it: {grid['configs_at_bar']}; at {grid['close_bar_share']:.0%}: "
            f"{grid['configs_at_close_bar']}. Random search's trials, exactly: median "
            f"{grid['random_median_trials']:g}, mean {grid['random_expected_trials']:.1f}; "
            f"the budget: {grid['budget_trials']:.1f} trials.",
            "",
            f"| sampler | trials to {data['target']:.0%}: median (p25-p75) | share of the grid | "
            f"seeds within the budget | trials to {grid['close_bar_share']:.0%}: median |",
            "| --- | --- | --- | --- | --- |",
        ]
        for label, s in grid["samplers"].items():
            lines.append(
                f"| {label} | {s['trials_median']:g} ({s['trials_p25']:g}-{s['trials_p75']:g}) | "
                f"{s['median_share_of_grid']:.0%} | {s['seeds_within_budget']}/{len(s['trials_needed'])} | "
                f"{s['trials_to_close_bar_median']:g} |"
            )
        target = grid["target"]
        lines += [
            "",
            f"Target holds on {name}: {_yes(target['holds'])} (within the budget: {_yes(target['within_budget'])}; "
            f"{'at most a third of' if grid.get('random_share') else 'fewer trials than'} random search's median: "
            f"{_yes(target['beats_random'])}).",
            "",
        ]
    return lines


def alternatives(data: dict[str, Any]) -> list[str]:
    lines = [
        "### Tuned against the alternatives: `python benchmarks/alternatives.py`",
        "",
        f"On {data['machine']}{_load_note(data)}; the whole run took {_seconds(data['wall_s'])}. Each config "
        f"measured {data['rounds']} time(s) in turn after the search: median throughput, largest drift, and "
        "the first round's warm-up (where `torch.compile` goes; its cache starts empty, and the search's "
        "trials fill it); drift against the "
        "study's fp32 reference. The search runs with the default sampler and budget, over the preset's "
        "values of the knobs its spec holds at one value for its grid "
        f"({', '.join(f'`{k}`' for k in next(iter(data['workloads'].values())).get('released', []))}). "
        "Target: tuned at least 1.05x the better of the rule of thumb and the finders, on every workload.",
        "",
        "| workload | config | knobs | samples/s | over baseline | drift | feasible | warm-up (first round) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, w in data["workloads"].items():
        for label, row in w["configs"].items():
            lines.append(
                f"| {name} | {label} | {_config(row['config'])} | {rate(row['throughput'])} | "
                f"{times(row['over_baseline'])} | {percent(row['drift'])} | {_yes(row['feasible'])} | "
                f"{_seconds(row['warmups_s'][0])} |"
            )
    lines += [
        "",
        "| workload | tuned over the better alternative | search: wall time | trials (space) | "
        "speedup in the study | finders (probes) | any OOM |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, w in data["workloads"].items():
        s, f = w["search"], w["finders"]
        rows = w["configs"]
        others = max(row["throughput"] for label, row in rows.items() if label not in ("baseline", "tuned"))
        over = rows["tuned"]["throughput"] / others if others else None
        finders = (
            f"Lightning {f['lightning_power']['batch_size']} ({len(f['lightning_power']['probes'])}), "
            f"Accelerate {f['accelerate']['batch_size']} ({len(f['accelerate']['probes'])})"
        )
        lines.append(
            f"| {name} | {times(over)} | {_seconds(s['wall_s'])} | {s['trials_ran']} ({s['space_size']}) | "
            f"{times(s['speedup_in_study'])} | {finders} | {'yes' if f['any_oom'] else 'no'} |"
        )
    return [*lines, ""]


def overhead(data: dict[str, Any]) -> list[str]:
    study, books = data["study"], data["bookkeeping"]
    start = data["startup"]
    rows = [
        ("trial process start-up from the fork server (median)", _seconds(start["fork_startup_s_median"])),
        ("trial round trip from the fork server (median)", _seconds(start["fork_roundtrip_s_median"])),
        ("trial start-up stored by the real study's trials (median)", _seconds(study["trial_startup_s"]["median"])),
        ("a fresh interpreter importing the runner (median)", _seconds(start["fresh_interpreter_import_s_median"])),
        ("fork server start (once per search)", _seconds(start["fork_server_start_s"])),
        (
            f"search wall time ({study['trials_ran']} trials, `{study['spec']}`)",
            _seconds(study["search_wall_s"]),
        ),
        (
            "sum of the trials' wall time / of their measured windows",
            (f"{_seconds(study['trials_wall_s'])} / {_seconds(study['measured_windows_s'])}"),
        ),
        (
            "search wall time over the trials' measured windows (re-measurement runs in the wall time only)",
            times(study["wall_over_measured_windows"]),
        ),
        *(
            [
                (
                    "re-measurement's measured windows / the search wall time over every measured window "
                    "(the trials' and re-measurement's)",
                    f"{_seconds(study['remeasured_windows_s'])} / {times(study['wall_over_all_measured_windows'])}",
                )
            ]
            if study.get("remeasured_windows_s") is not None
            else []
        ),
        (
            "search process's own time per trial (median: sampling, claims, record, read-back, output)",
            (_seconds(study["loop_per_trial_s"]["median"])),
        ),
        (
            "(search wall - trials' wall - reference) / trials (includes start-up, probe, export, charts)",
            _seconds(study["outside_trials_per_trial_s"]),
        ),
        (
            "before the first trial (interpreter, imports, probe, reference) / after the last "
            "(re-measurement, export, charts)",
            (f"{_seconds(study['before_first_trial_s'])} / {_seconds(study['after_last_trial_s'])}"),
        ),
        (
            f"`study.ask` on SQLite ({books['sampler']} sampler, median over {books['trials']} trials)",
            (
                f"{_seconds(books['ask_s']['median'])} (first 10: {_seconds(books['ask_s_median_first_10'])}, "
                f"last 10: {_seconds(books['ask_s_median_last_10'])})"
            ),
        ),
        ("`autotuner.results.store.record` on SQLite (median)", _seconds(books["record_s"]["median"])),
    ]
    return [
        "### Overhead: `python benchmarks/overhead.py`",
        "",
        f"On {data['machine']}{_load_note(data)} (`results/overhead.json`; `python benchmarks/trial_overhead.py` "
        "gives the start-up rows alone).",
        "",
        "| figure | value |",
        "| --- | --- |",
        *(f"| {what} | {value} |" for what, value in rows),
        "",
        *_overhead_before(data),
    ]


def run_length(data: dict[str, Any]) -> list[str]:
    trials, mode = data["trials"], data["mode"]
    eager, compiled = trials["none"], trials[mode]
    args = ", ".join(f"{k} {v}" for k, v in data["workload_args"].items())
    lines = [
        "### The run length decides whether compiling pays: `python benchmarks/run_length.py`",
        "",
        f"On {data['machine']}{_load_note(data)} (`results/run_length.json`): one study of the built-in GPT "
        f"({args}; global batch {data['global_batch']}, fp32) with `compile: none` (the baseline) and "
        f"`compile: {mode}`, both re-measured in lockstep, ranked for runs of each length as `run: {{steps: N}}` "
        f"ranks them. Compiled steps are {times(data['compiled_speedup_per_step'])} as fast; the compile costs "
        f"{_seconds(data['extra_warmup_s'])} more warm-up (cold cache), so the break-even run is "
        f"{data['break_even_steps']:,.0f} optimizer steps.",
        "",
        "| config | step | set-up + warm-up | compile cache |",
        "| --- | --- | --- | --- |",
    ]
    for name, t in (("none", eager), (mode, compiled)):
        before = float(t["setup_s"] or 0.0) + float(t["warmup_s"] or 0.0)
        lines.append(
            f"| compile {name} | {t['step_s'] * 1000:.2f} ms | {_seconds(before)} ({t['warmup_steps']} steps) | "
            f"{t['compile_cache'] or '-'} |"
        )
    lines += [
        "",
        "| run (optimizer steps) | predicted: none | predicted: " + mode + " | picks |",
        "| --- | --- | --- | --- |",
    ]
    for row in data["ranked"]:
        run_s = row["run_s"]
        lines.append(
            f"| {row['steps']:,} | {_seconds(run_s['none'])} | {_seconds(run_s[mode])} | `compile: {row['picks']}` |"
        )
    return [*lines, ""]


def _overhead_before(data: dict[str, Any]) -> list[str]:
    """With `--before REVISION`: the same study by that revision's autotuner and by this one, side by side."""
    if "before" not in data:
        return []
    pairs = list(zip(data["before"]["studies"], data["studies"], strict=True))
    figures = [
        ("search wall time", lambda s: _seconds(s["search_wall_s"])),
        ("sum of the trials' wall time", lambda s: _seconds(s["trials_wall_s"])),
        ("sum of their measured windows", lambda s: _seconds(s["measured_windows_s"])),
        ("search wall time over the trials' measured windows", lambda s: times(s["wall_over_measured_windows"])),
        ("re-measurement's measured windows", lambda s: _unless_none(_seconds, s.get("remeasured_windows_s"))),
        (
            "search wall time over every measured window (trials' and re-measurement's)",
            lambda s: _unless_none(times, s.get("wall_over_all_measured_windows")),
        ),
        (
            "before the first trial / after the last",
            lambda s: f"{_seconds(s['before_first_trial_s'])} / {_seconds(s['after_last_trial_s'])}",
        ),
    ]
    header = " | ".join(f"{data['before']['revision']} (run {n + 1}) | now (run {n + 1})" for n in range(len(pairs)))
    return [
        f"The same study by autotuner as of `{data['before']['revision']}` and as of "
        f"`{data.get('revision', 'the commit of the file')}`, alternately "
        f"(`--before {data['before']['revision']}`): the search's wall time now is "
        f"{times(data['search_wall_now_over_before'])} what it was (median over the pairs).",
        "",
        f"| figure | {header} |",
        "| --- |" + " --- |" * (2 * len(pairs)),
        *(f"| {what} | " + " | ".join(f"{show(b)} | {show(a)}" for b, a in pairs) + " |" for what, show in figures),
        "",
    ]


def _unless_none(show: Callable[[float], str], value: float | None) -> str:
    return "not stored" if value is None else show(value)


def fidelity(data: dict[str, Any], quickstart: dict[str, Any] | None) -> list[str]:
    def throughput(config: str, value: float) -> str:
        return f"{value:,.0f} matmuls/s" if config.startswith("machine floor") else rate(value)

    lines = [
        "### Measurement fidelity: `python benchmarks/fidelity.py`",
        "",
        f"On {data['machine']} (`results/fidelity.json`): the quickstart's baseline and winner. *One after "
        f"another*: {data['runs']} trials of each at the spec's trial settings, interleaved, as a search's trials "
        f"run; two trials apart = |a - b| / mean of consecutive runs. *In lockstep*: {data['runs']} groups, each two "
        "trials of each config alive at once and measured in turns, window by window, as re-measurement and "
        "`autotuner apply` measure on a CPU, with re-measurement's windows (`budget.remeasure_windows`), and the "
        "same processes over their first windows (a trial's, and half); two trials apart = the two of one group "
        "(target: 3%). The speedup columns: "
        "the winner's over the baseline, per run or group, and how far it moves from one to the next (what an "
        "export and a later apply can differ by). The machine floors are fixed matmuls with no autotuner code in "
        "them, timed over the same windows in a process of their own between the sequential trials: how far apart "
        "they come out is the machine's own drift, for compute (512x512 operands) and for memory (16 rows against "
        "9 MiB of weights, the shape of the baseline's layers).",
        "",
        "| measured | config | median samples/s | two trials apart: median (max) | spread over all runs "
        "| speedup per run | speedup runs apart: median (max) | CPU steal |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for mode, measured in data["modes"].items():
        label = mode
        speedups = ", ".join(times(s) for s in measured["speedup_runs"])
        moved = f"{measured['speedup_gap']['median']:.1%} ({measured['speedup_gap_max']:.1%})"
        for config, summary in measured["configs"].items():
            gap = summary["trial_gap"]
            lines.append(
                f"| {label} | {config} | {throughput(config, statistics.median(summary['throughputs']))} | "
                f"{gap['median']:.1%} ({summary['trial_gap_max']:.1%}) | {summary['spread_all_runs']:.1%} | "
                f"{speedups} | {moved} | {measured['steal_share']:.1%} |"
            )
            label = speedups = moved = ""
    timed = (quickstart or {}).get("run_time")
    if timed and "ratio" in timed:
        lines += [
            "",
            f"The run time (key `run_time`): `autotuner apply --steps {timed['steps']:,} --no-baseline` of the winner "
            f"from a fresh interpreter took {timed['steps_taken']:,} optimizer steps (the windows that cover the "
            f"steps asked, and the warm-up's and calibration's) in {_seconds(timed['run_s_here'])}, the framework's "
            f"start, the build and the warm-up included; the study's `run_s` for as many is "
            f"{_seconds(timed['run_s_predicted'])}: ratio {timed['ratio']:.2f}"
            f" ({'within' if timed['within_10_percent'] else 'not within'} 10%). The whole command, interpreter "
            f"start to exit (the probe, the drift check and reading the export too), took "
            f"{_seconds(timed['process_wall_s'])}.",
        ]
    return [*lines, ""]


def promise(coverages: dict[str, dict[str, Any]], quickstarts: dict[str, dict[str, Any]]) -> list[str]:
    """The interval's measured coverage on each machine (`coverages`: result file -> its data), and
    each quickstart's promise and its applies."""
    lines = [
        "### The promise and its interval: `python benchmarks/interval_coverage.py`, `python benchmarks/quickstart.py`",
        "",
    ]
    for source, coverage in coverages.items():
        lines += [
            f"On {coverage['machine']} (`results/{source}`): {coverage['rounds']} rounds of the "
            f"quickstart's winner ({coverage['configs']['winner']}) beside its baseline, each a fresh process of "
            f"both with {coverage['windows']} windows, in lockstep, as re-measurement measures a round: "
            f"{times(coverage['speedup'])} over all of them; one round's log-ratio standard deviation "
            f"{coverage['round_log_sd']:.3f}. Cut into studies of n rounds, each study's 90% interval checked "
            "against the speedup of the other rounds: the rounds' own interval, and as a study states it (with a "
            f"session's drift of {coverage.get('drift_allowed', 0):g} allowed for):",
            "",
            "| rounds a study | studies | held (rounds' own) | coverage | half-width, median (quartiles) | "
            "held (as stated) | coverage | half-width, median |",
            "|---|---|---|---|---|---|---|---|",
        ]
        stated = coverage.get("stated_coverage") or {}
        for n, found in coverage["coverage"].items():
            width = found["half_width"]
            also = stated.get(n)
            lines.append(
                f"| {n} | {found['blocks']} | {found['held']} | {found['coverage']:.0%} | "
                f"{width['median']:.1%} ({width['p25']:.1%}-{width['p75']:.1%}) | "
                + (
                    f"{also['held']} | {also['coverage']:.0%} | {also['half_width']['median']:.1%} |"
                    if also
                    else "- | - | - |"
                )
            )
        drifts = {n: d for n, d in (coverage.get("drift") or {}).items() if d is not None}
        if drifts:
            lines += [
                "",
                "The drift: means of consecutive blocks of "
                + ", ".join(f"{n} rounds stood apart by {d:.3f}" for n, d in drifts.items())
                + " (log sd) beyond what their rounds' spread gives them.",
            ]
        lines.append("")
    for name, data in quickstarts.items():
        if data.get("apply") and data["apply"].get("intervals"):
            lines += [*promise_table(data, f"results/{name}.json"), ""]
    return lines


def interval_procedure(data: dict[str, Any], source: str) -> list[str]:
    """The winner's interval under the whole re-measurement procedure, simulated (or replayed from
    recorded rounds): coverage and median half-width for each variant, scenario and log sd; and
    the simulated promise checks' verdicts."""
    rows = data["rows"]
    replayed = data.get("replayed")
    columns = sorted(
        {(row["sigma"], row.get("replay") or "") for row in rows}, key=lambda c: (c[0], c[1] == "in order")
    )
    command = "python benchmarks/interval_procedure.py" + (" --replay" if replayed else "")
    noise = (
        f"each config's round drawn from the {data['replayed_rounds']} rounds "
        f"{', '.join(f'`{path}`' for path in replayed)} recorded (their log-ratio residuals: real machines' noise, "
        "its tails included; log sd in the column), resampled from them all (independent rounds) or consecutive "
        "rounds of one file from a random start (in order: the machine's phases kept)"
        if replayed
        else "log-normal round noise of the log sd in each column"
    )
    scenarios = "; ".join(f"{name}: {', '.join(f'{t:g}x' for t in trues)}" for name, trues in data["scenarios"].items())
    lines = [
        f"### The winner's interval under the re-measurement procedure: `{command}`",
        "",
        f"`results/{source}`: {data['draws_per_row']:,} re-measurements a row, each "
        f"through the real standings, contenders, stopping rule and statement of the interval, up to "
        f"{data['remeasure_runs']} rounds, of the configs of each scenario ({scenarios}), {noise}. "
        f"Coverage of the winner's stated {data['level']:.0%} interval (its 95% margin about +-1%), then the "
        f"median half-width. The tool's method is the row that says so; the first is the rule it replaced "
        f"(stop once the leader's interval is within {data['remeasure_width']:.0%}).",
        "",
        "| rounds, and how the interval is stated | configs | "
        + " | ".join(f"sd {sigma:.3g}" + (f", {replay}" if replay else "") for sigma, replay in columns)
        + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for (variant, scenario), group in itertools.groupby(rows, key=lambda row: (row["variant"], row["scenario"])):
        by_column = {(row["sigma"], row.get("replay") or ""): row for row in group}
        cells = [
            f"{by_column[column]['coverage']:.1%}, {by_column[column]['median_half_width']:.1%}"
            if column in by_column
            else "-"
            for column in columns
        ]
        lines.append(f"| {variant} | {scenario} | " + " | ".join(cells) + " |")
    checks = data.get("apply_checks")
    if checks:
        check_sigmas = sorted({row["sigma"] for row in checks})
        lines += [
            "",
            f"`autotuner apply`'s promise check, simulated ({data['draws_per_row']:,} checks a row): an export of "
            f"one config re-measured {data['remeasure_runs']} rounds, checked in up to as many rounds, stopping at "
            + (
                f"the first that decides (kept within the export's interval widened by {checks[0]['tolerance']:.0%}); "
                "the true speedup here is the export's times the ratio. Each cell: kept / not kept / undecided, the "
                "wrong verdict's share in bold (not kept where the export's interval holds the speedup here, kept "
                "where the widened interval does not)."
                if "tolerance" in checks[0]
                else "the first that decides (within +-10%); the true speedup here is the export's times the ratio. "
                "Each cell: kept / not kept / undecided, the wrong verdict's share in bold (not kept where the ratio "
                "is within the tolerance, kept where it is not)."
            ),
            "",
            "| looks | ratio | " + " | ".join(f"sd {sigma:.3g}" for sigma in check_sigmas) + " |",
            "|---|---|" + "---|" * len(check_sigmas),
        ]
        for (looks, ratio), group in itertools.groupby(checks, key=lambda row: (row["looks"], row["ratio"])):
            by_sigma = {row["sigma"]: row for row in group}
            cells = [
                f"{r['kept']:.0%} / {r['not kept']:.0%} / {r['undecided']:.0%} **{r['wrong']:.1%}**"
                for r in (by_sigma[sigma] for sigma in check_sigmas)
            ]
            lines.append(f"| {looks} | {ratio:g} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def inference(data: dict[str, Any]) -> list[str]:
    """The inference study's winner against the baseline and the obvious alternatives."""
    search = data["search"]
    lines = [
        "### Inference: `python benchmarks/inference.py`",
        "",
        f"On {data['machine']} (`results/inference.json`): `autotuner search --spec {data['spec']}` took "
        f"{search['wall_s']:.1f} s ({search['trials_ran']} trials ran); then the tuned config, the baseline and the "
        f"obvious alternatives served side by side in lockstep, {data['rounds']} rounds, medians. Drift: the "
        f"relative error of the outputs on the held-out inputs against the fp32 model (tolerance "
        f"{data['max_drift']:.1%}"
        + (f", p99 latency limit {data['max_latency_ms']:g} ms" if data.get("max_latency_ms") else "")
        + ").",
        "",
        "| config | knobs | samples/s | over the baseline | p50 latency | p99 latency | drift | top-1 agreement |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in data["configs"].items():
        if "throughput" not in row:
            lines.append(f"| {name} | {row['config']} | failed: {row.get('error')} | | | | | |")
            continue
        agreement = "-" if row.get("top1_agreement") is None else f"{row['top1_agreement']:.1%}"
        lines.append(
            f"| {name} | {row['config']} | {row['throughput']:,.0f} | {row['over_baseline']:.2f}x | "
            f"{row['latency_p50_ms']:.2f} ms | {row['latency_p99_ms']:.2f} ms | {row['relative_error']:.3%} | "
            f"{agreement} |"
        )
    for name, row in data.get("unsupported", {}).items():
        lines.append(f"| {name} | {row['config']} | unsupported: {row['reason']} | | | | | |")
    return [*lines, ""]


def parallel_knobs(data: dict[str, Any], source: str) -> list[str]:
    """Each DDP and FSDP2 knob's trial of two ranks against its mode's base config."""
    lines = [
        "### The distributed knobs: `python benchmarks/parallel_knobs.py`",
        "",
        f"On {data['device']}, torch {data['versions'].get('torch', '?')} (`results/{source}`): each knob value "
        f"changed alone from its mode's base config (fp32, the global batch split between 2 ranks, no compile, "
        f"no loader workers), each a real trial of 2 ranks (gloo on a CPU, NCCL on GPUs), "
        f"{data['rounds']} rounds in shuffled order, medians. The held-out loss is after the trial's drift steps: "
        "a knob that only changes how the gradients travel keeps it.",
        "",
        "| workload | parallel | knob | samples/s | over the base | held-out loss |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for workload, modes in data["workloads"].items():
        for mode, found in modes.items():
            for name, row in found["variants"].items():
                if row["samples_per_s"] is None:
                    lines.append(f"| {workload} | {mode} | {name} | failed: {row['failed']} | | |")
                    continue
                lines.append(
                    f"| {workload} | {mode} | {name} | {row['samples_per_s']:,.0f} | {row['ratio']:.2f}x | "
                    f"{row['heldout_loss']:.6f} |"
                )
            for name, reason in found["not_run"].items():
                lines.append(f"| {workload} | {mode} | {name} | not run: {reason} | | |")
    return [*lines, ""]


def warm_start(data: dict[str, Any]) -> list[str]:
    """Trials to the bar from a related study's best configs, against a cold start."""
    lines = [
        "### Warm start: `python benchmarks/warm_start.py`",
        "",
        f"Trials the default sampler needs until a feasible trial reaches {data['target']:.0%} of the grid's best "
        f"(the baseline counted), cold and with `--warm-start` from the source grid's study, replayed over "
        f"{data['seeds']} seeds against recorded grids (`results/warm_start.json`).",
        "",
        "| grid | warm-started from | configs taken (dropped) | cold: median (p25-p75) | warm: median (p25-p75) |",
        "|---|---|---|---|---|",
    ]
    for pair in data["pairs"]:
        cold, warm = pair["cold"], pair["warm"]
        dropped = sum(pair["dropped"].values())
        why = ", ".join(pair["dropped"])
        lines.append(
            f"| {pair['target']} ({pair['grid_configs_run']} configs) | {pair['source']} ({pair['relation']}) | "
            f"{len(pair['warm_configs'])}" + (f" ({dropped}: {why})" if dropped else "") + " | "
            f"{cold['trials_median']:g} ({cold['trials_p25']:g}-{cold['trials_p75']:g}) | "
            f"{warm['trials_median']:g} ({warm['trials_p25']:g}-{warm['trials_p75']:g}) |"
        )
    return [*lines, ""]


def _interval_text(data: dict[str, Any] | None) -> str:
    if not data:
        return "-"
    return f"{times(data['estimate'])} ({data['low']:.2f}-{data['high']:.2f}x, {data['rounds']} rounds)"


def promise_table(quickstart: dict[str, Any], source: str) -> list[str]:
    """The export's speedup and interval, and each apply's promise check against it."""
    apply = quickstart["apply"]
    export = apply.get("export_interval")
    stated = (
        f", 90% interval {export['low']:.2f}-{export['high']:.2f}x from {export['rounds']} rounds, "
        f"half-width {_half_width(export):.1%}"
        if export
        else ", no interval (one round)"
    )
    lines = [
        f"The promise (`{source}`, key `apply`): best.yaml says {times(apply['export_speedup'])}{stated}. "
        f"Each `autotuner apply` ran the config over at least {apply['steps']} steps with the baseline "
        "beside it (the whole run's speedup), then its promise check: rounds of both configs measured as the "
        "study re-measured them"
        + (
            ", until they decided the promise or at the cap: "
            + _verdict_rule(apply)
            + ": "
            + ", ".join(f"{verdicts.count(v)} {v}" for v in ("kept", "not kept", "undecided") if verdicts.count(v))
            + f" of {len(verdicts)}."
            + _rejudged(apply)
            if (verdicts := apply.get("verdicts")) is not None
            else f", until its interval was +-5% or at the cap. They agree when the interval of apply's speedup over "
            f"the export's holds 1: {apply['agreed']} of {len(apply['agree'])} agreed."
        ),
        "",
        "| apply | speedup here, 90% interval (rounds) | "
        + (
            "judged: here at the look's level, against what was promised"
            if "promised" in apply
            else "here over the export, its interval"
        )
        + " | "
        + ("verdict" if verdicts is not None else "agrees")
        + " | whole run's speedup | throughput over the study's |",
        "|---|---|---|---|---|---|",
    ]
    said = verdicts if verdicts is not None else ["yes" if agree else "no" for agree in apply["agree"]]
    judged = (
        [
            f"{checked['low']:.2f}-{checked['high']:.2f}x ({checked['level']:.1%}) "
            f"in {promised[0]:.2f}-{promised[1]:.2f}x"
            if checked and promised
            else "-"
            for checked, promised in zip(apply["checked"], apply["promised"], strict=True)
        ]
        if "promised" in apply
        else [
            f"{a['estimate']:.3f} ({a['low']:.3f}-{a['high']:.3f}, {a['level']:.1%})" if a else "-"
            for a in apply["agreements"]
        ]
    )
    for k, (interval, versus, verdict, whole, ratio) in enumerate(
        zip(apply["intervals"], judged, said, apply["speedups_delivered"], apply["ratios"], strict=True), start=1
    ):
        shown = f"{verdict or '-'} | {times(whole)} | {ratio:.2f}"
        lines.append(f"| {k} | {_interval_text(interval)} | {versus} | {shown} |")
    return lines


def _rejudged(apply: dict[str, Any]) -> str:
    """For applies judged by the rule before (the interval of here over the export within the
    tolerance): the verdicts today's rule (`judge` against `Promised`) gives their recorded rounds,
    looking after each from the second as `autotuner apply` does."""
    if "promised" in apply or not apply.get("export_interval") or not apply.get("rounds"):
        return ""
    from autotuner.measurement.interval import Interval
    from autotuner.results.promise import Promised, first_decision

    export = Interval.from_dict(apply["export_interval"])
    promised = Promised.of(export, apply["export_speedup"], apply["tolerance"])
    assert promised is not None
    verdicts = [first_decision(rounds, export, promised, len(rounds)).value for rounds in apply["rounds"]]
    return (
        f" Their recorded rounds judged by today's rule (kept when apply's interval lies within the export's "
        f"widened by {apply['tolerance']:.0%} either way, {promised.text()}): "
        + ", ".join(f"{verdicts.count(v)} {v}" for v in ("kept", "not kept", "undecided") if verdicts.count(v))
        + "."
    )


def _verdict_rule(apply: dict[str, Any]) -> str:
    """How the applies' verdicts were reached: the rule of the tool that measured them."""
    if "promised" in apply:
        return (
            f"kept when apply's interval lies within the export's widened by {apply['tolerance']:.0%} either way, "
            "not kept when wholly outside it, else undecided"
        )
    return (
        f"kept when the interval of apply's speedup over the export's lies within +-{apply['tolerance']:.0%}, "
        "not kept when wholly outside, else undecided"
    )


def _half_width(interval: dict[str, Any]) -> float:
    return float((interval["high"] - interval["low"]) / 2 / interval["estimate"])


GPU_PARTS = ("study", "apply", "alternatives", "jax", "tests")
"""benchmarks/gpu.py's parts, each writing results/gpu-<part>.json (`tests`: a lease's `gpu` tests)."""
GPU_TARGETS = {"speedup": (3.0, 5.0), "mfu": (0.45, 0.50), "promise": 0.05}
"""What the GPU run is to reach on one H100: tuned over baseline on gpt >= 3x (stretch 5x), the
tuned gpt's MFU >= 45% (stretch 50%), the promise within 5% (as benchmarks/gpu.py's TARGETS)."""


def _met(value: float | None, bar: float, stretch: float | None = None) -> str:
    if value is None:
        return "**not measured**"
    met = "met" if value >= bar else "**not met**"
    if stretch is not None:
        met += f" (stretch: {'met' if value >= stretch else 'not met'})"
    return met


def _joules(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g} J"


def _gpu_knobs(config: dict[str, Any] | None) -> str:
    """A config of either backend: `bf16, batch 64x1, workers 2, compile default` (or `jit on`)."""
    if not config:
        return "-"
    batch = f"{config['batch_size']}x{config.get('accumulation', 1)}"
    last = f"jit {config['jit']}" if "jit" in config else f"compile {config.get('compile', '-')}"
    return f"{config['precision']}, batch {batch}, workers {config['workers']}, {last}"


def _gpu_heading(data: dict[str, Any], title: str) -> list[str]:
    versions = (data.get("environment") or {}).get("versions") or {}
    details = ", ".join(f"{k} {v}" for k, v in versions.items() if k in ("cuda", "cudnn", "jaxlib") and v)
    driver = (data.get("environment") or {}).get("driver")
    where = data.get("machine") or data.get("device_name") or "an unnamed device"
    dry = " A `--tiny` dry run: its figures say nothing of a GPU." if data.get("tiny") else ""
    stopped = " It was stopped at its time limit (what had finished is kept)." if "stopped" in data["status"] else ""
    error = f" It ended with an error: {data['error'].splitlines()[0][:300]}" if data.get("error") else ""
    changes = "; ".join(data.get("changes") or [])
    changed = f" Changed from the spec: {changes}." if changes else ""
    return [
        f"#### {title}: `{data.get('invocation') or 'python benchmarks/gpu.py --part ' + data['part']}`",
        "",
        f"On {where} ({data.get('device') or data.get('device_requested')}"
        + (f", driver {driver}" if driver else "")
        + (f", {details}" if details else "")
        + f"); the part took {_seconds(data.get('wall_s') or 0.0)}.{dry}{changed}{stopped}{error}",
        "",
    ]


def _gpu_study(data: dict[str, Any], title: str, targets: bool) -> list[str]:
    lines = _gpu_heading(data, title)
    base, tuned = data.get("baseline") or {}, data.get("best") or {}
    energy = data.get("energy") or {}
    outcomes = ", ".join(f"{name} {count}" for name, count in (data.get("outcomes") or {}).items())
    search = next(iter(data.get("commands") or []), {})
    bar, stretch = GPU_TARGETS["speedup"]
    mfu_bar, mfu_stretch = GPU_TARGETS["mfu"]
    rows = [
        ("search", f"{_seconds(search.get('wall_s') or 0.0)}, {data.get('trials_ran', 0)} trials ({outcomes})", "", ""),
        (
            "baseline",
            f"{_gpu_knobs(base.get('config'))}: {rate(base.get('throughput'))}"
            + (f" ({base['tokens_per_s']:,.0f} tokens/s)" if base.get("tokens_per_s") else ""),
            "",
            "",
        ),
        (
            "tuned",
            f"{_gpu_knobs(tuned.get('config'))}: {rate(tuned.get('throughput'))}"
            + (f" ({tuned['tokens_per_s']:,.0f} tokens/s)" if tuned.get("tokens_per_s") else "")
            + f", drift {percent(tuned.get('drift'))}",
            "",
            "",
        ),
        (
            "tuned over baseline",
            times(data.get("speedup")),
            f">= {bar:g}x (stretch {stretch:g}x)" if targets else "",
            _met(data.get("speedup"), bar, stretch) if targets else "",
        ),
        (
            "tuned MFU",
            percent(data.get("mfu"), 1),
            f">= {mfu_bar:.0%} (stretch {mfu_stretch:.0%})" if targets else "",
            _met(data.get("mfu"), mfu_bar, mfu_stretch) if targets else "",
        ),
        (
            "energy per sample: tuned / baseline / lowest feasible",
            f"{_joules(energy.get('best_j_per_sample'))} / {_joules(energy.get('baseline_j_per_sample'))} / "
            f"{_joules(energy.get('lowest_j_per_sample'))}"
            + (" (an objective of the study)" if energy.get("objective") else ""),
            "",
            "",
        ),
    ]
    lines += [
        "| figure | value | target (one H100) | met |" if targets else "| figure | value | | |",
        "| --- | --- | --- | --- |",
        *(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows),
        "",
        "| trial | config | outcome | samples/s | MFU | energy per sample | warm-up | reason |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for t in data.get("trials") or []:
        reason = (t.get("reason") or "").replace("|", "/").splitlines()[0][:120] if t.get("reason") else ""
        measured = rate(t.get("throughput")) if t["outcome"] == "ok" else "-"
        warmup = _seconds(t["warmup_s"]) if t.get("warmup_s") else "-"
        lines.append(
            f"| #{t['trial']}{' (baseline)' if t.get('role') == 'baseline' else ''} | {_gpu_knobs(t.get('config'))} | "
            f"{t['outcome']} | {measured} | {percent(t.get('mfu'), 1)} | {_joules(t.get('energy_j_per_sample'))} | "
            f"{warmup} | {reason} |"
        )
    return [*lines, ""]


def _checked_text(promise: dict[str, Any]) -> str:
    checked, interval = promise.get("speedup_checked"), promise.get("interval_checked")
    if checked is None:
        return "-"
    here = times(checked) + (f" ({interval[0]:.2f}-{interval[1]:.2f}x" if interval else " (no interval")
    here += f", {promise.get('rounds_checked')} rounds)"
    return here + f" against {_interval_text(promise.get('export_interval'))}"


def _gpu_apply(data: dict[str, Any]) -> list[str]:
    lines = _gpu_heading(data, "`autotuner apply` of the gpt study's winner")
    applied, promise = data.get("apply") or {}, data.get("promise") or {}
    ratio = promise.get("ratio")
    within = None if ratio is None else abs(ratio - 1)
    target = GPU_TARGETS["promise"]
    rows = [
        ("the export's speedup (best.yaml)", times(promise.get("export_speedup")), "", ""),
        (
            "delivered by `autotuner apply` (the export's baseline run as many optimizer steps)",
            times(promise.get("speedup_delivered")),
            "",
            "",
        ),
        (
            "the promise: delivered over the export's",
            "-" if ratio is None else f"{ratio:.3f}",
            f"within {target:.0%}",
            "**not measured**" if within is None else "met" if within <= target else "**not met**",
        ),
        (
            "the promise check: speedup here, 90% interval (rounds), against the export's interval",
            _checked_text(promise) + (f": {promise['verdict']}" if promise.get("verdict") else ""),
            "kept (older results: they agree)",
            "**not measured**" if promise.get("agrees") is None else "met" if promise["agrees"] else "**not met**",
        ),
        (
            "the config's throughput here / in the study",
            f"{rate(applied.get('throughput_here'))} / {rate(applied.get('throughput_study'))}",
            "",
            "",
        ),
        (
            "optimizer steps run: config / baseline",
            f"{applied.get('steps_run', '-')} / {applied.get('baseline_steps_run', '-')}",
            "",
            "",
        ),
    ]
    return [
        *lines,
        "| figure | value | target (one H100) | met |",
        "| --- | --- | --- | --- |",
        *(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows),
        "",
    ]


def _gpu_alternatives(data: dict[str, Any]) -> list[str]:
    lines = _gpu_heading(data, "The tuned config against the alternatives")
    done = {name: w for name, w in (data.get("workloads") or {}).items() if not w.get("error")}
    if done:
        tables = alternatives({**data, "workloads": done, "machine": data.get("machine") or "-"})
        lines += tables[tables.index("") + 3 :]  # its tables, without its heading and CPU paragraph
    for name, w in (data.get("workloads") or {}).items():
        if w.get("error"):
            lines += [f"{name}: not measured: {w['error'].splitlines()[0][:300]}", ""]
    resumed = [name for name, w in done.items() if (w.get("search") or {}).get("resumed")]
    if resumed:
        lines += [
            f"The search of {', '.join(resumed)} resumed the `--part study` study (its wall time is the resumption's).",
            "",
        ]
    return lines


def _gpu_tests(data: dict[str, Any]) -> list[str]:
    lines = _gpu_heading(data, "The `gpu` tests")
    selection = data.get("selection") or {}
    counts = ", ".join(f"{n} {o}" for o, n in sorted((data.get("counts") or {}).items())) or "no test ran"
    lines += [f"`pytest -m gpu {selection.get('file', '')} -k '{selection.get('expression', '')}'`: {counts}.", ""]
    if data.get("tests"):
        lines += ["| test | outcome | seconds | message |", "| --- | --- | --- | --- |"]
        for test in data["tests"]:
            seconds = "-" if test.get("time_s") is None else f"{test['time_s']:.1f}"
            message = (test.get("message") or "").replace("|", "/").replace("\n", " ")[:160]
            lines.append(f"| `{test['test']}` | {test['outcome']} | {seconds} | {message} |")
        lines.append("")
    return lines


def lease(data: dict[str, Any]) -> list[str]:
    """The plan of `python benchmarks/gpu.py --lease OUT` (or `--lease-more`) and what each step did."""
    dry = (
        " A `--tiny` dry run: its budgets are the dry run's, its figures say nothing of a GPU."
        if data.get("tiny")
        else ""
    )
    lines = [
        f"#### The lease: `{data.get('invocation') or 'python benchmarks/gpu.py --' + data['mode']}`",
        "",
        f"{len(data['steps'])} steps, budgets {_seconds(data['budgets_sum_s'])} of at most "
        f"{_seconds(data['total_budget_s'])} with the script's own {_seconds(data['script_reserve_s'])}; "
        f"the lease took {_seconds(data.get('wall_s') or 0.0)}, {data.get('status')}.{dry}",
        "",
        "| step | what | budget | given | took | outcome | file |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for step in data["steps"]:
        given, took = step.get("budget_given_s"), step.get("wall_s")
        outcome = step["status"] + (f": {step['error'][:160]}" if step.get("error") else "")
        lines.append(
            f"| {step['step']} | {step['what']} | {_seconds(step['budget_s'])} | "
            f"{'-' if given is None else _seconds(given)} | {'-' if took is None else _seconds(took)} | "
            f"{outcome} | `{step['file']}` |"
        )
    return [*lines, ""]


def gpu(results: dict[str, dict[str, Any]], plan: dict[str, Any] | None = None) -> list[str]:
    """The tables of benchmarks/gpu.py's result files (`results`: part -> its file's data; `plan`:
    a lease's `lease.json`)."""
    lines = [
        "### On one GPU: `python benchmarks/gpu.py`",
        "",
        "Each part is one command (see **GPU** above), its figures read from the study's storage "
        "(`results/gpu-<part>.json`). The targets are for one H100.",
        "",
    ]
    if plan:
        lines += lease(plan)
    if data := results.get("study"):
        lines += _gpu_study(data, "The gpt study (full `pytorch` preset, energy objective)", targets=True)
    if data := results.get("apply"):
        lines += _gpu_apply(data)
    if data := results.get("alternatives"):
        lines += _gpu_alternatives(data)
    if data := results.get("jax"):
        lines += _gpu_study(data, "The JAX gpt study (full `jax` preset)", targets=False)
    if data := results.get("tests"):
        lines += _gpu_tests(data)
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write benchmarks/README.md's results section from the result files.")
    parser.add_argument("--results", default=str(RESULTS), help="the result files' folder (default benchmarks/results)")
    parser.add_argument("--readme", default=str(README), help="the file to rewrite (default benchmarks/README.md)")
    args = parser.parse_args(argv)
    folder, readme = Path(args.results), Path(args.readme)
    sections = []
    if data := _load("fidelity.json", folder):
        sections += fidelity(data, _load("quickstart.json", folder))
    quickstarts = {path.stem: json.loads(path.read_text()) for path in sorted(folder.glob("quickstart*.json"))}
    coverages = {path.name: json.loads(path.read_text()) for path in sorted(folder.glob("interval_coverage*.json"))}
    if coverages or any(q.get("apply", {}).get("intervals") for q in quickstarts.values()):
        sections += promise(coverages, quickstarts)
    for source in ("interval_procedure.json", "interval_procedure-replay.json"):
        if data := _load(source, folder):
            sections += interval_procedure(data, source)
    if data := _load("inference.json", folder):
        sections += inference(data)
    for source in ("parallel_knobs-cpu.json", "parallel_knobs-gpu.json"):
        if data := _load(source, folder):
            sections += parallel_knobs(data, source)
    if data := _load("search_efficiency.json", folder):
        sections += search_efficiency(data)
    if data := _load("warm_start.json", folder):
        sections += warm_start(data)
    if data := _load("alternatives.json", folder):
        sections += alternatives(data)
    if data := _load("overhead.json", folder):
        sections += overhead(data)
    if data := _load("run_length.json", folder):
        sections += run_length(data)
    plan = _load("lease.json", folder)  # a lease's folder (`gpu.py --lease OUT`): its plan, step by step
    if (gpu_results := {part: data for part in GPU_PARTS if (data := _load(f"gpu-{part}.json", folder))}) or plan:
        sections += gpu(gpu_results, plan)
    text = readme.read_text()
    if START not in text:
        text = f"{text.rstrip()}\n\n## Results\n\n{START}\n{END}\n"
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    readme.write_text(f"{head}{START}\n\n" + "\n".join(sections) + f"\n{END}{tail}")
    print(readme)


if __name__ == "__main__":
    main()
