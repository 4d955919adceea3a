"""A JAX trial process on a GPU machine, checked where no GPU is: what
`autotuner.backends.jax.devices.configure_process` sets before the backend starts (and that it leaves a started
one alone), that `TunedTraining` and a trial keep every array on their device (two host devices
stand in for two GPUs, with JAX's device-to-device transfer guard on, so an array made on the other
device fails the step that uses it), that a GPU keeps its `cuda:i` name when the process sees only
it, and that probes and trials still run through the real trial launcher.

Each configuration check runs in a fresh Python: the platforms and visible devices are read once,
when a process's JAX backend starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from typing import Any

import jax
import jax.extend.backend
import pytest

from autotuner.backends.jax import devices as jax_devices
from autotuner.backends.jax import process as jax_process
from autotuner.backends.jax import runner
from autotuner.backends.jax.workload import JaxWorkload
from autotuner.trials.launcher import TrialLauncher
from autotuner.trials.outcomes import Outcome
from autotuner.trials.request import ProbeRequest
from tests.measurement.test_telemetry import FAST_UUID, fake_pynvml
from tests.measurement.test_telemetry import FakeGpu as NvmlGpu
from tests.support.helpers import SMALL_MLP, small_request
from tests.support.studies import ROOT

PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"
RUNNER = "autotuner.backends.jax.runner"
HERE = "tests.backends.test_jax_gpu_env"
TWO_HOST_DEVICES = "--xla_force_host_platform_device_count=2"
JAX_CONFIG = {"precision": "fp32", "batch_size": 4, "workers": 0, "jit": "on"}


def _python(code: str, **env: str) -> dict[str, Any]:
    """Run `code` in a fresh Python (no JAX or XLA settings of ours inherited, `env` added) and
    return the JSON it prints last."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAX_"))}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- configure_process


CONFIGURE = """
    import json, os
    import jax, jax.extend.backend
    from autotuner.backends.jax.devices import configure_process
    configure_process({spec!r})
    print(json.dumps({{
        "platforms": jax.config.jax_platforms,
        "visible": jax.config.values["jax_cuda_visible_devices"],
        "preallocate": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
        "fractions": [os.environ.get(name) for name in ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION")],
        "started": sorted(jax.extend.backend.backends()),
    }}))
"""
WHOLE_CARD = ["1.0", None]
"""The fractions (the old name's, the new name's) of a trial given the whole card."""


def test_a_cpu_trial_process_starts_the_cpu_platform_only_and_no_preallocation() -> None:
    got = _python(CONFIGURE.format(spec="cpu"))
    assert got == {
        "platforms": "cpu",
        "visible": "all",
        "preallocate": "false",
        "fractions": WHOLE_CARD,
        "started": ["cpu"],
    }


@pytest.mark.slow
def test_a_users_own_allocator_settings_are_kept() -> None:
    preallocating = _python(CONFIGURE.format(spec="cpu"), XLA_PYTHON_CLIENT_PREALLOCATE="true")
    # preallocating, a fraction of 1.0 would take the whole card up front: none is added
    assert (preallocating["preallocate"], preallocating["fractions"]) == ("true", [None, None])
    # A memory fraction only means something with preallocation: it is not turned off under it,
    # and the fraction stands, under either name (jaxlib refuses both names set at once).
    old_name = _python(CONFIGURE.format(spec="cpu"), XLA_PYTHON_CLIENT_MEM_FRACTION=".3")
    assert (old_name["preallocate"], old_name["fractions"]) == (None, [".3", None])
    new_name = _python(CONFIGURE.format(spec="cpu"), XLA_CLIENT_MEM_FRACTION=".3")
    assert (new_name["preallocate"], new_name["fractions"]) == (None, [None, ".3"])


