"""autotuner: find the fastest training config of a job on its hardware without numerical drift.

The engine imports neither torch nor jax; frameworks live in `autotuner.backends` (the top-level
`backends/` folder, mapped by the install) and are imported only by trial processes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotuner.errors import AutotunerError, BackendError, HardwareMismatch, SpecError
from autotuner.outcomes import NonFiniteLoss, Outcome

if TYPE_CHECKING:
    from autotuner.search import Search, SearchSummary
    from autotuner.spec import Job, load_spec

__version__ = "0.1.0"

# The study loop and the spec import `autotuner.backends`, which imports `autotuner.knobs`: loading
# them lazily keeps the fork server's first import (a backend's runner) free of an import cycle.
_LAZY = {
    "Search": "autotuner.search",
    "SearchSummary": "autotuner.search",
    "Job": "autotuner.spec",
    "load_spec": "autotuner.spec",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'autotuner' has no attribute {name!r}")


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
