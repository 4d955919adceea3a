"""Drift against the fp32 reference: the arithmetic, and end to end through trial processes."""

from __future__ import annotations

import math

import pytest

from autotuner.measurement.drift import Drift, measure_drift, relative_gap
from autotuner.trials.launcher import TrialLauncher
from autotuner.trials.outcomes import Outcome
from autotuner.trials.trial_output import Losses
from tests.support.helpers import RUNNER, SMALL_MLP, request

MLP = "autotuner.backends.pytorch.builtin:mlp"
TIMEOUT_S = 120.0


# ---------------------------------------------------------------- the arithmetic


def test_identical_is_zero() -> None:
    assert relative_gap(2.5, 2.5) == 0.0
    assert relative_gap(-3.0, -3.0) == 0.0
    assert relative_gap(0.0, 0.0) == 0.0
    assert measure_drift(1.0, [3.0, 2.0], 1.0, [3.0, 2.0]) == Drift(0.0, 0.0)


@pytest.mark.parametrize(
    ("value", "reference", "expected"),
    [
        (1.01, 1.0, 0.01),
        (0.99, 1.0, 0.01),
        (3.0, 2.0, 0.5),
        (1.0, 2.0, 0.5),
        (-1.5, -1.0, 0.5),
        (1.0, -1.0, 2.0),
        (0.0, 4.0, 1.0),
    ],
)
def test_known_relative_gaps(value: float, reference: float, expected: float) -> None:
    assert relative_gap(value, reference) == pytest.approx(expected, rel=1e-12)


def test_gap_is_relative_to_the_reference_not_symmetric() -> None:
    assert relative_gap(2.0, 1.0) == pytest.approx(1.0)
    assert relative_gap(1.0, 2.0) == pytest.approx(0.5)


def test_zero_reference() -> None:
    assert relative_gap(1e-9, 0.0) == math.inf


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_is_infinite_drift(bad: float) -> None:
    assert relative_gap(bad, 1.0) == math.inf
    assert relative_gap(1.0, bad) == math.inf
    assert relative_gap(bad, bad) == math.inf


def test_measure_drift_heldout_and_trajectory_max() -> None:
    drift = measure_drift(1.1, [2.0, 1.5, 1.2], 1.0, [2.0, 1.0, 1.2])
    assert drift.heldout == pytest.approx(0.1)
    assert drift.trajectory_max == pytest.approx(0.5)


def test_measure_drift_nan_anywhere_in_the_trajectory_is_infinite() -> None:
    drift = measure_drift(1.0, [2.0, math.nan, 1.0], 1.0, [2.0, 1.5, 1.0])
    assert drift.heldout == 0.0
    assert drift.trajectory_max == math.inf


def test_measure_drift_empty_trajectories() -> None:
    assert measure_drift(1.0, [], 1.0, []) == Drift(0.0, 0.0)


@pytest.mark.parametrize(("trial", "reference"), [([1.0, 2.0], [1.0]), ([1.0], [1.0, 2.0]), ([], [1.0])])
def test_mismatched_lengths_raise(trial: list[float], reference: list[float]) -> None:
    with pytest.raises(ValueError, match="drift steps"):
        measure_drift(1.0, trial, 1.0, reference)


# ---------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def reference(launcher: TrialLauncher) -> Losses:
    """The fp32 reference of the small mlp (drift phase only), as a search runs it."""
    result = launcher.call(RUNNER, "run", request(MLP, SMALL_MLP, measure=False), TIMEOUT_S)
    assert result.outcome is Outcome.OK, result.reason
    assert result.output.throughput is None  # the reference does not measure
    return result.output.losses


def test_reference_run_twice_has_exactly_zero_drift(launcher: TrialLauncher, reference: Losses) -> None:
    again = launcher.call(RUNNER, "run", request(MLP, SMALL_MLP, measure=False), TIMEOUT_S)
    assert again.outcome is Outcome.OK, again.reason
    losses = again.output.losses
    assert losses == reference  # bit for bit on the CPU
    assert measure_drift(losses.heldout, losses.trajectory, reference.heldout, reference.trajectory) == Drift(0.0, 0.0)


