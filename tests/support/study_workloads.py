"""Workloads for the study-level tests: small, and failing in ways a study must absorb."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from autotuner.backends.pytorch.builtin import mlp
from autotuner.backends.pytorch.workload import TorchWorkload


class _MemoryCeiling(nn.Module):
    """A linear layer that runs out of memory, with the real exception type, from a batch size up."""

    def __init__(self, ceiling: int):
        super().__init__()
        self.ceiling = ceiling
        self.linear = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] >= self.ceiling:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {x.shape[0]} rows (ceiling {self.ceiling})"
            )
        return self.linear(x)


def memory_ceiling(ceiling: int = 32, samples: int = 512) -> TorchWorkload:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(samples, 16, generator=generator)
    labels = torch.randint(4, (samples,), generator=generator)
    return TorchWorkload(
        model=_MemoryCeiling(ceiling),
        dataset=torch.utils.data.TensorDataset(inputs, labels),
        loss_fn=F.cross_entropy,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
    )


# ---------------------------------------------------------------- many workers, kill -9


def _log_process(log: Path) -> int:
    """Append this process's pid to `log` (one short O_APPEND write: concurrent processes never mix
    lines) and return how many processes it holds since: this one's place among them, from 1."""
    with open(log, "a") as file:
        file.write(f"{os.getpid()}\n")
    return len(log.read_text().splitlines())


class _TrainingLog:
    """A forward pre-hook: the first training forward pass (one that computes gradients) of each
    process appends its pid to `folder`/trained (one short O_APPEND write: concurrent processes
    never mix lines), so the file counts the processes that trained (the probe builds a workload
    and computes its loss on two items without gradients, but never trains it). The `hang_at`-th
    of them (from 1) writes `hang-<pid>` and hangs there."""

    def __init__(self, folder: str, hang_at: int | None = None):
        self.folder, self.at, self.pid = Path(folder), hang_at, 0

    def __call__(self, module: nn.Module, args: Any) -> None:
        if self.pid == os.getpid() or not torch.is_grad_enabled():
            return
        self.pid = os.getpid()
        if _log_process(self.folder / "trained") == self.at:
            self.reached()

    def reached(self) -> None:
        """What the `at`-th process to train does, in its first training forward pass."""
        (self.folder / f"hang-{self.pid}").touch()
        time.sleep(3600)


def counted_mlp(folder: str, **mlp_args: Any) -> TorchWorkload:
    """The built-in MLP; every process that trains it is logged in `folder`/trained."""
    workload = mlp(**mlp_args)
    workload.model.register_forward_pre_hook(_TrainingLog(folder))
    return workload


