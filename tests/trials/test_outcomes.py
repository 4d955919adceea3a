"""How a trial ends: every kind of misbehaviour, run through the real trial-process machinery
(fork server, own process group, pipe, timeout), comes back as the right outcome with a one-line
reason; and `classify_end` / `exception_message` on their own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from autotuner.backends.pytorch.runner import TRIAL_BACKEND
from autotuner.trials.launcher import TrialLauncher, TrialResult
from autotuner.trials.outcomes import Outcome, ProcessEnd, classify_end, exception_message
from autotuner.trials.trial_output import Losses, TrialOutput
from tests.support.helpers import FAULTY, ROOT, RUNNER, request

TIMEOUT_S = 60.0
"""Generous: a healthy tiny trial takes a few seconds; only the hang is meant to hit a limit."""
HANG_TIMEOUT_S = 5.0


def run(
    launcher: TrialLauncher, name: str, timeout_s: float = TIMEOUT_S, args: dict | None = None, **config
) -> TrialResult:
    return launcher.call(RUNNER, "run", request(name, args, **config), timeout_s)


def assert_one_line(reason: str) -> None:
    assert reason, "an infeasible trial must say why"
    assert "\n" not in reason and "\r" not in reason, reason
    assert reason == reason.strip()
    assert len(reason) <= 300


# ---------------------------------------------------------------- through trial processes


def test_healthy_workload_is_ok_with_measurements(launcher: TrialLauncher) -> None:
    result = run(launcher, "ok")
    assert result.outcome is Outcome.OK, result.reason
    assert result.reason == ""
    assert result.traceback is None
    throughput = result.output.throughput
    assert throughput.windows == 2 and throughput.steps == 2 and throughput.samples_per_step == 8
    assert len(throughput.window_samples_per_s) == 2
    assert all(rate > 0 for rate in throughput.window_samples_per_s)
    losses = result.output.losses
    assert len(losses.trajectory) == 2
    assert all(isinstance(v, float) for v in [losses.heldout, *losses.trajectory])
    assert result.startup_s is not None and result.startup_s >= 0
    assert result.wall_s > 0


def test_segfault_is_a_crash_naming_the_signal(launcher: TrialLauncher) -> None:
    """(Every test here shares one launcher: a crash never takes the machinery down.)"""
    result = run(launcher, "segfault")
    assert result.outcome is Outcome.CRASH
    assert_one_line(result.reason)
    assert "SIGSEGV" in result.reason
    assert result.traceback is None and result.output is None


def test_abort_is_a_crash_naming_the_signal(launcher: TrialLauncher) -> None:
    result = run(launcher, "abort")
    assert result.outcome is Outcome.CRASH
    assert_one_line(result.reason)
    assert "SIGABRT" in result.reason


def test_exit_without_result_is_a_crash_with_the_exit_code(launcher: TrialLauncher) -> None:
    result = run(launcher, "exit_code")
    assert result.outcome is Outcome.CRASH
    assert_one_line(result.reason)
    assert "code 3" in result.reason


def test_out_of_memory_is_oom_by_exception_type(launcher: TrialLauncher) -> None:
    result = run(launcher, "oom")
    assert result.outcome is Outcome.OOM
    assert_one_line(result.reason)
    assert result.reason.startswith("OutOfMemoryError: CUDA out of memory. Tried to allocate")
    assert result.traceback is None


def test_nan_loss_is_nan(launcher: TrialLauncher) -> None:
    result = run(launcher, "nan")
    assert result.outcome is Outcome.NAN
    assert_one_line(result.reason)
    assert "nan" in result.reason
    assert result.traceback is None


def test_exception_in_the_factory_is_an_error_with_its_traceback(launcher: TrialLauncher) -> None:
    result = run(launcher, "raises_in_factory")
    assert result.outcome is Outcome.ERROR
    assert_one_line(result.reason)
    assert result.reason == "ValueError: the factory refuses to build (samples=64)"
    assert result.traceback is not None
    assert result.traceback.startswith("Traceback (most recent call last):")
    assert "faulty_workloads.py" in result.traceback and "raises_in_factory" in result.traceback
    assert result.traceback.rstrip().endswith("ValueError: the factory refuses to build (samples=64)")


def test_factory_returning_the_wrong_type_is_an_error(launcher: TrialLauncher) -> None:
    result = run(launcher, "wrong_return")
    assert result.outcome is Outcome.ERROR
    assert_one_line(result.reason)
    assert result.reason.startswith("TypeError:")
    assert f"{FAULTY}:wrong_return" in result.reason and "str" in result.reason and "TorchWorkload" in result.reason
    assert result.traceback and "TypeError" in result.traceback


def test_workload_that_does_not_import_is_an_error(launcher: TrialLauncher) -> None:
    result = launcher.call(RUNNER, "run", request(f"{FAULTY}:no_such_factory"), TIMEOUT_S)
    assert result.outcome is Outcome.ERROR
    assert_one_line(result.reason)
    assert "no_such_factory" in result.reason


def _group_members(pgid: int) -> dict[int, str]:
    """pid -> state letter of every process in the process group `pgid` (from /proc)."""
    members = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid:
            members[int(entry.name)] = fields[0]
    return members


def _live(pgid: int) -> dict[int, str]:
    """Members that are not zombies. A zombie has already died: only its parent has not reaped it
    (orphans go to PID 1, which in some containers never reaps)."""
    return {pid: state for pid, state in _group_members(pgid).items() if state not in ("Z", "X")}


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("where", ["forward", "loader"])
def test_hang_is_a_timeout_and_the_whole_process_group_is_gone(
    launcher: TrialLauncher, tmp_path: Path, where: str
) -> None:
    """A hang is killed at the timeout, and the trial process and its data-loader worker both die.
    With `loader`, the worker itself sleeps (so PyTorch's worker watchdog, which ends an orphaned
    idle worker after a few seconds, cannot do the launcher's job): only killing the group ends it."""
    result = run(launcher, "hang", HANG_TIMEOUT_S, {"pid_dir": str(tmp_path), "where": where}, workers=1)
    assert result.outcome is Outcome.TIMEOUT, result.reason
    assert_one_line(result.reason)
    assert "timeout" in result.reason and "5 s" in result.reason
    assert result.traceback is None and result.output is None

    trial_pid, pgid = map(int, (tmp_path / "trial").read_text().split())
    assert pgid == trial_pid, "the trial process leads its own process group"
    assert pgid != os.getpgrp()
    workers = [int(p.name.removeprefix("worker-")) for p in tmp_path.glob("worker-*")]
    assert workers, "the hanging trial had a data-loader worker"
    for worker in workers:
        assert int((tmp_path / f"worker-{worker}").read_text().split()[1]) == pgid

    # The kill is a SIGKILL to the group: give the kernel a moment (bounded) to finish it.
    deadline = time.monotonic() + 10
    while _live(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _live(pgid) == {}, f"processes of the trial's group still running: {_live(pgid)}"
    for pid in [trial_pid, *workers]:
        assert pid not in _live(pgid)
    if not _group_members(pgid):  # every member reaped too: the group itself is gone
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)


def test_dataset_with_a_lambda_works_with_loader_workers(launcher: TrialLauncher) -> None:
    """A user's dataset holding a lambda runs with num_workers=1 under fork, Linux's default; so must
    the trial. (A trial process comes from a fork server, whose start method the DataLoader would
    otherwise inherit: workers would then need a picklable dataset and re-import torch.)"""
    result = run(launcher, "lambda_transform", workers=1)
    assert result.outcome is Outcome.OK, result.reason


LEAK_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
from tests.support.helpers import RUNNER, request
from autotuner.trials.launcher import TrialLauncher
if __name__ == "__main__":
    result = TrialLauncher([RUNNER]).call(RUNNER, "run", request("ok", workers=1), 120)
    print("OUTCOME", result.outcome.value)
"""


@pytest.mark.slow
def test_a_trial_with_loader_workers_leaks_nothing(tmp_path: Path) -> None:
    """A trial ends with os._exit and its loader workers are SIGKILLed with its group: nothing they
    held may be left for the search process's resource tracker to warn about at exit."""
    script = tmp_path / "one_trial.py"
    script.write_text(LEAK_SCRIPT.format(root=str(ROOT)))
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert "OUTCOME ok" in done.stdout, done.stdout + done.stderr
    assert "leaked semaphore" not in done.stderr, done.stderr


PRELOAD_SCRIPT = """
import json, sys
sys.path.insert(0, {root!r})
from autotuner.backends import PYTORCH
from autotuner.trials.launcher import TrialLauncher
if __name__ == "__main__":
    result = PYTORCH.launcher().call("tests.support.helpers", "preloaded", None, 120)
    print("PRELOADED", json.dumps(result.output))
"""


@pytest.mark.slow
def test_the_fork_server_has_the_runner_torch_and_the_first_steps_imports_preloaded(tmp_path: Path) -> None:
    """Trials start fast because the fork server of a search's launcher imported the backend's
    runner (torch, and what the first optimizer step imports) once. multiprocessing ignores an
    ImportError in a preload module, so a broken import would only show as every trial importing
    them again. In a fresh interpreter: this one's fork server is whichever launcher came first."""
    script = tmp_path / "preloaded.py"
    script.write_text(PRELOAD_SCRIPT.format(root=str(ROOT)))
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=180)
    line = next((line for line in done.stdout.splitlines() if line.startswith("PRELOADED ")), None)
    assert line is not None, done.stdout + done.stderr
    preloaded = json.loads(line.removeprefix("PRELOADED "))
    assert preloaded == {"autotuner.backends.pytorch.runner": True, "torch": True, "torch._dynamo": True}


