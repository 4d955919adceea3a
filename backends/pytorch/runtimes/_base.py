"""What runs a served model: the contract of a runtime, one module an implementation.

A runtime serves the model a `TunedInference` has prepared (on its device, in eval mode, in
channels_last where the config says): it owns what it offers on a device (`capabilities`, merged
into the probe's environment), the session that computes a batch's outputs (`session`), the graph
it runs from when it is not the model itself (`graph_format`: a trial keeps it in the study's
compile cache, `autotuner.trials.serving.graph_file`) and the export format that writes what it
runs (`export_format`). The `runtime` knob's values name them (`RUNTIMES`, `runtime_named`):

- `autotuner.backends.pytorch.runtimes.eager`: PyTorch itself (torchao's quantization or 2:4
  sparsity, the attention backend, `torch.compile`);
- `autotuner.backends.pytorch.runtimes.onnxruntime`: ONNX Runtime with one execution provider on
  the fp32 model exported through `torch.onnx`.

A new runtime is a module here with its `Runtime`, its values in the `runtime` knob
(`autotuner.backends.pytorch.knobs.runtime`) and its tests.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Served(Protocol):
    """What a runtime reads of the config it serves (`autotuner.backends.pytorch.serving.TunedInference`)."""

    @property
    def config(self) -> Mapping[str, object]: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def precision(self) -> str: ...

    @property
    def runtime(self) -> str: ...


class Session(Protocol):
    """A runtime's session: the outputs of one batch, on the device or the host."""

    def __call__(self, batch: object) -> object: ...


class Runtime(ABC):
    """One way to run a served model (see the module docstring)."""

    values: tuple[str, ...]
    """The `runtime` knob's values this runtime serves."""
    graph_format: str | None = None
    """The file suffix of the graph it runs from (`onnx`); None: it runs the model itself."""
    export_format: str | None = None
    """The `autotuner export --format` that writes what it runs; None: the trainers' formats."""

    def capabilities(self, device: torch.device) -> dict[str, bool]:
        """What this runtime offers on `device` (the knobs' rules read them), for the probe."""
        return {}

    @abstractmethod
    def session(self, tuned: Served, model: torch.nn.Module, example: object, graph_file: Path | None) -> Session:
        """The session that serves `model` as `tuned`'s config says; `example`: one batch on the
        device (what a graph is traced with, None if the caller gave none), `graph_file`: where
        that graph is kept (None: a temporary file)."""


def model_inputs(batch: object) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The positional and keyword arguments a batch calls the model with (`call_model`'s rule; a
    mapping's `labels` left out: serving computes no loss): parts of a user's batch."""
    if isinstance(batch, Mapping):
        return (), {k: v for k, v in batch.items() if k != "labels"}
    if isinstance(batch, (tuple, list)) and not hasattr(batch, "_fields") and len(batch) == 2:
        return (batch[0],), {}
    return (batch,), {}


def primary_output(output: object) -> torch.Tensor:
    """The tensor a model's output is compared by: itself, its `logits` (Hugging Face), or its first
    tensor (a tuple, a mapping)."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    values = output.values() if isinstance(output, Mapping) else output if isinstance(output, (tuple, list)) else []
    for value in values:
        if isinstance(value, torch.Tensor):
            return value
    raise TypeError(f"the model's output ({type(output).__name__}) holds no tensor to compare")