class _StartsOtherWork(_TrainingLog):
    """A forward pre-hook: the `at`-th process to train (counted as `_TrainingLog` counts, in
    `folder`/trained) starts, in its first training forward pass, a CPU-bound process of its own
    session (so not of the trial's process group) that spins for `seconds`; its pid goes to
    `folder`/other-work."""

    def __init__(self, folder: str, at: int, seconds: float):
        super().__init__(folder, at)
        self.seconds = seconds

    def reached(self) -> None:
        spin = f"import time\nend = time.monotonic() + {self.seconds}\nwhile time.monotonic() < end: pass"
        other = subprocess.Popen(  # not on the trial's pipes: the search's caller would wait for it
            [sys.executable, "-c", spin], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        (self.folder / "other-work").write_text(str(other.pid))


def busy_machine(folder: str, at: int, seconds: float, **mlp_args: Any) -> TorchWorkload:
    """The built-in MLP, whose `at`-th training process starts other work beside itself for
    `seconds` (`_StartsOtherWork`): a machine someone else is using."""
    workload = mlp(**mlp_args)
    workload.model.register_forward_pre_hook(_StartsOtherWork(folder, at, seconds))
    return workload


class _PidDataset(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Writes `loader-<parent pid>-<pid>` into `folder` from each data-loader worker that reads it."""

    def __init__(self, folder: str, samples: int):
        generator = torch.Generator().manual_seed(0)
        self.inputs = torch.randn(samples, 16, generator=generator)
        self.labels = torch.randint(4, (samples,), generator=generator)
        self.folder = folder
        self.owner = os.getpid()

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if os.getpid() != self.owner:  # a loader worker
            self.owner = os.getpid()
            (Path(self.folder) / f"loader-{os.getppid()}-{os.getpid()}").touch()
        return self.inputs[index], self.labels[index]


def hang_once(folder: str, hang_at: int, samples: int = 256) -> TorchWorkload:
    """A small linear model whose `hang_at`-th training process (logged as `counted_mlp` logs)
    hangs in its first forward pass, its data-loader workers running (`loader-<pid>-<worker pid>`)."""
    model = nn.Linear(16, 4)
    model.register_forward_pre_hook(_TrainingLog(folder, hang_at))
    return TorchWorkload(
        model=model,
        dataset=_PidDataset(folder, samples),
        loss_fn=F.cross_entropy,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
    )


# ---------------------------------------------------------------- batches as users write them

VOCABULARY = 16


@dataclass
class KeywordOutput:
    """What a Hugging Face model returns, reduced to two fields: the loss when the batch held labels."""

    logits: torch.Tensor
    loss: torch.Tensor | None = None


class KeywordClassifier(nn.Module):
    """A model called with keyword arguments, as Hugging Face models are: token ids, their mask and
    (for training) the labels; its output carries the loss. `source`, a string the batch also
    holds, reaches it untouched."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCABULARY, 8)
        self.head = nn.Linear(8, 3)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor | None = None,
        source: list[str] | None = None,
    ) -> KeywordOutput:
        assert source is not None and all(s == "synthetic" for s in source)
        mask = attention_mask.unsqueeze(-1).to(torch.float32)
        pooled = (self.embedding(input_ids) * mask).sum(1) / mask.sum(1)
        logits = self.head(pooled)
        return KeywordOutput(logits, F.cross_entropy(logits, labels) if labels is not None else None)


class _Sentences(torch.utils.data.Dataset[dict[str, Any]]):
    """Items of 2 to 6 token ids, a label and a string: `{"tokens", "labels", "source"}`."""

    def __init__(self, samples: int, labels: bool):
        generator = torch.Generator().manual_seed(0)
        self.lengths = torch.randint(2, 7, (samples,), generator=generator)
        self.lengths[:2] = torch.tensor([2, 5])  # the first batch is ragged
        self.tokens = torch.randint(1, VOCABULARY, (samples, 6), generator=generator)
        self.labels = torch.randint(3, (samples,), generator=generator) if labels else None

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict[str, Any]:
        item: dict[str, Any] = {"tokens": self.tokens[index, : int(self.lengths[index])], "source": "synthetic"}
        if self.labels is not None:
            item["labels"] = self.labels[index]
        return item


def pad(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The items' tokens padded into `input_ids` and `attention_mask` (the collate function of a
    tokenizer's padding), the rest batched as torch batches it."""
    width = max(len(item["tokens"]) for item in items)
    input_ids = torch.zeros(len(items), width, dtype=torch.long)
    attention_mask = torch.zeros(len(items), width, dtype=torch.long)
    for row, item in enumerate(items):
        input_ids[row, : len(item["tokens"])] = item["tokens"]
        attention_mask[row, : len(item["tokens"])] = 1
    rest = torch.utils.data.default_collate([{k: v for k, v in item.items() if k != "tokens"} for item in items])
    return {"input_ids": input_ids, "attention_mask": attention_mask, **rest}


def keyword_batches(samples: int = 256, padded: bool = True, labels: bool = True) -> TorchWorkload:
    """Dict items padded by the workload's collate function into keyword arguments of a model whose
    output carries the loss: no `loss_fn`. Without `padded` (torch's collate cannot batch the
    ragged items) or without `labels` (no loss), the probe refuses it."""
    return TorchWorkload(
        model=KeywordClassifier(),
        dataset=_Sentences(samples, labels),
        collate_fn=pad if padded else None,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
    )


class Sample(NamedTuple):
    features: torch.Tensor
    label: torch.Tensor
    weight: torch.Tensor


class _Weighted(torch.utils.data.Dataset[Sample]):
    def __init__(self, samples: int):
        generator = torch.Generator().manual_seed(0)
        self.features = torch.randn(samples, 16, generator=generator)
        self.labels = torch.randint(4, (samples,), generator=generator)
        self.weights = torch.rand(samples, generator=generator)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> Sample:
        return Sample(self.features[index], self.labels[index], self.weights[index])


def weighted_loss(model: nn.Module, batch: Sample) -> torch.Tensor:
    """A step the model call and a `loss_fn` cannot express: a per-sample weighted loss."""
    losses = F.cross_entropy(model(batch.features), batch.label, reduction="none")
    return (losses * batch.weight).sum() / batch.weight.sum()


def own_step(samples: int = 256) -> TorchWorkload:
    """Namedtuple items of three fields and the workload's own `train_step`."""
    return TorchWorkload(
        model=nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)),
        dataset=_Weighted(samples),
        train_step=weighted_loss,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
    )


