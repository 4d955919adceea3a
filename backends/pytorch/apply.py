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

import collections
import contextlib
import dataclasses
import functools
import inspect
import multiprocessing
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from autotuner.backends._base import ExportedConfig, TunedLoop
from autotuner.backends.pytorch import COMPILE, PREFETCH_FACTOR, PYTORCH
from autotuner.trials.outcomes import Unsupported
from autotuner.trials.streams import is_stream

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
COMPILE_MODES = {"default": None, "reduce-overhead": "reduce-overhead", "max-autotune": "max-autotune"}
CUDA_GRAPH_MODES = frozenset({"reduce-overhead", "max-autotune"})
"""Compile modes that capture CUDA graphs on a GPU (inductor's `triton.cudagraphs`)."""
SDPA_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}
NO_KERNEL = "No available kernel"
"""What scaled_dot_product_attention raises when none of the backends allowed can take its inputs."""
OPTIMIZER_FLAGS = ("foreach", "fused")
CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)


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


def rebuilt_optimizer(optimizer: torch.optim.Optimizer, choice: str) -> torch.optim.Optimizer:
    """`optimizer` for the `optimizer` knob: itself for `as-given`; for `foreach` or `fused`, a new
    optimizer of its class over its parameter groups with the same hyperparameters and that flag on
    (the other off). Only an optimizer that has not stepped yet is rebuilt: its state would be lost.
    `Unsupported` when its class takes no such flag."""
    if choice == "as-given":
        return optimizer
    kind = type(optimizer)
    accepted = inspect.signature(kind.__init__).parameters
    if choice not in accepted:
        raise Unsupported(f"optimizer={choice}: {kind.__name__} takes no {choice} argument")
    if optimizer.state:
        raise ValueError(
            f"optimizer={choice} rebuilds the optimizer: pass one that has not stepped yet "
            "(then load its state into TunedTraining.optimizer)"
        )
    groups = [{k: v for k, v in group.items() if k not in OPTIMIZER_FLAGS} for group in optimizer.param_groups]
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted and k not in OPTIMIZER_FLAGS}
    flags: dict[str, Any] = {flag: flag == choice for flag in OPTIMIZER_FLAGS if flag in accepted}
    try:
        return kind(groups, **defaults, **flags)
    except (RuntimeError, ValueError) as exc:  # e.g. fused kernels for this device or dtype do not exist
        raise Unsupported(f"optimizer={choice}: {kind.__name__} refused it: {exc}") from None


def repeated_blocks(model: torch.nn.Module) -> tuple[type[torch.nn.Module], ...]:
    """The largest module type `model` holds at least twice, containers and layers without
    submodules aside (a transformer's blocks, a ResNet's residual blocks); empty when there is none."""
    counts = collections.Counter(type(m) for m in model.modules())
    first: dict[type[torch.nn.Module], torch.nn.Module] = {}
    for module in model.modules():
        first.setdefault(type(module), module)
    candidates = [
        kind
        for kind, count in counts.items()
        if count >= 2 and not issubclass(kind, CONTAINERS) and any(True for _ in first[kind].children())
    ]
    if not candidates:
        return ()
    return (max(candidates, key=lambda kind: sum(p.numel() for p in first[kind].parameters())),)


def is_hugging_face(model: torch.nn.Module) -> bool:
    """A transformers `PreTrainedModel`: it checkpoints and chooses its attention itself."""
    return callable(getattr(model, "gradient_checkpointing_enable", None)) and callable(
        getattr(model, "set_attn_implementation", None)
    )


def _checkpointed(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)


def enable_checkpointing(model: torch.nn.Module, blocks: Sequence[type[torch.nn.Module]] | None = None) -> None:
    """Activation checkpointing of `model`'s blocks: instances of `blocks`, or where None, a Hugging
    Face model's own gradient checkpointing, or else the largest module type it repeats
    (`repeated_blocks`). Each block's forward keeps only its inputs and recomputes the rest in the
    backward (non-reentrant `torch.utils.checkpoint`). Applying it twice changes nothing.
    `Unsupported` when the model has no such blocks."""
    if not blocks and is_hugging_face(model) and getattr(model, "supports_gradient_checkpointing", False):
        # transformers 5 renamed it activation checkpointing (the old names warn)
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            if not model.is_activation_checkpointing:
                model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)  # type: ignore[operator]
        elif not model.is_gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # type: ignore[operator]
        return
    kinds = tuple(blocks or ()) or repeated_blocks(model)
    if not kinds:
        raise Unsupported("checkpointing=blocks: the model repeats no block (name them: checkpoint_blocks)")
    for module in model.modules():
        if isinstance(module, kinds) and not getattr(module, "_autotuner_checkpointed", False):
            module.forward = functools.partial(_checkpointed, module.forward)  # type: ignore[method-assign]
            module._autotuner_checkpointed = True  # type: ignore[assignment]


