"""JAX data parallel (`processes: N`, `parallel: data_parallel`): one trial process drives N local
devices, here two host devices its CPU client starts with. What it trains equals one device at
the same global batch (the drift phase's losses), it is measured as one trial, the
`param_sharding` knob places the parameters as it says or is unsupported where it cannot, and a
spec asks for it, or for what JAX cannot do, in one line. A data-parallel study end to end is
tests/e2e/test_jax_data_parallel.py's."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import jax
import numpy as np
import optax
import pytest

from autotuner.backends.jax import JAX, JaxCapabilities
from autotuner.backends.jax import devices as jax_devices
from autotuner.backends.jax.apply import TunedTraining
from autotuner.backends.jax.devices import local_devices
from autotuner.backends.jax.knobs.param_sharding import shard_axis
from autotuner.backends.jax.workload import ArrayDataset, JaxWorkload
from autotuner.errors import SpecError
from autotuner.spec.job import parse_spec
from autotuner.trials.launcher import TrialLauncher
from autotuner.trials.outcomes import Outcome, Unsupported
from autotuner.trials.request import ProbeRequest, TrialRequest
from tests.support.helpers import SMALL_MLP, assert_measured_as_one, small_request
from tests.support.studies import ROOT

RUNNER = "autotuner.backends.jax.runner"
HERE = "tests.backends.test_jax_data_parallel"
MLP = "autotuner.backends.jax.builtin:mlp"
GPT = "autotuner.backends.jax.builtin:gpt"
TINY_GPT = {"vocab": 64, "length": 16, "dim": 32, "layers": 2, "heads": 4, "samples": 128}
CONFIG = {
    "precision": "fp32",
    "batch_size": 8,
    "workers": 0,
    "jit": "off",
    "remat": "none",
    "donate": "off",
    "xla_flags": "default",
    "param_sharding": "replicated",
}


def _drift_request(devices: int, workload: str = MLP, accumulation: int = 1, **config: Any) -> TrialRequest:
    """The drift phase alone (as the reference runs it), global batch 16: on one device, micro-batch
    16; on `devices`, each device's share of it, over `accumulation` micro-batches."""
    arguments = SMALL_MLP if workload == MLP else TINY_GPT
    base = small_request(workload, {**CONFIG, **config}, arguments, measure=False)
    batch_size = 16 // devices // accumulation
    return dataclasses.replace(
        base,
        config={**base.config, "batch_size": batch_size, "accumulation": accumulation},
        global_batch=16,
        drift_steps=4,
        heldout_batch=8,
        processes=devices,
        parallel="data_parallel" if devices > 1 else None,
    )


def _losses(launcher: TrialLauncher, request: TrialRequest) -> tuple[float, list[float]]:
    done = launcher.call(RUNNER, "run", request, 180)
    assert done.outcome is Outcome.OK, done.reason
    assert done.output is not None
    return done.output.losses.heldout, done.output.losses.trajectory


def _assert_same_training(one: tuple[float, list[float]], two: tuple[float, list[float]]) -> None:
    """Equal within fp32 rounding: the loss of each drift step and the held-out loss after them."""
    assert len(two[1]) == len(one[1]) == 4
    for a, b in zip(one[1], two[1], strict=True):
        assert b == pytest.approx(a, rel=1e-5)
    assert two[0] == pytest.approx(one[0], rel=1e-5)


# ---------------------------------------------------------------- the same training as one device


