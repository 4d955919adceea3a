"""A trial across machines: this node's ranks of a trial whose ranks span `nodes` machines.

On every node the trial process (`autotuner.trials.launcher`) runs `run_nodes`: a
`torch.distributed.elastic` agent (what `torchrun` runs) starts this node's `processes` ranks,
forked, after a `c10d` rendezvous of all the nodes' agents on node 0's store (`rendezvous:` in
the spec: node 0's search hosts a `TCPStore` there for the study, `autotuner.trials.nodes`), one
rendezvous id per trial (`TrialRequest.run_id`), no restart (a failure is the trial's outcome).
A rank's global rank is `node_rank` x `processes` + its local rank (autotuner's node ranks: node 0
is the search's, whose rank 0 measures; the rendezvous's own order is by host name). The ranks join
their process group on the same store, under the trial's id, and run the one trial algorithm as
`autotuner.backends.pytorch.ranks.run_as_rank` does on one machine.

What the nodes tell each other goes through the store, under the trial's id: each rank's end
(`end/<rank>`: ok, or how it failed), rank 0's result (`result`), `failed` once any rank failed and
`over` once rank 0 finished. Every rank watches `failed` and `over` from a thread and leaves at
once when either is set (a peer may be blocked in a collective that will never complete), and the
search on node 0 sets `over` when its trial process ends however it ends (its timeout included),
so a rank that hangs on any node leaves too. A rank that dies without a word gets its end written
by its node's trial process (from the agent's exit codes). Node 0's trial process returns rank 0's
result, or raises `RankFailed` with the first failure, naming its node and rank; a node that said
nothing at all (its worker or machine is gone) is named as such. Every rank dies with its trial
process (PR_SET_PDEATHSIG), the trial process with its fork server.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import tempfile
import threading
import time
from typing import TYPE_CHECKING, cast

import torch.distributed as dist

from autotuner.backends.pytorch import PYTORCH
from autotuner.backends.pytorch.ranks import (
    SECONDARY,
    STOPPED,
    STORE_TIMEOUT,
    Rank,
    first_failure,
    run_as_rank,
    silent_exit,
)
from autotuner.measurement.hardware import core_shares
from autotuner.measurement.telemetry import usable_cpus
from autotuner.measurement.turns import Turns
from autotuner.trials.launcher import die_with_parent
from autotuner.trials.nodes import decoded, encoded, split_endpoint
from autotuner.trials.outcomes import EndMessage, Outcome, RankFailed
from autotuner.trials.request import ProfileRequest, TrialRequest
from autotuner.trials.trial_output import NodePart, ProfileOutput, TrialOutput

if TYPE_CHECKING:
    from autotuner.backends.pytorch.ranks import Trainer

JOIN_TIMEOUT_S = 60
"""How long a trial's rendezvous waits for every node's agent: the others start the trial as soon
as node 0 hands it to them."""
EXIT_BARRIER_S = 2
"""How long an agent whose ranks all finished waits for the other nodes' agents (the store is the
search's, not an agent's: nothing needs them to wait longer)."""
WATCH_S = 0.1
"""How often a rank looks whether the trial failed or ended elsewhere."""
FINISH_S = 2.0
"""Once rank 0 finished, how long another rank may take to finish too before it is stopped (one
that rank 0 left inside a step, when it stopped the trial early, never will)."""
GRACE_S = 2.0
"""After a failure, how long node 0 waits for every rank's end to reach the store before it
chooses which to report: a node's agent sees its ranks' ends within its monitor interval."""


def study_store(endpoint: str) -> dist.Store:
    """A client of the store node 0's search hosts at `endpoint` (`PyTorchBackend.node_store`),
    whose waits last as long as a rank's for rank 0's next command."""
    return cast(dist.Store, PYTORCH.node_store(endpoint, host=False, timeout_s=STORE_TIMEOUT.total_seconds()))


def run_nodes(
    backend: Trainer, request: TrialRequest | ProfileRequest, turns: Turns | None = None
) -> TrialOutput | ProfileOutput | NodePart:
    """This node's part of the trial of `request` (or its profile): its ranks started by an elastic
    agent once every node's agent met at the rendezvous. Node 0: rank 0's output, or `RankFailed`
    with the trial's first failure; another node: its `NodePart`, or `RankFailed` as node 0 would
    report it."""
    trial: TrialRequest = request.trial if isinstance(request, ProfileRequest) else request
    assert trial.rendezvous is not None and trial.run_id is not None, "a trial across nodes is handed out by node 0"
    store = dist.PrefixStore(trial.run_id, study_store(trial.rendezvous))
    shares = core_shares(usable_cpus(), trial.processes)
    exits = _run_agent(trial, _node_rank, (backend, request, turns, shares))
    base = trial.node_rank * trial.processes
    for local, code in exits.items():  # a rank that died without a word: its end from its exit code
        if code != 0 and _write_end(store, base + local, _silent_end(code)):
            store.add("failed", 1)
    if trial.node_rank == 0 and store.check(["result"]):
        end = cast(EndMessage, decoded(store.get("result")))
        if end["status"] == "ok":
            return cast(TrialOutput | ProfileOutput, end["result"])
    if trial.node_rank != 0 and not store.check(["failed"]):
        return NodePart(trial.node_rank)
    raise RankFailed(_first_failure(store, trial))


def _run_agent(trial: TrialRequest, entrypoint: object, args: tuple[object, ...]) -> dict[int, int]:
    """This node's ranks run by a `LocalElasticAgent` after the trial's `c10d` rendezvous; each local
    rank's exit code. A rendezvous that fails (a node missing) is a RuntimeError saying so."""
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.rendezvous import RendezvousError, RendezvousParameters
    from torch.distributed.elastic.rendezvous import registry as rendezvous_registry

    _quiet_elastic()
    assert trial.rendezvous is not None
    parameters = RendezvousParameters(
        backend="c10d",
        endpoint=trial.rendezvous,
        run_id=trial.run_id or "",
        min_nodes=trial.nodes,
        max_nodes=trial.nodes,
        local_addr=local_address(trial.rendezvous),
        is_host=False,  # the store is node 0's search's
        join_timeout=JOIN_TIMEOUT_S,
    )
    with tempfile.TemporaryDirectory(prefix="autotuner-elastic-") as logs:
        try:
            spec = WorkerSpec(
                role="trial",
                local_world_size=trial.processes,
                entrypoint=entrypoint,  # type: ignore[arg-type]
                args=args,
                rdzv_handler=rendezvous_registry.get_rendezvous_handler(parameters),
                max_restarts=0,
                monitor_interval=0.1,
                local_addr=parameters.local_addr,
            )
            agent = LocalElasticAgent(
                spec, DefaultLogsSpecs(log_dir=logs), start_method="fork", exit_barrier_timeout=EXIT_BARRIER_S
            )
            result = agent.run()
        except RendezvousError as exc:
            raise RuntimeError(
                f"the trial's {trial.nodes} nodes did not all meet at the rendezvous {trial.rendezvous} within "
                f"{JOIN_TIMEOUT_S} s ({type(exc).__name__}): is `autotuner search --node-rank R` running on every node?"
            ) from None
    exits = {failure.local_rank: failure.exitcode for failure in result.failures.values()}
    return {local: exits.get(local, 0) for local in range(trial.processes)}