@contextlib.contextmanager
def without_checkpointing(model: torch.nn.Module) -> Iterator[None]:
    """`model` without the activation checkpointing `enable_checkpointing` gave it, put back after:
    its blocks run their own forward and keep what the backward needs (the model FLOPs are counted
    so, without the backward's recomputed forwards)."""
    blocks: list[tuple[torch.nn.Module, functools.partial[Any]]] = [
        (m, m.forward)
        for m in model.modules()
        if isinstance(m.forward, functools.partial) and m.forward.func is _checkpointed
    ]
    # transformers 5 renamed it activation checkpointing; reading the old name warns
    renamed = hasattr(model, "activation_checkpointing_enable")
    flag = "is_activation_checkpointing" if renamed else "is_gradient_checkpointing"
    hugging_face = is_hugging_face(model) and bool(getattr(model, flag, False))
    try:
        for module, checkpointed in blocks:
            module.forward = checkpointed.args[0]  # type: ignore[method-assign]
        if hugging_face:
            disable: Any = getattr(model, "activation_checkpointing_disable", None)
            (disable or model.gradient_checkpointing_disable)()  # type: ignore[operator]
        yield
    finally:
        for module, checkpointed in blocks:
            module.forward = checkpointed  # type: ignore[method-assign]
        if hugging_face:
            enable_checkpointing(model)


def choose_attention(model: torch.nn.Module, attention: str) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    """The context the forward runs in for the `attention` knob: `sdpa_kernel` with that one backend,
    or nothing for `default` and `eager`. A Hugging Face model is switched to its `sdpa`
    implementation for a backend, to `eager` for eager; eager on any other model is `Unsupported`."""
    if attention == "eager" or (attention in SDPA_BACKENDS and is_hugging_face(model)):
        if not is_hugging_face(model):
            raise Unsupported("attention=eager: only Hugging Face models choose their attention implementation")
        try:
            model.set_attn_implementation("eager" if attention == "eager" else "sdpa")  # type: ignore[operator]
        except (ValueError, ImportError) as exc:
            raise Unsupported(f"attention={attention}: {exc}") from None
    if attention in SDPA_BACKENDS:
        return functools.partial(sdpa_kernel, [SDPA_BACKENDS[attention]])
    return contextlib.nullcontext


