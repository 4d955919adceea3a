"""A trial of several processes: the ranks of one config, started and watched by its trial process.

With `processes: N` the trial process (`autotuner.trials.launcher`) does not train: it starts N
ranks with `torch.multiprocessing.start_processes` (forked, so nothing is imported again and no
device has been touched before the fork), then hosts their rendezvous (a `torch.distributed.TCPStore`
on 127.0.0.1, started after the fork: its server thread is not copied into the ranks; they learn
its port through a pipe), and waits for them. Each rank joins the trial's process group (NCCL on GPUs, gloo
on the CPU) on its own device (`cuda:K+rank` from the request's `cuda:K`; on the CPU its own
share of the cores, as many threads), then runs the one trial algorithm
(`autotuner.trials.training.run_trial`) as a rank of `StoreGroup`: rank 0 measures and reports, the
others take the same steps. Rank 0 talks to the launcher directly (it inherits the trial's pipes:
its lockstep turns go both ways as a one-process trial's do).

The ranks fail together. A rank that raises sends its classified end (`oom`, `nan`,
`unsupported`, `error`) to the trial process and exits; one that dies sends nothing. Either way
the trial process kills every rank at once (the others may be blocked in a collective that will
never complete) and the trial ends with that rank's outcome, its reason naming the rank
(`RankFailed`). A pruned trial ends when rank 0 stops, wherever the others are: they are killed
with it. A rank that hangs keeps the others waiting in a collective: the launcher's
timeout kills the trial's process group, every rank and loader worker in it. Each rank dies
with the trial process (PR_SET_PDEATHSIG), and the trial process with the fork server, so kill -9
of the search leaves no rank behind.
"""

from __future__ import annotations

import datetime
import multiprocessing.connection
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, overload

import torch
import torch.distributed as dist
import torch.multiprocessing

from autotuner.measurement.hardware import core_shares
from autotuner.measurement.telemetry import usable_cpus
from autotuner.measurement.turns import Turns
from autotuner.trials.launcher import die_with_parent
from autotuner.trials.outcomes import EndMessage, Outcome, RankFailed, exception_message
from autotuner.trials.request import ProfileRequest, TrialRequest
from autotuner.trials.training import TrainingBackend, run_profile, run_trial
from autotuner.trials.trial_output import ProfileOutput, TrialOutput

if TYPE_CHECKING:
    from autotuner.backends.pytorch.apply import TunedTraining
    from autotuner.backends.pytorch.workload import TorchWorkload

    Trainer = TrainingBackend[torch.device, TorchWorkload, TunedTraining]

HOST = "127.0.0.1"
STORE_TIMEOUT = datetime.timedelta(days=7)
"""How long a rank waits at the store for rank 0's next command: as long as it takes (lockstep
turns, compiling); the launcher's timeout bounds the trial."""
GRACE_S = 1.0
"""After the first rank fails, how long the trial process waits for the others' ends before it
chooses which to report: a rank that crashed and the collective error it caused on its peer
arrive within milliseconds of each other."""
SECONDARY = (Outcome.ERROR.value,)
"""Outcomes a rank may end with because another rank failed first (a collective error): reported
only when no rank ended otherwise."""
STOPPED = "stopped"
"""The status of a rank that left because the trial failed or ended elsewhere (a trial across
nodes): not a failure."""


class StoreGroup:
    """`autotuner.trials.training.RankGroup` over the trial's `TCPStore`: rank 0's commands under
    numbered keys, gathered values under `key/rank`. `devices` are the devices of this node's
    ranks (rank 0 reads its node's GPUs' telemetry); `size` counts every node's."""

    def __init__(self, store: dist.Store, rank: int, size: int, devices: list[str]):
        self.store, self.rank, self.size, self.devices = store, rank, size, devices
        self._sent = self._read = 0

    def announce(self, what: str, count: int) -> None:
        self.store.set(f"command/{self._sent}", f"{what} {count}")
        self._sent += 1

    def next_command(self) -> tuple[str, int]:
        what, count = self.store.get(f"command/{self._read}").decode().rsplit(" ", 1)
        self._read += 1
        return what, int(count)

    def gather(self, key: str, value: float) -> list[float]:
        self.store.set(f"{key}/{self.rank}", repr(float(value)))
        if self.rank != 0:
            return []
        return [float(self.store.get(f"{key}/{rank}").decode()) for rank in range(self.size)]


def rank_device(spec: str, rank: int) -> str:
    """The device of `rank` for a trial on `spec` (`cpu`, `cuda`, `cuda:K`, `auto`): the CPU for
    every rank, or the `rank`-th GPU from K on."""
    if spec == "cpu" or (spec == "auto" and not torch.cuda.is_available()):
        return "cpu"
    base = int(spec.partition(":")[2] or 0)
    return f"cuda:{base + rank}"


