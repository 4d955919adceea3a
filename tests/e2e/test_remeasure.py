"""Re-measurement: its rounds, which configs stay in them and when the figures are settled, how
many trial processes are alive at once, and how a group that the memory cannot hold is split,
the baseline beside the configs in every part."""

from __future__ import annotations

import itertools
import re
import statistics
from pathlib import Path

import pytest
import yaml

from autotuner.results.records import records, remeasurements, speedup
from autotuner.search.remeasure import (
    settled,
)
from tests.support.studies import SMALL_SPEC, load_study, run_cli, write_spec


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A small study whose re-measurement may keep only 2 processes alive at once."""
    workdir = tmp_path_factory.mktemp("split")
    # remeasure_top 3 of 3 trials: both configs and the baseline whatever order a busy machine gives them
    budget = {"trials": 3, "remeasure_top": 3, "remeasure_runs": 2, "remeasure_windows": 3, "remeasure_group": 2}
    done = run_cli("search", "--spec", str(write_spec(workdir, budget=budget)), cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    return workdir, done.stdout


def test_a_split_remeasurement_measures_the_baseline_beside_every_config(split: tuple[Path, str]) -> None:
    workdir, stdout = split
    study = load_study(workdir)
    stored = remeasurements(study)
    configs = [n for n in stored if n != 0]
    assert configs and 0 in stored
    # two configs and the baseline do not fit in 2 processes; but configs behind by more than
    # pruning.TRIAL_NOISE are not re-measured with the first, and one that comes in later, within
    # the noise, is re-measured alone beside the baseline: a split needs two configs at least
    split = "in groups of at most 2 processes (budget.remeasure_group)" in stdout
    assert not split or len(configs) > 1, stdout
    for number in configs:
        claim = stored[number]
        # in lockstep with the baseline alone, once a round: its runs, and as many of the baseline's beside it
        rounds = len(claim.windows)
        assert claim.lockstep is True and claim.group == [0, number] and 1 <= rounds <= 2
        assert [len(w) for w in claim.windows] == [3] * rounds and len(claim.baseline_windows) == 3 * rounds
    trials = {t.number: t for t in records(study)}
    export = yaml.safe_load((workdir / "runs" / "small" / "best.yaml").read_text())
    winner = stored[export["study"]["trial"]]
    assert export["speedup"] == pytest.approx(
        statistics.median(itertools.chain(*winner.windows)) / statistics.median(winner.baseline_windows)
    )
    assert export["speedup"] == pytest.approx(speedup(trials[export["study"]["trial"]], None))


def test_rounds_go_on_while_the_baselines_processes_disagree(tmp_path: Path) -> None:
    # every other process of the baseline (micro-batch 8) is several times slower: no two in a row
    # agree (with 0.1 ms a pass, half as fast, a busy suite once measured a fast process as a slow one)
    spec = write_spec(
        tmp_path,
        workload="tests.support.study_workloads:paced_processes",
        # 0.5 ms more a forward pass for every other process of the baseline
        workload_args={"folder": str(tmp_path), "paces": {8: [0.0, 0.0005 / 8]}, **SMALL_SPEC["workload_args"]},
        baseline={"precision": "fp32", "batch_size": 8, "workers": 0, "compile": "none"},
        # fp32 alone: the space holds the baseline's micro-batch too, and a bf16 8 trial's processes
        # would take places among the baseline's
        space={"precision": ["fp32"], "batch_size": [32, 64], "workers": [0], "compile": ["none"]},
        budget={"trials": 3, "remeasure_top": 1, "remeasure_runs": 3, "remeasure_windows": 3},
    )
    done = run_cli("search", "--spec", str(spec), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    study = load_study(tmp_path)
    stored = remeasurements(study)
    # a clear winner, yet every round of the cap: the baseline's figure never settles
    assert len(stored[0].throughputs) == 3, (stored, done.stdout)
    # the leader measured beside it, for as many rounds
    assert any(len(r.throughputs) == 3 and r.group == [0, n] for n, r in stored.items() if n != 0), stored
    printed = " ".join(done.stdout.split())
    # the leader's own processes may disagree too on a busy machine: "of #n and of the baseline"
    cap = r"after 3 rounds \(budget\.remeasure_runs\) the last two processes of (#\d+ and of )?the baseline are "
    assert re.search(cap + r"more than 6% apart", printed), printed
    runs = [t.trial_throughput for t in records(study) if t.number == 0] + stored[0].throughputs
    assert not any(settled(runs[k : k + 2]) for k in range(len(runs) - 1)), runs


def test_a_newcomer_after_rounds_that_ran_to_the_cap_is_judged_in_one_round(tmp_path: Path) -> None:
    # Every process sleeps a pace a sample, so that its speed is about the pace's, whatever the
    # machine, and the speeds that decide are two times apart or more. The baseline's processes
    # (micro-batch 8: the reference's two, the baseline's trial, then its re-measurement's)
    # alternate between two paces ten times apart, the first fast, and the top config's (micro-batch
    # 64) between two three times apart: the first re-measurement runs every round of the cap (2)
    # unsettled, and their processes spread far. The other config's trial (micro-batch 32) is about
    # a quarter as fast as the top's (1,000 against 3,000-4,000 samples/s in five runs): not the
    # top, yet within that spread, so it comes in after. Its re-measurement's process is as fast as
    # the top's best, beside the baseline's next process, a slow one: it leads. Unsettled (its trial
    # and its process about three times apart), it would run a second round, as the first configs
    # did; the budget has none left: it is judged in one.
    paces = {8: [0.0005, 0.005], 64: [0.0002, 0.0006], 32: [0.0008, 0.0002]}
    spec = write_spec(
        tmp_path,
        workload="tests.support.study_workloads:paced_processes",
        workload_args={"folder": str(tmp_path), "paces": paces, **SMALL_SPEC["workload_args"]},
        baseline={"precision": "fp32", "batch_size": 8, "workers": 0, "compile": "none"},
        space={"precision": ["fp32"], "batch_size": [32, 64], "workers": [0], "compile": ["none"]},
        budget={"trials": 3, "remeasure_top": 1, "remeasure_runs": 2, "remeasure_windows": 3},
    )
    done = run_cli("search", "--spec", str(spec), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    study = load_study(tmp_path)
    stored = remeasurements(study)
    number = {t.config["batch_size"]: t.number for t in records(study)}
    top, newcomer = number[64], number[32]
    assert sorted(stored) == [0, 1, 2], stored  # the baseline, the top config, then the other
    assert stored[top].group == [0, top] and stored[newcomer].group == [0, newcomer], stored
    assert len(stored[0].throughputs) == 2 and len(stored[top].throughputs) == 2, stored
    assert len(stored[newcomer].throughputs) == 1, stored  # not 2 more rounds
    printed = " ".join(done.stdout.split())
    assert "after 1 round (budget.remeasure_runs, what the configs re-measured before left of it)" in printed, printed
