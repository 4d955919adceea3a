"""Workloads for the study-level tests: small, and failing in ways a study must absorb."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from backends.pytorch.workload import TorchWorkload


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
