"""autotuner: find the fastest training config of a job on its hardware without numerical drift.

The engine imports neither torch nor jax; frameworks live in the `backends` package and are
imported only by trial processes.
"""

from __future__ import annotations

from autotuner.errors import AutotunerError, BackendError, HardwareMismatch, SpecError
from autotuner.outcomes import NonFiniteLoss, Outcome
from autotuner.search import Search, SearchSummary
from autotuner.spec import Job, load_spec

__version__ = "0.1.0"

__all__ = [
    "AutotunerError",
    "BackendError",
    "HardwareMismatch",
    "Job",
    "NonFiniteLoss",
    "Outcome",
    "Search",
    "SearchSummary",
    "SpecError",
    "__version__",
    "load_spec",
]
