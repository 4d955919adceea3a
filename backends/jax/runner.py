"""The JAX backend's training role, trial-process side: JAX's steps of the one training trial
algorithm (`autotuner.trials.training`), exposed as the runner module's `TRIAL_BACKEND`, beside the
process part every role shares (`autotuner.backends.jax.process.JaxProcess`: the device, XLA's
set-up, the compile cache). Before the process starts JAX, `run` and `profile` put the config's
XLA flag bundle into the process's XLA_FLAGS, which XLA reads when the backend starts
(`autotuner.backends.jax.devices.use_xla_flags`). The config is applied by
`autotuner.backends.jax.apply.TunedTraining`, the object users apply an exported config with in
their own loop: a trial trains through it, so what a study measures is exactly what a user gets.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np

from autotuner.backends.jax import DATA_PARALLEL
from autotuner.backends.jax.apply import STRICT_MATMULS, TunedTraining, model_gradient
from autotuner.backends.jax.devices import use_xla_flags
from autotuner.backends.jax.process import _LOOKUPS, JaxProcess
from autotuner.backends.jax.workload import (
    JaxWorkload,
    MapDataset,
    as_workload,
    collate,
    first_batch_problem,
    remat_scope,
)
from autotuner.config.knobs import Config
from autotuner.measurement.turns import Turns
from autotuner.trials.probe import ProbeResult
from autotuner.trials.request import ProbeRequest, ProfileRequest, TrialRequest
from autotuner.trials.training import TrainingBackend, cache_state
from autotuner.trials.trial_output import ProfileOutput, TrialOutput


class JaxTrial(JaxProcess, TrainingBackend[jax.Device, JaxWorkload, TunedTraining]):
    """JAX's steps of a training trial (`autotuner.trials.training.TrainingBackend`)."""

    device_count: int | None  # JaxProcess's, restated for the type checker, which cannot follow the install's mapping

    def _drives(self, request: TrialRequest) -> None:
        self.device_count = request.processes if request.parallel == DATA_PARALLEL else 1

    def run(self, request: TrialRequest, turns: Turns | None = None) -> TrialOutput:
        use_xla_flags(request.config)  # first: XLA reads XLA_FLAGS when the backend starts, once
        self._drives(request)
        return super().run(request, turns)

    def profile(self, request: ProfileRequest) -> ProfileOutput:
        use_xla_flags(request.trial.config)
        self._drives(request.trial)
        return super().profile(request)

    def probe(self, request: ProbeRequest) -> ProbeResult:
        self.device_count = None if request.parallel == DATA_PARALLEL else 1
        return super().probe(request)

    def compile_lookups(self) -> dict[str, int]:
        return dict(_LOOKUPS)

    def compile_cache(self, before: dict[str, int]) -> str | None:
        """As torch's, but a cache this process found empty is `cold` whatever it found there
        since: JAX looks up again an executable it compiled and cached a moment before (another
        function with the same computation), a hit on this process's own work."""
        state = cache_state(_LOOKUPS["hit"] - before["hit"], _LOOKUPS["miss"] - before["miss"])
        return "cold" if state is not None and _LOOKUPS["found"] == 0 else state

    def as_workload(self, built: object, ref: str) -> JaxWorkload:
        return as_workload(built, ref)

    def workload_capabilities(self, workload: JaxWorkload, device: jax.Device, count: int) -> dict[str, bool]:
        """Whether the loss marks blocks for `remat`: traced (not run) under a remat scope."""
        batch = collate(workload.dataset, np.arange(count))
        with remat_scope("full") as scope:
            jax.make_jaxpr(workload.loss_fn)(workload.params, batch)
        return {"remat_blocks": scope.marked}

    def initial_state(self, workload: JaxWorkload) -> Any:
        return workload.params

    def training(
        self, workload: JaxWorkload, config: Config, device: jax.Device, parallel: str | None = None
    ) -> TunedTraining:
        """With `parallel: data_parallel`, over the trial's `processes` local devices from `device` on."""
        count = (self.device_count or 1) if parallel == DATA_PARALLEL else 1
        training = TunedTraining(
            config, workload.loss_fn, workload.optimizer, device=device, params=workload.params, devices=count
        )
        self.devices = training.devices
        return training

    def restart(self, workload: JaxWorkload, training: TunedTraining, initial: Any) -> TunedTraining:
        training.restart(initial)  # the initial weights, a fresh optimizer; compiled once, not twice
        return training

    def train_step(self, workload: JaxWorkload, training: TunedTraining, batches: Iterator[Any]) -> jax.Array:
        total = jnp.zeros((), jnp.float32)
        for _ in range(training.accumulation):
            batch = training.to_device(next(batches))
            with training.autocast():
                loss, grads = training.model(training.params, batch)
            training.backward(grads)
            total = total + loss
            training.step()
        return total / training.accumulation

    def synchronize(self, training: TunedTraining, pending: object) -> None:
        jax.block_until_ready((training.params, pending))  # the latest parameters depend on every step before them

    def evaluation(self, workload: JaxWorkload, training: TunedTraining) -> contextlib.AbstractContextManager[object]:
        """Eager, fp32 parameters, strict fp32 matmuls."""
        return jax.default_matmul_precision(STRICT_MATMULS)

    def first_batch_problem(self, workload: JaxWorkload, count: int) -> str | None:
        return first_batch_problem(workload, count)

    def batch_loss(self, workload: JaxWorkload, training: TunedTraining, dataset: MapDataset, indices: range) -> float:
        """A chunk of any size, whole on every device with data parallel: each computes what one
        device would, from the same weights."""
        batch = training.to_device(collate(dataset, np.asarray(indices)), whole=True)
        return float(workload.loss_fn(training.params, batch))

    def flops_per_sample(self, workload: JaxWorkload, training: TunedTraining) -> float | None:
        """The model FLOPs of one sample: the matmuls and convolutions (`dot_flops`) of the
        differentiated loss (forward and backward, no optimizer) on one micro-batch (all the
        devices' with data parallel), traced without the config's `remat` (`model_gradient`: the
        forward a checkpoint recomputes is the config's cost, not the model's), without running it."""
        count = min(training.micro_batch, len(workload.dataset))
        split = count % len(training.devices) == 0
        batch = training.to_device(collate(workload.dataset, np.arange(count)), whole=not split)
        with training.autocast():
            traced = jax.make_jaxpr(model_gradient(training))(training.params, batch)
        flops = dot_flops(traced.jaxpr)
        return flops / count if flops > 0 else None