def _slow_under_autocast(module: nn.Module, args: Any) -> None:
    """A forward pre-hook that takes 20 ms more per forward pass under CPU autocast (bf16)."""
    if torch.is_autocast_enabled("cpu"):
        time.sleep(0.02)


def slow_bf16(**mlp_args: Any) -> TorchWorkload:
    """The built-in MLP, many times slower at bf16 than at fp32: a config that cannot win."""
    workload = mlp(**mlp_args)
    workload.model.register_forward_pre_hook(_slow_under_autocast)
    return workload


def _paced(module: nn.Module, args: Any) -> None:
    """A forward pre-hook that takes 4 ms more per forward pass: a step's time is mostly its
    micro-batches' count, whatever the load of the machine."""
    time.sleep(0.004)


def paced_mlp(**mlp_args: Any) -> TorchWorkload:
    """The built-in MLP whose every forward pass takes 4 ms more: its configs are ranked by their
    accumulation (16x4 four times 64x1's time at least), on a busy machine as on a quiet one."""
    workload = mlp(**mlp_args)
    workload.model.register_forward_pre_hook(_paced)
    return workload


class _AttentionBlock(nn.Module):
    """Self-attention with dropout while training, through scaled_dot_product_attention."""

    def __init__(self, dim: int):
        super().__init__()
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.unsqueeze(1) for t in self.qkv(x).chunk(3, dim=-1))
        attended = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1 if self.training else 0.0)
        return x + self.out(attended.squeeze(1))


def dropout_attention(samples: int = 512, dim: int = 16, length: int = 8) -> TorchWorkload:
    """Two attention blocks with dropout over short sequences: a CPU's flash kernel refuses the
    dropout, so `attention: flash` can only be found unsupported by running it."""
    generator = torch.Generator().manual_seed(7)
    inputs = torch.randn(samples + 64, length, dim, generator=generator)
    labels = (inputs.sum(dim=(1, 2)) > 0).long()
    model = nn.Sequential(_AttentionBlock(dim), _AttentionBlock(dim), nn.Flatten(), nn.Linear(length * dim, 2))
    return TorchWorkload(
        model=model,
        dataset=torch.utils.data.TensorDataset(inputs[:samples], labels[:samples]),
        heldout=torch.utils.data.TensorDataset(inputs[samples:], labels[samples:]),
        loss_fn=F.cross_entropy,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
    )


_KEPT: list[Any] = []


def noisy_mlp(**mlp_args: Any) -> TorchWorkload:
    """The built-in MLP, built by a factory that prints, warns as a library does, and keeps a named
    semaphore (as a compile pool does) that its process never releases."""
    import multiprocessing
    import warnings

    print("hello from the factory")
    warnings.warn("a library's deprecation: pass dtype= instead", FutureWarning, stacklevel=1)
    _KEPT.append(multiprocessing.get_context("forkserver").Semaphore())
    return mlp(**mlp_args)


class TokenStream(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """A streamed corpus, as a `datasets` streaming dataset reads one: (inputs, targets) token
    sequences one after another, no length, no indexing; the same sequences each time."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor):
        self.inputs, self.targets = inputs, targets

    def __iter__(self) -> Any:
        for i in range(len(self.inputs)):
            yield self.inputs[i], self.targets[i]


def streamed_gpt(ends_after: int | None = None, **size: Any) -> TorchWorkload:
    """The built-in GPT reading its training sequences from a stream (`ends_after`: the stream
    holds that many), with no held-out set of its own: drift is measured on the stream's first."""
    from autotuner.backends.pytorch.builtin import gpt

    workload = gpt(**size)
    inputs, targets = workload.dataset.tensors  # type: ignore[attr-defined]
    count = len(inputs) if ends_after is None else ends_after
    workload.dataset = TokenStream(inputs[:count], targets[:count])
    workload.heldout = None
    return workload
