"""The PyTorch backend's training role, trial-process side: PyTorch's steps of the one training
trial algorithm (`autotuner.trials.training`), exposed as the runner module's `TRIAL_BACKEND`,
beside the process part every role shares (`autotuner.backends.pytorch.process.TorchProcess`);
what the probe reports of the device is `autotuner.backends.pytorch.probe`.

Imported by the fork server before any trial, so importing it must not initialise CUDA.
The config is applied by `autotuner.backends.pytorch.apply.TunedTraining`, the object users apply an
exported config with in their own loop: a trial trains through it, so what a study measures is
exactly what a user gets.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, cast

import torch

from autotuner.backends.pytorch.apply import TunedTraining, load_full_state, strict_fp32, without_checkpointing
from autotuner.backends.pytorch.nodes import run_nodes
from autotuner.backends.pytorch.probe import workload_capabilities
from autotuner.backends.pytorch.process import TorchProcess
from autotuner.backends.pytorch.ranks import run_ranks
from autotuner.backends.pytorch.workload import TorchWorkload, as_workload, first_batch_problem
from autotuner.config.knobs import Config
from autotuner.measurement.turns import Turns
from autotuner.trials.request import ProfileRequest, TrialRequest
from autotuner.trials.streams import prefix
from autotuner.trials.training import TrainingBackend, cache_state
from autotuner.trials.trial_output import ProfileOutput, TrialOutput

FLOP_COUNT_SAMPLES = 2
"""Samples the FLOP count runs on: FLOPs per sample do not depend on the batch, and a full
micro-batch on top of the measured phase's optimizer state and graph pools may not fit (two, not one:
batch norm cannot train on a single sample)."""


def _host_copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights copied to host memory: the initial weights the drift phase restores, kept
    off the device so they are not in the measured phase's peak memory."""
    return {name: value.detach().to("cpu", copy=True) for name, value in model.state_dict().items()}


def _cache_lookups() -> dict[str, int]:
    """Hits and misses of inductor's FX graph cache and AOTAutograd's cache so far in this process."""
    from torch._dynamo.utils import counters

    return {
        "hit": counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"],
        "miss": counters["inductor"]["fxgraph_cache_miss"] + counters["aot_autograd"]["autograd_cache_miss"],
    }


