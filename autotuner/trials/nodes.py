"""Trials across machines, the search's side: node 0 hands every trial to the other nodes.

A study whose trials span `nodes` machines runs `autotuner search` on each: node 0's is the
search (it holds the study, draws the configs, and its trials' rank 0 measures); the others follow
it (`autotuner.workers.nodes.follow`). Node 0's search hosts a store at the spec's `rendezvous`
(the framework's: `torch.distributed`'s `TCPStore`, through `autotuner.backends.Backend.node_store`)
for as long as it runs. Its launcher (`LeadingLauncher`) gives each trial request a rendezvous
id (`TrialRequest.run_id`) and writes it to the store before starting its own trial process; each
other node starts the same request as its node rank, and the trial's ranks meet under that id
(the backend's runner: `autotuner.backends.pytorch.nodes`). When node 0's trial process ends,
however it ends, the launcher marks the trial `over`, and every rank still running on any node
leaves. When the search ends, it tells the other nodes so.

Keys: `node/<R>/joined` and `node/<R>/left` (a follower's), `request/<k>` (the k-th request, pickled
with its function and timeout, `encoded`; `DONE` once the search is over), `<run_id>/...` (a
trial's own). The store carries pickles between the nodes of one job: like `torchrun`'s, it trusts
its network.
"""

from __future__ import annotations

import base64
import pickle
import time
from dataclasses import replace
from typing import Protocol

from autotuner.errors import shown
from autotuner.trials.launcher import TrialLauncher, TrialProcess
from autotuner.trials.request import ProfileRequest, TrialRequest

DONE = "done"
"""`request/<k>` once node 0's search is over: the followers leave."""
POLL_S = 0.1
LEAVE_S = 5.0
"""How long node 0's search waits, at its end, for the other nodes to read that it is over (its
store closes with it): they look ten times a second; one that is gone never does."""


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """`host:port` (a bracketed IPv6 host too) as its host and port; ValueError otherwise."""
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{shown(endpoint)} is not host:port (a port from 1 to 65535)")
    return host.strip("[]"), int(port)


class NodeStore(Protocol):
    """The store the nodes of a study share (`torch.distributed.Store`'s methods that are used)."""

    def set(self, key: str, value: str) -> None: ...

    def get(self, key: str) -> bytes: ...

    def check(self, keys: list[str]) -> bool: ...


def encoded(value: object) -> str:
    """`value` pickled, as text a store holds (`decoded` reads it)."""
    return base64.b64encode(pickle.dumps(value)).decode("ascii")


def decoded(text: bytes) -> object:
    """What `encoded` wrote, as a store gives it back."""
    return pickle.loads(base64.b64decode(text))


def spans_nodes(request: object) -> TrialRequest | None:
    """The trial of `request` when it spans several nodes, else None."""
    trial = request.trial if isinstance(request, ProfileRequest) else request
    return trial if isinstance(trial, TrialRequest) and trial.nodes > 1 else None


def with_trial(request: object, trial: TrialRequest) -> object:
    """`request` (a trial or a profile of one) with its trial replaced by `trial`."""
    return replace(request, trial=trial) if isinstance(request, ProfileRequest) else trial


class LeadingLauncher(TrialLauncher):
    """Node 0's launcher: a trial that spans nodes is handed to the other nodes (its request,
    with a rendezvous id of its own, written to the store) as its process starts here, and marked
    over in the store when its process ends."""

    def __init__(self, launcher: TrialLauncher, store: NodeStore, name: str):
        self.__dict__.update(launcher.__dict__)  # the same fork server and memory limit
        self.store, self.name, self.handed_out = store, name, 0

    def start(self, runner: str, function: str, arg: object, timeout_s: float, *, turns: bool = False) -> TrialProcess:
        trial = spans_nodes(arg)
        if trial is None:
            return super().start(runner, function, arg, timeout_s, turns=turns)
        run_id = f"{self.name}-{self.handed_out}"
        arg = with_trial(arg, replace(trial, run_id=run_id, node_rank=0))
        self.store.set(f"request/{self.handed_out}", encoded((function, arg, timeout_s)))
        self.handed_out += 1
        process = super().start(runner, function, arg, timeout_s, turns=turns)
        process.on_end = lambda: self.store.set(f"{run_id}/over", "1")
        return process

    def wait_for_nodes(self, nodes: int, timeout_s: float) -> list[int]:
        """Wait until nodes 1 to `nodes - 1` have joined, at most `timeout_s`; those that have not."""
        deadline = time.monotonic() + timeout_s
        while True:
            missing = [node for node in range(1, nodes) if not self.store.check([f"node/{node}/joined"])]
            if not missing or time.monotonic() > deadline:
                return missing
            time.sleep(POLL_S)

    def finish(self, nodes: int) -> None:
        """Tell the other nodes the search is over, and give them `LEAVE_S` to read it."""
        self.store.set(f"request/{self.handed_out}", DONE)
        deadline = time.monotonic() + LEAVE_S
        joined = [node for node in range(1, nodes) if self.store.check([f"node/{node}/joined"])]
        while time.monotonic() < deadline and not all(self.store.check([f"node/{node}/left"]) for node in joined):
            time.sleep(POLL_S)
