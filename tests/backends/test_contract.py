"""The backend contract (`backends/_base.py`), one suite that every backend runs.

Each backend comes with a small harness that knows how to write a training loop in its framework
(a tiny model, its loss and an SGD optimizer) and how to look inside it (weights, the compute
dtype, whether the step is compiled). The tests are written once against the harness: every knob
is honoured by the backend's `TunedTraining`, and real trials through the backend's runner, in
trial processes, report what the engine needs (throughput, memory, losses), classify their
failures (out of memory by the framework's own error, a diverged loss, an exception in the
factory), and keep the fp32 reference deterministic and drift-free. CPU only, real frameworks.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import replace
from itertools import pairwise
from typing import Any

import numpy as np
import pytest

from autotuner.apply import TunedConfig
from autotuner.backends import BACKENDS, Backend, Capabilities
from autotuner.config.knobs import COMMON_KNOBS, DERIVED
from autotuner.measurement.drift import measure_drift
from autotuner.trials.launcher import TrialLauncher, TrialResult
from autotuner.trials.outcomes import Outcome
from autotuner.trials.request import ProbeRequest, TrialRequest
from tests.support.helpers import ROOT, small_request  # noqa: F401 - ROOT: puts the repository on sys.path for the trial processes
from tests.support.numpy_backend import NUMPY  # registers the numpy backend: nothing under autotuner/ names it

TIMEOUT_S = 120.0
"""Generous: a tiny trial takes a few seconds."""
SAMPLES = 16
FEATURES = 8
CLASSES = 3
SMALL_MLP = {"features": 16, "hidden": 32, "depth": 1, "samples": 128}
"""The built-in mlp, small enough for a trial in a few seconds on a CPU."""


class Harness:
    """What the contract tests need to write and inspect a training loop in one framework."""

    backend: Backend
    faulty: str
    """Module of workloads that misbehave on purpose (ok, oom, nan, raises_in_factory, wrong_return)."""
    workload_type: str
    """The class name a factory must return."""
    compiled: dict[str, Any] | None
    """The knob value that compiles the step (the reference's value does not); None: no such knob."""
    optimized: dict[str, Any] | None
    """A fast config the CPU honours, for the drift check; None: every config is the reference's."""
    quick: dict[str, Any]
    """Knob values that make a tiny trial quickest here (a JAX step op by op compiles each of its
    ~100 operations on first use, one jit compiles it whole), for the tests that are not about
    the reference."""
    step_variants: tuple[dict[str, Any], ...]
    """Knob values the accumulation check runs under (cheap to compile here: torch.compile costs
    ~20 s a model on a CPU, a jit of a tiny model milliseconds)."""

    def reference(self, **changes: Any) -> dict[str, Any]:
        """A full config at the knobs' reference values, micro-batch 4, with `changes`."""
        config = {name: knob.reference for name, knob in self.backend.knobs.items()}
        config.update(batch_size=4, accumulation=1)
        config.update(changes)
        return config

    def training(self, config: dict[str, Any], dataset: Any = None) -> Any:
        """The backend's TunedTraining over a freshly initialised tiny model (the same weights
        every call) and an SGD optimizer."""
        raise NotImplementedError

    def data(self, samples: int = SAMPLES) -> tuple[np.ndarray, np.ndarray]:
        generator = np.random.default_rng(1)
        return generator.standard_normal((samples, FEATURES), dtype=np.float32), np.arange(samples) % CLASSES

    def dataset(self, samples: int) -> Any:
        """`samples` items; item i's label is i (to see which items a batch holds)."""
        raise NotImplementedError

    def batch(self, start: int, stop: int) -> Any:
        """Items start..stop of `data()` as one batch, in the framework's host arrays."""
        raise NotImplementedError

    def micro_step(self, tuned: Any, batch: Any) -> bool:
        """One micro-step as a user's loop writes it: what `step()` returned."""
        raise NotImplementedError

    def weights(self, tuned: Any) -> list[np.ndarray]:
        raise NotImplementedError

    def compute_dtype(self, tuned: Any) -> str:
        """The dtype the forward pass computes in, under `autocast()`."""
        raise NotImplementedError

    def matmul_precision(self, tuned: Any) -> str:
        """`tf32` or `strict`: the fp32 matmul precision in effect under `autocast()`."""
        raise NotImplementedError

    def is_compiled(self, tuned: Any) -> bool:
        raise NotImplementedError

    def loader_workers(self, loader: Any) -> int:
        raise NotImplementedError

    def labels(self, batch: Any) -> list[int]:
        raise NotImplementedError

    def real_oom(self) -> BaseException:
        """An instance of the framework's out-of-memory error, as the framework raises it."""
        raise NotImplementedError

    def restore(self) -> None:
        """Put back process-wide settings a TunedTraining changed."""


class PyTorchHarness(Harness):
    backend = BACKENDS["pytorch"]
    faulty = "tests.support.faulty_workloads"
    workload_type = "TorchWorkload"
    compiled = {"compile": "default"}
    optimized = {"precision": "bf16"}
    quick: dict[str, Any] = {}
    step_variants = ({},)

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self._saved = torch.get_float32_matmul_precision()

    def _model(self) -> Any:
        torch = self.torch
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.ReLU(), torch.nn.Linear(16, CLASSES))

    def training(self, config: dict[str, Any], dataset: Any = None) -> Any:
        from autotuner.backends.pytorch.apply import TunedTraining

        model = self._model()
        return TunedTraining(config, model, self.torch.optim.SGD(model.parameters(), lr=0.1), dataset, device="cpu")

    def dataset(self, samples: int) -> Any:
        inputs, _ = self.data(samples)
        return self.torch.utils.data.TensorDataset(self.torch.from_numpy(inputs), self.torch.arange(samples))

    def batch(self, start: int, stop: int) -> Any:
        inputs, labels = self.data()
        return self.torch.from_numpy(inputs[start:stop]), self.torch.from_numpy(labels[start:stop])

    def micro_step(self, tuned: Any, batch: Any) -> bool:
        inputs, target = tuned.to_device(batch)
        with tuned.autocast():
            loss = self.torch.nn.functional.cross_entropy(tuned.model(inputs), target)
        tuned.backward(loss)
        return bool(tuned.step())

    def weights(self, tuned: Any) -> list[np.ndarray]:
        return [p.detach().cpu().numpy().copy() for p in tuned.model.parameters()]

    def compute_dtype(self, tuned: Any) -> str:
        inputs, _ = tuned.to_device(self.batch(0, 4))
        with tuned.autocast():
            return str(tuned.model(inputs).dtype).removeprefix("torch.")

    def matmul_precision(self, tuned: Any) -> str:
        with tuned.autocast():
            return "tf32" if self.torch.get_float32_matmul_precision() == "high" else "strict"

    def is_compiled(self, tuned: Any) -> bool:
        # Asserted on the wrapper without running it: a CPU compile costs ~20 s per model.
        from torch._dynamo.eval_frame import OptimizedModule

        return isinstance(tuned.model, OptimizedModule)

    def loader_workers(self, loader: Any) -> int:
        return int(loader.num_workers)

    def labels(self, batch: Any) -> list[int]:
        return [int(v) for v in batch[1]]

    def real_oom(self) -> BaseException:
        return self.torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    def restore(self) -> None:
        from autotuner.backends.pytorch.apply import set_matmul_precision

        set_matmul_precision("fp32")
        self.torch.set_float32_matmul_precision(self._saved)


