"""What the host allocator's settings do to a speedup measured in lockstep rounds: the trial
processes' own (`autotuner.measurement.allocator`, set by the fork server) against glibc's
defaults, in alternating blocks of rounds.

    python benchmarks/allocator.py [--blocks 4] [--rounds 6] [--winner precision=bf16,batch_size=256]
        [--out allocator-amd.json]

Each block is one run of `benchmarks/interval_coverage.py` (`--rounds` rounds of the quickstart's
baseline and winner, a fresh process of each a round, measured together as re-measurement
measures them), in a fresh interpreter, so a fresh fork server: the settings are a process's from
its start. "defaults" runs it with `GLIBC_TUNABLES=glibc.malloc.perturb=0` (glibc's default
value of a malloc tunable: the caller set its own, so the fork server leaves glibc's defaults as
they are); "steady" without it. The blocks alternate, defaults first, so a machine's phases fall
on both. For each: the rounds' speedup (geometric mean) and its log sd, each block's speedup and
how far the blocks' stand apart ((max - min) / median), and each config's throughput with its
log sd over the rounds. Writes benchmarks/results/allocator.json (or `--out`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _harness import write_results

HERE = Path(__file__).parent
ARMS = {"defaults": {"GLIBC_TUNABLES": "glibc.malloc.perturb=0"}, "steady": {}}


def block(arm: str, rounds: int, winner: str, folder: Path, index: int) -> dict[str, Any]:
    """One block of `rounds` rounds under `arm`'s settings: the run's recorded rounds."""
    out = folder / f"{arm}-{index}.json"
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"} | ARMS[arm]
    command = [sys.executable, str(HERE / "interval_coverage.py"), "--rounds", str(rounds), "--out", str(out)]
    if winner:
        command += ["--winner", winner]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"block {index} ({arm}) failed: {done.stderr[-2000:]}")
    data = json.loads(out.read_text())
    print(f"{arm} block {index}: {len(data['ratios'])} rounds, speedup {data['speedup']:.3f}x")
    return {key: data[key] for key in ("ratios", "throughputs", "machine", "configs")}


def summary(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """An arm's figures over its blocks."""
    ratios = [r for b in blocks for r in b["ratios"]]
    logs = [math.log(r) for r in ratios]
    means = [math.exp(statistics.fmean(math.log(r) for r in b["ratios"])) for b in blocks]
    winner = [x for b in blocks for x in b["throughputs"]["winner"]]
    base = [x for b in blocks for x in b["throughputs"]["baseline"]]
    return {
        "rounds": len(ratios),
        "speedup": math.exp(statistics.fmean(logs)),
        "round_log_sd": statistics.stdev(logs),
        "block_speedups": means,
        "blocks_apart": (max(means) - min(means)) / statistics.median(means),
        "winner_per_s": math.exp(statistics.fmean(math.log(x) for x in winner)),
        "winner_log_sd": statistics.stdev(math.log(x) for x in winner),
        "baseline_per_s": math.exp(statistics.fmean(math.log(x) for x in base)),
        "baseline_log_sd": statistics.stdev(math.log(x) for x in base),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=4, help="blocks of each arm")
    parser.add_argument("--rounds", type=int, default=6, help="rounds a block")
    parser.add_argument("--winner", default="", help="the winner's knobs that differ from the baseline")
    parser.add_argument("--out", default="allocator.json")
    args = parser.parse_args()
    found: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as folder:
        for index in range(1, args.blocks + 1):
            for arm in ARMS:
                found[arm].append(block(arm, args.rounds, args.winner, Path(folder), index))
    arms = {arm: summary(blocks) for arm, blocks in found.items()}
    for arm, s in arms.items():
        print(
            f"{arm}: speedup {s['speedup']:.3f}x, a round's log sd {s['round_log_sd']:.3f}, blocks "
            f"{', '.join(f'{m:.2f}x' for m in s['block_speedups'])} ({s['blocks_apart']:.1%} apart); winner "
            f"{s['winner_per_s']:,.0f}/s (log sd {s['winner_log_sd']:.3f}), baseline {s['baseline_per_s']:,.0f}/s "
            f"(log sd {s['baseline_log_sd']:.3f})"
        )
    first = found["steady"][0]
    data = {
        "machine": first["machine"],
        "configs": first["configs"],
        "arms": {arm: {"environment": ARMS[arm], **arms[arm]} for arm in ARMS},
        "blocks": {arm: [b["ratios"] for b in blocks] for arm, blocks in found.items()},
    }
    print(f"wrote {write_results(args.out, data)}")


if __name__ == "__main__":
    main()
