"""The tables of benchmarks/README.md, written from the result files alone.

    python benchmarks/tables.py

Every figure in the README's results section comes from a file under benchmarks/results/ that a
benchmark script wrote; this rewrites that section (between its two markers) from them, so no
figure is typed by hand. A result file that is missing leaves its table out.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from _harness import RESULTS

README = Path(__file__).parent / "README.md"
START = "<!-- results: written by python benchmarks/tables.py from benchmarks/results/; do not edit by hand -->"
END = "<!-- results end -->"


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}/s"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _drift(value: float | str | None) -> str:
    if value is None:
        return "-"
    value = float(value)
    return "inf" if math.isinf(value) else f"{value:.3%}"


def _seconds(value: float) -> str:
    return f"{value * 1000:,.0f} ms" if value < 1 else f"{value:,.1f} s"


def _config(config: dict[str, Any] | None) -> str:
    if not config:
        return "-"
    batch = f"{config['batch_size']}x{config.get('accumulation', 1)}"
    return f"{config['precision']}, batch {batch}, workers {config['workers']}, compile {config['compile']}"


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
        "search's. The samplers are built as `autotuner search` builds them for the spec's `sampler` name "
        "(`autotuner.sampler.make_sampler`); variants change one thing in the default.",
        "",
    ]
    for name, grid in grids.items():
        best = grid["best"]
        lines += [
            f"**{name}** (`{grid['spec']}`: {grid['grid_configs']} configs, {grid['grid_configs_run']} run; "
            f"recorded on {grid['machine']}, load average {grid['load_1m_median']:.1f} (median over its trials), "
            f"each config the median of {grid['repeats']} sweep(s), in {_seconds(grid['record_wall_s'])}). "
            f"Best: {_config(best['config'])}, {_rate(best['throughput'])}, "
            f"{_ratio(grid['best_over_baseline'])} the baseline, drift {_drift(best['drift'])}. Configs at "
            f"{data['target']:.0%} of it: {grid['configs_at_bar']}; at {grid['close_bar_share']:.0%}: "
            f"{grid['configs_at_close_bar']}. Random search's expected count: {grid['random_expected_trials']:.1f}; "
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
            f"fewer trials than random search: {_yes(target['beats_random'])}).",
            "",
        ]
    return lines


def alternatives(data: dict[str, Any]) -> list[str]:
    lines = [
        "### Tuned against the alternatives: `python benchmarks/alternatives.py`",
        "",
        f"On {data['machine']}{_load_note(data)}; the whole run took {_seconds(data['wall_s'])}. Each config "
        f"measured {data['rounds']} time(s) in turn after the search: median throughput, largest drift, and "
        "the first round's warm-up (where `torch.compile` goes; its cache starts empty); drift against the "
        "study's fp32 reference.",
        "",
        "| workload | config | knobs | samples/s | over baseline | drift | feasible | warm-up (first round) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, w in data["workloads"].items():
        for label, row in w["configs"].items():
            lines.append(
                f"| {name} | {label} | {_config(row['config'])} | {_rate(row['throughput'])} | "
                f"{_ratio(row['over_baseline'])} | {_drift(row['drift'])} | {_yes(row['feasible'])} | "
                f"{_seconds(row['warmups_s'][0])} |"
            )
    lines += [
        "",
        "| workload | search: wall time | trials (space) | speedup in the study | finders (probes) | any OOM |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, w in data["workloads"].items():
        s, f = w["search"], w["finders"]
        finders = (
            f"Lightning {f['lightning_power']['batch_size']} ({len(f['lightning_power']['probes'])}), "
            f"Accelerate {f['accelerate']['batch_size']} ({len(f['accelerate']['probes'])})"
        )
        lines.append(
            f"| {name} | {_seconds(s['wall_s'])} | {s['trials_ran']} ({s['space_size']}) | "
            f"{_ratio(s['speedup_in_study'])} | {finders} | {'yes' if f['any_oom'] else 'no'} |"
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
            _ratio(study["wall_over_measured_windows"]),
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
        ("`autotuner.study.record` on SQLite (median)", _seconds(books["record_s"]["median"])),
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
    ]


def fidelity(data: dict[str, Any], quickstart: dict[str, Any] | None) -> list[str]:
    def rate(config: str, value: float) -> str:
        return f"{value:,.0f} matmuls/s" if config.startswith("machine floor") else _rate(value)

    lines = [
        "### Measurement fidelity: `python benchmarks/fidelity.py`, and the promise: `python benchmarks/quickstart.py`",
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
        speedups = ", ".join(f"{s:.2f}x" for s in measured["speedup_runs"])
        moved = f"{measured['speedup_gap']['median']:.1%} ({measured['speedup_gap_max']:.1%})"
        for config, summary in measured["configs"].items():
            gap = summary["trial_gap"]
            lines.append(
                f"| {label} | {config} | {rate(config, statistics.median(summary['throughputs']))} | "
                f"{gap['median']:.1%} ({summary['trial_gap_max']:.1%}) | {summary['spread_all_runs']:.1%} | "
                f"{speedups} | {moved} | {measured['steal_share']:.1%} |"
            )
            label = speedups = moved = ""
    if quickstart and quickstart.get("apply") and quickstart["apply"].get("promise_ratios"):
        apply = quickstart["apply"]
        delivered = ", ".join(f"{s:.2f}x" for s in apply["speedups_delivered"])
        ratios = ", ".join(f"{r:.3f}" for r in apply["promise_ratios"])
        ran = apply.get("steps_run") or [apply["steps"]]
        steps = f"{min(ran):,}-{max(ran):,}" if min(ran) != max(ran) else f"{ran[0]:,}"
        slowdowns = [s for s in apply.get("slowdowns") or [] if s is not None]
        lines += [
            "",
            f"The promise (`results/quickstart.json`, key `apply`): best.yaml says "
            f"{_ratio(apply['export_speedup'])}; `autotuner apply` (at least {apply['steps']} steps, {steps} once "
            f"its windows were lengthened, the baseline in lockstep with it over as many steps in windows of its own "
            f"length) delivered {delivered}: ratios {ratios}, {apply['promise_within_5_percent']} of "
            f"{len(apply['promise_ratios'])} within 5%."
            + (
                " The same two configs measured the study's way right before each apply (the speedup now): "
                + ", ".join(_ratio(n) for n in apply["speedups_now"] if n)
                + "; apply over now "
                + ", ".join(f"{r:.3f}" for r in apply["apply_over_now"] if r)
                + " (how far apply measures from the study's way), now over the export "
                + ", ".join(f"{r:.3f}" for r in apply["now_over_export"] if r)
                + " (how far the machine moved the speedup since the study)."
                if apply.get("speedups_now")
                else ""
            )
            + (
                " The tuned config's last quarter of windows against its first: "
                + ", ".join(f"{-s:+.0%}" for s in slowdowns)
                + " in throughput."
                if slowdowns
                else ""
            ),
        ]
    return [*lines, ""]


def main() -> None:
    sections = []
    if data := _load("fidelity.json"):
        sections += fidelity(data, _load("quickstart.json"))
    if data := _load("search_efficiency.json"):
        sections += search_efficiency(data)
    if data := _load("alternatives.json"):
        sections += alternatives(data)
    if data := _load("overhead.json"):
        sections += overhead(data)
    text = README.read_text()
    if START not in text:
        text = f"{text.rstrip()}\n\n## Results\n\n{START}\n{END}\n"
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    README.write_text(f"{head}{START}\n\n" + "\n".join(sections) + f"\n{END}{tail}")
    print(README)


if __name__ == "__main__":
    main()