class JaxHarness(Harness):
    backend = BACKENDS["jax"]
    faulty = "tests.support.faulty_jax_workloads"
    workload_type = "JaxWorkload"
    compiled = {"jit": "on"}
    optimized = {"precision": "bf16", "jit": "on"}
    quick = {"jit": "on"}
    step_variants = ({}, {"jit": "on"}, {"jit": "on", "donate": "on", "remat": "full"})

    def __init__(self) -> None:
        import jax

        self.jax = jax
        self.calls: list[tuple[str, str]] = []
        """(parameter dtype, input dtype) each time the Python of the loss ran."""

    def _loss(self, params: Any, batch: Any) -> Any:
        from tests.support.faulty_jax_workloads import _loss

        self.calls.append((str(params["w1"].dtype), str(batch[0].dtype)))
        return _loss(params, batch)

    def _params(self) -> dict[str, np.ndarray]:
        init = np.random.default_rng(0)
        return {
            "w1": (init.standard_normal((FEATURES, 16)) / np.sqrt(FEATURES)).astype(np.float32),
            "b1": np.zeros(16, np.float32),
            "w2": (init.standard_normal((16, CLASSES)) / 4.0).astype(np.float32),
            "b2": np.zeros(CLASSES, np.float32),
        }

    def training(self, config: dict[str, Any], dataset: Any = None) -> Any:
        import optax

        from autotuner.backends.jax.apply import TunedTraining

        return TunedTraining(config, self._loss, optax.sgd(0.1), dataset, device="cpu", params=self._params())

    def dataset(self, samples: int) -> Any:
        from autotuner.backends.jax.workload import ArrayDataset

        inputs, _ = self.data(samples)
        return ArrayDataset(inputs, np.arange(samples, dtype=np.int32))

    def batch(self, start: int, stop: int) -> Any:
        inputs, labels = self.data()
        return inputs[start:stop], labels[start:stop].astype(np.int32)

    def micro_step(self, tuned: Any, batch: Any) -> bool:
        batch = tuned.to_device(batch)
        with tuned.autocast():
            loss, grads = tuned.model(tuned.params, batch)
        tuned.backward(grads)
        return bool(tuned.step())

    def weights(self, tuned: Any) -> list[np.ndarray]:
        return [np.asarray(leaf) for leaf in self.jax.tree.leaves(tuned.params)]

    def compute_dtype(self, tuned: Any) -> str:
        self.calls.clear()
        self.micro_step(tuned, self.batch(0, 4))
        params_dtype, inputs_dtype = self.calls[-1]
        assert params_dtype == inputs_dtype, "the parameters and the inputs compute in one dtype"
        assert all(leaf.dtype == np.float32 for leaf in self.jax.tree.leaves(tuned.params)), "fp32 master weights"
        return params_dtype

    def matmul_precision(self, tuned: Any) -> str:
        with tuned.autocast():
            return "tf32" if self.jax.config.jax_default_matmul_precision == "tensorfloat32" else "strict"

    def is_compiled(self, tuned: Any) -> bool:
        """Jitted: the loss's Python runs once (the trace), however many steps follow."""
        self.calls.clear()
        for _ in range(3):
            self.micro_step(tuned, self.batch(0, 4))
        return len(self.calls) == 1

    def loader_workers(self, loader: Any) -> int:
        return int(loader.workers)

    def labels(self, batch: Any) -> list[int]:
        return [int(v) for v in np.asarray(batch[1])]

    def real_oom(self) -> BaseException:
        import jax.numpy as jnp

        from tests.support.faulty_jax_workloads import BEYOND_ANY_HOST

        try:
            jnp.zeros(BEYOND_ANY_HOST, jnp.float32).block_until_ready()
        except Exception as exc:  # noqa: BLE001 - whatever XLA raises is what is classified
            return exc
        raise AssertionError("XLA allocated 16 TiB")