@pytest.mark.slow
def test_backends_imports_first_in_a_fresh_interpreter() -> None:
    """The fork server imports `autotuner.backends.pytorch.runner` before anything else of the project."""
    for module in (
        "autotuner.backends",
        "autotuner.backends.pytorch.runner",
        "autotuner.trials.launcher",
        "autotuner.spec.job",
    ):
        done = subprocess.run(
            [sys.executable, "-c", f"import {module}"], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"import {module}: {done.stderr.strip().splitlines()[-1:]}"


# ---------------------------------------------------------------- classify_end on its own


def test_classify_end_message_that_is_not_a_dict_is_a_crash() -> None:
    c = classify_end(ProcessEnd(message=["garbage", "\nover lines"], exitcode=0))
    assert c.outcome is Outcome.CRASH
    assert_one_line(c.reason)
    assert "unreadable" in c.reason and "garbage" in c.reason


def test_classify_end_dict_with_unknown_status_is_a_crash() -> None:
    c = classify_end(ProcessEnd(message={"status": "weird"}, exitcode=0))
    assert c.outcome is Outcome.CRASH
    assert_one_line(c.reason)
    assert "weird" in c.reason


def test_classify_end_raised_with_unknown_kind_is_a_crash() -> None:
    c = classify_end(ProcessEnd(message={"status": "raised", "kind": "gremlins", "reason": "x"}, exitcode=0))
    assert c.outcome is Outcome.CRASH
    assert_one_line(c.reason)
    assert "gremlins" in c.reason


def test_classify_end_ok_without_a_mapping_is_a_crash() -> None:
    c = classify_end(ProcessEnd(message={"status": "ok", "result": [1, 2]}, exitcode=0))
    assert c.outcome is Outcome.CRASH
    assert_one_line(c.reason)


def test_classify_end_ok_carries_the_result() -> None:
    c = classify_end(ProcessEnd(message={"status": "ok", "result": {"a": 1}}, exitcode=0))
    assert c.outcome is Outcome.OK and c.result == {"a": 1} and c.reason == ""


def test_classify_end_ok_carries_a_trial_output_as_it_came() -> None:
    output = TrialOutput(Losses(2.0, [2.5, 2.2]))
    c = classify_end(ProcessEnd(message={"status": "ok", "result": output}, exitcode=0))
    assert c.outcome is Outcome.OK and c.result is output


@pytest.mark.parametrize(
    ("exitcode", "name"),
    [
        (-signal.SIGSEGV, "SIGSEGV"),
        (-signal.SIGKILL, "SIGKILL"),
        (-signal.SIGBUS, "SIGBUS"),
        (-signal.SIGABRT, "SIGABRT"),
    ],
)
def test_classify_end_negative_exit_code_names_the_signal(exitcode: int, name: str) -> None:
    c = classify_end(ProcessEnd(message=None, exitcode=exitcode))
    assert c.outcome is Outcome.CRASH
    assert_one_line(c.reason)
    assert name in c.reason


def test_classify_end_unknown_signal_number() -> None:
    c = classify_end(ProcessEnd(message=None, exitcode=-200))
    assert c.outcome is Outcome.CRASH
    assert "signal 200" in c.reason


def test_classify_end_positive_exit_code_without_message() -> None:
    c = classify_end(ProcessEnd(message=None, exitcode=7))
    assert c.outcome is Outcome.CRASH
    assert_one_line(c.reason)
    assert "code 7" in c.reason and "without a result" in c.reason


def test_classify_end_read_error_is_a_crash_with_the_error() -> None:
    c = classify_end(
        ProcessEnd(message=None, exitcode=0, read_error="UnpicklingError: invalid load key, '\\x00'.\nmore")
    )
    assert c.outcome is Outcome.CRASH
    assert_one_line(c.reason)
    assert "UnpicklingError" in c.reason


def test_classify_end_timed_out_wins_over_everything_else() -> None:
    c = classify_end(ProcessEnd(message={"status": "ok", "result": {}}, exitcode=-9, timed_out=True, timeout_s=2.5))
    assert c.outcome is Outcome.TIMEOUT
    assert_one_line(c.reason)
    assert "2.5 s" in c.reason


def test_classify_end_raised_message_keeps_kind_reason_and_traceback() -> None:
    message = {
        "status": "raised",
        "kind": "error",
        "reason": "KeyError: 'x'\n  with a second line",
        "traceback": "Traceback...\nKeyError",
    }
    c = classify_end(ProcessEnd(message=message, exitcode=0))
    assert c.outcome is Outcome.ERROR
    assert c.reason == "KeyError: 'x' with a second line"
    assert c.traceback == "Traceback...\nKeyError"


# ---------------------------------------------------------------- exception_message


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 - a real raised exception, with a traceback
        return caught


def test_exception_message_for_a_real_torch_oom() -> None:
    exc = _raised(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.\nGPU 0 has 1 GiB free"))
    assert TRIAL_BACKEND.classify_exception(exc) == "oom"
    message = exception_message(exc, lambda e: TRIAL_BACKEND.classify_exception(e) == "oom")
    assert message["status"] == "raised" and message["kind"] == "oom"
    assert_one_line(message["reason"])
    assert message["reason"].startswith("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert "traceback" not in message
    assert classify_end(ProcessEnd(message, 0)).outcome is Outcome.OOM


def test_oom_is_decided_by_type_never_by_text() -> None:
    text_only = _raised(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert TRIAL_BACKEND.classify_exception(text_only) is None
    message = exception_message(text_only, lambda e: TRIAL_BACKEND.classify_exception(e) == "oom")
    assert message["kind"] == "error"
    assert "Traceback (most recent call last)" in message["traceback"]


def test_classify_exception_other_types() -> None:
    assert TRIAL_BACKEND.classify_exception(ValueError("x")) is None
    assert (
        TRIAL_BACKEND.classify_exception(MemoryError()) is None
    )  # Python's own: autotuner.trials.outcomes makes it oom
    assert TRIAL_BACKEND.classify_exception(KeyboardInterrupt()) is None


def test_exception_message_non_finite_loss_is_nan() -> None:
    from autotuner.trials.outcomes import NonFiniteLoss

    message = exception_message(_raised(NonFiniteLoss("the loss became inf during drift step 2")), lambda e: False)
    assert message == {"status": "raised", "kind": "nan", "reason": "the loss became inf during drift step 2"}
