"""A study's compile cache is one folder per precision: a trial is never served the graphs
another precision compiled.

AOTAutograd's cache, which torch.compile looks up before inductor's, is keyed on Dynamo's graph,
and an autocast entered around the compiled model is not in that graph; torch 2.11 keyed only
whether autocast was on, not its dtype. On an H100 study an fp16 trial right after a bf16 one
found every lookup a hit (`compile_cache: warm`, a 3.3 s warm-up) and ran bf16's graphs. The
trial processes here key that cache as torch 2.11 did (`keyed_without_the_autocast_dtype`),
whatever torch is installed, so the test holds on the torch that had the fault.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from autotuner.trials.launcher import TrialLauncher
from autotuner.trials.outcomes import Outcome
from tests.support.helpers import RUNNER, SMALL_MLP, request

HERE = "tests.e2e.test_compile_cache"


def _runtime_state() -> Any:
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCacheDetails

    return getattr(AOTAutogradCacheDetails, "_record_runtime_state", None)


def keyed_without_the_autocast_dtype(**size: Any) -> Any:
    """The built-in mlp, in a process whose AOTAutograd cache keys whether autocast is on and not
    its dtype, as torch 2.11's did."""
    import torch
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCacheDetails

    from autotuner.backends.pytorch.builtin import mlp

    recorded = AOTAutogradCacheDetails._record_runtime_state

    def record(self: Any, gm: Any) -> None:
        recorded(self, gm)
        self.__dict__.pop("autocast_state", None)
        self.disable_amp = torch._C._is_any_autocast_enabled()

    AOTAutogradCacheDetails._record_runtime_state = record  # type: ignore[method-assign]
    return mlp(**size)


@pytest.mark.skipif(_runtime_state() is None, reason="this torch records AOTAutograd's runtime state elsewhere")
def test_an_fp16_trial_after_a_bf16_one_compiles_its_own_graphs(launcher: TrialLauncher, tmp_path: Path) -> None:
    cache = tmp_path / "compile-cache"

    def trial(precision: str) -> str | None:
        compiled = request(
            f"{HERE}:keyed_without_the_autocast_dtype", SMALL_MLP, compile="default", precision=precision
        )
        result = launcher.call(RUNNER, "run", dataclasses.replace(compiled, compile_cache=str(cache)), 300)
        assert result.outcome is Outcome.OK, result.reason
        return result.output.compile_cache

    assert trial("bf16") == "cold"
    assert trial("fp16") == "cold"  # in one shared folder: `warm`, bf16's graphs
    assert trial("bf16") == "warm"  # a precision still finds its own
    assert sorted(p.name for p in cache.iterdir()) == ["pytorch-bf16", "pytorch-fp16"]