@pytest.mark.parametrize("off", ["false", "False", "0"])
def test_without_preallocation_a_trial_may_take_the_whole_card(off: str) -> None:
    """Without preallocation JAX's allocator still stops at its default fraction, 75% of the card:
    a batch size that needs more would be recorded `oom` and rule out every larger one. Whoever
    turned preallocation off (the trial process, or the user without a fraction of their own), the
    fraction is the whole card; the process still allocates only what it uses."""
    got = _python(CONFIGURE.format(spec="cuda:1"), XLA_PYTHON_CLIENT_PREALLOCATE=off)
    assert (got["preallocate"], got["fractions"]) == (off, WHOLE_CARD)


@pytest.mark.parametrize(("spec", "visible"), [("cuda:1", "1"), ("cuda", "0"), ("auto", "all")])
def test_a_cuda_trial_process_sees_only_its_gpu(spec: str, visible: str) -> None:
    """`cuda:i` (and `cuda`, i.e. `cuda:0`) restricts JAX's CUDA client to CUDA device i, numbered
    as the user's CUDA numbers them; `auto`, which only a probe gets (it counts the GPUs for
    `--jobs`), sees them all. No platform is forced: this CPU-only jaxlib still starts its CPU."""
    got = _python(CONFIGURE.format(spec=spec))
    assert got == {
        "platforms": None,
        "visible": visible,
        "preallocate": "false",
        "fractions": WHOLE_CARD,
        "started": ["cpu"],
    }


def test_configuring_a_process_whose_jax_has_started_changes_nothing_and_does_not_raise() -> None:
    """A user's script that used JAX before: too late for the platforms, the visible devices and the
    allocator (read when the backend starts), so none is set, and nothing raises."""
    got = _python(
        """
        import json, os
        import jax
        from autotuner.backends.jax.devices import configure_process
        jax.numpy.ones(2).block_until_ready()
        for spec in ("cpu", "cuda:1", "cuda", "auto"):
            configure_process(spec)
        print(json.dumps({
            "platforms": jax.config.jax_platforms,
            "visible": jax.config.values["jax_cuda_visible_devices"],
            "preallocate": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
            "fraction": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
        }))
        """
    )
    assert got == {"platforms": None, "visible": "all", "preallocate": None, "fraction": None}


# ---------------------------------------------------------------- placement


TUNED_ON_THE_SECOND_DEVICE = """
    import itertools, json
    import jax, jax.numpy as jnp, numpy as np, optax
    from autotuner.backends.jax.apply import TunedTraining
    from autotuner.backends.jax.workload import ArrayDataset

    jax.config.update("jax_transfer_guard_device_to_device", "disallow")
    second = jax.devices("cpu")[1]
    made_inside: set = set()

    def loss_fn(params, batch):
        inputs, labels = batch
        scale = jnp.ones((), jnp.float32)  # an array the loss makes: op by op, it is made where it runs
        if not isinstance(scale, jax.core.Tracer):
            made_inside.update(scale.devices())
        logits = inputs @ params["w"] + params["b"]
        return optax.softmax_cross_entropy_with_integer_labels(logits * scale, labels).mean()

    rng = np.random.default_rng(0)
    dataset = ArrayDataset(rng.standard_normal((32, 4), dtype=np.float32), rng.integers(0, 3, 32).astype(np.int32))
    params = {"w": np.zeros((4, 3), np.float32), "b": np.zeros(3, np.float32)}
    places = {}
    for precision, jit, workers in itertools.product(("fp32", "bf16"), ("on", "off"), (0, 1)):
        config = {"precision": precision, "batch_size": 4, "accumulation": 2, "workers": workers, "jit": jit}
        tuned = TunedTraining(config, loss_fn, optax.adam(1e-2), dataset, device=second, params=params)
        seen = {"opt_state at the start": tuned.opt_state}
        for batch in itertools.islice(tuned.loader, 4):
            batch = tuned.to_device(batch)
            with tuned.autocast():
                loss, grads = tuned.model(tuned.params, batch)
            tuned.backward(grads)
            tuned.step()
            seen.update(batch=batch, loss=loss, grads=grads)
        seen.update(params=tuned.params, opt_state=tuned.opt_state)
        for name, tree in seen.items():
            devices = {str(d) for leaf in jax.tree.leaves(tree) for d in leaf.devices()}
            places[f"{precision} jit={jit} workers={workers}: {name}"] = sorted(devices)
    places["made inside the loss"] = sorted(str(d) for d in made_inside)
    print(json.dumps({"second": str(second), "places": places}))
"""


