"""The PyTorch backend's inference half, trial-process side: PyTorch's part of the inference trial
(`autotuner.trials.inference`), exposed as the runner module's `TRIAL_BACKEND`. The config is
applied by `autotuner.backends.pytorch.serving.TunedInference`, the object users serve with.

Imported by the fork server before any trial, so importing it must not initialise CUDA (nor
import torchao or onnxruntime: a config that uses them imports them).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from autotuner.backends.pytorch.apply import loader_workers
from autotuner.backends.pytorch.inference import PYTORCH_INFERENCE
from autotuner.backends.pytorch.probe import environment
from autotuner.backends.pytorch.runner import PyTorchTrial
from autotuner.backends.pytorch.serving import TunedInference, primary_output, sparse_layer
from autotuner.backends.pytorch.workload import InferenceWorkload, as_inference_workload, first_batch_problem
from autotuner.config.knobs import BATCH_SIZE, Config
from autotuner.trials.inference import ServingBackend, compare_outputs
from autotuner.trials.probe import Environment
from autotuner.trials.trial_output import OutputDrift


def _ort_providers() -> list[str]:
    """ONNX Runtime's execution providers in this build (none without onnxruntime)."""
    if importlib.util.find_spec("onnxruntime") is None:
        return []
    import onnxruntime

    return list(onnxruntime.get_available_providers())


def _label(item: Any) -> Any:
    """An item's label: a pair's second item, a mapping's `labels`; None where it carries none."""
    if isinstance(item, dict):
        return item.get("labels")
    if isinstance(item, (tuple, list)) and not hasattr(item, "_fields") and len(item) == 2:
        return item[1]
    return None


class PyTorchServing(ServingBackend, PyTorchTrial):
    """PyTorch's part of an inference trial (`autotuner.trials.inference.ServingBackend`)."""

    def environment(self, device: torch.device) -> Environment:
        found = environment(device)
        providers = _ort_providers()
        capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else (0, 0)
        inference = {
            "torchao": importlib.util.find_spec("torchao") is not None,
            "fp8": capability >= (8, 9),
            "sparse24": capability >= (8, 0),
            "onnxruntime": bool(providers),
            "ort_cpu": "CPUExecutionProvider" in providers,
            "ort_cuda": device.type == "cuda" and "CUDAExecutionProvider" in providers,
            "ort_tensorrt": device.type == "cuda" and "TensorrtExecutionProvider" in providers,
        }
        return dataclasses.replace(found, capabilities={**found.capabilities, **inference})

    def workload_capabilities(self, workload: Any, device: torch.device, count: int) -> dict[str, bool]:
        found = super().workload_capabilities(workload, device, count)
        return {**found, "sparse24_layers": any(sparse_layer(m) for m in workload.model.modules())}

    def as_workload(self, built: Any, ref: str) -> InferenceWorkload:  # type: ignore[override]
        return as_inference_workload(built, ref)

    def first_batch_problem(self, workload: Any, count: int) -> str | None:
        # what is served must hold a tensor to compare (`primary_output`), in eval mode
        return first_batch_problem(
            workload, count, lambda batch: primary_output(workload.forward(workload.model.eval(), batch))
        )

    def heldout_items(self, workload: InferenceWorkload, count: int) -> list[Any]:
        if workload.heldout is not None:
            return [workload.heldout[i] for i in range(count)]
        size = len(workload.dataset)
        return [workload.dataset[i] for i in range(size - count, size)]

    def reference_outputs(self, workload: InferenceWorkload, items: list[Any], batch: int, device: Any) -> Any:
        config = {name: knob.reference for name, knob in PYTORCH_INFERENCE.knobs.items()}
        strict = TunedInference({**config, BATCH_SIZE.name: batch}, workload.model, device=device)
        outputs = [
            primary_output(strict(workload.collate(items[k : k + batch]))).detach().to("cpu", torch.float64)
            for k in range(0, len(items), batch)
        ]
        return torch.cat(outputs)

    def serving(
        self, workload: InferenceWorkload, config: Config, device: Any, example: list[Any], export_file: str | None
    ) -> TunedInference:
        return TunedInference(
            config, workload.model, device=device, example=workload.collate(example), onnx_file=export_file
        )

    def batches(self, workload: InferenceWorkload, serving: TunedInference, seed: int) -> Iterator[Any]:
        generator = torch.Generator().manual_seed(seed)
        loader = torch.utils.data.DataLoader(
            workload.dataset,
            batch_size=serving.batch_size,
            shuffle=True,
            generator=generator,
            drop_last=True,
            collate_fn=workload.collate,
            **loader_workers(serving.workers),
        )
        while True:
            yielded = False
            for batch in loader:
                yielded = True
                yield batch
            if not yielded:
                raise ValueError("the data loader yields no batch: the dataset holds fewer items than one batch")

    def serve(self, serving: TunedInference, batch: Any) -> Any:
        outputs = serving(batch)
        serving.synchronize()
        return outputs

    def served_outputs(self, workload: InferenceWorkload, serving: TunedInference, items: list[Any]) -> torch.Tensor:
        size = serving.batch_size
        outputs = [
            primary_output(serving(workload.collate(items[k : k + size]))).detach().to("cpu", torch.float64)
            for k in range(0, len(items), size)
        ]
        return torch.cat(outputs)

    def output_drift(
        self, workload: InferenceWorkload, outputs: torch.Tensor, reference: torch.Tensor, items: list[Any]
    ) -> OutputDrift:
        error = float(workload.drift_fn(outputs, reference)) if workload.drift_fn is not None else None
        labels = [_label(item) for item in items]
        scalar = all(
            isinstance(label, int) or (isinstance(label, torch.Tensor) and label.numel() == 1) for label in labels
        )
        target = np.asarray([int(label) for label in labels]) if labels and scalar else None
        return compare_outputs(outputs.numpy(), reference.numpy(), target, error)


TRIAL_BACKEND = PyTorchServing()
