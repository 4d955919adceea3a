"""Serving a model with a tuned inference config: `TunedInference`, the one implementation of what
an inference config (`task: inference`) means. The trials serve through it, and users apply an
exported config to their own model with it, so what a study measured is what a user gets.

    from autotuner.apply import load_config
    from autotuner.backends.pytorch.serving import TunedInference

    tuned = TunedInference(load_config("runs/<name>/best.yaml"), model, example=batch)
    outputs = tuned(batch)          # the model's outputs, as the config computes them

What it does, once, in this order: the intra-op threads (`threads`, process-wide), the matmul
precision (TF32 for `tf32`), the model on its device in eval mode, its convolutions in
channels_last (`memory_format`); then either PyTorch: torchao's quantization of its linear layers
(`quantization`) or their 2:4 sparsity (`sparsity`, `sparsify`) and `torch.compile` (`compile`),
each call run under `torch.inference_mode`, the precision's autocast (bf16 or fp16; the weights
stay fp32, but for 2:4 sparse layers, served in that dtype) and the `attention` backend; or ONNX
Runtime (`runtime: onnxruntime-*`): the fp32 model exported once through `torch.onnx` (to `onnx_file`,
reused when it is there) and run in an `InferenceSession` with the provider the config names and
its threads. A batch reaches the model by the workload rule (`autotuner.backends.pytorch.workload.call_model`):
a mapping as keyword arguments (its `labels` left out), a pair's first item, or the whole batch.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from autotuner.backends._base import TunedLoop
from autotuner.backends.pytorch.apply import (
    COMPILE_MODES,
    choose_attention,
    resolve_device,
    set_matmul_precision,
    to_device,
)
from autotuner.backends.pytorch.inference import ORT_PROVIDERS, PYTORCH_INFERENCE, SPARSE_COLUMNS, SPARSE_ROWS
from autotuner.trials.outcomes import Unsupported

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def model_inputs(batch: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The positional and keyword arguments a batch calls the model with (`call_model`'s rule; a
    mapping's `labels` left out: serving computes no loss)."""
    if isinstance(batch, Mapping):
        return (), {k: v for k, v in batch.items() if k != "labels"}
    if isinstance(batch, (tuple, list)) and not hasattr(batch, "_fields") and len(batch) == 2:
        return (batch[0],), {}
    return (batch,), {}


def primary_output(output: Any) -> torch.Tensor:
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


