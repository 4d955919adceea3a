"""The optional third objective, energy per sample: the study it makes and what each trial gives
it, checked from a trial result as a GPU trial returns it (the NVML side runs only on a GPU). Its
refusal on a device without an energy counter is tests/e2e/test_objectives.py's."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from optuna.distributions import CategoricalDistribution

from autotuner.results.store import Yardstick, record
from autotuner.spec.job import parse_spec
from autotuner.study.storage import open_storage, open_study
from autotuner.trials.launcher import TrialResult
from autotuner.trials.outcomes import Outcome
from autotuner.trials.probe import Environment
from autotuner.trials.trial_output import TrialOutput
from tests.support.helpers import measured, reference
from tests.support.studies import SMALL_SPEC

GPU = Environment(
    backend="pytorch",
    device="cuda:0",
    device_name="NVIDIA H100 80GB HBM3",
    driver="550.54.15",
    versions={"python": "3.11.7", "torch": "2.3.0", "cuda": "12.1"},
    capabilities={"accelerator": True, "bf16": True, "fp16": True, "tf32": True},
    energy_counter=True,
)


def _job(name: str, energy: bool) -> Any:
    return parse_spec({**SMALL_SPEC, "name": name, "objective": {"max_drift": 0.01, "energy": energy}}, "x.yaml")


def _gpu_result(energy_j_per_sample: float) -> TrialResult[TrialOutput]:
    telemetry = {"gpu_util_mean": 90.0, "power_w_mean": 300.0, "energy_j_per_sample": energy_j_per_sample}
    return TrialResult(Outcome.OK, output=measured(1000.0, 2.0, [2.0], telemetry=telemetry))


def test_energy_is_the_third_objective_of_the_study(tmp_path: Path) -> None:
    job = _job("energy", energy=True)
    study = open_study(open_storage(f"sqlite:///{tmp_path}/e.db"), job, GPU)
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE", "MINIMIZE"]
    assert study.metric_names == ["throughput", "drift", "energy_j_per_sample"]
    fp32 = reference(2.0, [2.0])
    space = {k: CategoricalDistribution(v) for k, v in job.space.items()}
    against = Yardstick(job, fp32, GPU)
    measured = record(
        study, study.ask(space), job.complete(job.baseline), _gpu_result(0.3), role="baseline", against=against
    )
    failed = record(
        study, study.ask(space), job.complete(job.baseline), TrialResult(Outcome.CRASH, "killed by SIGSEGV"),
        role="search", against=against,
    )  # fmt: skip
    values = [t.values for t in study.get_trials()]
    assert values[0] == [1000.0, 0.0, 0.3] and measured.metrics["energy_j_per_sample"] == 0.3
    assert values[1][2] == math.inf and not failed.feasible
    # Without the objective the study has two, and a study made with one is not reused for the other.
    two = open_study(open_storage(f"sqlite:///{tmp_path}/two.db"), _job("two", energy=False), GPU)
    assert len(two.directions) == 2
