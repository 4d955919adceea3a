"""ONNX Runtime as the runtime (`runtime: onnxruntime-*`): the fp32 model exported once through
`torch.onnx` (to the trial's graph file, reused when it is there) and run in an
`InferenceSession` with the provider the config names and its threads; `autotuner export
--format onnx` writes the same graph and the session's settings for a server.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol, TypedDict

import numpy as np
import torch

from autotuner.backends.pytorch.knobs.runtime import ORT_PROVIDERS, RUNTIME
from autotuner.backends.pytorch.knobs.threads import THREADS
from autotuner.backends.pytorch.runtimes._base import Runtime, Served, model_inputs, primary_output
from autotuner.trials.outcomes import Unsupported


def providers() -> list[str]:
    """ONNX Runtime's execution providers in this build (none without onnxruntime)."""
    if importlib.util.find_spec("onnxruntime") is None:
        return []
    import onnxruntime

    return list(onnxruntime.get_available_providers())


class InferenceSession(Protocol):
    """What `OrtSession` calls of ONNX Runtime's `InferenceSession`."""

    def run(self, output_names: None, input_feed: Mapping[str, np.ndarray]) -> Sequence[np.ndarray]: ...


class SessionSettings(TypedDict):
    """`session_settings`: what an ONNX config's session runs with."""

    providers: list[str]
    intra_op_num_threads: int
    graph_optimization_level: str


class OrtSession:
    """An `InferenceSession` fed a batch as the model is called with; its first output as a tensor
    on the host."""

    def __init__(
        self, session: InferenceSession, names: list[str], folder: tempfile.TemporaryDirectory[str] | None = None
    ):
        self.session, self.names = session, names
        self.folder = folder
        """The temporary folder of a graph exported without a graph file: removed with the session."""

    def __call__(self, batch: object) -> torch.Tensor:
        args, kwargs = model_inputs(batch)
        flat = [*args, *kwargs.values()]
        feed = {name: tensor.detach().cpu().numpy() for name, tensor in zip(self.names, flat, strict=True)}
        return torch.from_numpy(self.session.run(None, feed)[0])


class OnnxRuntime(Runtime):
    values = tuple(ORT_PROVIDERS)
    graph_format = "onnx"
    export_format = "onnx"

    def capabilities(self, device: torch.device) -> dict[str, bool]:
        """Whether onnxruntime is installed, and which of the offered providers its build has (the
        GPU ones on a GPU only)."""
        found = providers()
        return {
            "onnxruntime": bool(found),
            "ort_cpu": "CPUExecutionProvider" in found,
            "ort_cuda": device.type == "cuda" and "CUDAExecutionProvider" in found,
            "ort_tensorrt": device.type == "cuda" and "TensorrtExecutionProvider" in found,
        }

    def session(self, tuned: Served, model: torch.nn.Module, example: object, graph_file: Path | None) -> OrtSession:
        """The session of the fp32 model exported with `example` (once: an existing `graph_file` is
        reused), its inputs named in the order the batch gives them."""
        import onnxruntime

        if example is None:
            raise ValueError(f"runtime={tuned.runtime}: give an example batch to export the model with")
        folder = None
        if graph_file is None:
            folder = tempfile.TemporaryDirectory(prefix="autotuner-onnx-")
            graph_file = Path(folder.name) / "model.onnx"
        if not graph_file.exists():
            export_onnx(model, example, graph_file)
        options = onnxruntime.SessionOptions()
        settings = session_settings(tuned.config)
        options.graph_optimization_level = getattr(
            onnxruntime.GraphOptimizationLevel, settings["graph_optimization_level"]
        )
        if settings["intra_op_num_threads"]:
            options.intra_op_num_threads = settings["intra_op_num_threads"]
        chosen: list[str | tuple[str, dict[str, int]]] = [*settings["providers"]]
        if tuned.device.type == "cuda":  # the trial's GPU, not ONNX Runtime's first
            gpu = {"device_id": tuned.device.index or 0}
            chosen = [p if p == CPU_PROVIDER else (p, gpu) for p in settings["providers"]]
        session = onnxruntime.InferenceSession(str(graph_file), options, providers=chosen)
        # a provider that cannot start (a library missing, another CUDA) is passed over for the
        # next one, with a warning only: the config would be timed on what it does not name
        started, wanted = session.get_providers(), settings["providers"][0]
        if started[0] != wanted:
            raise Unsupported(
                f"runtime={tuned.runtime}: ONNX Runtime could not start its {wanted} here "
                f"(the session would run on {started[0]})"
            )
        return OrtSession(session, [i.name for i in session.get_inputs()], folder)