class PyTorchTrial(TorchProcess, TrainingBackend[torch.device, TorchWorkload, TunedTraining]):
    """PyTorch's steps of a training trial (`autotuner.trials.training.TrainingBackend`)."""

    def as_workload(self, built: object, ref: str) -> TorchWorkload:
        return as_workload(built, ref)

    def first_batch_problem(self, workload: TorchWorkload, count: int) -> str | None:
        return first_batch_problem(workload, count)

    def workload_capabilities(self, workload: TorchWorkload, device: torch.device, count: int) -> dict[str, bool]:
        return workload_capabilities(workload, device, count)

    def initial_state(self, workload: TorchWorkload) -> dict[str, torch.Tensor]:
        return _host_copy(workload.model)

    def compile_lookups(self) -> dict[str, int]:
        return _cache_lookups()

    def compile_cache(self, before: dict[str, int]) -> str | None:
        now = _cache_lookups()
        return cache_state(now["hit"] - before["hit"], now["miss"] - before["miss"])

    def training(
        self, workload: TorchWorkload, config: Config, device: torch.device, parallel: str | None = None
    ) -> TunedTraining:
        workload.model.to(device).train()
        return self._tuned(workload, workload.model, config, device, parallel)

    def restart(
        self, workload: TorchWorkload, training: TunedTraining, initial: Mapping[str, torch.Tensor]
    ) -> TunedTraining:
        load_full_state(workload.model, initial)
        # compiled (and wrapped for its ranks) once, not twice
        return self._tuned(workload, training.model, training.config, training.device, training.parallel)

    @staticmethod
    def _tuned(
        workload: TorchWorkload,
        model: torch.nn.Module,
        config: Mapping[str, object],
        device: torch.device,
        parallel: str | None,
    ) -> TunedTraining:
        """The config applied to `model`, with a fresh optimizer (and so a fresh GradScaler)."""
        optimizer = workload.optimizer(workload.model.parameters())
        return TunedTraining(
            config,
            model,
            optimizer,
            device=device,
            collate_fn=workload.collate_fn,
            checkpoint_blocks=workload.checkpoint_blocks,
            parallel=parallel,
        )

    def train_step(self, workload: TorchWorkload, training: TunedTraining, batches: Iterator[Any]) -> torch.Tensor:
        total = torch.zeros((), device=training.device)
        for _ in range(training.accumulation):
            batch = training.to_device(next(batches))
            with training.autocast():
                loss = workload.loss(training.model, batch)
            training.backward(loss)
            total += loss.detach().float()
            training.step()
        return total / training.accumulation

    def synchronize(self, training: TunedTraining, pending: object) -> None:
        if training.device.type == "cuda":
            torch.cuda.synchronize(training.device)
        if training.world_size > 1:  # a window's edges are every rank's
            torch.distributed.barrier()

    def subset(self, dataset: torch.utils.data.Dataset[object], indices: list[int]) -> torch.utils.data.Subset[object]:
        return torch.utils.data.Subset(dataset, indices)

    @contextlib.contextmanager
    def evaluation(self, workload: TorchWorkload, training: TunedTraining) -> Iterator[None]:
        workload.model.eval()  # the module itself: eager, whatever the config compiled
        try:
            with torch.no_grad(), strict_fp32():
                yield
        finally:
            workload.model.train()

    def batch_loss(
        self,
        workload: TorchWorkload,
        training: TunedTraining,
        dataset: torch.utils.data.Dataset[object],
        indices: range,
    ) -> float:
        batch = training.to_device(workload.collate([dataset[i] for i in indices]))
        return float(workload.loss(workload.model, batch).double())

    def flops_per_sample(self, workload: TorchWorkload, training: TunedTraining) -> float | None:
        """The model FLOPs of one sample: one forward and backward of `FLOP_COUNT_SAMPLES` samples
        under `torch.utils.flop_counter` (matmuls, convolutions, and the CUDA attention kernels: it
        has no formula for the CPU's), eager and without the config's activation checkpointing
        (`without_checkpointing`: the forward a checkpointed block runs again in the backward is
        the config's cost, not the model's, so every config of a model is counted alike); the
        gradients are dropped and no optimizer step is taken (the weights are restored before the
        drift phase anyway). None when nothing was counted."""
        from torch.utils.flop_counter import FlopCounterMode

        items = prefix(workload.dataset, FLOP_COUNT_SAMPLES)
        count = len(items)
        try:
            batch = training.to_device(workload.collate(items))
            with without_checkpointing(workload.model), FlopCounterMode(display=False) as counter:
                workload.loss(workload.model, batch).backward()
        finally:
            workload.model.zero_grad(set_to_none=True)
        flops = counter.get_total_flops()
        return flops / count if flops > 0 else None

    def skipped_steps(self, training: TunedTraining) -> int:
        return training.skipped_steps

    def run(self, request: TrialRequest, turns: Turns | None = None) -> TrialOutput:
        """One trial; with `processes` above 1, as that many ranks (`autotuner.backends.pytorch.ranks`);
        with `nodes` above 1, as this node's ranks of it (`autotuner.backends.pytorch.nodes`: a
        `NodePart` off node 0, whose output nobody reads)."""
        if request.nodes > 1:
            return cast(TrialOutput, run_nodes(self, request, turns))
        if request.processes > 1:
            return run_ranks(self, request, turns)
        return super().run(request, turns)

    def profile(self, request: ProfileRequest) -> ProfileOutput:
        if request.trial.nodes > 1:
            return cast(ProfileOutput, run_nodes(self, request))
        if request.trial.processes > 1:
            return run_ranks(self, request)
        return super().profile(request)


TRIAL_BACKEND = PyTorchTrial()
