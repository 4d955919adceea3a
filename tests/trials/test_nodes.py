"""The pieces of a trial across nodes, each on its own: node 0's launcher handing requests out
through a real `TCPStore`, the first failure node 0 reports from the ranks' ends, and the command
line of a following node. A whole trial across two loopback nodes is tests/e2e/test_nodes.py's."""

from __future__ import annotations

import datetime
import json
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import torch.distributed as dist

from autotuner.backends.pytorch.nodes import _first_failure
from autotuner.cli import main
from autotuner.trials.launcher import TrialLauncher
from autotuner.trials.nodes import DONE, LeadingLauncher, decoded, split_endpoint
from autotuner.trials.outcomes import Outcome
from autotuner.trials.request import ProbeRequest, TrialRequest
from tests.support.helpers import request
from tests.support.studies import write_spec

HELPER = "tests.trials.test_nodes"


def echo(arg: object) -> dict[str, object]:
    """A trial process's function (this module's own): what it was asked, as plain data."""
    trial = arg if isinstance(arg, TrialRequest) else None
    return {"run_id": trial.run_id if trial else None, "node_rank": trial.node_rank if trial else None}


@pytest.fixture
def store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=5))


def across(nodes: int = 2) -> TrialRequest:
    return replace(request("builtin:mlp"), nodes=nodes, rendezvous="127.0.0.1:1")


@pytest.mark.slow  # three trial processes
def test_node_0_hands_out_each_trial_with_a_rendezvous_id_and_marks_it_over(
    launcher: TrialLauncher, store: dist.TCPStore
) -> None:
    leading = LeadingLauncher(launcher, store, "study")
    first = leading.call(HELPER, "echo", across(), 60)
    second = leading.call(HELPER, "echo", across(), 60)
    assert first.outcome is Outcome.OK and second.outcome is Outcome.OK, first.reason
    assert first.output == {"run_id": "study-0", "node_rank": 0}
    assert second.output == {"run_id": "study-1", "node_rank": 0}
    function, handed, timeout_s = decoded(store.get("request/0"))
    assert (function, handed.run_id, handed.nodes, timeout_s) == ("echo", "study-0", 2, 60)
    assert store.get("study-0/over") == b"1" and store.get("study-1/over") == b"1"  # its ranks elsewhere leave


def test_what_spans_one_node_is_not_handed_out(launcher: TrialLauncher, store: dist.TCPStore) -> None:
    leading = LeadingLauncher(launcher, store, "study")
    assert leading.call(HELPER, "echo", across(nodes=1), 60).output == {"run_id": None, "node_rank": 0}
    assert leading.call(HELPER, "echo", ProbeRequest("cpu", "builtin:mlp"), 60).outcome is Outcome.OK
    assert not store.check(["request/0"])


def test_the_end_of_the_search_reaches_the_nodes_that_joined(launcher: TrialLauncher, store: dist.TCPStore) -> None:
    leading = LeadingLauncher(launcher, store, "study")
    store.set("node/1/joined", "1")
    assert leading.wait_for_nodes(3, timeout_s=0.2) == [2]
    read = threading.Timer(
        0.3, lambda: store.set("node/1/left", "1") if store.get("request/0") == DONE.encode() else None
    )
    read.start()
    leading.finish(3)  # node 2 never joined: only node 1 is waited for
    read.join()
    assert store.get("request/0") == DONE.encode() and store.check(["node/1/left"])


def _ends(store: dist.Store, **ends: dict[str, object]) -> None:
    for rank, end in ends.items():
        store.set(f"end/{rank.removeprefix('r')}", json.dumps(end))


def test_a_ranks_own_failure_is_reported_before_the_errors_it_caused(store: dist.TCPStore) -> None:
    trial = replace(across(), processes=2)  # ranks 0-1 on node 0, 2-3 on node 1
    _ends(
        store,
        r0={"status": "raised", "kind": "error", "reason": "Connection reset by peer", "at": 1.0},
        r1={"status": "stopped"},
        r2={"status": "raised", "kind": "oom", "reason": "CUDA out of memory", "at": 2.0},
        r3={"status": "stopped"},
    )
    end = _first_failure(store, trial)
    assert end["kind"] == "oom" and end["reason"] == "node 1, rank 2 of 4: CUDA out of memory"


def test_a_rank_that_died_without_a_word_is_named_by_its_exit(store: dist.TCPStore) -> None:
    _ends(
        store,
        r0={"status": "raised", "kind": "error", "reason": "Connection reset by peer", "at": 1.0},
        r1={"status": "raised", "kind": "crash", "reason": "was killed by SIGKILL", "at": 2.0},
    )
    assert _first_failure(store, across())["reason"] == "node 1, rank 1 of 2: was killed by SIGKILL"


def test_a_node_none_of_whose_ranks_said_anything_is_named_as_gone(store: dist.TCPStore) -> None:
    _ends(store, r0={"status": "raised", "kind": "error", "reason": "Connection reset by peer", "at": 1.0})
    end = _first_failure(store, across())  # waits its grace for rank 1's end, which never comes
    assert end["kind"] == Outcome.CRASH.value
    assert end["reason"] == "node 1 (ranks 1-1 of 2) ended without a word: its worker or machine is gone"


def test_an_endpoint_is_host_and_port() -> None:
    assert split_endpoint("10.0.0.1:29500") == ("10.0.0.1", 29500)
    assert split_endpoint("[::1]:29500") == ("::1", 29500)
    for bad in ("10.0.0.1", ":29500", "host:0", "host:http", "host:70000"):
        with pytest.raises(ValueError):
            split_endpoint(bad)


@pytest.mark.parametrize(
    ("changes", "args", "says"),
    [
        ({}, ["--node-rank", "1"], "runs every trial on one machine (nodes: 1): no node follows"),
        (
            {"nodes": 2, "rendezvous": "127.0.0.1:29999", "space": {"batch_size": [16]}},
            ["--node-rank", "2"],
            "2 is not a node of 2: 1 to 1",
        ),
        (
            {"nodes": 2, "rendezvous": "127.0.0.1:29999", "space": {"batch_size": [16]}},
            ["--node-rank", "1", "--jobs", "2"],
            "not allowed with",
        ),
    ],
)
def test_a_following_node_that_cannot_be_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, object], args: list[str], says: str
) -> None:
    spec = write_spec(tmp_path, name="follower", **changes)
    with pytest.raises(SystemExit) as exited:
        raise SystemExit(main(["search", "--spec", str(spec), *args]))
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err