@pytest.mark.slow
@pytest.mark.parametrize(
    ("workload", "jit", "sharding", "accumulation"),
    [
        (MLP, "off", "replicated", 1),  # op by op
        (MLP, "on", "replicated", 1),
        (MLP, "on", "sharded", 2),
        (GPT, "on", "sharded", 1),
    ],
)
def test_two_devices_train_as_one_at_the_same_global_batch(
    launcher: TrialLauncher, workload: str, jit: str, sharding: str, accumulation: int
) -> None:
    """The same samples in the same optimizer steps, each micro-batch split between the devices
    and its loss the mean over all of it: the drift phase's loss trajectory and held-out loss
    equal one device's within fp32 rounding, with the parameters replicated or sharded."""
    one = _losses(launcher, _drift_request(1, workload, jit=jit))
    two = _losses(launcher, _drift_request(2, workload, accumulation, jit=jit, param_sharding=sharding))
    _assert_same_training(one, two)


@pytest.mark.slow
def test_a_two_device_trial_is_measured_as_one(launcher: TrialLauncher) -> None:
    """One process, two devices: global samples per second over its windows, its peak memory, and
    the drift phase after them; prefetch threads put the split micro-batches ahead of the step."""
    trial = small_request(MLP, {**CONFIG, "batch_size": 2, "workers": 1, "jit": "on"}, SMALL_MLP)
    # global batch 8: 2 a device x 2 devices x 2 micro-batches
    config = {**trial.config, "accumulation": 2}
    trial = dataclasses.replace(trial, config=config, processes=2, parallel="data_parallel", heldout_batch=4)
    result = launcher.call(RUNNER, "run", trial, 180)
    assert_measured_as_one(result, trial)
    assert len(result.output.losses.trajectory) == trial.drift_steps
    assert np.isfinite(result.output.losses.heldout)


def devices_of_a_trial(request: TrialRequest) -> dict[str, Any]:
    """Run in a trial process (forked from the fork server, which imported the runner): a trial of
    `request`, then the devices it trained over and those its JAX started with."""
    from autotuner.backends.jax import runner

    runner.TRIAL_BACKEND.run(request)
    return {
        "trained_on": [d.id for d in runner.TRIAL_BACKEND.devices],
        "started_with": [d.id for d in jax.devices()],
    }


@pytest.mark.slow
def test_a_forked_trial_process_starts_jax_with_its_own_count_of_devices(launcher: TrialLauncher) -> None:
    """The fork server imports the runner without starting JAX's backend, so each trial process
    still chooses how many host devices its CPU client starts with."""
    two = launcher.call(HERE, "devices_of_a_trial", _drift_request(2), 180)
    one = launcher.call(HERE, "devices_of_a_trial", _drift_request(1), 180)
    assert two.outcome is Outcome.OK and one.outcome is Outcome.OK, (two.reason, one.reason)
    assert two.output == {"trained_on": [0, 1], "started_with": [0, 1]}
    assert one.output == {"trained_on": [0], "started_with": [0]}


@pytest.mark.slow
def test_importing_the_runners_as_the_fork_server_does_starts_no_jax_backend() -> None:
    got = _python(
        """
        import json
        import autotuner.backends.pytorch.runner, autotuner.backends.jax.runner
        from jax._src import xla_bridge
        print(json.dumps({"started": xla_bridge.backends_are_initialized()}))
        """
    )
    assert got == {"started": False}


# ---------------------------------------------------------------- param_sharding


def test_shard_axis_is_the_largest_the_devices_divide() -> None:
    assert shard_axis((64, 32), 2) == 0 and shard_axis((32, 96), 2) == 1 and shard_axis((3, 8), 2) == 1
    assert shard_axis((32, 32), 2) == 0  # the first of equals
    assert shard_axis((3, 5), 2) is None and shard_axis((), 2) is None and shard_axis((1,), 2) is None
    assert shard_axis((6, 4), 3) == 0 and shard_axis((4, 4), 3) is None