@overload
def run_ranks(backend: Trainer, request: TrialRequest, turns: Turns | None = None) -> TrialOutput: ...


@overload
def run_ranks(backend: Trainer, request: ProfileRequest, turns: None = None) -> ProfileOutput: ...


def run_ranks(
    backend: Trainer, request: TrialRequest | ProfileRequest, turns: Turns | None = None
) -> TrialOutput | ProfileOutput:
    """Run the trial of `request` (or its profile) as its trial's ranks and return rank 0's
    output; `RankFailed` with the first rank's end when one fails."""
    trial: TrialRequest = request.trial if isinstance(request, ProfileRequest) else request
    size = trial.processes
    receivers, senders = zip(*(multiprocessing.Pipe(duplex=False) for _ in range(size)), strict=True)
    port_readers, port_writers = zip(*(multiprocessing.Pipe(duplex=False) for _ in range(size)), strict=True)
    shares = core_shares(usable_cpus(), size)
    context = torch.multiprocessing.start_processes(
        _rank_main,
        args=(backend, request, turns, list(port_readers), list(senders), shares),
        nprocs=size,
        join=False,
        start_method="fork",
    )
    for end in (*senders, *port_readers):
        end.close()
    try:
        # The store's server thread starts after the fork (a fork copies no thread, and a lock a
        # thread held stays held in the child): the ranks learn its port through their pipes.
        store = dist.TCPStore(HOST, 0, size, is_master=True, wait_for_workers=False, timeout=STORE_TIMEOUT)
        for writer in port_writers:
            writer.send(store.port)
            writer.close()
        return _watch(context.processes, list(receivers))
    finally:
        for process in context.processes:
            if process.is_alive():
                os.kill(process.pid, signal.SIGKILL)
            process.join()


def _watch(processes: list[Any], receivers: list[multiprocessing.connection.Connection]) -> Any:
    """Wait for the ranks: rank 0's output once every rank sent an ok end, or at once when rank 0's
    trial was pruned (the others may be inside a step it left: they are killed with the trial);
    `RankFailed` as soon as one raised or exited otherwise (after `GRACE_S` for the ends that
    failure caused)."""
    ends: dict[int, EndMessage] = {}
    exited: dict[int, int | None] = {}
    pipes = dict(enumerate(receivers))
    failed_at: float | None = None
    while True:
        if sum(end.get("status") == "ok" for end in ends.values()) == len(processes) or ends.get(0, {}).get("pruned"):
            return ends[0]["result"]
        failing = any(end.get("status") != "ok" for end in ends.values()) or any(exited.values())
        if failing and failed_at is None:
            failed_at = time.monotonic()
        left = None if failed_at is None else failed_at + GRACE_S - time.monotonic()
        waitable = [*pipes.values(), *(p.sentinel for rank, p in enumerate(processes) if rank not in exited)]
        if (left is not None and left <= 0) or not waitable:
            break
        for item in multiprocessing.connection.wait(waitable, left):
            if isinstance(item, multiprocessing.connection.Connection):
                rank = receivers.index(item)
                del pipes[rank]
                try:
                    ends[rank] = item.recv()
                except (EOFError, OSError):
                    pass  # it died without a word: its exit code tells
            else:
                rank = next(r for r, p in enumerate(processes) if p.sentinel == item)
                processes[rank].join()
                exited[rank] = processes[rank].exitcode
    raise RankFailed(_first_failure(ends, exited, len(processes)))


def _first_failure(ends: dict[int, EndMessage], exited: dict[int, int | None], size: int) -> EndMessage:
    """The end to report (`first_failure`), a rank that died without a word counted from its exit
    code, named by its rank."""
    silent: dict[int, EndMessage] = {
        rank: {"status": "raised", "kind": Outcome.CRASH.value, "reason": silent_exit(code)}
        for rank, code in sorted(exited.items())
        if rank not in ends
    }
    found = first_failure({**ends, **silent})
    assert found is not None, "a rank failed"
    rank, end = found
    said = "" if rank in silent else ":"  # `rank 1 of 2 was killed by SIGKILL`, `rank 1 of 2: ValueError: ...`
    return {**end, "reason": f"rank {rank} of {size}{said} {end.get('reason', '')}"}


