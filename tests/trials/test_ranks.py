"""A trial of several processes (`processes: N`, `autotuner.backends.pytorch.ranks`), on the CPU
with gloo and 2 ranks: what it trains equals one process at the same global batch, it is measured
as one trial, and a rank's failure ends the whole trial with that rank's outcome, nothing left
alive. The knobs DDP and FSDP2 add are tests/backends/test_parallel_knobs.py's."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from autotuner.trials.launcher import TrialLauncher
from autotuner.trials.outcomes import Outcome
from autotuner.trials.request import TrialRequest
from tests.support.helpers import RUNNER, SMALL_MLP, assert_measured_as_one, request, small_request

MLP = "autotuner.backends.pytorch.builtin:mlp"


def _on_two_ranks(trial: TrialRequest) -> TrialRequest:
    """`trial` (global batch 8, micro-batch 4) on two DDP ranks: no accumulation."""
    return replace(trial, config={**trial.config, "accumulation": 1}, processes=2, parallel="ddp")


def _drift_request(parallel: str | None, processes: int, batch_size: int = 0, accumulation: int = 1) -> TrialRequest:
    """The drift phase alone (as the reference runs it) of the built-in mlp, global batch 16."""
    base = small_request(MLP, {"precision": "fp32", "batch_size": 8, "workers": 0, "compile": "none"}, SMALL_MLP)
    config = {**base.config, "batch_size": batch_size or 16 // processes, "accumulation": accumulation}
    return replace(
        base,
        config=config,
        global_batch=16,
        drift_steps=4,
        measure=False,
        processes=processes,
        parallel=parallel,
    )


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_ranks_train_as_one_process_at_the_same_global_batch(launcher: TrialLauncher, parallel: str) -> None:
    """The same samples in the same optimizer steps, split between the ranks: the loss
    trajectory and the held-out loss after K steps equal one process's within fp32 rounding."""
    one = launcher.call(RUNNER, "run", _drift_request(None, 1), 120)
    two = launcher.call(RUNNER, "run", _drift_request(parallel, 2), 120)
    assert one.outcome is Outcome.OK, one.reason
    assert two.outcome is Outcome.OK, two.reason
    assert one.output is not None and two.output is not None
    single, ranks = one.output.losses, two.output.losses
    assert len(ranks.trajectory) == len(single.trajectory) == 4
    for a, b in zip(single.trajectory, ranks.trajectory, strict=True):
        assert b == pytest.approx(a, rel=1e-5)
    assert ranks.heldout == pytest.approx(single.heldout, rel=1e-5)


def test_accumulation_on_two_ranks_equals_one_process(launcher: TrialLauncher) -> None:
    """Micro-batch 4 x accumulation 2 x 2 ranks: the gradients are reduced once a step (no_sync
    for the first micro-batch), and the step equals one process's micro-batch 16."""
    one = launcher.call(RUNNER, "run", _drift_request(None, 1), 120)
    two = launcher.call(RUNNER, "run", _drift_request("ddp", 2, batch_size=4, accumulation=2), 120)
    assert two.outcome is Outcome.OK, two.reason
    assert one.output is not None and two.output is not None
    assert two.output.losses.heldout == pytest.approx(one.output.losses.heldout, rel=1e-5)


def test_a_trial_of_two_ranks_is_measured_as_one(launcher: TrialLauncher) -> None:
    """Rank 0 measures global samples per second; the other rank takes the same steps (its
    collectives meet rank 0's), so the trial ends ok with one throughput."""
    trial = _on_two_ranks(request("ok", batch_size=4))
    result = launcher.call(RUNNER, "run", trial, 120)
    assert_measured_as_one(result, trial)


def _all_end(pids: list[int], within_s: float = 30.0) -> bool:
    """Whether every one of `pids` has ended (`_alive`), allowing a SIGKILL the time to land: a
    killed process on a loaded machine can still be on its way out a moment after the kill."""
    end = time.monotonic() + within_s
    while _alive(pids) and time.monotonic() < end:
        time.sleep(0.05)
    return not _alive(pids)


def _alive(pids: list[int]) -> list[int]:
    """Those of `pids` still running: not gone, not zombies (a killed rank whose parent, the
    trial process, was killed too waits for PID 1, which in some containers never reaps)."""
    alive = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2 :].split()[0] not in ("Z", "X"):
            alive.append(pid)
    return alive


def _descendants(pid: int) -> list[int]:
    """Every process under `pid` (the ranks and their workers under a trial process)."""
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                children.append(int(entry))
    return children + [d for child in children for d in _descendants(child)]


@pytest.mark.parametrize(
    ("fault", "outcome", "says"),
    [
        ("crash", Outcome.CRASH, "rank 1 of 2 was killed by SIGKILL"),
        ("raise", Outcome.ERROR, "rank 1 of 2: ValueError: this rank's forward fails"),
        ("oom", Outcome.OOM, "rank 1 of 2: OutOfMemoryError"),
        # NaN gradients are all-reduced: both ranks' losses are NaN at the window's check, and
        # whichever says so first is reported
        ("nan", Outcome.NAN, " of 2: the loss became nan"),
    ],
)
def test_a_fault_on_one_rank_ends_the_whole_trial_with_its_outcome(
    launcher: TrialLauncher, fault: str, outcome: Outcome, says: str
) -> None:
    """Rank 0 waits in an all-reduce rank 1 never joins: the trial process sees rank 1's end,
    kills every rank and reports rank 1's outcome, not the trial's timeout (how soon is a figure of
    docs/guides/parallel.md, not an assertion)."""
    trial = _on_two_ranks(request("on_rank", {"fault": fault}, batch_size=4))
    began = time.monotonic()
    process = launcher.start(RUNNER, "run", trial, 120)
    ranks = []
    while process.process.is_alive() and not ranks and time.monotonic() - began < 30:
        ranks = _descendants(process.process.pid or 0)
        time.sleep(0.05)
    process.read_until_waiting(time.monotonic() + 120)
    result = process.end()
    assert result.outcome is outcome, result.reason
    assert says in result.reason  # the rank's own end, not the trial's timeout
    assert _all_end(ranks)


