"""The PyTorch backend's inference half, trial-process side: PyTorch's part of the inference trial
(`autotuner.trials.serving`), exposed as the runner module's `TRIAL_BACKEND`, beside the process
part every role shares (`autotuner.backends.pytorch.process.TorchProcess`). The config is
applied by `autotuner.backends.pytorch.serving.TunedInference`, the object users serve with.

Imported by the fork server before any trial, so importing it must not initialise CUDA (nor
import torchao or onnxruntime: a config that uses them imports them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sized
from typing import Any, cast

import numpy as np
import torch

from autotuner.backends.pytorch.apply import loader_workers
from autotuner.backends.pytorch.inference import PYTORCH_INFERENCE
from autotuner.backends.pytorch.knobs.runtime import RUNTIME
from autotuner.backends.pytorch.probe import environment, workload_capabilities
from autotuner.backends.pytorch.process import TorchProcess
from autotuner.backends.pytorch.runtimes import RUNTIMES, primary_output, runtime_named
from autotuner.backends.pytorch.runtimes.eager import sparse_layer
from autotuner.backends.pytorch.serving import TunedInference
from autotuner.backends.pytorch.workload import InferenceWorkload, as_inference_workload, first_batch_problem
from autotuner.config.knobs import BATCH_SIZE, Config
from autotuner.trials.probe import Environment
from autotuner.trials.serving import ServingBackend, compare_outputs
from autotuner.trials.trial_output import OutputDrift


def _label(item: object) -> object:
    """An item's label: a pair's second item, a mapping's `labels`; None where it carries none."""
    if isinstance(item, dict):
        return item.get("labels")
    if isinstance(item, (tuple, list)) and not hasattr(item, "_fields") and len(item) == 2:
        return item[1]
    return None


class PyTorchServing(TorchProcess, ServingBackend[torch.device, InferenceWorkload, TunedInference, torch.Tensor]):
    """PyTorch's part of an inference trial (`autotuner.trials.serving.ServingBackend`)."""

    def environment(self, device: torch.device) -> Environment:
        found = environment(device)
        inference = {name: offered for runtime in RUNTIMES for name, offered in runtime.capabilities(device).items()}
        return dataclasses.replace(found, capabilities={**found.capabilities, **inference})

    def workload_capabilities(self, workload: InferenceWorkload, device: torch.device, count: int) -> dict[str, bool]:
        found = workload_capabilities(workload, device, count)
        return {**found, "sparse24_layers": any(sparse_layer(m) for m in workload.model.modules())}

    def as_workload(self, built: object, ref: str) -> InferenceWorkload:
        return as_inference_workload(built, ref)

    def first_batch_problem(self, workload: InferenceWorkload, count: int) -> str | None:
        # what is served must hold a tensor to compare (`primary_output`), in eval mode
        return first_batch_problem(
            workload, count, lambda batch: primary_output(workload.forward(workload.model.eval(), batch))
        )

    def heldout_items(self, workload: InferenceWorkload, count: int) -> list[object]:
        if workload.heldout is not None:
            return [workload.heldout[i] for i in range(count)]
        size = len(cast(Sized, workload.dataset))  # map-style, with a length (`as_inference_workload`)
        return [workload.dataset[i] for i in range(size - count, size)]

    def reference_outputs(
        self, workload: InferenceWorkload, items: list[object], batch: int, device: torch.device
    ) -> torch.Tensor:
        config = {name: knob.reference for name, knob in PYTORCH_INFERENCE.knobs.items()}
        strict = TunedInference({**config, BATCH_SIZE.name: batch}, workload.model, device=device)
        outputs = [
            primary_output(strict(workload.collate(items[k : k + batch]))).detach().to("cpu", torch.float64)
            for k in range(0, len(items), batch)
        ]
        return torch.cat(outputs)

    def serving(
        self,
        workload: InferenceWorkload,
        config: Config,
        device: torch.device,
        example: list[object],
        graph_file: str | None,
    ) -> TunedInference:
        return TunedInference(
            config, workload.model, device=device, example=workload.collate(example), onnx_file=graph_file
        )

    def graph_format(self, config: Config) -> str | None:
        return runtime_named(str(config[RUNTIME.name])).graph_format

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

    def serve(self, serving: TunedInference, batch: Any) -> object:
        outputs = serving(batch)
        serving.synchronize()
        return outputs

    def served_outputs(self, workload: InferenceWorkload, serving: TunedInference, items: list[object]) -> torch.Tensor:
        size = serving.batch_size
        outputs = [
            primary_output(serving(workload.collate(items[k : k + size]))).detach().to("cpu", torch.float64)
            for k in range(0, len(items), size)
        ]
        return torch.cat(outputs)

    def output_drift(
        self, workload: InferenceWorkload, outputs: torch.Tensor, reference: torch.Tensor, items: list[object]
    ) -> OutputDrift:
        error = float(workload.drift_fn(outputs, reference)) if workload.drift_fn is not None else None
        labels = [_label(item) for item in items]
        scalars = [
            label
            for label in labels
            if isinstance(label, int) or (isinstance(label, torch.Tensor) and label.numel() == 1)
        ]
        target = np.asarray([int(label) for label in scalars]) if labels and len(scalars) == len(labels) else None
        return compare_outputs(outputs.numpy(), reference.numpy(), target, error)


TRIAL_BACKEND = PyTorchServing()
