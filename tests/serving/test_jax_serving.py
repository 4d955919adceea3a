"""Serving a JAX model with an inference config: `TunedInference` (what the JAX inference trials
serve through and users apply), the knobs' unsupported reasons, the workload's checks and the
drift rule. CPU only, real JAX."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("jax")

import jax
import jax.numpy as jnp

from autotuner.backends import get_backend
from autotuner.backends.jax import JaxCapabilities
from autotuner.backends.jax.inference import JAX_INFERENCE
from autotuner.backends.jax.inference_runner import JaxServing
from autotuner.backends.jax.serving import (
    JaxInferenceWorkload,
    TunedInference,
    as_inference_workload,
    primary_output,
    split_batch,
)
from autotuner.backends.jax.workload import ArrayDataset

REFERENCE = {name: knob.reference for name, knob in JAX_INFERENCE.knobs.items()}


def _config(**changes: object) -> dict[str, object]:
    return {**REFERENCE, "batch_size": 8, **changes}


def _params() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [
        {"w": rng.standard_normal((16, 32)).astype(np.float32) / 4, "b": np.zeros(32, np.float32)},
        {"w": rng.standard_normal((32, 5)).astype(np.float32) / 6, "b": np.zeros(5, np.float32)},
    ]


def _apply(params: list[dict[str, jax.Array]], inputs: jax.Array) -> jax.Array:
    hidden = jax.nn.gelu(inputs @ params[0]["w"] + params[0]["b"])
    return hidden @ params[1]["w"] + params[1]["b"]


def _items(count: int) -> ArrayDataset:
    rng = np.random.default_rng(1)
    return ArrayDataset(rng.standard_normal((count, 16)).astype(np.float32), np.arange(count, dtype=np.int32) % 5)


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b.astype(np.float64)))


def test_the_jax_backend_serves_as_well_as_it_trains() -> None:
    assert get_backend("jax", "inference") is JAX_INFERENCE
    assert set(JAX_INFERENCE.knobs) == {"precision", "batch_size", "accumulation", "workers", "jit"}


def test_the_reference_config_is_the_model_itself_and_jit_changes_nothing_in_fp32() -> None:
    inputs = _items(8).arrays[0]
    with jax.default_matmul_precision("float32"):
        expected = np.asarray(_apply(_params(), inputs))
    eager = np.asarray(TunedInference(_config(), _apply, "cpu", params=_params())(inputs))
    jitted = np.asarray(TunedInference(_config(jit="on"), _apply, "cpu", params=_params())(inputs))
    # fp32 through two code paths: equal up to float reassociation (a CPU's kernels may fuse and
    # order the sums differently, so bits are not promised), far inside what any knob moves
    assert _relative(eager, expected) < 1e-6 and _relative(jitted, expected) < 1e-6


def test_bf16_serves_bf16_weights_and_returns_fp32_outputs_within_its_numerics() -> None:
    inputs = _items(8).arrays[0]
    tuned = TunedInference(_config(precision="bf16", jit="on"), _apply, "cpu", params=_params())
    assert all(leaf.dtype == jnp.bfloat16 for leaf in jax.tree.leaves(tuned.params))  # cast once
    outputs = tuned.synchronize(tuned(inputs))
    assert outputs.dtype == jnp.float32
    expected = np.asarray(_apply(_params(), inputs), np.float64)
    assert 0 < _relative(np.asarray(outputs), expected) < 0.05


def test_the_loader_serves_batches_of_the_config_with_its_prefetch_threads() -> None:
    tuned = TunedInference(_config(batch_size=4, workers=2), _apply, "cpu", params=_params())
    batches = list(tuned.make_loader(_items(10), seed=0))
    assert len(batches) == 2 and all(split_batch(b)[0].shape == (4, 16) for b in batches)
    assert all(isinstance(split_batch(b)[0], jax.Array) for b in batches)  # placed by the threads


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({}, None),
        ({"precision": "bf16", "jit": "on"}, None),
        ({"precision": "tf32"}, "no TF32 matmuls"),
        ({"precision": "fp16"}, "float16"),
        ({"jit": "on", "_no_jit": True}, "XLA cannot compile"),
    ],
)
def test_what_a_cpu_cannot_serve_is_unsupported_with_the_reason(changes: dict[str, object], reason: str | None) -> None:
    jit = not changes.pop("_no_jit", False)
    found = JAX_INFERENCE.unsupported_reason(_config(**changes), JaxCapabilities(bf16=True, jit=jit))
    assert found is None if reason is None else reason in (found or ""), found


def test_a_training_workload_or_a_bad_one_is_refused_with_what_is_missing() -> None:
    with pytest.raises(TypeError, match="expected a JaxInferenceWorkload"):
        as_inference_workload((_params(), _apply), "x:y")
    with pytest.raises(TypeError, match="params must be a pytree of float arrays"):
        as_inference_workload(
            JaxInferenceWorkload(params={"n": np.arange(3)}, apply_fn=_apply, dataset=_items(4)), "x:y"
        )
    with pytest.raises(TypeError, match="dataset must be map-style"):
        as_inference_workload(JaxInferenceWorkload(params=_params(), apply_fn=_apply, dataset=iter([])), "x:y")


def test_the_probe_says_when_apply_fn_fails_on_the_first_batch() -> None:
    def broken(params: object, inputs: jax.Array) -> jax.Array:
        return inputs @ jnp.ones((3, 3))

    workload = JaxInferenceWorkload(params=_params(), apply_fn=broken, dataset=_items(8))
    found = JaxServing().first_batch_problem(workload, 2)
    assert found is not None and found.startswith("apply_fn fails on the first batch: TypeError")
    assert JaxServing().first_batch_problem(JaxInferenceWorkload(_params(), _apply, _items(8)), 2) is None


def test_output_drift_is_the_relative_error_with_top1_agreement_and_accuracy() -> None:
    serving, data = JaxServing(), _items(16)
    workload = JaxInferenceWorkload(params=_params(), apply_fn=_apply, dataset=data)
    items = [data[i] for i in range(16)]
    reference = serving.reference_outputs(workload, items, 8, jax.devices("cpu")[0])
    assert reference.shape == (16, 5) and reference.dtype == np.float64
    same = serving.output_drift(workload, reference.copy(), reference, items)
    assert same.relative_error == 0.0 and same.top1_agreement == 1.0
    assert same.accuracy == same.reference_accuracy is not None
    noisy = reference + 0.1 * np.linalg.norm(reference) / np.sqrt(reference.size)
    assert serving.output_drift(workload, noisy, reference, items).relative_error == pytest.approx(0.1, rel=1e-6)
    custom = JaxInferenceWorkload(params=_params(), apply_fn=_apply, dataset=data, drift_fn=lambda out, ref: 0.25)
    assert serving.output_drift(custom, noisy, reference, items).relative_error == 0.25


def test_the_primary_output_is_the_array_the_logits_or_the_first_array() -> None:
    logits = jnp.ones((2, 3))
    assert primary_output(logits) is logits and primary_output({"logits": logits, "a": 0}) is logits
    assert primary_output((logits, jnp.zeros(2))) is logits
    with pytest.raises(TypeError, match="holds no array"):
        primary_output(())
