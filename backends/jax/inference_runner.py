"""The JAX backend's inference half, trial-process side: JAX's part of the inference trial
(`autotuner.trials.serving`), exposed as the runner module's `TRIAL_BACKEND`, beside the process part
every role shares (`autotuner.backends.jax.process.JaxProcess`). The config is
applied by `autotuner.backends.jax.serving.TunedInference`, the object users serve with.

Imported by the fork server before any trial: importing jax initialises no device (JAX is set up
for the trial's device before anything starts it, as for training: `JaxTrial.configure_process`).
"""

from __future__ import annotations

from collections.abc import Iterator

import jax
import numpy as np

from autotuner.backends.jax.inference import JAX_INFERENCE
from autotuner.backends.jax.process import JaxProcess
from autotuner.backends.jax.serving import (
    JaxInferenceWorkload,
    TunedInference,
    as_inference_workload,
    primary_output,
    split_batch,
)
from autotuner.backends.jax.workload import collate
from autotuner.config.knobs import BATCH_SIZE, Config
from autotuner.trials.serving import ServingBackend, compare_outputs
from autotuner.trials.trial_output import OutputDrift


class JaxServing(JaxProcess, ServingBackend[jax.Device, JaxInferenceWorkload, TunedInference, np.ndarray]):
    """JAX's part of an inference trial (`autotuner.trials.serving.ServingBackend`)."""

    def as_workload(self, built: object, ref: str) -> JaxInferenceWorkload:
        return as_inference_workload(built, ref)

    def first_batch_problem(self, workload: JaxInferenceWorkload, count: int) -> str | None:
        try:
            inputs, _ = split_batch(collate(workload.dataset, np.arange(count)))
        except Exception as exc:
            return f"the dataset's first {count} items cannot be read and stacked: {type(exc).__name__}: {exc}"
        try:
            primary_output(workload.apply_fn(jax.tree.map(jax.numpy.asarray, workload.params), inputs))
        except Exception as exc:
            return f"apply_fn fails on the first batch: {type(exc).__name__}: {exc}"
        return None

    def heldout_items(self, workload: JaxInferenceWorkload, count: int) -> list[object]:
        if workload.heldout is not None:
            return [workload.heldout[i] for i in range(count)]
        size = len(workload.dataset)
        return [workload.dataset[i] for i in range(size - count, size)]

    def _outputs(self, serving: TunedInference, items: list[object]) -> np.ndarray:
        size = serving.batch_size
        outputs = [
            np.asarray(
                primary_output(serving(split_batch(collate(items, np.arange(k, min(k + size, len(items)))))[0])),
                np.float64,
            )
            for k in range(0, len(items), size)
        ]
        return np.concatenate(outputs)

    def reference_outputs(
        self, workload: JaxInferenceWorkload, items: list[object], batch: int, device: jax.Device
    ) -> np.ndarray:
        strict = {name: knob.reference for name, knob in JAX_INFERENCE.knobs.items()}
        config = {**strict, **JAX_INFERENCE.reference_overrides(), BATCH_SIZE.name: batch}
        return self._outputs(TunedInference(config, workload.apply_fn, device, params=workload.params), items)

    def serving(
        self,
        workload: JaxInferenceWorkload,
        config: Config,
        device: jax.Device,
        example: list[object],
        graph_file: str | None,
    ) -> TunedInference:
        return TunedInference(config, workload.apply_fn, device, params=workload.params)

    def batches(self, workload: JaxInferenceWorkload, serving: TunedInference, seed: int) -> Iterator[object]:
        loader = serving.make_loader(workload.dataset, shuffle=True, seed=seed)
        while True:
            yielded = False
            for batch in loader:
                yielded = True
                yield split_batch(batch)[0]
            if not yielded:
                raise ValueError("the data loader yields no batch: the dataset holds fewer items than one batch")

    def serve(self, serving: TunedInference, batch: object) -> object:
        return serving.synchronize(serving(batch))

    def served_outputs(
        self, workload: JaxInferenceWorkload, serving: TunedInference, items: list[object]
    ) -> np.ndarray:
        return self._outputs(serving, items)

    def output_drift(
        self, workload: JaxInferenceWorkload, outputs: np.ndarray, reference: np.ndarray, items: list[object]
    ) -> OutputDrift:
        error = float(workload.drift_fn(outputs, reference)) if workload.drift_fn is not None else None
        _, labels = split_batch(collate(items, np.arange(len(items))))
        return compare_outputs(outputs, reference, None if labels is None else np.asarray(labels), error)


TRIAL_BACKEND = JaxServing()