def _quiet_elastic() -> None:
    """The elastic agent's info lines kept out of the trial's log: what the trial says is its end."""
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def local_address(endpoint: str) -> str:
    """The address this machine reaches `endpoint` from (the interface its route takes, no packet
    sent): what the rendezvous tells the other nodes about this one."""
    host, port = split_endpoint(endpoint)
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port))
            return str(probe.getsockname()[0])
    except OSError:
        return socket.getfqdn()


def _node_rank(
    backend: Trainer, request: TrialRequest | ProfileRequest, turns: Turns | None, shares: list[set[int]]
) -> None:
    """One rank of a trial across nodes (started by the elastic agent, `LOCAL_RANK` in its
    environment): run it as its global rank, its end (and rank 0's result) written to the store."""
    die_with_parent()
    trial: TrialRequest = request.trial if isinstance(request, ProfileRequest) else request
    local = int(os.environ["LOCAL_RANK"])
    where = Rank(trial.node_rank * trial.processes + local, local, trial.nodes * trial.processes, shares[local])
    assert trial.rendezvous is not None and trial.run_id is not None
    try:
        store = dist.PrefixStore(trial.run_id, study_store(trial.rendezvous))
    except BaseException as exc:  # node 0's store is gone: nobody to tell
        raise SystemExit(f"rank {where.rank}: {exc}") from None
    threading.Thread(target=_watch, args=(trial, where.rank), daemon=True).start()
    end = run_as_rank(backend, request, turns, where, store)
    if where.rank == 0:
        store.set("result", encoded(end))
    _write_end(store, where.rank, {k: v for k, v in end.items() if k != "result"})
    if end["status"] != "ok":
        store.add("failed", 1)
        os._exit(1)  # loader workers and compile pools die with the trial process's group
    if where.rank == 0:
        store.set("over", "1")
    # returns to the agent's wrapper: a rank that leaves with os._exit(0) would leave it waiting for its return value