@pytest.mark.slow
def test_tuned_training_keeps_everything_on_its_device() -> None:
    """On the second of two host devices (a `cuda:1` trial's case), the parameters, the optimizer
    state (its step count too, from the start), the batches, the losses, the gradients and what
    the loss makes op by op all live there, and no step needs a device-to-device transfer."""
    got = _python(TUNED_ON_THE_SECOND_DEVICE, XLA_FLAGS=TWO_HOST_DEVICES)
    elsewhere = {name: devices for name, devices in got["places"].items() if devices != [got["second"]]}
    assert not elsewhere, elsewhere


RECORDED: dict[str, set[str]] = {"params": set(), "loss": set()}
"""Where `recording_mlp`'s parameters were made, and the arrays its loss made op by op."""


def recording_mlp(**args: Any) -> JaxWorkload:
    """The built-in mlp, recording in RECORDED where its arrays are made."""
    from autotuner.backends.jax.builtin import mlp

    workload = mlp(**args)
    workload.params = jax.tree.map(jax.numpy.asarray, workload.params)  # made by JAX, as jax.random makes them
    RECORDED["params"].update(str(d) for leaf in jax.tree.leaves(workload.params) for d in leaf.devices())
    loss_fn = workload.loss_fn

    def loss(params: Any, batch: Any) -> jax.Array:
        one = jax.numpy.ones(())
        if not isinstance(one, jax.core.Tracer):
            RECORDED["loss"].update(str(d) for d in one.devices())
        return loss_fn(params, batch) * one

    workload.loss_fn = loss
    return workload


TRIAL_ON_THE_SECOND_DEVICE = """
    import json
    import jax
    from autotuner.backends.jax import process, runner
    from tests.backends import test_jax_gpu_env as here
    from tests.support.helpers import SMALL_MLP, small_request

    second = jax.devices("cpu")[1]
    process.resolve_device = lambda spec: second  # "cuda:1" on a machine with two GPUs
    jax.config.update("jax_transfer_guard_device_to_device", "disallow")
    results = {}
    for jit in ("on", "off"):
        config = {"precision": "fp32", "batch_size": 4, "workers": 1, "jit": jit}
        request = small_request(f"{here.__name__}:recording_mlp", config, SMALL_MLP, heldout_batch=4)
        results[jit] = runner.TRIAL_BACKEND.run(request).losses.heldout
    print(json.dumps({"second": str(second), "recorded": {k: sorted(v) for k, v in here.RECORDED.items()}}))
"""


@pytest.mark.slow
def test_a_trial_keeps_everything_on_its_device() -> None:
    """`run` on the second host device: the workload's parameters are made there, what its loss
    makes op by op too, and its steps (measured, drift, held-out) never move an array between devices."""
    got = _python(TRIAL_ON_THE_SECOND_DEVICE, XLA_FLAGS=TWO_HOST_DEVICES)
    assert got["recorded"] == {"params": [got["second"]], "loss": [got["second"]]}


# ---------------------------------------------------------------- device names


class FakeGpu:
    """What the naming needs of a JAX GPU device: its platform and its CUDA ordinal."""

    platform = "gpu"

    def __init__(self, ordinal: int):
        self.local_hardware_id = ordinal

    def __repr__(self) -> str:
        return f"FakeGpu({self.local_hardware_id})"


