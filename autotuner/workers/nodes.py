"""The nodes of a study whose trials span machines: node 0 leads, the others follow.

`autotuner search --spec S --node-rank R` with R above 0 runs `follow`: it joins node 0's store at
the spec's `rendezvous` and runs, as node R, every trial node 0 hands out
(`autotuner.trials.nodes.LeadingLauncher`), each in its own trial process with the trial's
timeout, several at once when node 0 runs several at once, until node 0's search is over. It
never opens the study's storage: node 0 records every trial. `lead` is node 0's side: its store,
its launcher, and the wait for the other nodes before the first trial.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import cast

from autotuner.errors import BackendError, SpecError
from autotuner.spec.job import Job
from autotuner.trials.launcher import TrialLauncher
from autotuner.trials.nodes import DONE, POLL_S, LeadingLauncher, NodeStore, decoded, spans_nodes, with_trial
from autotuner.trials.outcomes import Outcome

JOIN_S = 600.0
"""How long node 0 waits for the other nodes to join, and another node for node 0's store."""
TIMEOUT_SLACK_S = 30.0
"""A following node's trial process may run this much longer than node 0's: it starts later (and
node 0 marks the trial over, which ends its ranks, however node 0's ends)."""


def lead(job: Job, launcher: TrialLauncher, note: Callable[[str], None]) -> LeadingLauncher:
    """Node 0's launcher of `job`'s trials: its store hosted at the spec's `rendezvous`, the other
    nodes waited for (`JOIN_S` at most: then a `BackendError` naming those missing)."""
    endpoint = job.spec.rendezvous
    assert endpoint is not None
    try:
        store = job.backend.node_store(endpoint, host=True, timeout_s=JOIN_S)
    except RuntimeError as exc:
        raise SpecError(
            f"node 0 cannot listen at {endpoint}: {str(exc).splitlines()[0][:120]}", source=job.source, key="rendezvous"
        ) from None
    leading = LeadingLauncher(launcher, store, job.spec.name)
    others = job.spec.nodes - 1
    note(f"node 0 of {job.spec.nodes}: waiting at {endpoint} for {others} more (autotuner search --node-rank R)")
    missing = leading.wait_for_nodes(job.spec.nodes, JOIN_S)
    if missing:
        raise BackendError(
            f"node{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} did not join at {endpoint} within "
            f"{JOIN_S:.0f} s: run `autotuner search --spec {job.source} --node-rank R` on each"
        )
    return leading


def follow(job: Job, node_rank: int, note: Callable[[str], None]) -> int:
    """Run node `node_rank`'s part of every trial node 0 hands out, until its search is over: 0; 1
    when node 0's store went away first (its search stopped)."""
    if job.spec.nodes == 1:
        raise SpecError(f"{job.source} runs every trial on one machine (nodes: 1): no node follows", key="--node-rank")
    if not 0 < node_rank < job.spec.nodes:
        raise SpecError(f"{node_rank} is not a node of {job.spec.nodes}: 1 to {job.spec.nodes - 1}", key="--node-rank")
    endpoint = job.spec.rendezvous
    assert endpoint is not None
    try:
        store = job.backend.node_store(endpoint, host=False, timeout_s=JOIN_S)
    except RuntimeError as exc:
        raise BackendError(f"node {node_rank}: no node 0 at {endpoint} within {JOIN_S:.0f} s ({exc})") from None
    store.set(f"node/{node_rank}/joined", "1")
    note(f"node {node_rank} of {job.spec.nodes}: following node 0 at {endpoint}")
    launcher = job.backend.launcher(job.spec.trial.max_memory_mb, job.workload_path())
    launcher.ensure_running()  # from this thread: each trial below is started from a thread of its own
    runs: list[threading.Thread] = []
    failed: list[str] = []
    handed = 0
    try:
        while (payload := _next(store, handed)) != DONE.encode():
            function, request, timeout_s = cast(tuple[str, object, float], decoded(payload))
            request = _as_node(job, request, node_rank)
            run = threading.Thread(
                target=_run, args=(job, launcher, function, request, timeout_s, failed, note), daemon=True
            )
            run.start()
            runs.append(run)
            handed += 1
        store.set(f"node/{node_rank}/left", "1")  # node 0's store may close now: its trials are over
    except (RuntimeError, OSError):  # torch's store raises RuntimeError (DistNetworkError) when its server is gone
        note(f"node {node_rank}: node 0's store at {endpoint} is gone (its search stopped)")
        return 1
    for run in runs:
        run.join()
    note(f"node {node_rank}: node 0's search is over; ran {handed} trials' ranks here, {len(failed)} failed")
    return 0


def _next(store: NodeStore, handed: int) -> bytes:
    """The next request node 0 hands out (or `DONE`), waited for."""
    key = f"request/{handed}"
    while not store.check([key]):
        time.sleep(POLL_S)
    return store.get(key)


def _as_node(job: Job, request: object, node_rank: int) -> object:
    """Node 0's `request` as this node's: its rank, its own logs, no progress, and node 0's compile
    cache where this machine has that folder (loopback, a shared file system), else its own."""
    trial = spans_nodes(request)
    if trial is None:
        raise BackendError("node 0 handed out a request that spans no nodes: are both nodes on the same spec?")
    log = job.log_path(Path(trial.log).name) if trial.log else None
    cache = trial.compile_cache
    if cache is not None and not Path(cache).is_dir():
        cache = str(job.compile_cache_dir())
    return with_trial(request, replace(trial, node_rank=node_rank, log=log, progress=None, compile_cache=cache))


def _run(
    job: Job,
    launcher: TrialLauncher,
    function: str,
    request: object,
    timeout_s: float,
    failed: list[str],
    note: Callable[[str], None],
) -> None:
    result = launcher.call(job.backend.runner, function, request, timeout_s + TIMEOUT_SLACK_S)
    if result.outcome != Outcome.OK:
        trial = spans_nodes(request)
        name = trial.run_id if trial is not None else "a trial"
        failed.append(f"{name}: {result.outcome.value}")
        note(f"{name}: {result.outcome.value}: {result.reason}")
