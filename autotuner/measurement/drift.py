"""Numerical drift of a trial against the study's fp32 reference.

Both runs start from the same initial weights and take the same K optimizer steps on the same
batches in the same order at the same global batch. Drift is |L_trial - L_ref| / |L_ref|, with
L the loss on a fixed held-out batch after the K steps; the largest relative gap over the
training-loss trajectory is kept too. Anything non-finite is infinite drift.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Drift:
    heldout: float
    """Relative gap of the held-out loss after K steps: the figure compared to the tolerance."""
    trajectory_max: float
    """Largest relative gap of the training loss over the K steps."""


def relative_gap(value: float, reference: float) -> float:
    """|value - reference| / |reference|; infinite when either is not finite."""
    if not (math.isfinite(value) and math.isfinite(reference)):
        return math.inf
    if reference == 0.0:
        return 0.0 if value == 0.0 else math.inf
    return abs(value - reference) / abs(reference)


def measure_drift(
    heldout: float, trajectory: Sequence[float], reference_heldout: float, reference_trajectory: Sequence[float]
) -> Drift:
    if len(trajectory) != len(reference_trajectory):
        raise ValueError(
            f"the trial took {len(trajectory)} drift steps but the reference took {len(reference_trajectory)}"
        )
    gaps = [relative_gap(v, r) for v, r in zip(trajectory, reference_trajectory, strict=True)]
    return Drift(relative_gap(heldout, reference_heldout), max(gaps, default=0.0))
