"""Trials across machines, on one: two "nodes" on loopback, each an `autotuner search` of its own
with one gloo rank, meeting at a `c10d` rendezvous on 127.0.0.1 (`nodes: 2`). A 2-node x 1-rank
trial trains as a 1-node x 2-rank one does, a node that dies mid-trial ends the trial on the other
with the node named and no process left on either, and a whole 2-node study runs and exports its
multi-node launch lines. The pieces (the store's protocol, the first failure, the spec's checks)
are tests/trials/test_nodes.py's."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotuner.spec.job import load_spec
from autotuner.trials.nodes import LeadingLauncher
from autotuner.trials.outcomes import Outcome
from autotuner.workers.nodes import follow
from tests.e2e.test_coordination import _descendants, _running
from tests.support.studies import ROOT, run_cli, write_spec

NODE_SPEC: dict[str, Any] = {
    "processes": 1,
    "nodes": 2,
    "parallel": "ddp",
    "baseline": {"precision": "fp32", "batch_size": 16, "workers": 0, "compile": "none"},
    "space": {"precision": ["fp32", "bf16"], "batch_size": [16, 32], "workers": [0], "compile": ["none"]},
    "budget": {"trials": 2},
    "sampler": {"name": "random", "seed": 0},
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def node_spec(folder: Path, name: str, **changes: Any) -> Path:
    return write_spec(folder, **{**NODE_SPEC, "name": name, "rendezvous": f"127.0.0.1:{free_port()}", **changes})


def start_node(spec: Path, cwd: Path, *args: str, core: int) -> subprocess.Popen[str]:
    """`autotuner search --spec SPEC ARGS` as a process of its own on one core (a node of its own:
    its trials' contention watch sees its own core only)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen(
        [sys.executable, "-m", "autotuner", "search", "--spec", str(spec), *args],
        cwd=cwd,
        env={**env, "COLUMNS": "200"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.sched_setaffinity(0, {core}),
    )


def cores() -> tuple[int, int]:
    usable = sorted(os.sched_getaffinity(0))
    return usable[0], usable[-1]


def start_nodes(spec: Path, cwd: Path) -> tuple[subprocess.Popen[str], subprocess.Popen[str]]:
    """Node 0's search and node 1's, each on a core of its own."""
    first, last = cores()
    follower = start_node(spec, cwd, "--node-rank", "1", core=last)
    return start_node(spec, cwd, core=first), follower


def faulty_spec(folder: Path, name: str, fault: str, timeout: float | None = None) -> Path:
    """A 2-node spec whose rank 1 (node 1's) does `fault` in its forward
    (`tests.support.faulty_workloads.on_rank`), a trial `timeout` when given."""
    return node_spec(
        folder,
        name,
        workload="tests.support.faulty_workloads:on_rank",
        workload_args={"fault": fault, "rank": 1},
        baseline={"precision": "fp32", "batch_size": 8, "workers": 0, "compile": "none"},
        space={"batch_size": [8]},
        **({"trial": {"timeout": timeout}} if timeout else {}),
    )


def test_a_two_node_study_runs_end_to_end_and_exports_its_launch_lines(tmp_path: Path) -> None:
    spec = node_spec(tmp_path, "nodes")
    endpoint = yaml.safe_load(spec.read_text())["rendezvous"]
    leader, follower = start_nodes(spec, tmp_path)
    try:
        out, err = leader.communicate(timeout=400)
        follower_out, follower_err = follower.communicate(timeout=60)
    finally:
        for node in (leader, follower):
            node.kill()
    assert leader.returncode == 0, out + err
    assert follower.returncode == 0, follower_out + follower_err
    assert "on cpu x 2 nodes x 1 process (ddp)" in out.splitlines()[0]
    assert "node 1: node 0's search is over" in follower_err and ", 0 failed" in follower_err
    export = yaml.safe_load((tmp_path / "runs" / "nodes" / "best.yaml").read_text())
    assert export["spec"]["nodes"] == 2 and export["spec"]["processes"] == 1
    assert export["spec"]["rendezvous"] == endpoint
    params = export["params"]
    assert params["batch_size"] * params["accumulation"] * 2 == 64  # the global batch over both nodes
    exported = {}
    for fmt in ("torchrun", "accelerate", "lightning", "hf-trainer"):
        done = run_cli("export", "--spec", str(spec), "--format", fmt, cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        exported[fmt] = (tmp_path / "runs" / "nodes" / f"best.{fmt}.py").read_text()
    torchrun = f"torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint {endpoint}"
    assert torchrun in exported["torchrun"] and torchrun in exported["hf-trainer"]
    assert "--num_machines 2 --num_processes 2 --machine_rank R" in exported["accelerate"]
    assert "num_nodes=2" in exported["lightning"] and "devices=1" in exported["lightning"]


def _two_nodes(spec: Path, *configs: dict[str, Any]) -> tuple[list[Any], list[int]]:
    """Trials of `spec`'s job (of `configs`, by default its reference config), their drift phase
    alone, on two loopback nodes: node 0 led from this process, node 1 following in a thread; their
    results, and node 1's exit code."""
    job = load_spec(spec)
    assert job.spec.rendezvous is not None
    store = job.backend.node_store(job.spec.rendezvous, host=True, timeout_s=60)
    leading = LeadingLauncher(job.backend.launcher(None, job.workload_path()), store, job.spec.name)
    codes: list[int] = []
    node1 = threading.Thread(target=lambda: codes.append(follow(job, 1, note=lambda text: None)))
    node1.start()
    try:
        results = []
        for config in configs or (job.reference_config(),):
            request = job.trial_request({**job.reference_config(), **config}, "cpu", measure=False)
            results.append(leading.call(job.backend.runner, "run", request, job.trial_timeout()))
        return results, codes
    finally:
        leading.finish(2)
        node1.join(timeout=30)


def test_two_nodes_of_one_rank_train_as_one_node_of_two(tmp_path: Path) -> None:
    nodes = node_spec(tmp_path, "two-nodes")
    (across,), codes = _two_nodes(nodes)
    assert across.outcome is Outcome.OK, across.reason
    assert codes == [0]
    one = write_spec(tmp_path, **{**NODE_SPEC, "name": "one-node", "nodes": 1, "processes": 2})
    job = load_spec(one)
    request = job.trial_request(job.reference_config(), "cpu", measure=False)
    alone = job.backend.launcher(None, job.workload_path()).call(job.backend.runner, "run", request, 120)
    assert alone.outcome is Outcome.OK, alone.reason
    # The same ranks, data shards and all-reduce: only the threads each rank computes with differ.
    ours, theirs = across.output.losses, alone.output.losses
    assert len(ours.trajectory) == len(theirs.trajectory) == job.spec.trial.drift_steps
    assert ours.trajectory == pytest.approx(theirs.trajectory, rel=1e-5, abs=1e-6)
    assert ours.heldout == pytest.approx(theirs.heldout, rel=1e-5)


def test_hybrid_sharding_across_two_nodes_trains_as_fsdp_does(tmp_path: Path) -> None:
    """FSDP2 over a 2-D mesh on two loopback nodes (`fsdp_mesh: hybrid`: replicated across the
    nodes; `hybrid_across`: sharded across them) gives the losses of FSDP over every rank."""
    spec = node_spec(tmp_path, "hsdp", parallel="fsdp", space={"fsdp_mesh": ["flat", "hybrid", "hybrid_across"]})
    results, codes = _two_nodes(spec, {"fsdp_mesh": "flat"}, {"fsdp_mesh": "hybrid"}, {"fsdp_mesh": "hybrid_across"})
    assert [r.outcome for r in results] == [Outcome.OK] * 3, [r.reason for r in results]
    flat, *hybrids = (r.output.losses for r in results)
    for hybrid in hybrids:  # the same sums, reduced in another order at most
        assert hybrid.trajectory == pytest.approx(flat.trajectory, rel=1e-5, abs=1e-6)
        assert hybrid.heldout == pytest.approx(flat.heldout, rel=1e-5)
    assert codes == [0]


def test_a_rank_that_fails_on_node_1_fails_the_trial_with_its_node_named(tmp_path: Path) -> None:
    spec = faulty_spec(tmp_path, "raises", "raise")
    (result,), codes = _two_nodes(spec)
    assert result.outcome is Outcome.ERROR
    assert "node 1, rank 1 of 2" in result.reason and "this rank's forward fails" in result.reason
    assert codes == [0]


def test_a_node_killed_mid_trial_ends_it_on_the_other_and_leaves_no_process(tmp_path: Path) -> None:
    """Rank 1 (node 1) hangs in its forward, rank 0 (node 0) waits in its all-reduce; kill -9 of
    node 1's search ends node 0's trial before its timeout, node 1 named, and no process of either
    node is left."""
    spec = faulty_spec(tmp_path, "killed", "hang", timeout=90)
    leader, follower = start_nodes(spec, tmp_path)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(_ranks_started(node.pid) for node in (leader, follower)):
            time.sleep(0.2)
        time.sleep(2.0)  # rank 1 is in its forward, rank 0 in the all-reduce
        below = {**_descendants(leader.pid), **_descendants(follower.pid)}
        follower.send_signal(signal.SIGKILL)
        out, err = leader.communicate(timeout=120)
    finally:
        for node in (leader, follower):
            node.kill()
            node.wait()
    # ended by what the nodes told each other, not by the trial's timeout
    assert "node 1 (ranks 1-1 of 2) ended without a word" in err and "timeout" not in err, out + err
    time.sleep(2)
    left = [pid for pid, started in below.items() if _running(pid, started)]
    assert not left, f"processes left behind: {[_cmdline(pid) for pid in left]}"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _ranks_started(pid: int) -> bool:
    """Whether the search `pid` has a rank running: its fork server, a trial process forked from
    that, and a rank forked from the trial process (all three run the fork server's command line)."""
    return sum("forkserver" in _cmdline(child) for child in _descendants(pid)) >= 3


def test_a_rank_that_hangs_on_node_1_ends_with_the_trials_timeout_on_both_nodes(tmp_path: Path) -> None:
    """Rank 1 (node 1) sleeps in its forward: node 0's trial times out, marks the trial over, and
    node 1's rank leaves at once; both searches end and leave no process."""
    spec = faulty_spec(tmp_path, "hangs", "hang", timeout=12)
    leader, follower = start_nodes(spec, tmp_path)
    below: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 120
        while leader.poll() is None and time.monotonic() < deadline:
            below.update({**_descendants(leader.pid), **_descendants(follower.pid)})  # every process they start
            time.sleep(0.2)
        out, err = leader.communicate(timeout=60)
        follower_out, follower_err = follower.communicate(timeout=60)
    finally:
        for node in (leader, follower):
            node.kill()
            node.wait()
    assert leader.returncode == 1 and "timeout" in err, out + err  # the reference timed out: nothing to compare with
    assert follower.returncode == 0, follower_out + follower_err
    assert "node 0's search is over" in follower_err
    time.sleep(1)
    left = [pid for pid, started in below.items() if _running(pid, started)]
    assert not left, f"processes left behind: {[_cmdline(pid) for pid in left]}"


def test_a_following_node_runs_trials_handed_out_together_each_to_its_end(tmp_path: Path) -> None:
    """Node 0 runs two trials at once (as a re-measurement's lockstep group does), one ending
    long before the other: node 1, a search of its own, runs both to their ends (its fork server
    outlives the thread that first used it)."""
    spec = node_spec(tmp_path, "together", trial={"drift_steps": 2, "steps": 20, "windows": 4})
    job = load_spec(spec)
    assert job.spec.rendezvous is not None
    store = job.backend.node_store(job.spec.rendezvous, host=True, timeout_s=60)
    leading = LeadingLauncher(job.backend.launcher(None, job.workload_path()), store, job.spec.name)
    first, last = cores()
    follower = start_node(spec, tmp_path, "--node-rank", "1", core=last)
    try:
        assert not leading.wait_for_nodes(2, timeout_s=60)
        short = job.trial_request(job.reference_config(), "cpu", measure=False)
        long = job.trial_request(job.reference_config(), "cpu")
        processes = [leading.start(job.backend.runner, "run", r, 120) for r in (short, long)]
        for process in processes:
            process.read_until_waiting(time.monotonic() + 120)
        results = [process.end() for process in processes]
        leading.finish(2)
        _, err = follower.communicate(timeout=60)
    finally:
        follower.kill()
        follower.wait()
    assert [r.outcome for r in results] == [Outcome.OK, Outcome.OK], [r.reason for r in results]
    assert follower.returncode == 0 and "ran 2 trials' ranks here, 0 failed" in err, err
