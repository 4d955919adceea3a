"""Serving a model with an inference config: `TunedInference` (what the trials serve through and
users apply), the knobs' unsupported reasons, and the drift, latency and held-out rules of the
inference trial. CPU only, real torch, torchao and ONNX Runtime."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from autotuner.backends.pytorch.inference import PYTORCH_INFERENCE, InferenceCapabilities
from autotuner.backends.pytorch.inference_runner import PyTorchServing
from autotuner.backends.pytorch.serving import TunedInference, primary_output, session_settings
from autotuner.backends.pytorch.workload import InferenceWorkload, TorchWorkload, as_inference_workload
from autotuner.measurement.timing import Throughput
from autotuner.trials.outcomes import Unsupported
from autotuner.trials.request import TrialRequest
from autotuner.trials.serving import Served, by_calls, heldout_count, latency, percentile

REFERENCE = {name: knob.reference for name, knob in PYTORCH_INFERENCE.knobs.items()}


def _config(**changes: object) -> dict[str, object]:
    return {**REFERENCE, "batch_size": 8, **changes}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 5))


def _inputs(count: int = 16) -> torch.Tensor:
    return torch.randn(count, 32, generator=torch.Generator().manual_seed(1))


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_the_reference_config_is_the_model_itself() -> None:
    model, x = _model(), _inputs()
    expected = model(x)
    served = TunedInference(_config(), _model(), device="cpu")(x)
    # the same fp32 model through the serving path: equal up to float reassociation, not in bits
    assert _relative(served, expected.detach()) < 1e-6


@pytest.mark.parametrize(
    ("changes", "most"),
    [
        ({"precision": "bf16"}, 0.05),
        ({"quantization": "int8-dynamic"}, 0.05),
        ({"quantization": "int8-weight-only"}, 0.05),
        ({"runtime": "onnxruntime-cpu", "threads": 1}, 1e-5),
    ],
)
def test_each_knob_computes_the_same_outputs_within_its_numerics(
    changes: dict[str, object], most: float, tmp_path: Path
) -> None:
    x = _inputs()
    expected = _model()(x).detach()
    tuned = TunedInference(_config(**changes), _model(), device="cpu", example=x[:8], onnx_file=tmp_path / "m.onnx")
    outputs = primary_output(tuned(x[:8])).float()
    assert _relative(outputs, expected[:8]) <= most
    if changes.get("runtime"):
        assert (tmp_path / "m.onnx").exists() and tuned.session is not None


@pytest.mark.parametrize("runtime", ["onnxruntime-cuda", "onnxruntime-tensorrt"])
def test_an_onnx_provider_that_does_not_start_is_unsupported_not_a_silent_cpu_session(
    runtime: str, tmp_path: Path
) -> None:
    """ONNX Runtime falls back to the next provider it was given when one cannot start (here: a
    build without CUDA); a trial would then time the CPU under the GPU runtime's name."""
    pytest.importorskip("onnxruntime")
    with pytest.raises(Unsupported, match=rf"runtime={runtime}: ONNX Runtime could not start"):
        TunedInference(_config(runtime=runtime), _model(), device="cpu", example=_inputs(8), onnx_file=tmp_path / "m")


def test_tensorrt_falls_back_to_cuda_then_the_cpu() -> None:
    """What TensorRT cannot run goes to CUDA, as ONNX Runtime's own guide sets the providers."""
    assert session_settings(_config(runtime="onnxruntime-tensorrt"))["providers"] == [
        "TensorrtExecutionProvider",
        "CUDAExecutionProvider",
        "CPUExecutionProvider",
    ]
    assert session_settings(_config(runtime="onnxruntime-cuda"))["providers"] == [
        "CUDAExecutionProvider",
        "CPUExecutionProvider",
    ]


def test_an_onnx_runtime_needs_an_example_and_reuses_its_export(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="give an example batch"):
        TunedInference(_config(runtime="onnxruntime-cpu"), _model(), device="cpu")
    x, onnx = _inputs(8), tmp_path / "m.onnx"
    TunedInference(_config(runtime="onnxruntime-cpu"), _model(), device="cpu", example=x, onnx_file=onnx)
    written = onnx.stat().st_mtime_ns
    TunedInference(_config(runtime="onnxruntime-cpu"), _model(), device="cpu", example=x, onnx_file=onnx)
    assert onnx.stat().st_mtime_ns == written  # exported once