def test_a_gpu_keeps_its_cuda_name_when_the_process_sees_only_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A `cuda:1` trial's JAX sees one GPU, CUDA's device 1: it is still `cuda:1`, as the spec and
    the `--jobs` workers name it (and as the probe reports it)."""
    only = FakeGpu(1)
    monkeypatch.setattr(jax_devices, "gpus", lambda: [only])
    assert jax_devices.resolve_device("cuda:1") is only
    assert jax_devices.device_name(only) == "cuda:1"
    with pytest.raises(ValueError, match=r"^device 'cuda:0': "):
        jax_devices.resolve_device("cuda:0")
    every = [FakeGpu(0), FakeGpu(1), FakeGpu(2)]
    monkeypatch.setattr(jax_devices, "gpus", lambda: every)
    assert jax_devices.resolve_device("cuda:2") is every[2] and jax_devices.device_name(every[2]) == "cuda:2"
    assert jax_devices.resolve_device("auto") is every[0] and jax_devices.resolve_device("cuda") is every[0]
    with pytest.raises(ValueError, match=r"^device 'cuda:3': "):
        jax_devices.resolve_device("cuda:3")


class FakeCard(FakeGpu):
    """What a probe asks of a JAX GPU device, on a card of 141 GiB whose allocator may take 75%."""

    device_kind = "NVIDIA H200"
    compute_capability = "9.0"

    def memory_stats(self) -> dict[str, int]:
        return {"bytes_limit": int(0.75 * 141 * 2**30), "bytes_in_use": 0}


def test_a_gpus_memory_is_the_cards_not_its_allocators_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe reports the card's memory as NVML reads it, not the allocator's `bytes_limit`
    (the share the memory fraction lets JAX take); without NVML, no figure rather than that one."""
    card = FakeCard(1)
    board = NvmlGpu(FAST_UUID, watts=400.0, sampled_w=350.0, total_bytes=141 * 2**30)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([board], time.perf_counter))
    monkeypatch.setattr(jax_process, "cuda_uuid", lambda ordinal: FAST_UUID if ordinal == 1 else None)
    monkeypatch.setattr(jax_process, "gpus", lambda: [card])
    monkeypatch.setattr(jax_process, "_start_flag_check", lambda platform: None)
    for works in ("_bf16_works", "_jit_works", "_donation_works"):  # what would run on the device
        monkeypatch.setattr(jax_process, works, lambda device: True)
    environment = runner.TRIAL_BACKEND.environment(card)  # type: ignore[arg-type]
    assert (environment.device, environment.device_name, environment.driver) == ("cuda:1", "NVIDIA H200", "999.99")
    assert environment.memory_mb == 141 * 1024 and environment.energy_counter
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML
    assert runner.TRIAL_BACKEND.environment(card).memory_mb is None  # type: ignore[arg-type]


# ---------------------------------------------------------------- through the trial launcher


def process_setup(arg: dict[str, Any]) -> dict[str, Any]:
    """Run in a trial process: a trial of `arg["request"]`, then what the process's JAX was set up with."""
    from autotuner.backends.jax import runner

    runner.TRIAL_BACKEND.run(arg["request"])
    return {
        "platforms": jax.config.values["jax_platforms"],
        "preallocate": os.environ.get(PREALLOCATE),
        "started": sorted(jax.extend.backend.backends()),
    }


@pytest.mark.slow
def test_probe_and_trials_run_through_the_trial_launcher(launcher: TrialLauncher) -> None:
    mlp = "autotuner.backends.jax.builtin:mlp"
    probed = launcher.call(RUNNER, "probe", ProbeRequest("cpu", mlp, SMALL_MLP), 120)
    assert probed.outcome is Outcome.OK, probed.reason
    assert probed.output.workload_error is None
    environment = probed.output.environment
    assert environment.device == "cpu" and environment.capabilities["jit"] and environment.device_count == 0
    for jit in ("on", "off"):
        request = small_request(mlp, {**JAX_CONFIG, "jit": jit}, SMALL_MLP, heldout_batch=4)
        done = launcher.call(RUNNER, "run", request, 120)
        assert done.outcome is Outcome.OK, done.reason
        assert done.output.throughput.samples_per_s > 0 and len(done.output.losses.trajectory) == 2
    request = small_request(mlp, JAX_CONFIG, SMALL_MLP, heldout_batch=4)
    setup = launcher.call(HERE, "process_setup", {"request": request}, 120)
    assert setup.outcome is Outcome.OK, setup.reason
    assert setup.output == {
        "platforms": "cpu",
        "preallocate": os.environ.get(PREALLOCATE, "false"),
        "started": ["cpu"],
    }