@pytest.mark.slow
def test_a_rank_that_hangs_ends_the_trial_at_its_timeout_with_every_rank(launcher: TrialLauncher) -> None:
    """Rank 1 sleeps in its forward, rank 0 waits in its all-reduce for ever: the trial's timeout
    kills the trial's process group, both ranks with it."""
    trial = _on_two_ranks(request("on_rank", {"fault": "hang"}, batch_size=4))
    began = time.monotonic()
    process = launcher.start(RUNNER, "run", trial, 15)
    ranks: list[int] = []
    while process.process.is_alive() and len(ranks) < 2 and time.monotonic() - began < 15:
        ranks = _descendants(process.process.pid or 0)
        time.sleep(0.05)
    process.read_until_waiting(began + 15)
    result = process.end()
    assert result.outcome is Outcome.TIMEOUT, result.reason
    assert ranks and _all_end(ranks)


def test_a_pruned_trial_of_two_ranks_ends_at_once_with_every_rank(launcher: TrialLauncher) -> None:
    """Rank 0's rule stops it inside a window, where rank 1 is in the next step's all-reduce: the
    trial ends pruned with rank 0's output (not at its timeout), and no rank is left."""
    trial = replace(_on_two_ranks(request("ok", batch_size=4)), prune_best=1e12, prune_after=2, windows=50)
    began = time.monotonic()
    process = launcher.start(RUNNER, "run", trial, 120)
    ranks: list[int] = []
    while process.process.is_alive() and len(ranks) < 2 and time.monotonic() - began < 30:
        ranks = _descendants(process.process.pid or 0)
        time.sleep(0.05)
    process.read_until_waiting(time.monotonic() + 120)
    result = process.end()
    assert result.outcome is Outcome.OK, result.reason
    assert result.output is not None and result.output.throughput is not None
    throughput = result.output.throughput
    assert throughput.stopped is not None and throughput.windows < 50
    assert throughput.bound is not None and throughput.floor is not None and throughput.bound < throughput.floor
    assert ranks and _all_end(ranks)


@pytest.mark.slow
def test_a_hugging_face_model_keeps_its_own_attention_and_checkpointing_through_a_ddp_trial(
    launcher: TrialLauncher,
) -> None:
    """Measured, then tuned again for the drift phase with DDP's wrapper around it: the model's
    own eager attention and gradient checkpointing hold in both, and the trial is recorded ok."""
    pytest.importorskip("transformers")
    config = {"precision": "fp32", "batch_size": 4, "workers": 0, "compile": "none"}
    gpt2 = {"layers": 2, "width": 32, "heads": 2, "vocab": 64, "length": 16, "samples": 64}
    trial = small_request("examples.huggingface.gpt2:make_workload", config, gpt2)
    trial = _on_two_ranks(replace(trial, config={**trial.config, "attention": "eager", "checkpointing": "blocks"}))
    result = launcher.call(RUNNER, "run", trial, 120)
    assert result.outcome is Outcome.OK, result.reason
    assert result.output is not None and result.output.losses.heldout > 0


def _threads() -> int:
    """The OS threads of this process (native ones included: a TCPStore's server, a thread pool's)."""
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_the_ranks_are_forked_before_the_trial_process_starts_their_stores_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fork copies one thread and every lock: the ranks are forked from a process that runs no
    thread of the trial's own (the store's server starts after them), and still train."""
    import torch.multiprocessing

    from autotuner.backends.pytorch.ranks import run_ranks
    from autotuner.backends.pytorch.runner import TRIAL_BACKEND

    forked_with: list[int] = []
    start = torch.multiprocessing.start_processes

    def counted(*args: object, **kwargs: object) -> object:
        forked_with.append(_threads())
        return start(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.multiprocessing, "start_processes", counted)
    before = _threads()
    output = run_ranks(TRIAL_BACKEND, _drift_request("ddp", 2))
    assert forked_with == [before]
    assert output.losses.heldout > 0


@pytest.mark.slow
def test_a_rank_that_fails_to_count_the_models_flops_ends_an_fsdp_trial_at_once(launcher: TrialLauncher) -> None:
    """FSDP's ranks count the model's FLOPs through its collectives: a rank whose count raises ends
    the trial with its error at once, where swallowing it left the other rank waiting in a
    reduce-scatter until the trial's timeout."""
    trial = replace(_on_two_ranks(request("on_rank", {"fault": "count"}, batch_size=4)), parallel="fsdp")
    result = launcher.call(RUNNER, "run", trial, 60)
    assert result.outcome is Outcome.ERROR, result.reason
    assert "rank 1 of 2: ValueError: this rank cannot be counted" in result.reason
