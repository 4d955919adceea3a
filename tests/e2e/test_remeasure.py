"""Re-measurement end to end: a study whose memory holds only two processes at once measures its
configs in parts, the baseline beside each, in lockstep. Its rounds (which configs stay in them,
when the leader's interval stops them, a newcomer after the cap) are decided on scripted processes in
tests/search/test_remeasure.py."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import yaml

from autotuner.measurement.interval import stated_interval
from autotuner.results.records import records, remeasurements, speedup
from autotuner.results.standings import joint_among
from tests.support.studies import load_study, run_cli, write_spec


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A small study whose re-measurement may keep only 2 processes alive at once."""
    workdir = tmp_path_factory.mktemp("split")
    # remeasure_top 3 of 3 trials: both configs and the baseline whatever order a busy machine gives them
    budget = {
        "trials": 3,
        "remeasure_top": 3,
        "remeasure_runs": 2,
        "remeasure_windows": 3,
        "remeasure_group": 2,
        "remeasure_share": 0,  # every config, whatever a trial's seconds leave
    }
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
    # each round's speedup: the config's process over the baseline's beside it; the export's, their geometric mean
    assert len(winner.speedups) == len(winner.windows)
    assert export["speedup"] == pytest.approx(statistics.geometric_mean(winner.speedups))
    assert export["speedup"] == pytest.approx(speedup(trials[export["study"]["trial"]], None))
    if len(winner.speedups) >= 2:  # the interval of its rounds, in the export beside it
        # stated jointly with the configs still in contention at the end, which a busy machine decides
        among = joint_among(stored)[export["study"]["trial"]]
        assert 1 <= among <= len(configs)
        assert export["speedup_interval"] == stated_interval(winner.speedups, among=among).as_dict()