def export_onnx(model: torch.nn.Module, example: object, path: Path) -> list[str]:
    """Export `model` (fp32, eval) through `torch.onnx` with `example` (a batch as the model is
    called with) to `path`, written whole (a reader never sees half a file); the input names, in
    the order the batch gives them (`input_<k>` for positional inputs, the keywords' own names).

    The graph computes the model's primary output alone (`primary_output`: what drift compares
    and the runtime serves), so that a model whose output holds what the exporter cannot take (a
    Hugging Face causal LM's cache) exports all the same. Every axis of every input is dynamic: a
    collate function that pads each batch to its own length gives each batch its own shape."""
    args, kwargs = model_inputs(example)
    names = [f"input_{k}" for k in range(len(args))] + list(kwargs)
    dynamic = {
        name: {axis: f"{name}_{axis}" for axis in range(value.dim())}
        for name, value in zip(names, [*args, *kwargs.values()], strict=True)
        if isinstance(value, torch.Tensor)
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    # The tracer warns wherever the model turns a tensor into a Python value (a Hugging Face model
    # does, checking its mask): the graph may not hold for other shapes. Drift, measured on the
    # held-out batches at their own shapes, is what tells; the warning would be on every trial.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(
            PrimaryOutput(model, list(kwargs)),
            (*args, *kwargs.values()),
            str(partial),
            input_names=names,
            output_names=["output"],
            dynamic_axes=dynamic,
            dynamo=False,  # the TorchScript exporter, which needs no onnxscript
        )
    partial.replace(path)
    return names


class PrimaryOutput(torch.nn.Module):
    """`model` computing its primary output alone (`primary_output`), for the ONNX exporter, which
    traces positional inputs only: the last `len(keywords)` of them are passed by those names."""

    def __init__(self, model: torch.nn.Module, keywords: list[str]):
        super().__init__()
        self.model, self.keywords = model, keywords

    def forward(self, *inputs: object) -> torch.Tensor:
        positional = len(inputs) - len(self.keywords)
        kwargs = dict(zip(self.keywords, inputs[positional:], strict=True))
        return primary_output(self.model(*inputs[:positional], **kwargs))


CPU_PROVIDER = "CPUExecutionProvider"
ORT_FALLBACKS = {"TensorrtExecutionProvider": ("CUDAExecutionProvider",)}
"""Where ONNX Runtime sends the operators a provider lacks, before the CPU: TensorRT's go to CUDA."""


def session_settings(config: Mapping[str, object]) -> SessionSettings:
    """The ONNX Runtime session an ONNX config runs in: its providers (the config's, then the
    fallbacks ONNX Runtime takes for what a GPU provider lacks: CUDA for TensorRT, then the CPU),
    intra-op threads (0: ONNX Runtime's default) and graph optimisation level."""
    provider = ORT_PROVIDERS[RUNTIME.of(config)]
    providers = list(dict.fromkeys([provider, *ORT_FALLBACKS.get(provider, ()), CPU_PROVIDER]))
    return {
        "providers": providers,
        "intra_op_num_threads": int(THREADS.of(config)),
        "graph_optimization_level": "ORT_ENABLE_ALL",
    }


ONNX_RUNTIME = OnnxRuntime()