def test_param_sharding_is_a_knob_of_data_parallel_jobs_only() -> None:
    assert "param_sharding" in JAX.knobs and JAX.knobs["param_sharding"].reference == "replicated"
    assert "param_sharding" not in JAX.job_knobs(None)
    assert "param_sharding" in JAX.job_knobs("data_parallel")
    assert JAX.irrelevant("param_sharding", "sharded", JaxCapabilities()) == (
        "param_sharding=sharded: a knob of parallel: data_parallel (a trial over several devices)"
    )
    assert JAX.irrelevant("param_sharding", "sharded", JaxCapabilities(data_parallel=True)) is None
    config = {**CONFIG, "accumulation": 1, "param_sharding": "sharded"}
    assert JAX.unsupported_reason(config, JaxCapabilities()) is not None
    assert JAX.unsupported_reason(config, JaxCapabilities(data_parallel=True)) is None
    # the less memory first: an out-of-memory sharded trial rules out replicated
    assert JAX.knobs["param_sharding"].memory_order == ("sharded", "replicated")


def test_sharded_parameters_on_one_device_are_unsupported() -> None:
    params = {"w": np.zeros((4, 2), np.float32)}
    with pytest.raises(Unsupported, match=r"^param_sharding=sharded: it splits the parameters between devices"):
        TunedTraining(
            {**CONFIG, "accumulation": 1, "param_sharding": "sharded"},
            lambda p, b: (p["w"] * 0).sum(),
            optax.sgd(0.1),
            device="cpu",
            params=params,
        )


def odd_linear(**_: Any) -> JaxWorkload:
    """A linear model none of whose parameters has an even axis: sharded over two devices, nothing splits."""
    rng = np.random.default_rng(0)
    inputs = rng.standard_normal((64, 3), dtype=np.float32)
    labels = rng.integers(0, 5, 64).astype(np.int32)

    def loss_fn(params: Any, batch: Any) -> jax.Array:
        x, y = batch
        return optax.softmax_cross_entropy_with_integer_labels(x @ params["w"] + params["b"], y).mean()

    params = {"w": rng.standard_normal((3, 5), dtype=np.float32), "b": np.zeros(5, np.float32)}
    return JaxWorkload(params, loss_fn, optax.sgd(0.1), ArrayDataset(inputs, labels))


def test_sharded_parameters_that_no_axis_divides_are_unsupported(launcher: TrialLauncher) -> None:
    trial = _drift_request(2, param_sharding="sharded")
    trial = dataclasses.replace(trial, workload=f"{HERE}:odd_linear", workload_args={})
    done = launcher.call(RUNNER, "run", trial, 180)
    assert done.outcome is Outcome.UNSUPPORTED, done.reason
    assert done.reason == (
        "param_sharding=sharded: no parameter has an axis 2 devices divide, so every one would stay whole on "
        "every device"
    )


PLACEMENTS = """
    import json
    import jax, numpy as np
    jax.config.update("jax_num_cpu_devices", 2)
    from autotuner.backends.jax.apply import TunedTraining
    from autotuner.backends.jax.builtin import gpt
    np.random.seed(0)
    w = gpt(vocab=64, length=16, dim=32, layers=1, heads=4, samples=32)
    w.params["odd"] = np.zeros(3, np.float32)  # no axis two devices divide: whole on both
    loss_fn = w.loss_fn
    w.loss_fn = lambda params, batch: loss_fn(params, batch) + params["odd"].sum()
    got = {}
    for sharding in ("replicated", "sharded"):
        config = {"precision": "fp32", "batch_size": 2, "accumulation": 1, "workers": 0, "jit": "on",
                  "param_sharding": sharding}
        tuned = TunedTraining(config, w.loss_fn, w.optimizer, w.dataset, device="cpu", params=w.params, devices=2)
        batch = tuned.to_device(next(iter(tuned.loader)))
        with tuned.autocast():
            loss, grads = tuned.model(tuned.params, batch)
        tuned.backward(grads)
        tuned.step()
        spec = lambda leaf: "/".join(str(axis) for axis in leaf.sharding.spec) or "whole"
        specs = lambda tree: {spec(leaf) for leaf in jax.tree.leaves(tree)}
        got[sharding] = {
            "token": spec(tuned.params["token"]),
            "odd": spec(tuned.params["odd"]),
            "params": sorted(specs(tuned.params)),
            "grads": sorted(specs(grads)),
            "state": sorted(specs(tuned.opt_state)),
            "batch": [spec(batch[0]), list(batch[0].shape)],
            "whole": spec(tuned.to_device(np.zeros((3, 2)), whole=True)),
            "devices": len(tuned.params["token"].sharding.device_set),
            "global_batch": tuned.global_batch,
        }
    print(json.dumps(got))
"""


