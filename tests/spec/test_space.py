"""The search space as a value: narrowing, the baseline in front and the points give new values,
and a job whose space is narrowed is a new job."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autotuner.backends.pytorch.capabilities import TorchCapabilities
from autotuner.spec.space import SearchSpace
from tests.spec.test_spec import spec

SPACE = SearchSpace.of({"precision": ["fp32", "bf16"], "workers": [0, 2]})


def test_a_space_holds_tuples_and_compares_as_a_mapping() -> None:
    assert SPACE["precision"] == ("fp32", "bf16") and list(SPACE) == ["precision", "workers"]
    assert SPACE == {"precision": ("fp32", "bf16"), "workers": (0, 2)} and SPACE.size == 4
    assert list(SPACE.points()) == [
        {"precision": "fp32", "workers": 0},
        {"precision": "fp32", "workers": 2},
        {"precision": "bf16", "workers": 0},
        {"precision": "bf16", "workers": 2},
    ]


def test_narrowing_gives_a_new_space_and_what_it_dropped() -> None:
    narrowed, dropped = SPACE.narrowed(lambda knob, value: "no bf16 here" if value == "bf16" else None)
    assert narrowed == {"precision": ("fp32",), "workers": (0, 2)}
    assert dropped == {"precision": {"bf16": "no bf16 here"}}
    assert SPACE["precision"] == ("fp32", "bf16")  # the space narrowed is as it was


def test_a_point_goes_in_front_of_the_values_that_lack_it() -> None:
    assert SPACE.with_first({"precision": "fp16", "workers": 2}) == {
        "precision": ("fp16", "fp32", "bf16"),
        "workers": (0, 2),
    }


def test_a_job_is_not_changed_after_it_is_built(tmp_path: Path) -> None:
    job = spec(tmp_path, space="pytorch-cpu")
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.space = SPACE  # type: ignore[misc]
    cpu = TorchCapabilities(bf16=True, compile=True)
    narrowed, dropped = job.narrow(cpu)
    assert narrowed is not job and narrowed.space != job.space and dropped
    assert job.space == job.declared_space == narrowed.declared_space
    assert narrowed.identity() == job.identity()
