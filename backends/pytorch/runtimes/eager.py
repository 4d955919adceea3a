"""PyTorch itself as the runtime (`runtime: pytorch`): torchao's quantization of the model's linear
layers (`quantization`) or their 2:4 sparsity (`sparsity`), the attention backend (`attention`)
and `torch.compile` (`compile`), each call under `torch.inference_mode`, the precision's
autocast (bf16 or fp16; the weights stay fp32, but for 2:4 sparse layers, served in that dtype)
and the attention backend's context.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from autotuner.backends.pytorch.apply import COMPILE_MODES, choose_attention
from autotuner.backends.pytorch.knobs._family import import_torchao
from autotuner.backends.pytorch.knobs.attention import ATTENTION
from autotuner.backends.pytorch.knobs.compile import COMPILE
from autotuner.backends.pytorch.knobs.quantization import QUANTIZATION
from autotuner.backends.pytorch.knobs.sparsity import SPARSE_COLUMNS, SPARSE_ROWS, SPARSITY
from autotuner.backends.pytorch.runtimes._base import AUTOCAST, Runtime, Served, model_inputs


class EagerSession:
    """The model (compiled or not) called under the config's context."""

    def __init__(self, model: Callable[..., object], context: Callable[[], contextlib.AbstractContextManager[None]]):
        self.model, self.context = model, context

    def __call__(self, batch: object) -> object:
        args, kwargs = model_inputs(batch)
        with self.context():
            return self.model(*args, **kwargs)


class PyTorchRuntime(Runtime):
    values = ("pytorch",)

    def capabilities(self, device: torch.device) -> dict[str, bool]:
        """torchao for quantization; fp8 from compute capability 8.9, 2:4 sparse kernels from 8.0."""
        capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else (0, 0)
        return {
            "torchao": importlib.util.find_spec("torchao") is not None,
            "fp8": capability >= (8, 9),
            "sparse24": capability >= (8, 0),
        }

    def session(self, tuned: Served, model: torch.nn.Module, example: object, graph_file: Path | None) -> EagerSession:
        quantize(model, QUANTIZATION.of(tuned.config))
        sparsify(model, SPARSITY.of(tuned.config), AUTOCAST.get(tuned.precision))
        attention = choose_attention(model, ATTENTION.of(tuned.config))
        mode = COMPILE.of(tuned.config)
        compiled = model if mode == "none" else torch.compile(model, mode=COMPILE_MODES[mode])
        dtype = AUTOCAST.get(tuned.precision)

        @contextlib.contextmanager
        def context() -> Iterator[None]:
            autocast = torch.autocast(tuned.device.type, dtype=dtype) if dtype else contextlib.nullcontext()
            with torch.inference_mode(), autocast, attention():
                yield

        return EagerSession(compiled, context)


def quantize(model: torch.nn.Module, quantization: str) -> None:
    """torchao's `quantize_` of the model's linear layers, in place."""
    if quantization == "none":
        return
    import_torchao("torchao")
    from torchao.quantization import (
        Float8DynamicActivationFloat8WeightConfig,
        Int8DynamicActivationInt8WeightConfig,
        Int8WeightOnlyConfig,
        quantize_,
    )

    configs: dict[str, Callable[[], object]] = {
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
    import_torchao("torchao")
    from torchao.sparsity import apply_fake_sparsity

    apply_fake_sparsity(model, filter_fn=sparse_layer)


PYTORCH = PyTorchRuntime()
