"""Imported by the trial fork server alone (`autotuner.trials.launcher.TrialLauncher` preloads it): when
the search process that started the fork server dies, however it dies (kill -9 included), the
fork server kills every trial process group it started, then exits.

The fork server cannot rely on multiprocessing noticing: it waits for end-of-file on a pipe whose
write end every process it forks inherits, so it lives as long as any trial does, and a trial
dies with the fork server (PR_SET_PDEATHSIG), so a hung trial would keep both alive for ever.
Here Linux itself tells the fork server (PR_SET_PDEATHSIG, SIGTERM) when its parent dies. Each
trial process leads its own process group, and its data-loader workers, compile workers and
whatever else it started are in that group, so nothing of a trial outlives the search.

It fixes the host allocator's thresholds before it forks anything, so that every trial process,
and its ranks and loader workers, allocates as the others do (`autotuner.measurement.allocator`).

It also keeps the fork server from initialising CUDA, after which every forked trial would fail
("Cannot re-initialize CUDA in forked subprocess"): `torch.cuda.is_available()`, wherever a
preloaded module calls it, asks NVML instead of the CUDA driver (PYTORCH_NVML_BASED_CUDA_CHECK).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
from types import FrameType

from autotuner.measurement.allocator import steady_allocator

# before the runners are preloaded: torch reads it at every is_available() call
os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
steady_allocator()

_SERVER = os.getpid()
_PR_SET_PDEATHSIG = 1


def _child_groups() -> list[int]:
    """The process groups led by children of this process (the trial processes)."""
    groups = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as file:
                stat = file.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (name) ": state, ppid, pgid, ...
        if int(fields[1]) == _SERVER and int(fields[2]) == int(entry):
            groups.append(int(entry))
    return groups


def kill_trial_groups() -> None:
    if os.getpid() != _SERVER:
        return  # a trial process inherits the exit handler; it is the fork server's alone
    for group in _child_groups():
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _parent_died(signum: int, frame: FrameType | None) -> None:
    if os.getpid() != _SERVER:  # inherited by a trial process: behave as if there were no handler
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    kill_trial_groups()
    os._exit(0)


def _watch_parent() -> None:
    parent = os.getppid()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return  # not Linux
    signal.signal(signal.SIGTERM, _parent_died)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died while the request was being made
        _parent_died(signal.SIGTERM, None)


if os.path.isdir("/proc"):
    _watch_parent()
    atexit.register(kill_trial_groups)  # the fork server's normal end (its search ended)