class NumpyHarness(Harness):
    """The third backend, defined in tests/support/numpy_backend.py: fp32 only, nothing to compile."""

    backend = NUMPY
    faulty = "tests.support.numpy_backend"
    workload_type = "NumpyWorkload"
    compiled = None
    optimized = None
    quick: dict[str, Any] = {}
    step_variants = ({},)

    def training(self, config: dict[str, Any], dataset: Any = None) -> Any:
        from tests.support.numpy_backend import TunedTraining

        init = np.random.default_rng(0)
        params = {
            "w0": (init.standard_normal((FEATURES, 16)) / np.sqrt(FEATURES)).astype(np.float32),
            "b0": np.zeros(16, np.float32),
            "w1": (init.standard_normal((16, CLASSES)) / 4.0).astype(np.float32),
            "b1": np.zeros(CLASSES, np.float32),
        }
        return TunedTraining(config, params, 0.1, dataset)

    def dataset(self, samples: int) -> Any:
        from tests.support.numpy_backend import Pairs

        inputs, _ = self.data(samples)
        return Pairs(inputs, np.arange(samples))

    def batch(self, start: int, stop: int) -> Any:
        inputs, labels = self.data()
        return inputs[start:stop], labels[start:stop]

    def micro_step(self, tuned: Any, batch: Any) -> bool:
        with tuned.autocast():
            _, grads = tuned.model(tuned.params, tuned.to_device(batch))
        tuned.backward(grads)
        return bool(tuned.step())

    def weights(self, tuned: Any) -> list[np.ndarray]:
        return [value.copy() for value in tuned.params.values()]

    def compute_dtype(self, tuned: Any) -> str:
        return str(tuned.params["w0"].dtype)

    def matmul_precision(self, tuned: Any) -> str:
        return "strict"

    def is_compiled(self, tuned: Any) -> bool:
        return False

    def loader_workers(self, loader: Any) -> int:
        return int(loader.workers)

    def labels(self, batch: Any) -> list[int]:
        return [int(v) for v in batch[1]]

    def real_oom(self) -> BaseException:
        try:
            np.empty(2**42, np.float32)
        except MemoryError as exc:
            return exc
        raise AssertionError("numpy allocated 16 TiB")


