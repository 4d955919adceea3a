"""A study's profiles, stored and read back: where a step's time goes in the baseline and in the
best config (`autotuner.search.profiling` runs them), kept in the study's system attrs as
`profile:<trial number>` beside their traces in its artifact store.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import optuna

from autotuner.measurement.traces import Operator
from autotuner.study.names import PROFILE_PREFIX
from autotuner.study.optuna_adapter import study_id, study_storage


@dataclass
class Profile:
    trial: int
    role: str
    """`baseline` or `best`."""
    steps: int
    seconds: float
    """Wall time of the profiling process, start to end (the price of the profile)."""
    where: str
    """`device` (a GPU's kernels) or `host`."""
    total_ms: float
    """Self time of everything on that side, per step."""
    operators: list[Operator] = field(default_factory=list)
    artifact: str | None = None
    """The trace's artifact id in the study's artifact store."""
    artifact_name: str | None = None

    def as_dict(self) -> dict[str, Any]:  # Optuna stores it: its JSON type, nested operators included
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        operators = [Operator(**op) for op in data.get("operators", [])]
        return cls(**{**data, "operators": operators})


def stored_profiles(study: optuna.Study) -> dict[int, Profile]:
    """The profiles stored with the study, by trial number."""
    attrs = study_storage(study).get_study_system_attrs(study_id(study))
    return {
        int(key.removeprefix(PROFILE_PREFIX)): Profile.from_dict(value)
        for key, value in attrs.items()
        if key.startswith(PROFILE_PREFIX) and isinstance(value, dict)
    }


def describe(profile: Profile, top: int = 3) -> str:
    """One line: `trial #4 (best): 3 steps profiled in 0.3 s; self time on the host 41 ms a step:
    aten::mm 15%, ...`."""
    ops = ", ".join(f"{op.name} {op.share:.0%}" for op in profile.operators[:top])
    return (
        f"trial #{profile.trial} ({profile.role}): {profile.steps} step{'s' if profile.steps != 1 else ''} "
        f"profiled in {profile.seconds:.1f} s; "
        f"self time on the {profile.where} {profile.total_ms:.3g} ms a step: {ops}"
    )