@pytest.mark.slow
def test_the_batch_is_split_and_the_parameters_placed_as_the_knob_says() -> None:
    got = _python(PLACEMENTS)
    for placed in got.values():  # a micro-batch of 2 a device, split along its first axis
        assert placed["batch"] == ["data", [4, 16]] and placed["whole"] == "whole"
        assert placed["devices"] == 2 and placed["global_batch"] == 4
    assert got["replicated"]["params"] == got["replicated"]["grads"] == got["replicated"]["state"] == ["whole"]
    sharded = got["sharded"]
    assert sharded["token"] == "data" and sharded["odd"] == "whole"  # (64, 32); (3,)
    assert "None/data" in sharded["params"]  # the qkv weight, (32, 96): its larger axis is the second
    assert sharded["grads"] == sharded["params"]  # reduce-scattered, placed as the parameters are
    assert set(sharded["params"]) <= set(sharded["state"])  # Adam's moments too; its step count whole


# ---------------------------------------------------------------- the devices of a process


CONFIGURE = """
    import json, os
    import jax
    from autotuner.backends.jax.devices import configure_process
    configure_process({spec!r}, {devices!r})
    print(json.dumps({{
        "visible": jax.config.values["jax_cuda_visible_devices"],
        "cpu_devices": len(jax.devices("cpu")),
        "stuck_wait": "--xla_cpu_collective_call_terminate_timeout_seconds=3600" in os.environ.get("XLA_FLAGS", ""),
    }}))
"""


@pytest.mark.parametrize(
    ("spec", "devices", "visible", "cpu_devices"),
    [
        ("cpu", 2, "all", 2),
        ("cpu", 1, "all", 1),
        ("auto", 3, "all", 3),
        ("cuda:1", 2, "1,2", 1),  # GPUs 1 and 2 only (this CPU-only jaxlib starts its CPU)
        ("cuda", 2, "0,1", 1),
        ("cuda:1", None, "all", 1),  # a data-parallel job's probe: every GPU, to count them
    ],
)
def test_a_process_opens_the_devices_it_drives(spec: str, devices: int | None, visible: str, cpu_devices: int) -> None:
    """And host devices' collectives wait as long as the trial does, not XLA's 40 s (a flag this
    XLA knows: one it did not would abort the process)."""
    got = _python(CONFIGURE.format(spec=spec, devices=devices))
    assert got == {"visible": visible, "cpu_devices": cpu_devices, "stuck_wait": cpu_devices > 1}


class FakeGpu:
    """What the device choice needs of a JAX GPU: its platform and its CUDA ordinal."""

    platform = "gpu"

    def __init__(self, ordinal: int):
        self.local_hardware_id = ordinal


def test_data_parallel_gpus_are_the_trials_and_the_next_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    every = [FakeGpu(0), FakeGpu(1), FakeGpu(2)]
    monkeypatch.setattr(jax_devices, "gpus", lambda: every)
    assert local_devices(every[1], 2) == every[1:]  # type: ignore[arg-type]
    assert local_devices(every[0], 3) == every  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^data parallel over 2 GPUs from cuda:2 needs cuda:2 to cuda:3; JAX sees"):
        local_devices(every[2], 2)  # type: ignore[arg-type]


def test_too_few_host_devices_say_how_to_start_more() -> None:
    first = jax.devices("cpu")[0]
    count = len(jax.devices("cpu")) + 1
    with pytest.raises(ValueError, match=rf"^data parallel over {count} devices: .*jax_num_cpu_devices"):
        local_devices(first, count)