def test_measuring_first_does_not_change_the_drift_phase(launcher: TrialLauncher, reference: Losses) -> None:
    """The fp32 baseline (measured, then drift) starts its drift phase from the same weights and
    batches as the reference: its drift is exactly 0, so the tolerance is not eaten by the tuner."""
    result = launcher.call(RUNNER, "run", request(MLP, SMALL_MLP, measure=True), TIMEOUT_S)
    assert result.outcome is Outcome.OK, result.reason
    assert result.output.throughput.samples_per_s > 0
    losses = result.output.losses
    assert len(losses.trajectory) == 2
    assert measure_drift(losses.heldout, losses.trajectory, reference.heldout, reference.trajectory) == Drift(0.0, 0.0)


def test_loader_workers_do_not_change_the_numerics(launcher: TrialLauncher, reference: Losses) -> None:
    """Data-loader workers deliver the same batches in the same order: drift exactly 0."""
    result = launcher.call(RUNNER, "run", request(MLP, SMALL_MLP, workers=1), TIMEOUT_S)
    assert result.outcome is Outcome.OK, result.reason
    assert result.output.losses == reference


def test_accumulation_changes_the_numerics_only_by_rounding(launcher: TrialLauncher, reference: Losses) -> None:
    """batch 4 x accumulation 2 is the same optimizer step as 8 x 1, up to float rounding."""
    result = launcher.call(RUNNER, "run", request(MLP, SMALL_MLP, batch_size=4), TIMEOUT_S)
    assert result.outcome is Outcome.OK, result.reason
    losses = result.output.losses
    assert losses.trajectory[0] == pytest.approx(reference.trajectory[0], rel=1e-5)
    drift = measure_drift(losses.heldout, losses.trajectory, reference.heldout, reference.trajectory)
    assert drift.heldout < 1e-4 and drift.trajectory_max < 1e-4


def test_bf16_drifts_a_little_but_stays_finite(launcher: TrialLauncher, reference: Losses) -> None:
    result = launcher.call(RUNNER, "run", request(MLP, SMALL_MLP, precision="bf16"), TIMEOUT_S)
    assert result.outcome is Outcome.OK, result.reason
    losses = result.output.losses
    drift = measure_drift(losses.heldout, losses.trajectory, reference.heldout, reference.trajectory)
    assert 0.0 < drift.trajectory_max < 0.05  # bf16 autocast really ran, and only rounded


OVERFLOW = {**SMALL_MLP, "input_scale": 1e6}
"""Inputs of ~1e6: beyond float16's largest finite value (65504) as soon as autocast casts them."""


def test_overflowing_fp16_is_classified_nan(launcher: TrialLauncher) -> None:
    result = launcher.call(RUNNER, "run", request(MLP, OVERFLOW, precision="fp16"), TIMEOUT_S)
    assert result.outcome is Outcome.NAN, (result.outcome, result.reason)
    assert "nan" in result.reason or "inf" in result.reason
    assert "\n" not in result.reason


def test_same_inputs_in_fp32_are_ok(launcher: TrialLauncher) -> None:
    result = launcher.call(RUNNER, "run", request(MLP, OVERFLOW, precision="fp32"), TIMEOUT_S)
    assert result.outcome is Outcome.OK, result.reason
    losses = result.output.losses
    assert all(math.isfinite(v) for v in [losses.heldout, *losses.trajectory])


def test_overflowing_fp16_drift_phase_alone_is_nan(launcher: TrialLauncher) -> None:
    """Even without the measured phase, the drift phase itself catches the non-finite loss."""
    result = launcher.call(RUNNER, "run", request(MLP, OVERFLOW, precision="fp16", measure=False), TIMEOUT_S)
    assert result.outcome is Outcome.NAN, (result.outcome, result.reason)
    assert "drift step 1" in result.reason
