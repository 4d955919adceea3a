"""The script `autotuner export --format torchrun` writes, run as the user runs it: torchrun
starts two CPU ranks (gloo), each loads the export and trains through `TunedTraining`, which
wraps the model in DDP or shards it with FSDP2 itself. What the snippet says is
tests/backends/integrations/test_parallel_exports.py's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotuner.apply import load_config
from autotuner.backends.pytorch.integrations import snippet

YOURS = """import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
dataset = torch.utils.data.TensorDataset(torch.randn(256, 8), torch.randint(4, (256,)))
loss_fn = torch.nn.functional.cross_entropy
epochs = 2
"""
"""What the snippet leaves to the user: the model, optimizer, dataset, loss and epochs."""
REPORT = """
with open(f"rank-{tuned.rank}.txt", "w") as report:  # a file each: the ranks' stdout interleaves
    report.write(f"rank {tuned.rank} of {tuned.world_size}: {type(tuned.model).__name__}, "
                 f"{len(tuned.loader)} micro-batches an epoch, loss {loss.item():.3f}")
"""
"""What the user does with the trained model, before the snippet's end (`tuned.finish()`)."""
FINISHED = """
with open(f"rank-{tuned.rank}.txt", "a") as report:
    report.write(f"; finished: {type(tuned.model).__name__}")
"""
"""After the snippet's end: what `tuned.model` is then (DDP's wrapper let go of)."""


def export(parallel: str, **params: Any) -> dict[str, Any]:
    """An export of a job of two CPU ranks, as `autotuner export` writes it."""
    knobs = {"precision": "fp32", "batch_size": 16, "accumulation": 2, "workers": 0, "compile": "none", **params}
    return {
        "version": 1,
        "params": knobs,
        "metrics": {"throughput": 1000.0},
        "baseline": {"params": None, "throughput": 500.0},
        "speedup": 2.0,
        "environment": {"backend": "pytorch", "fingerprint": "f" * 16, "device": "cpu"},
        "spec": {"identity": "i" * 16, "global_batch": 16 * 2 * 2, "processes": 2, "parallel": parallel},
        "study": {"name": "ranks", "trial": 1},
    }


@pytest.mark.parametrize(
    ("data", "wrapper", "finished"),
    [
        (export("ddp", bucket_cap_mb=1, bucket_view=True, comm_hook="fp16"), "DistributedDataParallel", "Sequential"),
        (export("fsdp", reshard_after_forward=False, param_dtype="bf16"), "FSDPSequential", "FSDPSequential"),
    ],
    ids=["ddp", "fsdp"],
)
def test_the_torchrun_script_trains_on_the_ranks_it_was_tuned_as(
    tmp_path: Path, data: dict[str, Any], wrapper: str, finished: str
) -> None:
    best = tmp_path / "best.yaml"
    best.write_text(yaml.safe_dump(data))
    code = snippet("torchrun", load_config(best))
    launch = code.splitlines()[2]
    assert launch.startswith("# launch: torchrun --standalone --nproc-per-node 2 your_training.py;")
    script = tmp_path / "your_training.py"
    end = code.index("tuned.finish()")
    script.write_text(YOURS + code[:end] + REPORT + code[end:] + FINISHED)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    # 0, not -6: no rank aborts at exit ("terminate called without an active exception"), which a
    # gloo worker freeing the last step's collectives as the interpreter finalizes made it now and
    # then before TunedTraining.finish (see there)
    assert done.returncode == 0, done.stdout + done.stderr
    reports = [(tmp_path / f"rank-{rank}.txt").read_text() for rank in range(2)]
    assert [line.split(":")[0] for line in reports] == ["rank 0 of 2", "rank 1 of 2"]
    # each rank its half of the dataset: 128 samples, 8 micro-batches of 16
    assert all(f": {wrapper}, 8 micro-batches an epoch" in line for line in reports), reports
    assert all(line.endswith(f"; finished: {finished}") for line in reports), reports