@pytest.mark.slow
def test_a_data_parallel_probe_says_so_in_its_capabilities(launcher: TrialLauncher) -> None:
    probed = launcher.call(RUNNER, "probe", ProbeRequest("cpu", MLP, SMALL_MLP, 16, "data_parallel"), 120)
    assert probed.outcome is Outcome.OK, probed.reason
    assert probed.output is not None and probed.output.environment.capabilities["data_parallel"] is True
    single = launcher.call(RUNNER, "probe", ProbeRequest("cpu", MLP, SMALL_MLP, 16), 120)
    assert single.output is not None and single.output.environment.capabilities["data_parallel"] is False


# ---------------------------------------------------------------- specs


SPEC = {"name": "dp", "backend": "jax", "workload": "builtin:mlp", "global_batch": 32, "device": "cpu"}


def test_a_jax_spec_with_two_processes_trains_data_parallel() -> None:
    job = parse_spec({**SPEC, "processes": 2}, "job.yaml")
    assert job.parallel == "data_parallel" and job.rank_batch == 16
    assert job.space["param_sharding"] == ("replicated", "sharded")  # the jax preset searches it
    assert job.baseline["param_sharding"] == "replicated" and job.baseline["batch_size"] == 16
    config = job.complete({"batch_size": 4})
    assert config["accumulation"] == 4  # 4 a device x 4 micro-batches x 2 devices = 32
    request = job.trial_request(config, "cpu")
    assert request.processes == 2 and request.parallel == "data_parallel" and request.global_batch == 32
    assert job.reference_config()["param_sharding"] == "replicated"
    named = parse_spec(
        {**SPEC, "processes": 2, "parallel": "data_parallel", "space": {"param_sharding": ["replicated", "sharded"]}},
        "job.yaml",
    )
    assert named.parallel == "data_parallel" and named.space["param_sharding"] == ("replicated", "sharded")


def test_a_one_device_jax_spec_has_no_param_sharding() -> None:
    job = parse_spec(SPEC, "job.yaml")
    assert job.parallel is None and "param_sharding" not in job.space and "param_sharding" not in job.baseline
    with pytest.raises(SpecError) as caught:
        parse_spec({**SPEC, "space": {"param_sharding": ["sharded"]}}, "job.yaml")
    assert str(caught.value).endswith(
        "space.param_sharding: param_sharding is a knob of parallel: data_parallel, with processes: 2 or more"
    )


@pytest.mark.parametrize(
    ("extra", "key", "says"),
    [
        (
            {"processes": 2, "parallel": "ddp"},
            "parallel",
            "ddp is not a way the jax backend trains; choose between data_parallel",
        ),
        ({"parallel": "data_parallel"}, "parallel", "parallel: data_parallel trains several processes together"),
        ({"processes": 3}, "processes", "global_batch (32) is not a multiple of processes (3)"),
    ],
)
def test_what_jax_cannot_run_in_parallel_is_one_line(extra: dict[str, Any], key: str, says: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec({**SPEC, **extra}, "job.yaml")
    message = str(caught.value)
    assert "\n" not in message and caught.value.key == key and says in message, message


def test_data_parallel_is_not_a_pytorch_way() -> None:
    spec = {**SPEC, "backend": "pytorch", "processes": 2, "parallel": "data_parallel"}
    with pytest.raises(SpecError, match="data_parallel is not a way the pytorch backend trains; choose between ddp"):
        parse_spec(spec, "job.yaml")


# ---------------------------------------------------------------- helpers


def _python(code: str, **env: str) -> dict[str, Any]:
    """Run `code` in a fresh Python (no JAX or XLA settings of ours inherited, `env` added) and
    return the JSON it prints last: JAX reads its platforms and devices once, when it starts."""
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
