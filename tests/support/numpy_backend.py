"""A third backend, defined outside the package: numpy, with gradients written by hand.

It shows what a backend is: an engine-side `Backend` registered with
`autotuner.backends.register` (on import), a `TunedTraining` that applies a config to a loop,
and a `TrainingBackend` with the framework's steps of the one trial algorithm (`autotuner.trials.training`),
exposed as this module's `TRIAL_BACKEND` (it is its own runner module).
Nothing under `autotuner/` knows about it. Its knobs: precision (fp32 only), batch_size,
accumulation and workers (threads that gather a micro-batch's items). The tests run the backend
contract suite (tests/backends/test_contract.py) against it; the misbehaving workloads the suite
needs (ok, oom, nan, raises_in_factory, wrong_return) are here too.
"""

from __future__ import annotations

import contextlib
import platform
import resource
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from autotuner.backends import Backend, Capabilities, register
from autotuner.backends._base import TunedLoop
from autotuner.config.knobs import ACCUMULATION, BATCH_SIZE, PRECISION, WORKERS, Config, knob_table
from autotuner.trials.probe import Environment
from autotuner.trials.training import TrainingBackend

# ---------------------------------------------------------------- engine side


class NumpyBackend(Backend):
    name = "numpy"
    runner = "tests.support.numpy_backend"
    knobs = knob_table(PRECISION.restricted("fp32"), BATCH_SIZE, ACCUMULATION, WORKERS)
    builtin_workloads = {"mlp": "tests.support.numpy_backend:mlp"}
    default_space = "numpy"
    requires = ("numpy",)
    install = "pip install numpy"
    PRESETS = {"numpy": {"precision": ["fp32"], "batch_size": [8, 16, 32, 64], "workers": [0, 1]}}

    def unsupported_reason(self, config: Config, capabilities: Capabilities) -> str | None:
        return self.unsupported_precision(config.get("precision", "fp32"), capabilities)

    def presets(self) -> list[str]:
        return list(self.PRESETS)

    def load_preset(self, name: str) -> dict[str, Any]:
        return dict(self.PRESETS[name])


NUMPY = register(NumpyBackend())

# ---------------------------------------------------------------- the workload and the model


@dataclass
class NumpyWorkload:
    params: dict[str, np.ndarray]
    """float32 weights of `forward`'s MLP (w0, b0, ..., the last pair the output layer)."""
    dataset: Any
    """Map-style: dataset[i] -> (inputs, label)."""
    lr: float = 0.1
    heldout: Any | None = None
    tokens_per_sample: int | None = None
    flops_per_sample: float | None = None


def as_workload(built: Any, ref: str) -> NumpyWorkload:
    if not isinstance(built, NumpyWorkload):
        raise TypeError(f"workload factory {ref} returned {type(built).__name__}, expected a NumpyWorkload")
    return built


class Pairs:
    """(inputs[i], labels[i]) for each row i."""

    def __init__(self, inputs: np.ndarray, labels: np.ndarray):
        self.inputs, self.labels = inputs, labels

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[np.ndarray, Any]:
        return self.inputs[index], self.labels[index]


def collate(items: list[tuple[np.ndarray, Any]]) -> tuple[np.ndarray, np.ndarray]:
    return np.stack([item[0] for item in items]), np.asarray([item[1] for item in items])


def loss_and_grads(params: dict[str, np.ndarray], batch: tuple[np.ndarray, np.ndarray]) -> tuple[float, dict]:
    """The mean softmax cross-entropy of a tanh MLP over `batch`, and its gradients, by hand."""
    inputs, labels = batch
    layers = len(params) // 2
    activations = [inputs.astype(np.float32)]
    for i in range(layers - 1):
        activations.append(np.tanh(activations[-1] @ params[f"w{i}"] + params[f"b{i}"]))
    logits = activations[-1] @ params[f"w{layers - 1}"] + params[f"b{layers - 1}"]
    logits = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    rows = np.arange(len(labels))
    loss = float(-np.log(probs[rows, labels]).mean())
    delta = probs
    delta[rows, labels] -= 1.0
    delta /= len(labels)
    grads = {}
    for i in reversed(range(layers)):
        grads[f"w{i}"] = activations[i].T @ delta
        grads[f"b{i}"] = delta.sum(axis=0)
        if i:
            delta = (delta @ params[f"w{i}"].T) * (1.0 - activations[i] ** 2)
    return loss, grads


def _workload(
    samples: int, features: int, hidden: int, depth: int, classes: int, *, nan: bool = False
) -> NumpyWorkload:
    data = np.random.default_rng(0)
    inputs = data.standard_normal((samples, features), dtype=np.float32)
    if nan:
        inputs[:] = np.nan
    labels = data.integers(classes, size=samples)
    init = np.random.default_rng(np.random.randint(2**31))  # the trial's seed
    sizes = [features] + [hidden] * int(depth) + [classes]
    params = {}
    for i, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:], strict=False)):
        params[f"w{i}"] = (init.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)
        params[f"b{i}"] = np.zeros(fan_out, np.float32)
    return NumpyWorkload(params=params, dataset=Pairs(inputs, labels))


def mlp(features: int = 16, hidden: int = 32, depth: int = 1, samples: int = 128, classes: int = 10) -> NumpyWorkload:
    """The built-in: a tanh MLP on Gaussian inputs with random labels."""
    return _workload(samples, features, hidden, depth, classes)


