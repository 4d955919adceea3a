"""Jobs of every shape the guides describe, as a user brings them (`examples/`: models built from
`transformers` configs, a PEFT adapter, a Flax module, a collate function that pads each batch to
its own length, a stream of each kind), searched end to end from the command line under the ways
the job can run: one process, several ranks under DDP and FSDP2, JAX's data parallelism, and
`task: inference` where the model serves. Each study is made small (a baseline and one config);
what it must show is that the job runs, its numerics are compared, and its winner is exported.

Each family runs under the way of running where it differs most from the others (a causal LM's
blocks sharded by FSDP2, the padding collate's batches split by DDP's sampler, a LoRA adapter's
frozen weights under FSDP2, a Flax module over a mesh), and every way of running meets two
families at least; a study of each family under each way would take a 2-core VM many minutes
for little more. The one-process paths of the same models have their own tests
(tests/e2e/test_huggingface.py, tests/e2e/test_inference.py, tests/e2e/test_jax_backend.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from autotuner.results.records import records
from tests.support.studies import held_space, load_study, run_cli

GPT2 = {"layers": 1, "width": 32, "heads": 2, "vocab": 64, "length": 16, "samples": 96}
CLASSIFIER = {"layers": 1, "width": 32, "heads": 2, "vocab": 100, "longest": 16, "samples": 96}
VIT = {"layers": 1, "width": 32, "heads": 2, "image": 16, "patch": 8, "samples": 96}
FLAX = {"features": 16, "hidden": 32, "depth": 2, "samples": 512}
STREAM = {"features": 16, "hidden": 32, "samples": 512}

TRAINING = {"warmup_steps": 1, "steps": 2, "windows": 2, "drift_steps": 2, "min_window_s": 0}
SERVING = {"warmup_steps": 1, "steps": 2, "windows": 2, "min_window_s": 0}


def _spec(
    name: str, workload: str, args: dict[str, Any], global_batch: int, space: dict[str, Any], **keys: Any
) -> dict[str, Any]:
    inference = keys.get("task") == "inference"
    trial = {**(SERVING if inference else TRAINING), "prune_after": 0, "timeout": 300, "quiet_wait": 0}
    return held_space(
        {
            "name": name,
            "backend": "pytorch",
            "workload": workload,
            "workload_args": args,
            "device": "cpu",
            "global_batch": global_batch,
            "space": space,
            "budget": {"trials": 2, "remeasure_top": 0},
            "trial": trial,
            "profile": {"steps": 0},
            "sampler": {"name": "tpe", "seed": 0},
            **keys,
        }
    )


def _training(name: str, workload: str, args: dict[str, Any], processes: int = 1, **keys: Any) -> dict[str, Any]:
    """A PyTorch training study of the baseline (fp32, micro-batch 2) and bf16 at the largest micro-batch."""
    batch = 8 // processes
    space = {"precision": ["fp32", "bf16"], "batch_size": [2, batch], "workers": [0], "compile": ["none"]}
    baseline = {"precision": "fp32", "batch_size": 2, "workers": 0, "compile": "none"}
    if processes > 1:
        keys["processes"] = processes
    return _spec(name, workload, args, 8, space, baseline=baseline, **keys)


def _serving(name: str, workload: str, args: dict[str, Any], **keys: Any) -> dict[str, Any]:
    """A PyTorch inference study of the baseline (fp32, batches of 2) and the same on ONNX Runtime."""
    space = {"precision": ["fp32"], "batch_size": [2], "runtime": ["pytorch", "onnxruntime-cpu"]}
    baseline = {"precision": "fp32", "batch_size": 2, "runtime": "pytorch"}
    return _spec(name, workload, args, 8, space, task="inference", baseline=baseline, **keys)


def _flax(name: str, **keys: Any) -> dict[str, Any]:
    """A JAX study of the Flax example: the baseline (fp32, jitted) and bf16. Op by op, each of the
    module's operations is compiled on its own first, which takes a 2-core VM tens of seconds."""
    space = {"precision": ["fp32", "bf16"], "batch_size": [8], "jit": ["on"]}
    baseline = {"precision": "fp32", "batch_size": 8, "jit": "on"}
    if keys.get("task") == "inference":
        return _spec(
            name, "examples.jax.flax_mlp:make_serving", FLAX, 16, space, backend="jax", baseline=baseline, **keys
        )
    space |= {"workers": [0], "remat": ["none"], "donate": ["off"], "xla_flags": ["default"]}
    baseline |= {"workers": 0}
    return _spec(name, "examples.jax.flax_mlp:make_workload", FLAX, 16, space, backend="jax", baseline=baseline, **keys)


DDP = {"processes": 2, "parallel": "ddp"}
FSDP = {"processes": 2, "parallel": "fsdp"}
MODES = {"one-process": {}, "ddp": DDP, "fsdp": FSDP}


