"""The study's fp32 reference: the strictest config's drift phase, run twice.

Drift is measured against it (`autotuner.results.evidence.Reference`); the gap between its two runs is its
own noise floor, shown next to the tolerance. A search runs it once per study, through a claim
(`autotuner.workers.coordination.OncePerStudy.reference`), so several workers do not run it twice.
"""

from __future__ import annotations

import math

from autotuner.errors import BackendError
from autotuner.measurement.drift import measure_drift
from autotuner.results.evidence import Reference
from autotuner.spec.job import Job
from autotuner.trials.launcher import TrialLauncher, TrialResult
from autotuner.trials.outcomes import Outcome
from autotuner.trials.trial_output import TrialOutput

REFERENCE_LEASE_TRIALS = 3
"""A worker running the reference (two trial runs) holds it for this many trial timeouts, plus
the probe's; past that, another worker takes it over."""


def run_reference(launcher: TrialLauncher, job: Job, device: str, progress: str | None = None) -> Reference:
    """Run the fp32 reference (`Job.reference_config`) twice; the gap between the two runs is its noise floor.
    `progress`: the phase file of the search's console (`autotuner.trials.progress`)."""
    config = job.reference_config()
    request = job.trial_request(config, device, measure=False, progress=progress, log=job.log_path("reference"))
    outputs: list[TrialOutput] = []
    wall_s = 0.0
    for _ in range(2):
        result: TrialResult[TrialOutput] = launcher.call(job.backend.runner, "run", request, job.trial_timeout(config))
        if result.outcome is not Outcome.OK:
            raise BackendError(
                f"the fp32 reference run failed ({result.outcome}: {result.reason}); no drift can be measured"
            )
        assert result.output is not None  # it ended ok: it sent its output
        outputs.append(result.output)
        wall_s += result.wall_s
    served = [o.output_drift for o in outputs if o.output_drift is not None]
    if served:  # an inference study: each trial compares its outputs with the fp32 model's itself
        floor = max(d.relative_error for d in served)
        return Reference(config, math.nan, [], floor, 0.0, [], wall_s, outputs=True)
    first, second = (o.losses for o in outputs)
    noise = measure_drift(second.heldout, second.trajectory, first.heldout, first.trajectory)
    return Reference(
        config=config,
        heldout=first.heldout,
        trajectory=first.trajectory,
        noise_floor=noise.heldout,
        noise_floor_trajectory=noise.trajectory_max,
        runs_heldout=[first.heldout, second.heldout],
        wall_s=wall_s,
    )