def ok(samples: int = 64) -> NumpyWorkload:
    return _workload(samples, 8, 16, 1, 3)


def oom(samples: int = 64) -> NumpyWorkload:
    """Its dataset asks numpy for more memory than any host has, when a batch is gathered."""
    workload = ok(samples)
    inputs = workload.dataset.inputs

    class Huge(Pairs):
        def __getitem__(self, index: int) -> tuple[np.ndarray, Any]:
            np.empty(2**42, np.float32)
            return super().__getitem__(index)

    workload.dataset = Huge(inputs, workload.dataset.labels)
    return workload


def nan(samples: int = 64) -> NumpyWorkload:
    return _workload(samples, 8, 16, 1, 3, nan=True)


def raises_in_factory(samples: int = 64) -> NumpyWorkload:
    raise ValueError(f"the factory refuses to build (samples={samples})")


def wrong_return(samples: int = 64) -> Any:
    return "not a workload"


# ---------------------------------------------------------------- a config applied to a loop


class Loader:
    """Micro-batches of a map-style dataset, the last partial one dropped; `workers` threads
    gather a micro-batch's items."""

    def __init__(self, dataset: Any, batch_size: int, *, shuffle: bool, seed: int | None, workers: int):
        self.dataset, self.batch_size, self.shuffle, self.workers = dataset, batch_size, shuffle, workers
        self._rng = np.random.default_rng(seed)

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        count = len(self.dataset) // self.batch_size * self.batch_size
        order = self._rng.permutation(len(self.dataset))[:count] if self.shuffle else np.arange(count)
        with ThreadPoolExecutor(max(1, self.workers)) as pool:
            for indices in order.reshape(-1, self.batch_size):
                yield collate(list(pool.map(self.dataset.__getitem__, indices.tolist())))


class TunedTraining(TunedLoop):
    """A numpy config applied to `params` and SGD with learning rate `lr`."""

    def __init__(self, config: Mapping[str, Any], params: dict[str, np.ndarray], lr: float, dataset: Any = None):
        super().__init__(NUMPY, config)
        self.device = "cpu"
        self.lr = lr
        self.params = {name: value.copy() for name, value in params.items()}
        self.model = loss_and_grads
        self._total: dict[str, np.ndarray] | None = None
        self._micro_steps = 0
        self.loader = self.make_loader(dataset) if dataset is not None else None

    def to_device(self, batch: Any) -> Any:
        return batch

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def backward(self, grads: dict[str, np.ndarray]) -> None:
        if self._total is None:
            self._total = grads
        else:
            self._total = {name: self._total[name] + grads[name] for name in grads}

    def step(self) -> bool:
        self._micro_steps += 1
        if self._micro_steps % self.accumulation or self._total is None:
            return False
        for name, grad in self._total.items():
            self.params[name] = (self.params[name] - self.lr * grad / self.accumulation).astype(np.float32)
        self._total = None
        return True

    def make_loader(self, dataset: Any, *, shuffle: bool = True, seed: int | None = None) -> Loader:
        return Loader(dataset, self.batch_size, shuffle=shuffle, seed=seed, workers=self.workers)


# ---------------------------------------------------------------- trial side


class NumpyTrial(TrainingBackend[str, Any, Any]):
    name = NUMPY.name

    def resolve_device(self, spec: str) -> str:
        if spec not in ("auto", "cpu"):
            raise ValueError(f"device {spec!r}: the numpy backend runs on the cpu")
        return "cpu"

    def environment(self, device: str) -> Environment:
        return Environment(
            backend=self.name,
            device=device,
            device_name=platform.processor() or platform.machine(),
            driver=platform.release(),
            versions={"python": platform.python_version(), "numpy": np.__version__},
            capabilities={"accelerator": False},
        )

    def seed(self, seed: int) -> None:
        np.random.seed(seed)

    def as_workload(self, built: Any, ref: str) -> NumpyWorkload:
        return as_workload(built, ref)

    def training(
        self, workload: NumpyWorkload, config: dict[str, Any], device: str, parallel: str | None = None
    ) -> TunedTraining:
        return TunedTraining(config, workload.params, workload.lr)

    def restart(self, workload: NumpyWorkload, training: TunedTraining, initial: Any) -> TunedTraining:
        return TunedTraining(training.config, workload.params, workload.lr)  # the workload's params never move

    def train_step(self, workload: NumpyWorkload, training: TunedTraining, batches: Iterator[Any]) -> float:
        total = 0.0
        for _ in range(training.accumulation):
            loss, grads = training.model(training.params, next(batches))
            training.backward(grads)
            training.step()
            total += loss
        return total / training.accumulation

    def synchronize(self, training: TunedTraining, pending: Any) -> None:
        pass

    def evaluation(self, workload: NumpyWorkload, training: TunedTraining) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def batch_loss(self, workload: NumpyWorkload, training: TunedTraining, dataset: Any, indices: range) -> float:
        return training.model(training.params, collate([dataset[i] for i in indices]))[0]

    def peak_memory_mb(self, device: str) -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def classify_exception(self, exc: BaseException) -> str | None:
        return "oom" if isinstance(exc, MemoryError) else None


TRIAL_BACKEND = NumpyTrial()
