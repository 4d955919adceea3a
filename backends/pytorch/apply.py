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
GradScaler enabled only for fp16); what every other knob does is its family's `apply`
(`autotuner.backends.pytorch.knobs`), called once, in `APPLY`'s order, on the run as it is
built; the step itself has no branches on the config. Importing this
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
import functools
import multiprocessing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypedDict

import torch

from autotuner.backends._base import ExportedConfig, TunedLoop
from autotuner.backends.pytorch import PREFETCH_FACTOR, PYTORCH
from autotuner.backends.pytorch.device import B, resolve_device, set_matmul_precision, strict_fp32, to_device
from autotuner.backends.pytorch.knobs import APPLY
from autotuner.backends.pytorch.knobs._family import Build
from autotuner.backends.pytorch.knobs.attention import SDPA_BACKENDS, choose_attention
from autotuner.backends.pytorch.knobs.checkpointing import enable_checkpointing, without_checkpointing
from autotuner.backends.pytorch.knobs.compile import MODES as COMPILE_MODES
from autotuner.backends.pytorch.knobs.compile import uses_cuda_graphs
from autotuner.backends.pytorch.knobs.ddp import POWERSGD_START, distributed_data_parallel
from autotuner.backends.pytorch.knobs.float8 import float8_training
from autotuner.backends.pytorch.knobs.fsdp import PARAM_DTYPE, fully_sharded, hybrid_shape, over_parameters
from autotuner.backends.pytorch.knobs.fsdp import dtype as mixed_precision_dtype
from autotuner.backends.pytorch.knobs.optimizer import rebuilt_optimizer
from autotuner.backends.pytorch.modules import is_hugging_face, repeated_blocks, uncompiled, users_module
from autotuner.trials.streams import is_stream

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def allocate_grads(optimizer: torch.optim.Optimizer) -> None:
    """Give every parameter of `optimizer` that has none a zero `.grad`, so that backward adds into
    it in place instead of installing its own output tensor there."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.requires_grad and param.grad is None:
                param.grad = torch.zeros_like(param)


PARALLEL = ("ddp", "fsdp")
DTYPES = {choice: mixed_precision_dtype(choice) for choice in PARAM_DTYPE.choices or ()}
"""FSDP2's MixedPrecisionPolicy dtypes by knob value (None: the parameters' own, fp32)."""
_SETTLED: list[object] = []
"""The barriers `TunedTraining.finish` waited on, on a CPU (gloo), kept until the interpreter exits:
each is freed, with the collectives it still watches, on the main thread (see `finish`)."""


class LoaderWorkers(TypedDict):
    """`loader_workers`' DataLoader arguments."""

    num_workers: int
    persistent_workers: bool
    multiprocessing_context: str | None


def loader_workers(workers: int) -> LoaderWorkers:
    """DataLoader arguments for `workers` worker processes that live as long as the loader (a
    timed window that spans the end of the dataset does not start them again), forked where the
    platform can (they start in milliseconds; a trial process comes from a fork server, whose
    default would start a second fork server and import torch again)."""
    fork = workers > 0 and "fork" in multiprocessing.get_all_start_methods()
    return {
        "num_workers": workers,
        "persistent_workers": workers > 0,
        "multiprocessing_context": "fork" if fork else None,
    }