def dot_flops(jaxpr: jax.extend.core.Jaxpr) -> float:
    """The FLOPs of `jaxpr`'s matrix products (`dot_general`) and convolutions
    (`conv_general_dilated`), 2 per multiply-add, those of the jaxprs inside it included: a scan's
    body times its length, a cond's costliest branch, a while loop's body once (its trip count is
    not known). What PyTorch's FLOP counter counts: not the elementwise operations, reductions
    and transcendentals that XLA's cost analysis adds, nor what it fuses away or duplicates."""
    total = 0.0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            (contracting, _), _ = eqn.params["dimension_numbers"]
            lhs = _shape(eqn.invars[0])
            total += 2.0 * math.prod(_shape(eqn.outvars[0])) * math.prod(lhs[d] for d in contracting)
        elif name == "conv_general_dilated":  # each output: a multiply-add per kernel weight of one output feature
            rhs = _shape(eqn.invars[1])
            out_features = rhs[eqn.params["dimension_numbers"].rhs_spec[0]]
            total += 2.0 * math.prod(_shape(eqn.outvars[0])) * math.prod(rhs) / out_features
        inner = [dot_flops(j) for j in _inner_jaxprs(eqn.params)]
        if name == "cond":
            total += max(inner, default=0.0)
        else:
            total += sum(inner) * (eqn.params.get("length", 1) if name == "scan" else 1)
    return total


def _shape(var: Any) -> tuple[int, ...]:
    return tuple(var.aval.shape)


def _inner_jaxprs(params: Mapping[str, object]) -> Iterator[jax.extend.core.Jaxpr]:
    """The jaxprs among an equation's parameters (a call's, a cond's branches, a loop's body)."""
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, jax.extend.core.ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, jax.extend.core.Jaxpr):
                yield item


TRIAL_BACKEND = JaxTrial()
