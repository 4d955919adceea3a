"""A tuned config applied to a PyTorch training loop: the user's own, and the trials' loop too.

`TunedTraining` is the one implementation of what a config means in PyTorch. The trial runner
(`autotuner.backends.pytorch.runner`) trains through it, so what a study measured is what a user gets:

    from autotuner.apply import load_config
    from autotuner.backends.pytorch.apply import TunedTraining

    tuned = TunedTraining(load_config("runs/quickstart/best.yaml"), model, optimizer, dataset)
    for inputs, target in tuned.loader:
        inputs, target = tuned.to_device((inputs, target))
        with tuned.autocast():
            loss = loss_fn(tuned.model(inputs), target)
        tuned.backward(loss)
        if tuned.step():
            ...  # an optimizer step was taken: schedulers, logging

Batches of dicts, as Hugging Face models take them, go the same way, with the collate function
the study's workload used: `TunedTraining(config, model, optimizer, dataset, collate_fn=collate)`,
then `loss = tuned.model(**tuned.to_device(batch)).loss` under `tuned.autocast()`.

Precision is decided once, in the constructor (TF32 flags, an autocast context or a null one, a
GradScaler enabled only for fp16); the step itself has no branches on the config. Importing this
module does not initialise CUDA (the fork server preloads it with the runner).

`torch.compile` modes that capture CUDA graphs (`reduce-overhead`, `max-autotune` on a GPU)
replay into the same output buffers every time: a gradient that autograd installed as `.grad`
from one micro-batch's replay would be overwritten by the next one's. With accumulation, the
gradients are therefore allocated once and zeroed in place (`zero_grad(set_to_none=False)`), so
each micro-batch's gradients are added into them, and every forward starts a new CUDA-graph step
(`torch.compiler.cudagraph_mark_step_begin`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import multiprocessing
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from autotuner.backends._base import TunedLoop
from autotuner.backends.pytorch import PYTORCH

if TYPE_CHECKING:
    from autotuner.apply import TunedConfig

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
COMPILE_MODES = {"default": None, "reduce-overhead": "reduce-overhead", "max-autotune": "max-autotune"}
CUDA_GRAPH_MODES = frozenset({"reduce-overhead", "max-autotune"})
"""Compile modes that capture CUDA graphs on a GPU (inductor's `triton.cudagraphs`)."""


def resolve_device(spec: str | torch.device | None) -> torch.device:
    """`auto` (or None): cuda:0 if there is a GPU, else the CPU; otherwise a checked cpu/cuda device."""
    spec = "auto" if spec is None else str(spec)
    if spec == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {spec!r}: CUDA is not available here")
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise ValueError(f"device {spec!r}: only {torch.cuda.device_count()} CUDA device(s) visible")
        return torch.device("cuda", index)
    if device.type != "cpu":
        raise ValueError(f"device {spec!r}: the pytorch backend runs on cpu or cuda")
    return device


def set_matmul_precision(precision: str) -> None:
    """TF32 matmuls and convolutions for `tf32`, strict fp32 for every other precision (process-wide)."""
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


@contextlib.contextmanager
def strict_fp32() -> Iterator[None]:
    """Strict fp32 matmuls and convolutions inside (no TF32, whatever the config set), restored after:
    an evaluation that compares weights must not mix in the evaluation's own numerics."""
    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
    )
    set_matmul_precision("fp32")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])


def uses_cuda_graphs(mode: str, device: torch.device) -> bool:
    """Whether `torch.compile` with `mode` captures CUDA graphs on `device`."""
    return device.type == "cuda" and mode in CUDA_GRAPH_MODES


def _compiled(model: torch.nn.Module, mode: str) -> torch.nn.Module:
    if mode == "none":
        return model
    from torch._dynamo.eval_frame import OptimizedModule

    if isinstance(model, OptimizedModule):  # already compiled (the runner's drift phase): compile once
        return model
    compiled: torch.nn.Module = torch.compile(model, mode=COMPILE_MODES[mode])  # type: ignore[assignment]
    return compiled