HARNESSES = {"pytorch": PyTorchHarness, "jax": JaxHarness, "numpy": NumpyHarness}


def _precisions(harness: Harness) -> tuple[str, ...]:
    return tuple(harness.backend.knobs["precision"].choices or ())


def backend_capabilities(harness: Harness, **report: bool) -> Capabilities:
    """`report` as the harness's backend reads a probe's capabilities (its own ones kept)."""
    return harness.backend.capabilities(report)


@pytest.fixture(params=list(HARNESSES), scope="class")
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    made = HARNESSES[request.param]()
    yield made
    made.restore()


def _request(
    harness: Harness, workload: str, config: dict[str, Any], *, measure: bool = True, **args: Any
) -> TrialRequest:
    """`small_request` at the harness's reference config (micro-batch 4 x 2 by default) with `config`'s changes."""
    if ":" not in workload:
        workload = f"{harness.faulty}:{workload}"
    return small_request(
        workload, {**harness.reference(batch_size=4), **config}, args, measure=measure, heldout_batch=4
    )


def _mlp(harness: Harness) -> str:
    return harness.backend.resolve_workload("builtin:mlp")


def _run(launcher: TrialLauncher, harness: Harness, request: TrialRequest) -> TrialResult:
    return launcher.call(harness.backend.runner, "run", request, TIMEOUT_S)


@pytest.fixture(scope="class")
def reference_runs(harness: Harness, launcher: TrialLauncher) -> list[TrialResult]:
    """The fp32 reference of the built-in mlp run twice, drift phase only, as a study runs it."""
    request = _request(harness, _mlp(harness), harness.reference(), measure=False, **SMALL_MLP)
    runs = [_run(launcher, harness, request) for _ in range(2)]
    assert all(r.outcome is Outcome.OK for r in runs), [r.reason for r in runs]
    return runs


