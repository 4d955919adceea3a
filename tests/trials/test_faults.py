"""The memory limit of a trial process (`trial.max_memory_mb`): what refuses an allocation past it,
Python's MemoryError as `oom`, and a limit that leaves a study's identity alone. The faults of a
whole search are tests/e2e/test_faults.py's."""

from __future__ import annotations

from pathlib import Path

from autotuner.trials.launcher import TrialLauncher
from autotuner.trials.outcomes import Outcome, exception_message
from tests.support.helpers import ALLOCATE_MB, FAULTY, MEMORY_LIMIT_MB, RUNNER, request
from tests.support.studies import SMALL_SPEC, write_spec

"""The trial timeout of the fault study: a healthy trial here takes well under a second."""
"""fp32/16 is the baseline (and the reference's batching, and the held-out chunk)."""


# ---------------------------------------------------------------- the memory limit itself


def test_the_memory_limit_is_what_refuses_the_allocation() -> None:
    """The same trial is ok without a limit and `oom` with one: the allocation fails because of
    the limit set on the trial process, not because the machine is small."""
    trial = request(f"{FAULTY}:by_config", {"faults": {"fp32/8": "allocate"}, "allocate_mb": ALLOCATE_MB})
    free = TrialLauncher([RUNNER]).call(RUNNER, "run", trial, 120)
    assert free.outcome is Outcome.OK, free.reason
    limited = TrialLauncher([RUNNER], memory_limit_mb=MEMORY_LIMIT_MB).call(RUNNER, "run", trial, 120)
    assert limited.outcome is Outcome.OOM, limited.reason
    assert "DefaultCPUAllocator" in limited.reason and "trial.max_memory_mb" in limited.reason
    assert limited.traceback is None


def test_python_memory_error_is_oom() -> None:
    message = exception_message(MemoryError(), lambda exc: False)
    assert message["kind"] == "oom" and message["reason"].startswith("MemoryError")
    assert "traceback" not in message


def test_the_memory_limit_is_not_part_of_the_study_identity(tmp_path: Path) -> None:
    from autotuner.spec.job import load_spec

    plain = load_spec(write_spec(tmp_path, name="a"))
    limited = load_spec(write_spec(tmp_path, name="a", trial={**SMALL_SPEC["trial"], "max_memory_mb": 4096}))
    assert limited.spec.trial.max_memory_mb == 4096 and plain.spec.trial.max_memory_mb is None
    assert limited.identity() == plain.identity()
