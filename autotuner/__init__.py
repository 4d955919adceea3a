"""autotuner: find the fastest training config of a job on its hardware without numerical drift.

The engine imports neither torch nor jax; frameworks live in `autotuner.backends` (the top-level
`backends/` folder, mapped by the install) and are imported only by trial processes. This package
itself imports only what every part of it shares (the error and outcome types): a trial process
and a user's training loop that imports `autotuner.backends.<name>.apply` do not load the study
loop, Optuna or SQLAlchemy. The command line is `autotuner.cli`; the Python API is
`autotuner.export.reader.load_config` and each backend's `apply.TunedTraining`.
"""

from __future__ import annotations

from autotuner.errors import AutotunerError, BackendError, HardwareMismatch, SpecError
from autotuner.trials.outcomes import NonFiniteLoss, Outcome

__version__ = "0.1.0"

__all__ = [
    "AutotunerError",
    "BackendError",
    "HardwareMismatch",
    "NonFiniteLoss",
    "Outcome",
    "SpecError",
    "__version__",
]