def load_full_state(module: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Load a full state dict (every tensor whole, as `module.state_dict()` gave it before any
    sharding) into `module`, sharded by FSDP2 or not."""
    from torch.distributed.tensor import DTensor

    if any(isinstance(p, DTensor) for p in module.parameters()):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(module, dict(state), options=StateDictOptions(full_state_dict=True))
    else:
        module.load_state_dict(state)


class TunedTraining(TunedLoop):
    """One tuned config applied to a model, its optimizer and (optionally) its dataset.

    The constructor moves `model` to `device` (default: cuda:0 if there is a GPU, else the CPU),
    sets the process-wide flags (TF32 on for `tf32`, strict fp32 otherwise; cuDNN's benchmark
    mode), converts the model to `channels_last` for that memory format, turns on activation
    checkpointing of its blocks (`enable_checkpointing`; `checkpoint_blocks` names their types),
    picks its attention (`choose_attention`), and compiles it with the config's mode (`model` is
    then the `torch.compile` wrapper, sharing the parameters of the module passed in; a module
    `torch.compile` already wrapped is kept as it is). For `optimizer: foreach` or `fused`,
    `optimizer` is rebuilt with that flag (`rebuilt_optimizer`): build schedulers over
    `tuned.optimizer`, not over the one passed in. `collate_fn` batches the items of every loader
    `make_loader` builds (None: torch's default). Under CUDA graphs with accumulation, the
    optimizer's parameters get their `.grad` allocated here and kept (see the module docstring).
    `config` is a `TunedConfig` from `autotuner.apply.load_config`, or a plain mapping of knob
    values; a knob it lacks (a config exported before the knob existed) takes its reference value.
    A knob value this model or optimizer cannot take raises `autotuner.trials.outcomes.Unsupported`.

    Build the optimizer over the model's parameters before or after: moving a module keeps its
    parameter objects. With `dataset`, `loader` is its DataLoader (see `make_loader`). As a rank of
    several (`parallel`), call `finish()` after the last step, before
    `torch.distributed.destroy_process_group()`.
    """

    def __init__(
        self,
        config: ExportedConfig | Mapping[str, object],
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        dataset: torch.utils.data.Dataset[object] | None = None,
        device: str | torch.device | None = None,
        *,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        checkpoint_blocks: Sequence[type[torch.nn.Module]] | None = None,
        parallel: str | None = None,
    ):
        super().__init__(PYTORCH, config)
        self.parallel: str | None = parallel or getattr(config, "parallel", None)
        """`ddp` or `fsdp`: this process is one rank of several; None: one process."""
        if self.parallel is not None and self.parallel not in PARALLEL:
            raise ValueError(f"parallel={self.parallel!r}: choose between {', '.join(PARALLEL)}")
        if self.parallel is not None and not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            raise ValueError(
                f"parallel={self.parallel} trains across processes: start them with torchrun and call "
                "torch.distributed.init_process_group() before TunedTraining"
            )
        self.world_size = torch.distributed.get_world_size() if self.parallel else 1
        self.rank = torch.distributed.get_rank() if self.parallel else 0
        self.params = self.config
        """The knob values (its name before `config`, kept for loops that read it)."""
        self.device = resolve_device(device)
        set_matmul_precision(self.precision)
        model = model.to(self.device)
        wrapped = uncompiled(model)  # DDP's wrapper where the model was tuned before (the runner's drift phase)
        build = Build(
            self.config,
            self.device,
            model,
            wrapped,
            users_module(wrapped),
            optimizer,
            self.accumulation,
            self.parallel,
            checkpoint_blocks,
        )
        for family in APPLY:
            family.apply(build)
        self.model, self.optimizer = build.model, build.optimizer
        self.module = build.module
        """The user's model, under its parallel wrapper (DDP) and its compiled wrapper."""
        self._attention = build.attention
        self._ddp, self._fsdp = build.ddp, build.fsdp
        self._channels_last = build.channels_last
        self._mark_step = build.mark_step
        self._keep_grads = build.keep_grads
        self._after_step = build.after_step
        if self._keep_grads:
            allocate_grads(self.optimizer)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")
        self.skipped_steps = 0
        """Optimizer steps the GradScaler skipped because fp16 gradients overflowed (fp16 only)."""
        self._scale = self.scaler.get_scale() if self.scaler.is_enabled() else 1.0
        dtype = AUTOCAST_DTYPES.get(self.precision)
        self._autocast: Callable[[], contextlib.AbstractContextManager[None]] = (
            functools.partial(torch.autocast, self.device.type, dtype=dtype) if dtype else contextlib.nullcontext
        )
        self._pin_memory = self._non_blocking = build.pin_memory
        self._micro_steps = 0
        self.collate_fn = collate_fn
        """What batches a list of items in `make_loader` (the workload's); None: torch's default."""
        self.loader = self.make_loader(dataset) if dataset is not None else None

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """The context for the forward pass and the loss: autocast for bf16/fp16, nothing otherwise.
        With an `attention` backend, the forward's scaled-dot-product attention uses that one.
        Under CUDA graphs, calling it also starts a new CUDA-graph step (the previous micro-batch's
        outputs have been used by then)."""
        self._mark_step()
        # Accumulating: only the micro-batch that ends the optimizer step reduces the gradients.
        last = self._micro_steps % self.accumulation == self.accumulation - 1
        if self._ddp is not None:
            self._ddp.require_backward_grad_sync = last  # what DDP.no_sync() sets, read in the forward
        if self._fsdp is not None:
            self._fsdp.set_requires_gradient_sync(last)
        return self._forward_context()

    @contextlib.contextmanager
    def _forward_context(self) -> Iterator[None]:
        with self._autocast(), self._attention():
            yield

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate this micro-batch's gradients: the loss divided by `accumulation` (so the sum over
        the micro-batches is the mean over the global batch), scaled by the GradScaler for fp16.
        Under the `attention` backend too: a checkpointed block's forward, recomputed here, must
        choose the kernel its first run chose (torch's checkpoint restores autocast, not this)."""
        with self._attention():
            self.scaler.scale(loss / self.accumulation).backward()

    def step(self) -> bool:
        """Call after every `backward`. Every `accumulation`-th call steps the optimizer (through the
        GradScaler, which skips the update when fp16 gradients overflowed: counted in
        `skipped_steps`), runs what a knob does after it (float8's precomputed scales), updates the
        scale and zeroes the gradients, and returns True; the other
        calls return False."""
        self._micro_steps += 1
        if self._micro_steps % self.accumulation:
            return False
        self.scaler.step(self.optimizer)
        self._after_step()
        self.scaler.update()
        if self.scaler.is_enabled():  # the scaler's step has synchronized already: reading it is cheap
            scale = self.scaler.get_scale()
            self.skipped_steps += scale < self._scale  # it backs off only when it skipped the step
            self._scale = scale
        self.optimizer.zero_grad(set_to_none=not self._keep_grads)
        return True

    def finish(self) -> None:
        """The end of training, as a rank of several (`parallel`; one process has nothing to end):
        call it once after the last step, in every rank, before
        `torch.distributed.destroy_process_group()`. The ranks wait for each other (a barrier), and
        `model` lets go of DDP's wrapper: from then on it is the module DDP wrapped (FSDP2 shards the
        module itself, which stays as it is).

        It keeps a rank on the CPU from aborting at the interpreter's exit ("terminate called
        without an active exception", SIGABRT). Gloo runs each collective on the process group's
        worker threads, and the worker that drops a finished collective last frees the Python
        objects it holds (its tensors; the `contextvars` context torch's backward pass keeps for
        the collectives it starts; a DDP communication hook's callback), for which it takes the
        GIL. Once the main thread has begun finalizing the interpreter, CPython ends a thread that
        asks for the GIL (`pthread_exit`), and the unwinding through torch's noexcept destructors
        aborts the process (pytorch/pytorch#190489): a race the last step's collectives lose now and then. The workers
        outlive `destroy_process_group()` as long as something holds the group (DDP's wrapper,
        FSDP2's device mesh, which torch's DTensor caches keep too), so:

        - the barrier, on a CPU, is taken with the GIL released: it waits for a worker that is
          freeing a collective, and one still finishing its last collective is watched by the
          barrier's work only weakly, so that it is freed with that work, which `_SETTLED` keeps
          until the interpreter exits: on the main thread, never on a worker;
        - without DDP's wrapper, `destroy_process_group()` frees the group and joins its workers,
          the GIL released, so what a communication hook's callback leaves is freed before then."""
        if self.parallel is None or not torch.distributed.is_initialized():
            return
        if self.device.type == "cuda":  # NCCL: destroy_process_group() shuts its threads down
            torch.distributed.barrier(device_ids=[self.device.index])
        else:
            settled = torch.distributed.barrier(async_op=True)
            settled.wait()
            _SETTLED.append(settled)
        if self._ddp is not None:
            self.model = self._ddp.module
            self._ddp = None

    def to_device(self, value: B) -> B:
        """A batch on the device: its tensors moved, in dicts (any mapping), lists, tuples, namedtuples
        and dataclasses nested to any depth, each rebuilt as its own type; anything else is left as
        it is; 4-D floating-point tensors (images) in the channels_last layout where the config
        says so. Non-blocking from the pinned memory of a CUDA loader."""
        return to_device(value, self.device, non_blocking=self._non_blocking, channels_last=self._channels_last)

    def make_loader(
        self, dataset: torch.utils.data.Dataset[object], *, shuffle: bool = True, seed: int | None = None
    ) -> torch.utils.data.DataLoader[object]:
        """A DataLoader of micro-batches: `workers` worker processes (persistent, started with fork
        where the platform has it, as in the trials), each loading `prefetch_factor` batches
        ahead, pinned memory for a CUDA device where the config pins it, and the last partial
        micro-batch dropped so every optimizer step sees `global_batch` samples, batched by
        `collate_fn`. `seed` fixes the shuffling and the workers' seeds. As a rank of several
        (`parallel`), the loader takes this rank's share of the dataset (`DistributedSampler`:
        every `world_size`-th item from its rank on, of the same order for every config), so the
        ranks' micro-batches of one optimizer step together hold `global_batch` samples. A
        streamed dataset (no length) is read in its order, not shuffled, the rank's share split
        between the workers without duplicates (`autotuner.backends.pytorch.workload.StreamShard`)."""
        workers = self.workers
        sampler: torch.utils.data.DistributedSampler[object] | None = None
        if isinstance(dataset, Iterable) and is_stream(dataset):
            from autotuner.backends.pytorch.workload import Stream

            dataset, shuffle = Stream(dataset).shard(self.rank, self.world_size, self.batch_size), False
            seed = None  # nothing to shuffle
        elif self.world_size > 1:  # this rank's shard of every global batch, the same for every config
            sampler = torch.utils.data.DistributedSampler(
                dataset, self.world_size, self.rank, shuffle=shuffle, seed=seed or 0, drop_last=True
            )
        return torch.utils.data.DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle if sampler is None else False,
            sampler=sampler,
            collate_fn=self.collate_fn,
            drop_last=True,
            pin_memory=self._pin_memory,
            prefetch_factor=int(PREFETCH_FACTOR.of(self.config)) if workers > 0 else None,
            **loader_workers(workers),
            generator=torch.Generator().manual_seed(seed) if seed is not None and sampler is None else None,
        )

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step: micro-batch x accumulation x ranks."""
        return self.batch_size * self.accumulation * self.world_size


__all__ = [
    "COMPILE_MODES",
    "DTYPES",
    "POWERSGD_START",
    "SDPA_BACKENDS",
    "TunedTraining",
    "choose_attention",
    "distributed_data_parallel",
    "enable_checkpointing",
    "float8_training",
    "fully_sharded",
    "hybrid_shape",
    "is_hugging_face",
    "load_full_state",
    "loader_workers",
    "over_parameters",
    "rebuilt_optimizer",
    "repeated_blocks",
    "resolve_device",
    "set_matmul_precision",
    "strict_fp32",
    "to_device",
    "uses_cuda_graphs",
    "without_checkpointing",
]