def _search(spec: dict[str, Any], folder: Path) -> None:
    """`autotuner search` of `spec` from `folder`: it ends normally, both configs are measured with
    their drift, and the winner is exported for the job as it runs (its ranks, its global batch)."""
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    done = run_cli("search", "--spec", str(path), cwd=folder)
    assert done.returncode == 0, done.stdout + done.stderr
    trials = records(load_study(folder, spec["name"]))
    assert [t.outcome for t in trials] == ["ok", "ok"], [(t.config, t.outcome, t.reason) for t in trials]
    assert trials[0].role == "baseline" and trials[1].config != trials[0].config
    assert all("drift" in t.metrics for t in trials)
    export = yaml.safe_load((folder / "runs" / spec["name"] / "best.yaml").read_text())
    assert export["metrics"]["drift"] <= spec.get("objective", {}).get("max_drift", 0.01)
    ranks = spec.get("processes", 1)
    assert (export["spec"].get("processes", 1), export["spec"].get("parallel")) == (ranks, spec.get("parallel"))
    if spec.get("task") != "inference":  # the global batch kept, over every rank
        params = export["params"]
        assert params["batch_size"] * params.get("accumulation", 1) * ranks == spec["global_batch"]


class TestTransformersModels:
    """Models built from `transformers` configs. The GPT-2 example in one process has its own test
    (tests/e2e/test_huggingface.py), as does a served BERT (tests/e2e/test_inference.py)."""

    @pytest.fixture(autouse=True)
    def _transformers(self) -> None:
        pytest.importorskip("transformers")

    def test_a_causal_lm_sharded(self, tmp_path: Path) -> None:
        _search(_training("gpt2", "examples.huggingface.gpt2:make_workload", GPT2, **FSDP), tmp_path)

    def test_a_causal_lm_served(self, tmp_path: Path) -> None:
        _search(_serving("gpt2", "examples.huggingface.gpt2:make_workload", GPT2), tmp_path)

    def test_a_masked_lm_classifier_fed_by_a_padding_collate_over_ddp(self, tmp_path: Path) -> None:
        _search(_training("classifier", "examples.huggingface.classifier:make_workload", CLASSIFIER, **DDP), tmp_path)


class TestVisionTransformer:
    @pytest.fixture(autouse=True)
    def _transformers(self) -> None:
        pytest.importorskip("transformers")

    def test_a_vision_transformer_over_ddp(self, tmp_path: Path) -> None:
        _search(_training("vit", "examples.huggingface.vit:make_workload", VIT, **DDP), tmp_path)

    def test_a_vision_transformer_served(self, tmp_path: Path) -> None:
        _search(_serving("vit", "examples.huggingface.vit:make_workload", VIT), tmp_path)


class TestAdapter:
    @pytest.mark.parametrize("mode", ["one-process", "fsdp"])
    def test_a_peft_lora_adapter_on_a_frozen_causal_lm(self, mode: str, tmp_path: Path) -> None:
        pytest.importorskip("transformers")
        pytest.importorskip("peft")
        _search(_training("lora", "examples.huggingface.lora:make_workload", GPT2, **MODES[mode]), tmp_path)


class TestFlax:
    @pytest.fixture(autouse=True)
    def _flax(self) -> None:
        pytest.importorskip("flax")

    def test_a_flax_model_data_parallel(self, tmp_path: Path) -> None:
        _search(_flax("flax", processes=2, parallel="data_parallel"), tmp_path)

    def test_a_flax_model_served(self, tmp_path: Path) -> None:
        _search(_flax("flax", task="inference"), tmp_path)


class TestStreams:
    """Each kind of stream the guide names, read whole by one process and shared by ranks."""

    @pytest.mark.parametrize(
        ("kind", "mode"),
        [(kind, "one-process") for kind in ("iterable", "sharding", "datasets", "generator")]
        + [("datasets", "ddp"), ("sharding", "fsdp")],
    )
    def test_a_stream(self, kind: str, mode: str, tmp_path: Path) -> None:
        if kind == "datasets":
            pytest.importorskip("datasets")
        args = {**STREAM, "kind": kind}
        _search(_training(f"stream-{kind}", "examples.streams:make_workload", args, **MODES[mode]), tmp_path)


def test_a_stream_to_serve_is_refused_in_one_line_before_anything_runs(tmp_path: Path) -> None:
    """`task: inference` serves each config the same items in whole batches of its size, which a
    stream cannot promise: refused before a trial, not a crash after one."""
    spec = _serving("served-stream", "examples.streams:make_workload", {**STREAM, "kind": "iterable"})
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    done = run_cli("search", "--spec", str(path), cwd=tmp_path)
    assert done.returncode == 2 and not done.stdout, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "dataset must be map-style" in line and "task: inference" in line
    assert not (tmp_path / "runs").exists()