def _quiet_import(module: str) -> None:
    """Import `module` with its import-time warnings held back: torchao logs each CUDA kernel
    library it cannot load on a machine without them, and torch's pytree a deprecation of the enum
    torchao registers; neither says anything about the config."""
    import importlib
    import logging

    loggers = [logging.getLogger(name) for name in (module, "torch.utils._pytree")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        importlib.import_module(module)
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def quantize(model: torch.nn.Module, quantization: str) -> None:
    """torchao's `quantize_` of the model's linear layers, in place."""
    if quantization == "none":
        return
    _quiet_import("torchao")
    from torchao.quantization import (
        Float8DynamicActivationFloat8WeightConfig,
        Int8DynamicActivationInt8WeightConfig,
        Int8WeightOnlyConfig,
        quantize_,
    )

    configs: dict[str, Callable[[], Any]] = {
        "int8-weight-only": Int8WeightOnlyConfig,
        "int8-dynamic": Int8DynamicActivationInt8WeightConfig,
        "fp8": Float8DynamicActivationFloat8WeightConfig,
    }
    quantize_(model, configs[quantization]())


def sparse_layer(module: torch.nn.Module, name: str = "") -> bool:
    """Whether `module` is a linear layer whose weight the 2:4 kernels take."""
    return (
        isinstance(module, torch.nn.Linear)
        and module.out_features % SPARSE_ROWS == 0
        and module.in_features % SPARSE_COLUMNS == 0
    )


def sparsify(model: torch.nn.Module, sparsity: str, dtype: torch.dtype | None) -> None:
    """2:4 sparsity of the model's linear layers the kernels take (`sparse_layer`), in place: each
    four weights of a row pruned to their two largest (`prune_2_4`), the layer cast to `dtype` (the
    precision's: the kernels take bf16 or fp16), its weight compressed for the sparse kernels
    (torchao's `sparsify_` with `semi_sparse_weight`). Its kernels need an NVIDIA GPU of compute
    capability 8.0 or later."""
    if sparsity == "none":
        return
    if dtype is None:
        raise ValueError("sparsity=2:4 serves the sparse weights in bf16 or fp16: set precision")
    prune_2_4(model)
    from torchao.sparsity import semi_sparse_weight, sparsify_

    for module in model.modules():
        if sparse_layer(module):
            module.to(dtype)
    sparsify_(model, semi_sparse_weight(), filter_fn=sparse_layer)


def prune_2_4(model: torch.nn.Module) -> None:
    """Each four consecutive weights of a row of the model's `sparse_layer`s pruned to their two
    largest in magnitude (torchao's `apply_fake_sparsity`), in place: the zeros 2:4 kernels skip."""
    _quiet_import("torchao")
    from torchao.sparsity import apply_fake_sparsity

    apply_fake_sparsity(model, filter_fn=sparse_layer)


class TunedInference(TunedLoop):
    """A config applied to `model` for serving (see the module docstring). `config`: an exported
    config (`autotuner.apply.load_config`) or a mapping of knob values; `example`: one batch as
    the model is called with (needed by the ONNX runtimes, which export the model with it);
    `onnx_file`: where the exported graph goes (a temporary folder's file by default)."""

    def __init__(
        self,
        config: Any,
        model: torch.nn.Module,
        *,
        device: str | torch.device | None = None,
        example: Any = None,
        onnx_file: str | os.PathLike[str] | None = None,
    ):
        super().__init__(PYTORCH_INFERENCE, config)
        self.device = resolve_device(device)
        self.runtime: str = self.config["runtime"]
        self.quantization: str = self.config["quantization"]
        threads = int(self.config["threads"])
        if threads:
            torch.set_num_threads(threads)
        set_matmul_precision(self.precision)
        channels_last = self.config["memory_format"] == "channels_last"
        self._channels_last = channels_last
        model = model.to(self.device).eval()
        if channels_last:
            model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self.session: Any = None
        self.model: Callable[..., Any] = model
        self._attention: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
        if self.runtime == "pytorch":
            quantize(model, self.quantization)
            sparsify(model, self.config["sparsity"], AUTOCAST.get(self.precision))
            self._attention = choose_attention(model, self.config["attention"])
            mode = self.config["compile"]
            self.model = model if mode == "none" else torch.compile(model, mode=COMPILE_MODES[mode])
        else:
            if example is None:
                raise ValueError(f"runtime={self.runtime}: give an example batch to export the model with")
            self.session, self._names = self._onnx_session(model, self.to_device(example), onnx_file, threads)

    def to_device(self, batch: Any) -> Any:
        return to_device(batch, self.device, channels_last=self._channels_last)

    @contextlib.contextmanager
    def _context(self) -> Iterator[None]:
        dtype = AUTOCAST.get(self.precision)
        autocast = torch.autocast(self.device.type, dtype=dtype) if dtype else contextlib.nullcontext()
        with torch.inference_mode(), autocast, self._attention():
            yield

    def __call__(self, batch: Any) -> Any:
        """The model's outputs on `batch` (moved to the device), as the config computes them; with an
        ONNX runtime, its first output as a tensor on the host."""
        batch = self.to_device(batch)
        if self.session is not None:
            args, kwargs = model_inputs(batch)
            flat = [*args, *kwargs.values()]
            feed = {name: tensor.detach().cpu().numpy() for name, tensor in zip(self._names, flat, strict=True)}
            return torch.from_numpy(self.session.run(None, feed)[0])
        args, kwargs = model_inputs(batch)
        with self._context():
            return self.model(*args, **kwargs)

    def synchronize(self) -> None:
        """Wait until the device has finished what it was given."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _onnx_session(
        self, model: torch.nn.Module, example: Any, onnx_file: str | os.PathLike[str] | None, threads: int
    ) -> tuple[Any, list[str]]:
        """The ONNX Runtime session of the fp32 model exported with `example` (once: an existing
        `onnx_file` is reused), and the names of its inputs in the order the batch gives them."""
        import onnxruntime

        if onnx_file is None:
            import tempfile

            self._folder = tempfile.TemporaryDirectory(prefix="autotuner-onnx-")
            onnx_file = Path(self._folder.name) / "model.onnx"
        path = Path(onnx_file)
        if not path.exists():
            export_onnx(model, example, path)
        options = onnxruntime.SessionOptions()
        settings = session_settings(self.config)
        options.graph_optimization_level = getattr(
            onnxruntime.GraphOptimizationLevel, settings["graph_optimization_level"]
        )
        if settings["intra_op_num_threads"]:
            options.intra_op_num_threads = settings["intra_op_num_threads"]
        providers = settings["providers"]
        if self.device.type == "cuda":  # the trial's GPU, not ONNX Runtime's first
            providers = [p if p == CPU_PROVIDER else (p, {"device_id": self.device.index or 0}) for p in providers]
        session = onnxruntime.InferenceSession(str(path), options, providers=providers)
        # a provider that cannot start (a library missing, another CUDA) is passed over for the
        # next one, with a warning only: the config would be timed on what it does not name
        started, wanted = session.get_providers(), settings["providers"][0]
        if started[0] != wanted:
            raise Unsupported(
                f"runtime={self.runtime}: ONNX Runtime could not start its {wanted} here "
                f"(the session would run on {started[0]})"
            )
        return session, [i.name for i in session.get_inputs()]


def export_onnx(model: torch.nn.Module, example: Any, path: Path) -> list[str]:
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

    def forward(self, *inputs: Any) -> torch.Tensor:
        positional = len(inputs) - len(self.keywords)
        kwargs = dict(zip(self.keywords, inputs[positional:], strict=True))
        return primary_output(self.model(*inputs[:positional], **kwargs))


CPU_PROVIDER = "CPUExecutionProvider"
ORT_FALLBACKS = {"TensorrtExecutionProvider": ("CUDAExecutionProvider",)}
"""Where ONNX Runtime sends the operators a provider lacks, before the CPU: TensorRT's go to CUDA."""


def session_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The ONNX Runtime session an ONNX config runs in: its providers (the config's, then the
    fallbacks ONNX Runtime takes for what a GPU provider lacks: CUDA for TensorRT, then the CPU),
    intra-op threads (0: ONNX Runtime's default) and graph optimisation level."""
    provider = ORT_PROVIDERS[config["runtime"]]
    providers = list(dict.fromkeys([provider, *ORT_FALLBACKS.get(provider, ()), CPU_PROVIDER]))
    return {
        "providers": providers,
        "intra_op_num_threads": int(config["threads"]),
        "graph_optimization_level": "ORT_ENABLE_ALL",
    }
