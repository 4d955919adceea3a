"""The serving role's contract (`autotuner.trials.serving.ServingBackend`), one suite that every
backend that serves a model runs, as `test_contract` runs every backend's training role.

Each harness names the backend's built-in inference workload and its arguments. The tests are
written once: the runner's `TRIAL_BACKEND` is a serving role on the process contract and not a
training one, a trial of the strict config serves the held-out items with the fp32 reference's
outputs, the study's reference measures nothing and reports fp32's own floor, the probe reports
the environment and refuses a held-out set smaller than one served step, and an exception in the
factory is an error with its traceback. CPU only, real frameworks, in trial processes.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import Any

import pytest

from autotuner.backends import INFERENCE, Backend
from autotuner.trials.launcher import TrialLauncher, TrialResult
from autotuner.trials.outcomes import Outcome
from autotuner.trials.process import TrialProcess
from autotuner.trials.request import ProbeRequest, TrialRequest
from autotuner.trials.serving import ServingBackend
from autotuner.trials.training import TrainingBackend
from tests.support.helpers import ROOT, small_request  # noqa: F401 - ROOT: puts the repository on sys.path for the trial processes

TIMEOUT_S = 120.0
"""Generous: a tiny inference trial takes a few seconds."""
STRICT_BATCHING = 1e-5
"""Relative error allowed between strict fp32 outputs computed in batches of different sizes: the
same operations, their sums in another order (the float32 epsilon is 1.2e-7; a few layers of
sums over a few hundred terms stay well under this)."""


@dataclass(frozen=True)
class Harness:
    backend: Backend
    workload: str
    args: dict[str, Any]
    heldout: int
    """Held-out items the built-in workload holds with `args`."""

    def reference(self, **changes: Any) -> dict[str, Any]:
        strict = {name: knob.reference for name, knob in self.backend.knobs.items()}
        return {**strict, **self.backend.reference_overrides(), "batch_size": 4, **changes}

    def request(self, config: dict[str, Any], *, measure: bool = True, workload: str | None = None) -> TrialRequest:
        return small_request(workload or self.workload, config, self.args, measure=measure)


HARNESSES = {
    "pytorch": Harness(
        INFERENCE["pytorch"],
        "autotuner.backends.pytorch.inference_builtin:encoder",
        {"width": 32, "heads": 2, "layers": 1, "length": 8, "vocab": 50, "samples": 64},
        heldout=256,
    ),
    "jax": Harness(
        INFERENCE["jax"],
        "autotuner.backends.jax.inference_builtin:mlp",
        {"features": 16, "hidden": 32, "depth": 1, "samples": 128},
        heldout=256,
    ),
}


def raises_in_factory(**args: Any) -> Any:
    raise ValueError(f"the factory refuses to build ({len(args)} arguments)")


@pytest.fixture(params=list(HARNESSES), scope="module")
def harness(request: pytest.FixtureRequest) -> Harness:
    return HARNESSES[request.param]


def _run(launcher: TrialLauncher, harness: Harness, request: TrialRequest) -> TrialResult:
    return launcher.call(harness.backend.runner, "run", request, TIMEOUT_S)


def test_every_backend_that_serves_runs_the_contract() -> None:
    assert set(HARNESSES) == set(INFERENCE)


def test_the_runner_holds_a_serving_role_that_is_no_trainer(harness: Harness) -> None:
    role = importlib.import_module(harness.backend.runner).TRIAL_BACKEND
    assert isinstance(role, ServingBackend) and isinstance(role, TrialProcess)
    assert not isinstance(role, TrainingBackend)
    assert not hasattr(role, "train_step") and not hasattr(role, "restart")
    assert role.name == harness.backend.name


@pytest.mark.slow
def test_the_strict_config_serves_the_references_outputs(harness: Harness, launcher: TrialLauncher) -> None:
    result = _run(launcher, harness, harness.request(harness.reference()))
    assert result.outcome is Outcome.OK, result.reason
    output = result.output
    assert output.throughput is not None and output.throughput.samples_per_s > 0
    assert output.latency is not None and output.latency.calls > 0 and output.latency.p50_ms > 0
    assert output.peak_memory_mb > 0
    drift = output.output_drift
    assert drift is not None and drift.relative_error <= STRICT_BATCHING
    assert drift.top1_agreement == 1.0


@pytest.mark.slow
def test_the_study_reference_measures_nothing_and_reports_fp32s_floor(
    harness: Harness, launcher: TrialLauncher
) -> None:
    result = _run(launcher, harness, harness.request(harness.reference(), measure=False))
    assert result.outcome is Outcome.OK, result.reason
    assert result.output.throughput is None and result.output.latency is None
    drift = result.output.output_drift
    assert drift is not None and drift.relative_error <= STRICT_BATCHING


@pytest.mark.slow
def test_the_probe_reports_the_environment_and_refuses_a_small_heldout_set(
    harness: Harness, launcher: TrialLauncher
) -> None:
    request = ProbeRequest("cpu", harness.workload, harness.args, global_batch=8)
    probed = launcher.call(harness.backend.runner, "probe", request, TIMEOUT_S)
    assert probed.outcome is Outcome.OK, probed.reason
    assert probed.output.workload_error is None
    environment = probed.output.environment
    assert environment.backend == harness.backend.name and environment.device == "cpu"
    capabilities = harness.backend.capabilities(environment.capabilities)
    assert isinstance(capabilities, harness.backend.capabilities_type)
    assert harness.backend.unsupported_reason(harness.reference(), capabilities) is None
    small = launcher.call(
        harness.backend.runner, "probe", replace(request, global_batch=harness.heldout + 8), TIMEOUT_S
    )
    assert small.outcome is Outcome.OK, small.reason
    assert small.output.workload_error is not None and "fewer than one" in small.output.workload_error


def test_an_exception_in_the_factory_is_an_error_with_its_traceback(harness: Harness, launcher: TrialLauncher) -> None:
    result = _run(launcher, harness, harness.request(harness.reference(), workload=f"{__name__}:raises_in_factory"))
    assert result.outcome is Outcome.ERROR
    assert result.reason.startswith("ValueError: the factory refuses to build")
    assert result.traceback is not None and "raises_in_factory" in result.traceback