class TestBackendContract:
    # ------------------------------------------------------------ the engine side

    def test_the_knobs_are_the_common_ones_and_its_own(self, harness: Harness) -> None:
        backend = harness.backend
        for common in COMMON_KNOBS:
            knob = backend.knobs[common.name]
            assert (knob.choices is None) == (common.choices is None), common.name
            if knob.choices is not None and common.choices is not None:
                assert set(knob.choices) <= set(common.choices), common.name
        for name, knob in backend.knobs.items():
            assert knob.name == name
            if knob.choices is not None:
                assert knob.reference in knob.choices, f"{name}: the reference value must be one the backend honours"
        assert backend.default_space in backend.presets()
        assert set(backend.load_preset(backend.default_space)) <= set(backend.knobs)
        assert backend.missing_requirements() is None

    def test_the_cpu_runs_the_reference_and_refuses_tf32_with_a_reason(self, harness: Harness) -> None:
        cpu = backend_capabilities(harness, bf16=True, compile=True, jit=True)
        backend = harness.backend
        assert backend.unsupported_reason(harness.reference(), Capabilities()) is None
        if "bf16" in _precisions(harness):
            assert backend.unsupported_reason(harness.reference(precision="bf16"), cpu) is None
            reason = backend.unsupported_reason(harness.reference(precision="bf16"), Capabilities())
            assert reason is not None and reason.startswith("bf16:")
        if harness.compiled is not None:
            assert backend.unsupported_reason(harness.reference(**harness.compiled), cpu) is None
        reason = backend.unsupported_reason(harness.reference(precision="tf32"), cpu)
        assert reason is not None and reason.startswith("tf32:") and "\n" not in reason

    # ------------------------------------------------------------ TunedTraining honours every knob

    @pytest.mark.slow
    def test_precision_sets_the_compute_dtype(self, harness: Harness) -> None:
        assert harness.compute_dtype(harness.training(harness.reference(precision="fp32"))) == "float32"
        if "bf16" in _precisions(harness):
            assert harness.compute_dtype(harness.training(harness.reference(precision="bf16"))) == "bfloat16"

    def test_tf32_allows_tf32_matmuls_and_every_other_precision_is_strict(self, harness: Harness) -> None:
        for precision in _precisions(harness):
            expected = "tf32" if precision == "tf32" else "strict"
            assert harness.matmul_precision(harness.training(harness.reference(precision=precision))) == expected

    @pytest.mark.slow
    def test_accumulated_micro_batches_step_as_the_whole_batch(self, harness: Harness) -> None:
        for variant in harness.step_variants:
            whole = harness.training(harness.reference(batch_size=SAMPLES, accumulation=1, **variant))
            before = harness.weights(whole)
            assert harness.micro_step(whole, harness.batch(0, SAMPLES)) is True
            expected = harness.weights(whole)
            assert any(not np.array_equal(a, b) for a, b in zip(before, expected, strict=True)), "no update"

            accumulated = harness.training(harness.reference(batch_size=4, accumulation=4, **variant))
            assert accumulated.global_batch == SAMPLES
            stepped = [harness.micro_step(accumulated, harness.batch(i, i + 4)) for i in range(0, SAMPLES, 4)]
            assert stepped == [False, False, False, True], variant
            for got, want in zip(harness.weights(accumulated), expected, strict=True):
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=str(variant))

    def test_step_steps_once_every_accumulation_calls(self, harness: Harness) -> None:
        tuned = harness.training(harness.reference(batch_size=2, accumulation=3))
        assert (tuned.batch_size, tuned.accumulation, tuned.global_batch) == (2, 3, 6)
        snapshots, reported = [], []
        for _ in range(6):
            reported.append(harness.micro_step(tuned, harness.batch(0, 2)))
            snapshots.append(harness.weights(tuned))
        assert reported == [False, False, True] * 2
        moved = [any(not np.array_equal(a, b) for a, b in zip(x, y, strict=True)) for x, y in pairwise(snapshots)]
        assert moved == [False, True, False, False, True], "the weights change on the optimizer steps only"

    def test_compile_or_jit_is_applied_and_the_reference_is_eager(self, harness: Harness) -> None:
        if harness.compiled is not None:
            assert harness.is_compiled(harness.training(harness.reference(**harness.compiled))) is True
        assert harness.is_compiled(harness.training(harness.reference())) is False

    def test_the_loader_has_the_micro_batch_and_the_workers(self, harness: Harness) -> None:
        dataset = harness.dataset(18)
        tuned = harness.training(harness.reference(batch_size=4, workers=2), dataset)
        assert harness.loader_workers(tuned.loader) == 2
        epoch = list(tuned.loader)
        assert [len(harness.labels(b)) for b in epoch] == [4] * 4, "micro-batches, the partial last one dropped"
        seen = [label for b in epoch for label in harness.labels(b)]
        assert len(set(seen)) == 16 and set(seen) <= set(range(18))
        assert seen != sorted(seen), "shuffled"
        again = [label for b in tuned.make_loader(dataset, seed=3) for label in harness.labels(b)]
        assert again == [label for b in tuned.make_loader(dataset, seed=3) for label in harness.labels(b)]
        plain = harness.training(harness.reference(batch_size=4), dataset).make_loader(dataset, shuffle=False)
        assert harness.loader_workers(plain) == 0
        assert [harness.labels(b) for b in plain] == [list(range(i, i + 4)) for i in range(0, 16, 4)]

    def test_a_config_of_another_backend_is_refused(self, harness: Harness) -> None:
        with pytest.raises(ValueError, match="precision"):
            harness.training(harness.reference(precision="fp8"))
        other, foreign = next(
            (name, knob)
            for name, backend in BACKENDS.items()
            for knob in backend.knobs
            if name != harness.backend.name and knob not in harness.backend.knobs
        )
        with pytest.raises(ValueError, match=foreign):
            harness.training({**harness.reference(), foreign: BACKENDS[other].knobs[foreign].reference})
        tuned = TunedConfig(
            params=harness.reference(),
            metrics={"throughput": 1.0},
            baseline={},
            speedup=None,
            environment={"backend": other, "fingerprint": "0"},
            spec={"identity": "0"},
            study={"name": "x"},
            drift={},
            source="x.best.yaml",
        )
        with pytest.raises(ValueError, match=f"tuned with the {other} backend"):
            harness.training(tuned)  # type: ignore[arg-type]

    # ------------------------------------------------------------ the runner, in trial processes

    @pytest.mark.slow
    def test_the_probe_reports_the_environment(self, harness: Harness, launcher: TrialLauncher) -> None:
        request = ProbeRequest("cpu", _mlp(harness), SMALL_MLP)
        probed = launcher.call(harness.backend.runner, "probe", request, TIMEOUT_S)
        assert probed.outcome is Outcome.OK, probed.reason
        assert probed.output.workload_error is None
        environment = probed.output.environment
        assert environment.backend == harness.backend.name
        assert environment.device == "cpu" and environment.device_name and environment.driver
        assert environment.device_count == 0 and environment.peak_flops == {}
        assert environment.versions["python"] and len(environment.versions) > 1
        capabilities = harness.backend.capabilities(environment.capabilities)
        assert isinstance(capabilities, harness.backend.capabilities_type)
        assert not capabilities.accelerator and not capabilities.tf32
        assert harness.backend.unsupported_reason(harness.reference(), capabilities) is None
        assert harness.backend.unsupported_reason(harness.reference(precision="tf32"), capabilities) is not None
        bad = launcher.call(
            harness.backend.runner, "probe", replace(request, workload_args={"depth": "two"}), TIMEOUT_S
        )
        assert bad.outcome is Outcome.OK and "does not build a workload" in bad.output.workload_error

    @pytest.mark.slow
    def test_the_probe_refuses_a_dataset_smaller_than_the_global_batch(
        self, harness: Harness, launcher: TrialLauncher
    ) -> None:
        request = ProbeRequest("cpu", _mlp(harness), SMALL_MLP, global_batch=128)
        fits = launcher.call(harness.backend.runner, "probe", request, TIMEOUT_S)
        assert fits.outcome is Outcome.OK and fits.output.workload_error is None, fits.reason
        small = launcher.call(harness.backend.runner, "probe", replace(request, global_batch=129), TIMEOUT_S)
        assert small.outcome is Outcome.OK, small.reason
        assert small.output.workload_error == (
            f"{_mlp(harness)}: the dataset holds 128 items, fewer than one global batch (129): no step can be taken"
        )

    def test_a_trial_whose_loader_yields_nothing_is_an_error(self, harness: Harness, launcher: TrialLauncher) -> None:
        result = _run(launcher, harness, _request(harness, "ok", {**harness.quick, "batch_size": 8}, samples=4))
        assert result.outcome is Outcome.ERROR, result.reason
        assert result.reason == (
            "EmptyLoader: the data loader yields no batch: the dataset holds fewer items than one micro-batch"
        )

    def test_a_trial_reports_throughput_memory_and_losses(self, harness: Harness, launcher: TrialLauncher) -> None:
        result = _run(launcher, harness, _request(harness, _mlp(harness), harness.quick, **SMALL_MLP))
        assert result.outcome is Outcome.OK, result.reason + (result.traceback or "")
        throughput = result.output.throughput
        assert (throughput.windows, throughput.steps, throughput.samples_per_step) == (2, 2, 8)
        assert len(throughput.window_samples_per_s) == 2 and throughput.samples_per_s > 0
        assert throughput.warmup_s > 0 and throughput.measured_s > 0
        assert result.output.peak_memory_mb > 0
        losses = result.output.losses
        assert len(losses.trajectory) == 2
        assert all(isinstance(v, float) and np.isfinite(v) for v in [losses.heldout, *losses.trajectory])

    @pytest.mark.slow
    def test_the_reference_is_deterministic_and_a_measured_run_of_it_does_not_drift(
        self, harness: Harness, launcher: TrialLauncher, reference_runs: list[TrialResult]
    ) -> None:
        first, second = (r.output.losses for r in reference_runs)
        assert reference_runs[0].output.throughput is None, "the reference runs the drift phase only"
        assert first == second, "two runs of the fp32 reference are bitwise equal"
        measured = _run(launcher, harness, _request(harness, _mlp(harness), harness.reference(), **SMALL_MLP))
        assert measured.outcome is Outcome.OK, measured.reason
        losses = measured.output.losses
        drift = measure_drift(losses.heldout, losses.trajectory, first.heldout, first.trajectory)
        assert drift.heldout < 1e-6 and drift.trajectory_max < 1e-6, drift

    def test_a_fast_config_drifts_little_from_the_reference(
        self, harness: Harness, launcher: TrialLauncher, reference_runs: list[TrialResult]
    ) -> None:
        if harness.optimized is None:
            pytest.skip(f"the {harness.backend.name} backend runs the reference's numerics only")
        fast = _run(launcher, harness, _request(harness, _mlp(harness), harness.optimized, measure=False, **SMALL_MLP))
        assert fast.outcome is Outcome.OK, fast.reason
        ref, got = reference_runs[0].output.losses, fast.output.losses
        drift = measure_drift(got.heldout, got.trajectory, ref.heldout, ref.trajectory)
        assert 0 < drift.heldout < 0.01, f"{harness.optimized}: {drift}"

    def test_out_of_memory_is_oom_by_the_framework_error(self, harness: Harness, launcher: TrialLauncher) -> None:
        runner = importlib.import_module(harness.backend.runner)
        assert runner.TRIAL_BACKEND.classify_exception(harness.real_oom()) == "oom"
        assert runner.TRIAL_BACKEND.classify_exception(RuntimeError("RESOURCE_EXHAUSTED: CUDA out of memory")) is None
        assert runner.TRIAL_BACKEND.classify_exception(ValueError("x")) is None
        result = _run(launcher, harness, _request(harness, "oom", harness.quick))
        assert result.outcome is Outcome.OOM, result.reason
        assert result.reason and "\n" not in result.reason and result.traceback is None

    def test_a_diverged_loss_is_nan(self, harness: Harness, launcher: TrialLauncher) -> None:
        result = _run(launcher, harness, _request(harness, "nan", harness.quick))
        assert result.outcome is Outcome.NAN, result.reason
        assert "nan" in result.reason and result.traceback is None

    def test_an_exception_in_the_factory_is_an_error_with_its_traceback(
        self, harness: Harness, launcher: TrialLauncher
    ) -> None:
        result = _run(launcher, harness, _request(harness, "raises_in_factory", harness.quick))
        assert result.outcome is Outcome.ERROR
        assert result.reason == "ValueError: the factory refuses to build (samples=64)"
        assert result.traceback is not None and "raises_in_factory" in result.traceback
        wrong = _run(launcher, harness, _request(harness, "wrong_return", harness.quick))
        assert wrong.outcome is Outcome.ERROR
        assert wrong.reason.startswith("TypeError:") and harness.workload_type in wrong.reason


def test_every_registered_backend_runs_the_contract() -> None:
    assert set(HARNESSES) == set(BACKENDS)
    assert all(set(DERIVED) <= set(backend.knobs) for backend in BACKENDS.values())