def first_failure(ends: Mapping[int, EndMessage]) -> tuple[int, EndMessage] | None:
    """Which failed end of `ends` (rank -> end) to report: a rank's own failure (out of memory, a
    NaN, an unsupported knob) before a rank that died without a word (`crash`), before an error
    (which a peer's failure may have caused: a collective whose peer is gone fails too); the first
    to fail of each (`at`). Ends that are not failures (ok, `STOPPED`) are passed over; None when
    none failed."""
    failed = sorted(
        ((rank, end) for rank, end in ends.items() if end.get("status") not in ("ok", STOPPED)),
        key=lambda item: item[1].get("at", 0),
    )
    for order in (lambda kind: kind not in (*SECONDARY, Outcome.CRASH.value), lambda kind: kind == Outcome.CRASH.value):
        chosen = [(rank, end) for rank, end in failed if order(end.get("kind"))]
        if chosen:
            return chosen[0]
    return failed[0] if failed else None


def silent_exit(code: int | None) -> str:
    """How a rank that sent no end ended, from its exit code: `was killed by SIGKILL`, `exited with
    code 1 without a result`."""
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code} without a result"


def _rank_main(
    rank: int,
    backend: Trainer,
    request: TrialRequest | ProfileRequest,
    turns: Turns | None,
    ports: list[multiprocessing.connection.Connection],
    senders: list[multiprocessing.connection.Connection],
    shares: list[set[int]],
) -> None:
    """One rank: join the process group (the store's port comes through `ports[rank]`), run
    the trial (or its profile) as rank `rank`, send its end, exit."""
    die_with_parent()
    sender = senders[rank]
    for other in (*senders, *ports):
        if other is not sender and other is not ports[rank]:
            other.close()
    try:
        port = ports[rank].recv()  # EOFError if the trial process could not start the store
        ports[rank].close()
        trial: TrialRequest = request.trial if isinstance(request, ProfileRequest) else request
        store = dist.TCPStore(HOST, port, trial.processes, is_master=False, timeout=STORE_TIMEOUT)
    except BaseException as exc:
        end = failed_end(backend, exc)
    else:
        end = run_as_rank(backend, request, turns, Rank(rank, rank, trial.processes, shares[rank]), store)
    try:
        sender.send(end)
    finally:
        os._exit(0 if end["status"] == "ok" else 1)  # loader workers and compile pools die with the group


@dataclass(frozen=True)
class Rank:
    """Where one rank of a trial stands: its global rank among `size`, its rank on its node (its
    device: `cuda:K+local` from the request's `cuda:K`) and, on the CPU, its node's cores it runs on."""

    rank: int
    local: int
    size: int
    cores: set[int]


def failed_end(backend: Trainer, exc: BaseException) -> EndMessage:
    """The end of a rank that raised `exc`, classified, with the wall-clock time it failed at (which
    rank failed first: comparable across nodes as far as their clocks agree)."""
    end = exception_message(exc, lambda e: backend.classify_exception(e) == "oom")
    end["at"] = time.time()
    return end


def run_as_rank(
    backend: Trainer, request: TrialRequest | ProfileRequest, turns: Turns | None, where: Rank, store: dist.Store
) -> EndMessage:
    """Join the trial's process group on `store` as `where.rank` and run the trial (or its profile)
    as that rank; its end (rank 0's carries the result)."""
    try:
        trial: TrialRequest = request.trial if isinstance(request, ProfileRequest) else request
        device = rank_device(trial.device, where.local)
        os.environ["LOCAL_WORLD_SIZE"] = str(trial.processes)  # as torchrun sets it: FSDP2's hybrid mesh reads it
        if device == "cpu":
            if hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(0, where.cores)
            torch.set_num_threads(len(where.cores))
        dist.init_process_group(
            "nccl" if device.startswith("cuda") else "gloo",
            store=dist.PrefixStore("process_group", store),
            rank=where.rank,
            world_size=where.size,
            device_id=torch.device(device) if device.startswith("cuda") else None,
        )
        devices = [rank_device(trial.device, r) for r in range(trial.processes)]  # this node's
        group = StoreGroup(dist.PrefixStore("trial", store), where.rank, where.size, devices)
        own = replace(trial, device=device, progress=trial.progress if where.rank == 0 else None)
        result: TrialOutput | ProfileOutput
        if isinstance(request, ProfileRequest):
            result = run_profile(backend, replace(request, trial=own), group)
        else:
            result = run_trial(backend, own, turns if where.rank == 0 else None, group)
        end: EndMessage = {"status": "ok", "result": result if where.rank == 0 else None}
        throughput = getattr(result, "throughput", None) if where.rank == 0 else None
        end["pruned"] = throughput is not None and throughput.stopped is not None
        return end
    except BaseException as exc:  # everything a rank raises is the trial's outcome
        return failed_end(backend, exc)
