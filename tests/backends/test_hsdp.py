"""`fsdp_mesh`: FSDP2's hybrid sharding (HSDP) on the CPU with gloo. Ranks started here as torchrun
starts a job on several nodes (`LOCAL_WORLD_SIZE` ranks a node) train through `TunedTraining` on
each mesh: the hybrid meshes group the ranks by node and train as the flat one does; where the
knob cannot act, and why; what the export formats write for it."""

from __future__ import annotations

import multiprocessing
import os
from dataclasses import dataclass
from multiprocessing.queues import Queue
from pathlib import Path
from typing import cast

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from autotuner.backends.pytorch import PYTORCH, TorchCapabilities
from autotuner.backends.pytorch.apply import TunedTraining, hybrid_shape
from autotuner.backends.pytorch.integrations import TRAINERS, snippet
from autotuner.backends.pytorch.integrations import accelerate as accelerate_export
from autotuner.backends.pytorch.integrations import lightning as lightning_export
from autotuner.backends.pytorch.integrations import transformers as transformers_export
from autotuner.backends.pytorch.knobs.fsdp import FSDP_MESH
from autotuner.backends.pytorch.probe import parallel_capabilities
from autotuner.spec.job import parse_spec
from tests.backends.integrations.test_parallel_exports import quiet, tuned
from tests.support.helpers import FP32

LAYOUTS = ("flat", "hybrid", "hybrid_across")
STEPS = 3
MICRO_BATCH = 4
RANK_TIMEOUT_S = 60


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


@dataclass(frozen=True)
class Trained:
    """What one rank saw of a few steps on one mesh (`_train`)."""

    losses: list[float]
    """The mean loss of every rank, at each step."""
    groups: tuple[list[int], ...]
    """The ranks of this rank's group along each of the mesh's dimensions."""
    names: tuple[str, ...] | None
    """The mesh's dimension names (None: the flat mesh's one, unnamed)."""
    shard: int
    """Elements of this rank's shard of the first weight (16 x 8)."""


Found = dict[str, Trained] | str
"""A rank's `Trained` by layout (and `unsynced`), or what it raised."""


