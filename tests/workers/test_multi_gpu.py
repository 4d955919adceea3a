"""`autotuner search --jobs N` on a GPU machine: how many workers its GPUs hold when each trial
takes one GPU, or P with `processes: P`. The workers themselves are tests/e2e/test_coordination.py's."""

from __future__ import annotations

import pytest

from autotuner.errors import SpecError
from autotuner.workers.multi_gpu import check_gpus


def test_workers_of_one_gpu_each() -> None:
    check_gpus(4, 4)
    with pytest.raises(SpecError, match="only 4 are visible"):
        check_gpus(5, 4)


def test_workers_of_several_gpus_each_share_the_machine_by_trials() -> None:
    check_gpus(2, 8, processes=4)
    with pytest.raises(SpecError) as refused:
        check_gpus(3, 8, processes=4)
    assert "4 GPUs (processes: 4) each" in str(refused.value) and "at most 2 workers" in str(refused.value)


def test_no_gpu_no_workers() -> None:
    with pytest.raises(SpecError, match="has none visible"):
        check_gpus(2, 0, processes=2)
