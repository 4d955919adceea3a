"""Serving a model with a tuned inference config: `TunedInference`, the one implementation of what
an inference config (`task: inference`) means. The trials serve through it, and users apply an
exported config to their own model with it, so what a study measured is what a user gets.

    from autotuner.apply import load_config
    from autotuner.backends.pytorch.serving import TunedInference

    tuned = TunedInference(load_config("runs/<name>/best.yaml"), model, example=batch)
    outputs = tuned(batch)          # the model's outputs, as the config computes them

What it does, once, in this order: the intra-op threads (`threads`, process-wide), the matmul
precision (TF32 for `tf32`), the model on its device in eval mode, its convolutions in
channels_last (`memory_format`); then the session of the config's runtime
(`autotuner.backends.pytorch.runtimes`): PyTorch itself, torchao's quantization of its linear
layers (`quantization`) or their 2:4 sparsity (`sparsity`) and `torch.compile` (`compile`), each
call run under `torch.inference_mode`, the precision's autocast and the `attention` backend; or
ONNX Runtime (`runtime: onnxruntime-*`): the fp32 model exported once through `torch.onnx` (to
`onnx_file`, reused when it is there) and run in an `InferenceSession` with the provider the
config names and its threads. A batch reaches the model by the workload rule
(`autotuner.backends.pytorch.workload.call_model`): a mapping as keyword arguments (its `labels`
left out), a pair's first item, or the whole batch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from autotuner.backends._base import ExportedConfig, TunedLoop
from autotuner.backends.pytorch.device import B, resolve_device, set_matmul_precision, to_device
from autotuner.backends.pytorch.inference import PYTORCH_INFERENCE
from autotuner.backends.pytorch.knobs.memory_format import MEMORY_FORMAT, channels_last
from autotuner.backends.pytorch.knobs.quantization import QUANTIZATION
from autotuner.backends.pytorch.knobs.runtime import RUNTIME
from autotuner.backends.pytorch.knobs.threads import THREADS
from autotuner.backends.pytorch.runtimes import Session, model_inputs, primary_output, runtime_named
from autotuner.backends.pytorch.runtimes.eager import prune_2_4, quantize, sparse_layer, sparsify
from autotuner.backends.pytorch.runtimes.onnxruntime import export_onnx, session_settings


class TunedInference(TunedLoop):
    """A config applied to `model` for serving (see the module docstring). `config`: an exported
    config (`autotuner.apply.load_config`) or a mapping of knob values; `example`: one batch as
    the model is called with (needed by the ONNX runtimes, which export the model with it);
    `onnx_file`: where the exported graph goes (a temporary folder's file by default)."""

    def __init__(
        self,
        config: ExportedConfig | Mapping[str, object],
        model: torch.nn.Module,
        *,
        device: str | torch.device | None = None,
        example: object = None,
        onnx_file: str | os.PathLike[str] | None = None,
    ):
        super().__init__(PYTORCH_INFERENCE, config)
        self.device = resolve_device(device)
        self.runtime: str = RUNTIME.of(self.config)
        self.quantization: str = QUANTIZATION.of(self.config)
        threads = int(THREADS.of(self.config))
        if threads:
            torch.set_num_threads(threads)
        set_matmul_precision(self.precision)
        self._channels_last = MEMORY_FORMAT.of(self.config) == "channels_last"
        model = model.to(self.device).eval()
        if self._channels_last:
            model = channels_last(model)
        graph = None if onnx_file is None else Path(onnx_file)
        example = None if example is None else self.to_device(example)
        self.session: Session = runtime_named(self.runtime).session(self, model, example, graph)

    def to_device(self, batch: B) -> B:
        return to_device(batch, self.device, channels_last=self._channels_last)

    def __call__(self, batch: object) -> Any:
        """The model's outputs on `batch` (moved to the device), as the config computes them; with an
        ONNX runtime, its first output as a tensor on the host."""
        return self.session(self.to_device(batch))

    def synchronize(self) -> None:
        """Wait until the device has finished what it was given."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


__all__ = [
    "TunedInference",
    "export_onnx",
    "model_inputs",
    "primary_output",
    "prune_2_4",
    "quantize",
    "session_settings",
    "sparse_layer",
    "sparsify",
]