def _train(layout: str, *, all_reduce: bool = True) -> Trained:
    """This rank's view of `STEPS` SGD steps of a tiny MLP sharded on `layout` through
    `TunedTraining`, each rank taking its share of the same global batch. Without `all_reduce`, a
    hybrid mesh's replicas skip FSDP2's all-reduce of their gradients."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model = _mlp()
    config = {**FP32, "batch_size": MICRO_BATCH, FSDP_MESH.name: layout}
    tuned = TunedTraining(config, model, torch.optim.SGD(model.parameters(), lr=0.1), parallel="fsdp")
    cast(FSDPModule, tuned.module).set_requires_all_reduce(all_reduce, recurse=True)  # FSDP2 made it one
    data = torch.Generator().manual_seed(1)
    mine = slice(rank * MICRO_BATCH, (rank + 1) * MICRO_BATCH)
    losses = []
    for _ in range(STEPS):
        inputs = torch.randn(world * MICRO_BATCH, 8, generator=data)
        target = torch.randn(world * MICRO_BATCH, 4, generator=data)
        loss = torch.nn.functional.mse_loss(tuned.model(inputs[mine]), target[mine])
        tuned.backward(loss)
        assert tuned.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    tuned.finish()
    weight = next(tuned.module.parameters())
    assert isinstance(weight, DTensor)  # FSDP2's shard of it
    mesh = weight.device_mesh
    groups = tuple(dist.get_process_group_ranks(mesh.get_group(dim)) for dim in range(mesh.ndim))
    return Trained(losses, groups, mesh.mesh_dim_names, weight.to_local().numel())


def _rank(rank: int, world: int, local: int, store: str, queue: Queue[tuple[int, Found]]) -> None:
    os.environ["LOCAL_WORLD_SIZE"] = str(local)  # as torchrun sets it on each node
    torch.set_num_threads(1)  # the ranks share two cores
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        found = {layout: _train(layout) for layout in LAYOUTS}
        queue.put((rank, {**found, "unsynced": _train("hybrid", all_reduce=False)}))
    except BaseException as exc:  # the test's failure, not a wait on the queue
        queue.put((rank, repr(exc)))
    finally:
        dist.destroy_process_group()


def _ranks(world: int, local: int, tmp_path: Path) -> list[dict[str, Trained]]:
    """What each of `world` ranks, `local` a node, found (`_train`), by rank. Forked: a rank
    starts in a fraction of a second, with torch imported already."""
    context = multiprocessing.get_context("fork")
    queue: Queue[tuple[int, Found]] = context.Queue()
    store = str(tmp_path / f"store-{world}x{local}")
    processes = [context.Process(target=_rank, args=(r, world, local, store, queue)) for r in range(world)]
    for process in processes:
        process.start()
    try:
        found = dict(queue.get(timeout=RANK_TIMEOUT_S) for _ in processes)
    finally:
        for process in processes:
            process.join(RANK_TIMEOUT_S)
            process.kill()  # one still waiting in a collective of a rank that failed
    views = {rank: view for rank, view in found.items() if not isinstance(view, str)}
    assert len(views) == world, {rank: view for rank, view in found.items() if isinstance(view, str)}
    return [views[rank] for rank in range(world)]


FLAT_LIKE = 1e-5
"""How close a hybrid mesh's losses are to the flat mesh's, relatively. The gradients are the same
sums in another order (a reduce-scatter in a node, then an all-reduce across nodes, against one
reduce-scatter of every rank): in fp32 (eps 1.2e-7) a few ulps a step, compounded over three SGD
steps of a loss near 1; 1e-5 is a hundred ulps. Replicas that skip their all-reduce, each node
training on its own half of the data, are off by tens to hundreds of times more from the second
step on (asserted below: the comparison tells a broken HSDP apart)."""


@pytest.mark.parametrize(
    ("world", "local", "groups", "shards"),
    [
        # 2 nodes x 2 ranks: hybrid shards within a node, hybrid_across across the nodes
        (
            4,
            2,
            {"flat": ([0, 1, 2, 3],), "hybrid": ([0, 2], [0, 1]), "hybrid_across": ([0, 1], [0, 2])},
            {"flat": 32, "hybrid": 64, "hybrid_across": 64},
        ),
        # 2 nodes x 1 rank: hybrid only replicates, hybrid_across shards over the two nodes
        (
            2,
            1,
            {"flat": ([0, 1],), "hybrid": ([0, 1], [0]), "hybrid_across": ([0], [0, 1])},
            {"flat": 64, "hybrid": 128, "hybrid_across": 64},
        ),
    ],
    ids=["2x2", "2x1"],
)
def test_a_hybrid_mesh_groups_the_ranks_by_node_and_trains_as_the_flat_one(
    tmp_path: Path, world: int, local: int, groups: dict[str, tuple[list[int], ...]], shards: dict[str, int]
) -> None:
    ranks = _ranks(world, local, tmp_path)
    first = ranks[0]
    for layout in LAYOUTS:
        assert first[layout].groups == groups[layout], layout  # rank 0's (replicate, shard) groups
        assert first[layout].names == (None if layout == "flat" else ("replicate", "shard"))
        assert first[layout].shard == shards[layout]  # of the 16 x 8 weight: 128 / ranks it is sharded over
    node_1 = ranks[local]  # the first rank of the second node
    assert node_1["hybrid"].groups[1] == list(range(local, 2 * local))  # its shard group: its own node
    flat = first["flat"].losses
    for layout in ("hybrid", "hybrid_across"):
        assert first[layout].losses == pytest.approx(flat, rel=FLAT_LIKE), layout
    unsynced = first["unsynced"].losses
    assert unsynced[0] == pytest.approx(flat[0], rel=FLAT_LIKE)  # the same first step: nothing stepped yet
    assert all(abs(u - f) > 10 * FLAT_LIKE * abs(f) for u, f in zip(unsynced[1:], flat[1:], strict=True))


def test_the_nodes_are_counted_as_torchrun_counts_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "8")  # before the process group: a trainer building its own mesh
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert hybrid_shape() == (2, 4)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert hybrid_shape() == (1, 8)  # unset: every rank on one node
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    with pytest.raises(ValueError, match="the 8 ranks do not make nodes of 3 ranks each"):
        hybrid_shape()


def test_the_hybrid_meshes_act_on_a_trial_across_two_nodes_only() -> None:
    assert parallel_capabilities("fsdp", 2)["hsdp"] and not parallel_capabilities("fsdp", 1)["hsdp"]
    assert not parallel_capabilities("ddp", 2)["hsdp"]
    one_node, two_nodes = TorchCapabilities(fsdp=True), TorchCapabilities(fsdp=True, hsdp=True)
    for layout in ("hybrid", "hybrid_across"):
        reason = PYTORCH.irrelevant("fsdp_mesh", layout, one_node)
        assert reason == f"fsdp_mesh={layout}: a trial on one node has no nodes to replicate across (nodes: 2 or more)"
        assert PYTORCH.irrelevant("fsdp_mesh", layout, two_nodes) is None
    assert "a knob of parallel: fsdp" in (PYTORCH.irrelevant("fsdp_mesh", "hybrid", TorchCapabilities(ddp=True)) or "")
    assert PYTORCH.irrelevant("fsdp_mesh", "flat", one_node) is None  # the reference runs everywhere


def test_a_spec_searches_the_mesh_and_one_node_drops_the_hybrid_values(tmp_path: Path) -> None:
    data = {
        "name": "job",
        "backend": "pytorch",
        "workload": "builtin:mlp",
        "global_batch": 64,
        "processes": 2,
        "parallel": "fsdp",
        "space": {"preset": "pytorch-fsdp", "fsdp_mesh": list(LAYOUTS)},
    }
    job = parse_spec(data, str(tmp_path / "spec.yaml"))
    assert tuple(job.space["fsdp_mesh"]) == LAYOUTS and job.baseline["fsdp_mesh"] == "flat"
    narrowed, dropped = job.narrow(TorchCapabilities(fsdp=True))
    assert tuple(narrowed.space["fsdp_mesh"]) == ("flat",) and set(dropped["fsdp_mesh"]) == {"hybrid", "hybrid_across"}
    kept, _ = job.narrow(TorchCapabilities(fsdp=True, hsdp=True))
    assert tuple(kept.space["fsdp_mesh"]) == LAYOUTS


# ------------------------------------------------------------------ exports


TWO_NODES = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}
"""The environment torchrun gives a rank of 2 nodes x 2 ranks, before its process group."""


@pytest.mark.parametrize("reshard", [True, False])
def test_the_trainers_shard_a_hybrid_config_within_a_node(
    reshard: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelerate.utils import ParallelismConfig
    from torch.distributed.fsdp import ShardingStrategy
    from transformers import TrainingArguments

    config = tuned("fsdp", fsdp_mesh="hybrid", reshard_after_forward=reshard)
    for name, value in TWO_NODES.items():
        monkeypatch.setenv(name, value)
    accelerate = quiet(accelerate_export.accelerator_arguments, config)
    arguments = quiet(transformers_export.training_arguments, config)
    strategy = quiet(lightning_export.trainer_arguments, config)["strategy"]
    for name in TWO_NODES:
        monkeypatch.delenv(name)  # TrainingArguments would start the distributed run they describe
    hsdp = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2)  # Accelerate's (replicate, shard) mesh
    assert accelerate["parallelism_config"] == hsdp
    assert accelerate["fsdp_plugin"].reshard_after_forward is reshard  # the plugin's FSDP2 knobs, as before
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], **{**arguments, "use_cpu": True})
    assert args.parallelism_config == hsdp and isinstance(args.fsdp_config, dict)
    assert args.fsdp_config["reshard_after_forward"] is reshard
    hybrid = ShardingStrategy.HYBRID_SHARD if reshard else ShardingStrategy._HYBRID_SHARD_ZERO2
    assert strategy.sharding_strategy is hybrid  # FSDP1's hybrid sharding
    assert strategy.kwargs["device_mesh"] == (2, 2)  # (replicas, shards): Lightning's device_mesh tuple


@pytest.mark.parametrize("layout", ["hybrid", "hybrid_across"])
def test_every_format_writes_the_mesh_or_says_why_it_cannot(layout: str) -> None:
    config = tuned("fsdp", fsdp_mesh=layout)
    code = {fmt: quiet(snippet, fmt, config) for fmt in TRAINERS}
    for fmt, text in code.items():
        compile(text, f"best.{fmt}.py", "exec")
        launched = "torchrun --nnodes M --nproc-per-node 2" in text
        assert launched == (layout == "hybrid" or fmt == "torchrun"), fmt  # the formats that build the mesh
    assert "fsdp_mesh=hybrid" in code["torchrun"]  # TunedTraining applies it: its knobs' line names it
    if layout == "hybrid":
        assert "'parallelism_config': ParallelismConfig(*hybrid_shape())," in code["accelerate"]
        assert "'parallelism_config': ParallelismConfig(*hybrid_shape())," in code["hf-trainer"]
        assert (
            "sharding_strategy='HYBRID_SHARD'" in code["lightning"]
            and "device_mesh=hybrid_shape()" in code["lightning"]
        )
        assert all(
            "from autotuner.backends.pytorch.apply import hybrid_shape" in code[f] for f in TRAINERS if f != "torchrun"
        )
        return
    for fmt in ("accelerate", "hf-trainer", "lightning"):  # sharded over every rank, and the comment says why
        assert "# fsdp_mesh=hybrid_across: " in code[fmt] and "no mesh that shards across nodes" in code[fmt]
        assert "parallelism_config" not in code[fmt] and "device_mesh" not in code[fmt]
    assert "sharding_strategy='FULL_SHARD'" in code["lightning"]
    with pytest.warns(UserWarning, match="fsdp_mesh=hybrid_across"):
        accelerate_export.accelerator_arguments(config)