def allocate_grads(optimizer: torch.optim.Optimizer) -> None:
    """Give every parameter of `optimizer` that has none a zero `.grad`, so that backward adds into
    it in place instead of installing its own output tensor there."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.requires_grad and param.grad is None:
                param.grad = torch.zeros_like(param)


def to_device(value: Any, device: torch.device, *, non_blocking: bool = False, channels_last: bool = False) -> Any:
    """`value` with every tensor in it on `device` (see `TunedTraining.to_device`); with
    `channels_last`, its 4-D floating-point tensors (images) in that layout."""
    if isinstance(value, torch.Tensor):
        if channels_last and value.dim() == 4 and value.is_floating_point():
            return value.to(device, non_blocking=non_blocking, memory_format=torch.channels_last)
        return value.to(device, non_blocking=non_blocking)
    move = functools.partial(to_device, device=device, non_blocking=non_blocking, channels_last=channels_last)
    if isinstance(value, Mapping):
        moved = {k: move(v) for k, v in value.items()}
        return moved if type(value) is dict else _rebuilt(value, moved)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(move(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(move(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: move(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **changes)
    return value


def _rebuilt(mapping: Mapping[Any, Any], items: dict[Any, Any]) -> Any:
    """A mapping of `mapping`'s type holding `items` (an OrderedDict, a Hugging Face `BatchEncoding`),
    or a plain dict where that type cannot be built from a dict."""
    try:
        return type(mapping)(items)  # type: ignore[call-arg]
    except TypeError:
        return items


PARALLEL = ("ddp", "fsdp")
DTYPES = {"fp32": None, "bf16": torch.bfloat16}
"""FSDP2's MixedPrecisionPolicy dtypes by knob value (None: the parameters' own, fp32)."""
POWERSGD_START = 2
"""PowerSGD compresses from this optimizer step on (the earliest it allows with error feedback):
a config is measured, and its drift judged, as it trains, not over vanilla all-reduces that
PowerSGD's default of 1,000 steps would run first."""
_SETTLED: list[Any] = []
"""The barriers `TunedTraining.finish` waited on, on a CPU (gloo), kept until the interpreter exits:
each is freed, with the collectives it still watches, on the main thread (see `finish`)."""


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The module `torch.compile` wrapped, or `model` itself."""
    from torch._dynamo.eval_frame import OptimizedModule

    return model._orig_mod if isinstance(model, OptimizedModule) else model  # type: ignore[return-value]


def loader_workers(workers: int) -> dict[str, Any]:
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


def _users_module(model: torch.nn.Module) -> torch.nn.Module:
    """The module DistributedDataParallel wraps, or `model` itself (FSDP2 shards a module in place)."""
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def distributed_data_parallel(model: torch.nn.Module, config: Mapping[str, Any], device: torch.device) -> Any:
    """`model` wrapped in DistributedDataParallel with the config's bucket size, bucket views,
    static graph and communication hook (fp16 or bf16 compression: torch's default hooks;
    PowerSGD: rank 1, error feedback and warm start, from step `POWERSGD_START`)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=int(config["bucket_cap_mb"]),
        gradient_as_bucket_view=bool(config["bucket_view"]),
        static_graph=bool(config["static_graph"]),
    )
    hook = config["comm_hook"]
    if hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=POWERSGD_START)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return ddp