def _watch(trial: TrialRequest, rank: int) -> None:
    """A rank's watch (a daemon thread, on a store connection of its own): leave at once when the
    trial failed or ended elsewhere, or when node 0's store is gone."""
    assert trial.rendezvous is not None and trial.run_id is not None
    try:
        store = dist.PrefixStore(trial.run_id, study_store(trial.rendezvous))
        while not store.check(["failed"]) and not store.check(["over"]):
            time.sleep(WATCH_S)
        finishing = time.monotonic() + FINISH_S
        while not store.check(["failed"]) and time.monotonic() < finishing:
            time.sleep(WATCH_S)  # over: this rank may be finishing its last step, then it leaves on its own
        _write_end(store, rank, {"status": STOPPED})
    except BaseException:  # the store is gone with node 0's search
        pass
    os._exit(1)


def _write_end(store: dist.Store, rank: int, end: dict[str, object]) -> bool:
    """`end` as rank `rank`'s unless it has one already (the first word stands); whether it was."""
    text = json.dumps({k: v for k, v in end.items() if isinstance(v, (str, int, float, bool, type(None)))})
    return store.compare_set(f"end/{rank}", "", text).decode() == text


def _silent_end(code: int) -> dict[str, object]:
    """The end of a rank that exited with `code` without writing one."""
    return {"status": "raised", "kind": Outcome.CRASH.value, "reason": silent_exit(code), "at": time.time()}


def _first_failure(store: dist.Store, trial: TrialRequest) -> EndMessage:
    """The end to report, named by node and rank: a rank's own failure (out of memory, a NaN, an
    unsupported knob) before a rank that died without a word, before a node none of whose ranks
    said anything (its worker or machine is gone), before an error (a collective whose peer is
    gone fails too); the first of each. Waits up to `GRACE_S` for every rank's end."""
    world = trial.nodes * trial.processes
    keys = [f"end/{rank}" for rank in range(world)]
    deadline = time.monotonic() + GRACE_S
    while not store.check(keys) and time.monotonic() < deadline:
        time.sleep(WATCH_S)
    ends: dict[int, EndMessage] = {r: json.loads(store.get(key)) for r, key in enumerate(keys) if store.check([key])}
    found = first_failure(ends)

    def named(rank: int, end: EndMessage) -> EndMessage:
        node = rank // trial.processes
        return {**end, "reason": f"node {node}, rank {rank} of {world}: {end.get('reason', '')}"}

    if found is not None and found[1].get("kind") not in SECONDARY:  # a rank's own failure, or its silent death
        return named(*found)
    silent = sorted({rank // trial.processes for rank in range(world) if rank not in ends})
    if silent:
        node = silent[0]
        ranks = range(node * trial.processes, (node + 1) * trial.processes)
        return {
            "status": "raised",
            "kind": Outcome.CRASH.value,
            "reason": f"node {node} (ranks {ranks[0]}-{ranks[-1]} of {world}) ended without a word: its worker or "
            "machine is gone",
        }
    if found is not None:
        return named(*found)  # the first error
    return {"status": "raised", "kind": Outcome.ERROR.value, "reason": "the trial failed on another node"}