def allocate_grads(optimizer: torch.optim.Optimizer) -> None:
    """Give every parameter of `optimizer` that has none a zero `.grad`, so that backward adds into
    it in place instead of installing its own output tensor there."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.requires_grad and param.grad is None:
                param.grad = torch.zeros_like(param)


def to_device(value: Any, device: torch.device, *, non_blocking: bool = False) -> Any:
    """`value` with every tensor in it on `device` (see `TunedTraining.to_device`)."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=non_blocking)
    if isinstance(value, Mapping):
        moved = {k: to_device(v, device, non_blocking=non_blocking) for k, v in value.items()}
        return moved if type(value) is dict else _rebuilt(value, moved)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(to_device(v, device, non_blocking=non_blocking) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(to_device(v, device, non_blocking=non_blocking) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {
            f.name: to_device(getattr(value, f.name), device, non_blocking=non_blocking)
            for f in dataclasses.fields(value)
            if f.init
        }
        return dataclasses.replace(value, **changes)
    return value


def _rebuilt(mapping: Mapping[Any, Any], items: dict[Any, Any]) -> Any:
    """A mapping of `mapping`'s type holding `items` (an OrderedDict, a Hugging Face `BatchEncoding`),
    or a plain dict where that type cannot be built from a dict."""
    try:
        return type(mapping)(items)  # type: ignore[call-arg]
    except TypeError:
        return items


class TunedTraining(TunedLoop):
    """One tuned config applied to a model, its optimizer and (optionally) its dataset.

    The constructor moves `model` to `device` (default: cuda:0 if there is a GPU, else the CPU),
    sets the TF32 flags (on for `tf32`, strict fp32 otherwise; process-wide), and compiles the
    model with the config's mode (`model` is then the `torch.compile` wrapper, sharing the
    parameters of the module passed in; a module `torch.compile` already wrapped is kept as it is).
    `collate_fn` batches the items of every loader `make_loader` builds (None: torch's default).
    Under CUDA graphs with accumulation, the optimizer's parameters get their `.grad` allocated
    here and kept (see the module docstring). `config` is a `TunedConfig` from
    `autotuner.apply.load_config`, or a plain mapping of knob values (precision, batch_size,
    accumulation, workers, compile).

    Build the optimizer over the model's parameters before or after: moving a module keeps its
    parameter objects. With `dataset`, `loader` is its DataLoader (see `make_loader`).
    """

    def __init__(
        self,
        config: TunedConfig | Mapping[str, Any],
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        dataset: torch.utils.data.Dataset[Any] | None = None,
        device: str | torch.device | None = None,
        *,
        collate_fn: Callable[[list[Any]], Any] | None = None,
    ):
        super().__init__(PYTORCH, config)
        self.params = self.config
        """The knob values (its name before `config`, kept for loops that read it)."""
        self.device = resolve_device(device)
        set_matmul_precision(self.precision)
        self.model = _compiled(model.to(self.device), self.config["compile"])
        self.optimizer = optimizer
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")
        self.skipped_steps = 0
        """Optimizer steps the GradScaler skipped because fp16 gradients overflowed (fp16 only)."""
        self._scale = self.scaler.get_scale() if self.scaler.is_enabled() else 1.0
        cuda_graphs = uses_cuda_graphs(self.config["compile"], self.device)
        self._mark_step: Callable[[], None] = torch.compiler.cudagraph_mark_step_begin if cuda_graphs else lambda: None
        self._keep_grads = cuda_graphs and self.accumulation > 1
        if self._keep_grads:
            allocate_grads(optimizer)
        dtype = AUTOCAST_DTYPES.get(self.precision)
        self._autocast: Callable[[], contextlib.AbstractContextManager[Any]] = (
            functools.partial(torch.autocast, self.device.type, dtype=dtype) if dtype else contextlib.nullcontext
        )
        self._non_blocking = self.device.type == "cuda"
        self._micro_steps = 0
        self.collate_fn = collate_fn
        """What batches a list of items in `make_loader` (the workload's); None: torch's default."""
        self.loader = self.make_loader(dataset) if dataset is not None else None

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The context for the forward pass and the loss: autocast for bf16/fp16, nothing otherwise.
        Under CUDA graphs, calling it also starts a new CUDA-graph step (the previous micro-batch's
        outputs have been used by then)."""
        self._mark_step()
        return self._autocast()

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate this micro-batch's gradients: the loss divided by `accumulation` (so the sum over
        the micro-batches is the mean over the global batch), scaled by the GradScaler for fp16."""
        self.scaler.scale(loss / self.accumulation).backward()

    def step(self) -> bool:
        """Call after every `backward`. Every `accumulation`-th call steps the optimizer (through the
        GradScaler, which skips the update when fp16 gradients overflowed: counted in
        `skipped_steps`), updates the scale and zeroes the gradients, and returns True; the other
        calls return False."""
        self._micro_steps += 1
        if self._micro_steps % self.accumulation:
            return False
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if self.scaler.is_enabled():  # the scaler's step has synchronized already: reading it is cheap
            scale = self.scaler.get_scale()
            self.skipped_steps += scale < self._scale  # it backs off only when it skipped the step
            self._scale = scale
        self.optimizer.zero_grad(set_to_none=not self._keep_grads)
        return True

    def to_device(self, value: Any) -> Any:
        """A batch on the device: its tensors moved, in dicts (any mapping), lists, tuples, namedtuples
        and dataclasses nested to any depth, each rebuilt as its own type; anything else is left as
        it is. Non-blocking from the pinned memory of a CUDA loader."""
        return to_device(value, self.device, non_blocking=self._non_blocking)

    def make_loader(
        self, dataset: torch.utils.data.Dataset[Any], *, shuffle: bool = True, seed: int | None = None
    ) -> torch.utils.data.DataLoader[Any]:
        """A DataLoader of micro-batches: `workers` worker processes (persistent, started with fork
        where the platform has it, as in the trials), pinned memory on CUDA, and the last partial
        micro-batch dropped so every optimizer step sees `global_batch` samples, batched by
        `collate_fn`. `seed` fixes the shuffling and the workers' seeds."""
        workers = self.workers
        fork = workers > 0 and "fork" in multiprocessing.get_all_start_methods()
        return torch.utils.data.DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            collate_fn=self.collate_fn,
            drop_last=True,
            num_workers=workers,
            pin_memory=self.device.type == "cuda",
            persistent_workers=workers > 0,
            # Linux's usual fork: workers start in milliseconds. (A trial process comes from a fork
            # server, whose default would start a second fork server and re-import torch.)
            multiprocessing_context="fork" if fork else None,
            generator=torch.Generator().manual_seed(seed) if seed is not None else None,
        )