def fully_sharded(
    model: torch.nn.Module,
    config: Mapping[str, Any],
    device: torch.device,
    blocks: Sequence[type[torch.nn.Module]] | None,
) -> torch.nn.Module:
    """`model` sharded in place with FSDP2's `fully_shard` over every rank of the process group:
    each of its blocks (`blocks`, else a Hugging Face model's or the largest module type it repeats:
    `repeated_blocks`) on its own, then the root, with the config's resharding, mixed-precision
    policy and offload."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    shard = functools.partial(
        fully_shard,
        mesh=mesh,
        reshard_after_forward=bool(config["reshard_after_forward"]),
        mp_policy=MixedPrecisionPolicy(
            param_dtype=DTYPES[config["param_dtype"]], reduce_dtype=DTYPES[config["reduce_dtype"]]
        ),
        offload_policy=CPUOffloadPolicy() if config["offload"] == "cpu" else OffloadPolicy(),
    )
    kinds = tuple(blocks or ()) or repeated_blocks(model)
    for module in list(model.modules()):
        if kinds and isinstance(module, kinds) and module is not model:
            shard(module)
    shard(model)
    return model


def over_parameters(optimizer: torch.optim.Optimizer, names: Mapping[int, str], model: torch.nn.Module) -> Any:
    """`optimizer` over `model`'s parameters as they are now (FSDP2 replaces each parameter with its
    shard): a new optimizer of its class, with its groups and hyperparameters, each parameter
    found again by its name (`names`: the old parameters' ids -> their names). Itself when it holds
    the model's parameters already."""
    current = dict(model.named_parameters())
    if all(id(p) in {id(q) for q in current.values()} for g in optimizer.param_groups for p in g["params"]):
        return optimizer
    if optimizer.state:
        raise ValueError("parallel=fsdp shards the parameters: pass an optimizer that has not stepped yet")
    groups = [{**group, "params": [current[names[id(p)]] for p in group["params"]]} for group in optimizer.param_groups]
    accepted = inspect.signature(type(optimizer).__init__).parameters
    return type(optimizer)(groups, **{k: v for k, v in optimizer.defaults.items() if k in accepted})


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
        config: ExportedConfig | Mapping[str, Any],
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        dataset: torch.utils.data.Dataset[Any] | None = None,
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
        torch.backends.cudnn.benchmark = bool(self.config["cudnn_benchmark"])
        self._channels_last = self.config["memory_format"] == "channels_last"
        model = model.to(self.device)
        if self._channels_last:
            model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        wrapped = _unwrapped(model)  # DDP's wrapper where the model was tuned before (the runner's drift phase)
        self.module = _users_module(wrapped)
        """The user's model, under its parallel wrapper (DDP) and its compiled wrapper."""
        if self.config["checkpointing"] == "blocks":
            enable_checkpointing(self.module, checkpoint_blocks)
        self._attention = choose_attention(self.module, self.config["attention"])
        self._ddp: Any = None
        self._fsdp: Any = None
        if self.parallel == "ddp":
            if wrapped is not self.module:  # already wrapped
                self._ddp = wrapped
            else:
                self._ddp = model = distributed_data_parallel(model, self.config, self.device)
        elif self.parallel == "fsdp":
            from torch.distributed.fsdp import FSDPModule

            if not isinstance(self.module, FSDPModule):
                names = {id(p): name for name, p in model.named_parameters()}
                fully_sharded(model, self.config, self.device, checkpoint_blocks)
                optimizer = over_parameters(optimizer, names, model)
            self._fsdp = self.module
        self.model = _compiled(model, self.config[COMPILE.name])
        self.optimizer = rebuilt_optimizer(optimizer, self.config["optimizer"])
        optimizer = self.optimizer
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")
        self.skipped_steps = 0
        """Optimizer steps the GradScaler skipped because fp16 gradients overflowed (fp16 only)."""
        self._scale = self.scaler.get_scale() if self.scaler.is_enabled() else 1.0
        cuda_graphs = uses_cuda_graphs(self.config[COMPILE.name], self.device)
        self._mark_step: Callable[[], None] = torch.compiler.cudagraph_mark_step_begin if cuda_graphs else lambda: None
        self._keep_grads = cuda_graphs and self.accumulation > 1
        if self._keep_grads:
            allocate_grads(optimizer)
        dtype = AUTOCAST_DTYPES.get(self.precision)
        self._autocast: Callable[[], contextlib.AbstractContextManager[Any]] = (
            functools.partial(torch.autocast, self.device.type, dtype=dtype) if dtype else contextlib.nullcontext
        )
        self._pin_memory = bool(self.config["pin_memory"]) and self.device.type == "cuda"
        self._non_blocking = self._pin_memory
        self._micro_steps = 0
        self.collate_fn = collate_fn
        """What batches a list of items in `make_loader` (the workload's); None: torch's default."""
        self.loader = self.make_loader(dataset) if dataset is not None else None

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
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
        attention = self.config["attention"]
        try:
            with self._autocast(), self._attention():
                yield
        except RuntimeError as exc:
            # sdpa_kernel leaves one backend, and it refuses what it cannot compute (dropout on a
            # CPU's flash kernel, a head size or a mask it lacks) with this text
            if attention not in SDPA_BACKENDS or NO_KERNEL not in f"{exc} {exc.__cause__}":
                raise
            raise Unsupported(f"attention={attention}: its kernel cannot compute this model's attention here") from exc

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

    def to_device(self, value: Any) -> Any:
        """A batch on the device: its tensors moved, in dicts (any mapping), lists, tuples, namedtuples
        and dataclasses nested to any depth, each rebuilt as its own type; anything else is left as
        it is; 4-D floating-point tensors (images) in the channels_last layout where the config
        says so. Non-blocking from the pinned memory of a CUDA loader."""
        return to_device(value, self.device, non_blocking=self._non_blocking, channels_last=self._channels_last)

    def make_loader(
        self, dataset: torch.utils.data.Dataset[Any], *, shuffle: bool = True, seed: int | None = None
    ) -> torch.utils.data.DataLoader[Any]:
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
        sampler: torch.utils.data.DistributedSampler[Any] | None = None
        if is_stream(dataset):
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
            prefetch_factor=int(self.config[PREFETCH_FACTOR.name]) if workers > 0 else None,
            **loader_workers(workers),
            generator=torch.Generator().manual_seed(seed) if seed is not None and sampler is None else None,
        )

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step: micro-batch x accumulation x ranks."""
        return self.batch_size * self.accumulation * self.world_size