class _Tagger(nn.Module):
    """A token model as Hugging Face writes them: keyword inputs, an output mapping that holds a
    cache object beside its logits (which the ONNX exporter cannot take), any sequence length."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = nn.Embedding(50, 16), nn.Linear(16, 5)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, object]:
        hidden = self.embed(input_ids) * attention_mask.unsqueeze(-1)
        return {"logits": self.head(hidden), "past_key_values": object(), "hidden": hidden}


def test_onnx_runtime_serves_a_keyword_model_with_a_cache_at_each_batchs_own_length(tmp_path: Path) -> None:
    """A collate function that pads each batch to its own length gives every batch its own
    shape: the exported graph takes them all, and computes the output drift compares."""
    pytest.importorskip("onnxruntime")

    def batch(length: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(1, 50, (4, length), generator=torch.Generator().manual_seed(length))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.zeros(4)}

    tuned = TunedInference(
        _config(runtime="onnxruntime-cpu", batch_size=4),
        _Tagger(),
        device="cpu",
        example=batch(7),
        onnx_file=tmp_path / "m",
    )
    for length in (7, 3, 12):
        expected = _Tagger()(batch(length)["input_ids"], batch(length)["attention_mask"])["logits"].detach()
        served = tuned(batch(length))
        assert served.shape == (4, length, 5) and _relative(served, expected) < 1e-6


def test_a_mapping_batch_is_passed_as_keywords_without_its_labels() -> None:
    class Keyword(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 3)

        def forward(self, features: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"logits": self.linear(features)}

    tuned = TunedInference(_config(), Keyword(), device="cpu")
    out = tuned({"features": torch.randn(2, 4), "labels": torch.tensor([0, 1])})
    assert primary_output(out).shape == (2, 3)


CPU = InferenceCapabilities(bf16=True, fp16=True, compile=True, torchao=True, onnxruntime=True, ort_cpu=True)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({}, None),
        ({"quantization": "int8-dynamic"}, None),
        ({"runtime": "onnxruntime-cpu", "threads": 1}, None),
        ({"runtime": "onnxruntime-cpu", "precision": "bf16"}, "the model is exported in fp32"),
        ({"runtime": "onnxruntime-cpu", "quantization": "int8-dynamic"}, "ONNX Runtime runs the exported fp32 graph"),
        ({"runtime": "onnxruntime-cuda"}, "this ONNX Runtime build has no CUDAExecutionProvider"),
        ({"quantization": "fp8"}, "compute capability 8.9"),
        ({"compile": "reduce-overhead"}, "CUDA graphs need a CUDA device"),
        ({"precision": "tf32"}, "no TF32 matmuls"),
    ],
)
def test_what_a_cpu_cannot_serve_is_unsupported_with_the_reason(changes: dict[str, object], reason: str | None) -> None:
    found = PYTORCH_INFERENCE.unsupported_reason(_config(**changes), CPU)
    assert found is None if reason is None else reason in (found or ""), found


def test_a_missing_library_is_unsupported_with_the_pip_line() -> None:
    bare = InferenceCapabilities(bf16=True)
    found = PYTORCH_INFERENCE.unsupported_reason(_config(quantization="int8-dynamic"), bare)
    assert found is not None and "torchao is not installed here: pip install torchao" in found
    found = PYTORCH_INFERENCE.unsupported_reason(_config(runtime="onnxruntime-cpu"), bare)
    assert found is not None and "pip install onnxruntime" in found


def test_held_out_items_are_whole_served_steps() -> None:
    assert heldout_count(256, 64) == 256 and heldout_count(300, 64) == 256
    assert heldout_count(1000, 48) == 240  # 256 at most, in steps of 48
    assert heldout_count(10, 64) == 64  # one step at least (the probe checks the data holds it)
    assert heldout_count(2000, 512) == 512


def test_the_probe_refuses_a_held_out_set_smaller_than_one_served_step() -> None:
    from autotuner.trials.process import _data_problem

    small = InferenceWorkload(model=_model(), dataset=_classifier_items(64), heldout=_classifier_items(10))
    found = _data_problem(PyTorchServing(), small, 32)
    assert found is not None and "held-out set holds 10 items, fewer than one served step (32" in found
    assert _data_problem(PyTorchServing(), small, 8) is None


def test_latency_is_read_from_the_calls_inside_the_measured_windows() -> None:
    calls = [Served(0.5, 9.0), *(Served(1.0 + k * 0.01, 0.001 * (k + 1)) for k in range(100)), Served(5.0, 1.0)]
    found = latency(calls, [(1.0, 2.5)])  # the warm-up's call (0.5) and one after (5.0) are not counted
    assert found is not None and found.calls == 100
    assert found.p50_ms == pytest.approx(50.5) and found.p99_ms == pytest.approx(99.0)
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0 and latency(calls, []) is None


def _windows(spans: list[tuple[float, float]], **changes: object) -> Throughput:
    """Two measured windows of 2 steps of 8 samples, each over 1 s of wall time."""
    return Throughput(
        samples_per_s=16.0, spread=0.0, window_samples_per_s=[16.0, 16.0], warmup_s=0.1, measured_s=2.0,
        steps=2, windows=2, samples_per_step=8, window_spans=spans, **changes,
    )  # fmt: skip


def test_optimizing_latency_times_a_window_by_its_served_calls_alone() -> None:
    """Each window's wall time holds the loading of the next batch as well: ranking by latency, a
    window is timed by the calls it served (two of 0.1 s, then two of 0.2 s), not the 1 s it lasted."""
    calls = [Served(0.05, 5.0), Served(1.1, 0.1), Served(1.6, 0.1), Served(3.1, 0.2), Served(3.6, 0.2)]
    timed = by_calls(_windows([(1.0, 2.0), (3.0, 4.0)]), calls)
    assert timed.window_samples_per_s == pytest.approx([80.0, 40.0])
    assert timed.samples_per_s == pytest.approx(60.0) and timed.measured_s == pytest.approx(0.6)
    assert timed.spread == pytest.approx(40.0 / 60.0)
    pruned = _windows([(1.0, 2.0), (3.0, 4.0)], stopped="behind")
    assert by_calls(pruned, calls) is pruned  # its rule's stretches, as judged


def _classifier_items(count: int) -> list[tuple[torch.Tensor, int]]:
    x = _inputs(count)
    return [(x[k], k % 5) for k in range(count)]


def test_output_drift_is_the_relative_error_with_top1_agreement_and_accuracy() -> None:
    serving = PyTorchServing()
    workload = InferenceWorkload(model=_model(), dataset=_classifier_items(16))
    items = _classifier_items(16)
    reference = serving.reference_outputs(workload, items, 8, torch.device("cpu"))
    same = serving.output_drift(workload, reference.clone(), reference, items)
    assert same.relative_error == 0.0 and same.top1_agreement == 1.0
    assert same.accuracy == same.reference_accuracy is not None
    noisy = reference + 0.1 * reference.norm() / math.sqrt(reference.numel()) * torch.ones_like(reference)
    drift = serving.output_drift(workload, noisy, reference, items)
    assert drift.relative_error == pytest.approx(0.1, rel=1e-6)
    custom = InferenceWorkload(model=_model(), dataset=items, drift_fn=lambda out, ref: 0.25)
    assert serving.output_drift(custom, noisy, reference, items).relative_error == 0.25


def test_a_training_workload_serves_its_model_and_data() -> None:
    training = TorchWorkload(model=_model(), dataset=_classifier_items(8), optimizer=torch.optim.SGD)
    served = as_inference_workload(training, "x:y")
    assert served.model is training.model and served.dataset is training.dataset
    with pytest.raises(TypeError, match="expected an InferenceWorkload"):
        as_inference_workload(object(), "x:y")


def test_the_exported_graph_is_kept_once_per_workload_seed_and_batch() -> None:
    from autotuner.backends.pytorch.inference_runner import PyTorchServing
    from autotuner.trials.serving import graph_file
    from tests.support.helpers import small_request

    def request(**config: object) -> TrialRequest:
        workload = "autotuner.backends.pytorch.inference_builtin:encoder"
        return dataclasses.replace(small_request(workload, _config(**config), {"width": 64}), compile_cache="/cache")

    def export_file(request: TrialRequest) -> str | None:
        return graph_file(request, PyTorchServing().graph_format(request.config))

    assert export_file(request()) is None  # PyTorch's runtime exports nothing
    eight = export_file(request(runtime="onnxruntime-cpu"))
    assert eight is not None and eight.startswith("/cache/onnx/") and eight.endswith(".onnx")
    assert export_file(request(runtime="onnxruntime-cpu", threads=2)) == eight  # the same graph
    assert export_file(request(runtime="onnxruntime-cpu", batch_size=4)) != eight


def test_only_an_onnx_winner_exports_as_onnx(tmp_path: Path) -> None:
    from autotuner.backends.pytorch.integrations import write
    from autotuner.errors import SpecError
    from autotuner.export.reader import parse_config

    export = {
        "version": 1,
        "params": _config(),
        "metrics": {"throughput": 100.0},
        "baseline": {},
        "speedup": None,
        "environment": {"backend": "pytorch", "device": "cpu", "fingerprint": "0"},
        "spec": {"identity": "x", "task": "inference"},
        "study": {"name": "s"},
    }
    tuned = parse_config(export, "best.yaml")
    with pytest.raises(SpecError, match="runs on pytorch: --format onnx writes the model of an inference config"):
        write("onnx", tuned, None, tmp_path / "best.onnx")  # type: ignore[arg-type]


def test_2_4_sparsity_prunes_each_four_weights_of_the_layers_its_kernels_take_to_two() -> None:
    from autotuner.backends.pytorch.serving import prune_2_4, sparse_layer

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 64), nn.GELU(), nn.Linear(64, 5))  # the head's shape: no kernel
    assert sparse_layer(model[0]) and not sparse_layer(model[2])
    kept, head = model[0].weight.detach().clone(), model[2].weight.detach().clone()
    prune_2_4(model)
    groups = model[0].weight.detach().reshape(-1, 4)
    assert bool(((groups != 0).sum(dim=1) == 2).all())
    largest = kept.reshape(-1, 4).abs().topk(2, dim=1).values.sum(dim=1)
    assert torch.allclose(groups.abs().sum(dim=1), largest)  # the two largest of each four kept
    assert torch.equal(model[2].weight.detach(), head)


@pytest.mark.parametrize(
    ("caps", "changes", "reason"),
    [
        (CPU, {"sparsity": "2:4", "precision": "bf16"}, "compute capability 8.0"),
        (
            dataclasses.replace(CPU, accelerator=True, sparse24=True),
            {"sparsity": "2:4", "precision": "bf16"},
            "no linear layer the 2:4 kernels take",
        ),
        (
            dataclasses.replace(CPU, accelerator=True, sparse24=True, sparse24_layers=True),
            {"sparsity": "2:4", "precision": "fp32"},
            "served in bf16 or fp16",
        ),
        (
            dataclasses.replace(CPU, accelerator=True, sparse24=True, sparse24_layers=True),
            {"sparsity": "2:4", "precision": "bf16", "quantization": "int8-dynamic"},
            "not offered together",
        ),
        (
            dataclasses.replace(CPU, accelerator=True, sparse24=True, sparse24_layers=True),
            {"sparsity": "2:4", "precision": "bf16"},
            None,
        ),
    ],
)
def test_2_4_sparsity_is_offered_on_a_gpu_that_has_the_kernels_only(
    caps: InferenceCapabilities, changes: dict[str, object], reason: str | None
) -> None:
    found = PYTORCH_INFERENCE.unsupported_reason(_config(**changes), caps)
    assert found is None if reason is None else reason in (found or ""), found


class _LoaderPids(torch.utils.data.Dataset[torch.Tensor]):
    """Each item says which process loaded it."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        import os

        return torch.tensor([os.getpid()])


def test_the_served_batches_come_from_loader_workers_that_live_through_every_pass() -> None:
    """A window may span the end of the dataset: its loader workers go on serving the next pass
    rather than starting again inside the timed window, as training's do."""
    workload = InferenceWorkload(model=_model(), dataset=_LoaderPids())
    serving = TunedInference(_config(batch_size=4, workers=1), workload.model, device="cpu")
    batches = PyTorchServing().batches(workload, serving, seed=0)
    pids = {int(pid) for _ in range(6) for pid in next(batches)}  # three passes of two batches
    batches.close()
    assert len(pids) == 1
