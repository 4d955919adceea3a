"""What the JAX backend adds beyond the shared contract (`tests/backends/test_contract.py`): specs
naming it (its presets, YAML's bare on/off, a Python without jax), its built-in workloads against
their PyTorch twins, its prefetching loader, and a config's later processes loading what its
first compiled. A JAX study end to end is tests/e2e/test_jax_backend.py's. CPU only, real jax
and torch."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
import torch
import yaml

from autotuner.backends.jax import JAX
from autotuner.backends.jax.apply import TunedTraining
from autotuner.backends.jax.workload import ArrayDataset, JaxWorkload, as_workload
from autotuner.errors import SpecError
from autotuner.spec.job import TRIAL_TIMEOUT_S, load_spec
from autotuner.trials.launcher import TrialLauncher
from autotuner.trials.outcomes import Outcome
from tests.support.helpers import ROOT
from tests.support.studies import JAX_SPEC, _write

# ---------------------------------------------------------------- specs


def test_the_jax_quickstart_spec_uses_the_jax_knobs_and_presets() -> None:
    job = load_spec(ROOT / "studies" / "quickstart-jax.yaml")
    assert job.backend is JAX
    assert set(job.space) == set(JAX.knobs) - {"accumulation", "param_sharding"}  # one device: nothing to shard
    assert job.space["jit"] == ("off", "on") and "tf32" not in job.space["precision"]
    assert job.space["remat"] == ("none",) and job.space["donate"] == ("off",)  # jax-cpu holds them at reference
    strict = {"remat": "none", "donate": "off", "xla_flags": "default"}
    assert job.baseline == {"precision": "fp32", "batch_size": 16, "workers": 0, "jit": "off", **strict}
    assert job.reference_config() == {
        "precision": "fp32",
        "batch_size": 16,
        "workers": 0,
        "jit": "on",  # the reference runs jitted, strict fp32 all the same: the baseline stays op by op
        **strict,
        "accumulation": 16,
    }


def test_a_jax_spec_gets_the_jax_preset_by_default(tmp_path: Path) -> None:
    minimal = {"name": "job", "backend": "jax", "workload": "builtin:gpt", "global_batch": 64}
    job = load_spec(_write(tmp_path, {**minimal, "name": "job"}))
    assert job.space["precision"] == ("fp32", "tf32", "bf16") and job.space["jit"] == ("off", "on")
    assert job.workload_path() == "autotuner.backends.jax.builtin:gpt"


@pytest.mark.parametrize(
    ("text", "key", "fragment"),
    [
        ("baseline: {jit: off}", "baseline.jit", "quote it"),
        ("space: {jit: [on, off]}", "space.jit", "quote it"),
        ("baseline: {compile: none}", "baseline.compile", "jax backend has no knob"),
        ("workload: builtin:cnn", "workload", "builtin:mlp, builtin:gpt"),
        ("baseline: {precision: fp16}", "baseline.precision", "fp32, tf32, bf16"),
    ],
)
def test_bad_jax_specs_are_one_line(tmp_path: Path, text: str, key: str, fragment: str) -> None:
    base = {"name": "job", "backend": "jax", "workload": "builtin:mlp", "global_batch": 64}
    data = {**base, **yaml.safe_load(text)}
    with pytest.raises(SpecError) as caught:
        load_spec(_write(tmp_path, data))
    message = str(caught.value)
    assert "\n" not in message and caught.value.key == key and fragment in message, message


WITHOUT_JAX = """
import sys
sys.modules["jax"] = None  # what `import jax` finds in a Python without it
from autotuner.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_jax_spec_in_a_python_without_jax_is_one_line_and_exit_2(tmp_path: Path) -> None:
    spec = _write(tmp_path, JAX_SPEC)
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_JAX, "search", "--spec", str(spec)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == (
        f"autotuner: error: {spec}: backend: "
        "the jax backend needs jax, not installed here: pip install 'autotuner[jax]'\n"
    )
    assert not (tmp_path / "runs").exists(), "nothing is stored"


# ---------------------------------------------------------------- the built-ins and the factory contract


def test_the_builtin_workloads_are_the_twins_of_the_pytorch_ones() -> None:
    from autotuner.backends.jax import builtin as workloads
    from autotuner.backends.pytorch import builtin as torch_workloads

    np.random.seed(0)
    tiny_gpt = {"vocab": 32, "length": 16, "dim": 16, "layers": 2, "heads": 2, "samples": 64}
    for name, args in (("mlp", {"features": 16, "hidden": 32, "depth": 2, "samples": 64}), ("gpt", tiny_gpt)):
        ours = as_workload(getattr(workloads, name)(**args), name)
        theirs = getattr(torch_workloads, name)(**args)
        params = sum(leaf.size for leaf in jax.tree.leaves(ours.params))
        assert params == sum(p.numel() for p in theirs.model.parameters()), name
        assert len(ours.dataset) == len(theirs.dataset) and len(ours.heldout) == len(theirs.heldout)
        for mine, torch_item in zip(ours.dataset[0], theirs.dataset[0], strict=True):
            assert mine.shape == tuple(torch_item.shape), name
        assert (ours.tokens_per_sample, ours.flops_per_sample) == (theirs.tokens_per_sample, theirs.flops_per_sample)
    assert ours.flops_per_sample is not None and ours.flops_per_sample > 0


def test_the_mlp_twins_compute_the_same_function() -> None:
    from autotuner.backends.jax import builtin as workloads
    from autotuner.backends.pytorch import builtin as torch_workloads

    args = {"features": 16, "hidden": 32, "depth": 2, "samples": 64}
    np.random.seed(0)
    ours = as_workload(workloads.mlp(**args), "mlp")
    theirs = torch_workloads.mlp(**args)
    linears = [m for m in theirs.model if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        for layer, linear in zip(ours.params, linears, strict=True):
            linear.weight.copy_(torch.from_numpy(np.asarray(layer["w"]).T))
            linear.bias.copy_(torch.from_numpy(np.asarray(layer["b"])))
        inputs = theirs.dataset[:8][0]
        expected = theirs.model(inputs).numpy()
    np.testing.assert_allclose(workloads.mlp_apply(ours.params, inputs.numpy()), expected, rtol=1e-5, atol=1e-6)


def test_the_parameters_follow_the_trial_seed_and_the_data_do_not() -> None:
    from autotuner.backends.jax.builtin import mlp

    def build(seed: int) -> JaxWorkload:
        np.random.seed(seed)
        return mlp(features=8, hidden=8, depth=1, samples=32)

    a, b, c = build(0), build(0), build(1)
    assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True))
    assert not np.array_equal(a.params[0]["w"], c.params[0]["w"])
    assert np.array_equal(a.dataset.arrays[0], c.dataset.arrays[0])


def test_as_workload_says_what_is_wrong() -> None:
    good = JaxWorkload(
        {"w": np.ones(2, np.float32)}, lambda p, b: p["w"].sum(), optax.sgd(0.1), ArrayDataset(np.ones(4))
    )
    assert as_workload(good, "x:y") is good
    assert isinstance(as_workload(tuple(vars(good).values())[:4], "x:y"), JaxWorkload)
    with pytest.raises(TypeError, match="optax GradientTransformation"):
        as_workload(JaxWorkload(good.params, good.loss_fn, "adam", good.dataset), "x:y")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="pytree of float arrays"):
        as_workload(JaxWorkload({"w": np.ones(2, np.int32)}, good.loss_fn, good.optimizer, good.dataset), "x:y")
    with pytest.raises(TypeError, match="map-style"):
        as_workload(JaxWorkload(good.params, good.loss_fn, good.optimizer, iter([1])), "x:y")
    with pytest.raises(ValueError, match="different lengths"):
        ArrayDataset(np.ones(3), np.ones(4))


def test_prefetch_workers_put_the_batches_on_the_device_ahead() -> None:
    config = {"precision": "fp32", "batch_size": 4, "accumulation": 1, "jit": "off"}
    dataset = ArrayDataset(np.arange(40, dtype=np.float32).reshape(20, 2), np.arange(20))
    params = {"w": np.ones(2, np.float32)}
    prefetching = TunedTraining(
        {**config, "workers": 2}, lambda p, b: p["w"].sum(), optax.sgd(0.1), dataset, params=params
    )
    batches = list(prefetching.loader)
    assert all(isinstance(leaf, jax.Array) and leaf.devices() == {prefetching.device} for b in batches for leaf in b)
    assert sorted(int(v) for b in batches for v in b[1]) == list(range(20))
    plain = TunedTraining({**config, "workers": 0}, lambda p, b: p["w"].sum(), optax.sgd(0.1), dataset, params=params)
    assert all(isinstance(leaf, np.ndarray) for b in plain.loader for leaf in b)
    left_early = iter(prefetching.loader)
    next(left_early)
    left_early.close()  # an epoch abandoned midway drops what was prefetched for it
    assert [len(b[1]) for b in prefetching.loader] == [4] * 5


def test_step_before_backward_is_refused() -> None:
    tuned = TunedTraining(
        {"precision": "fp32", "batch_size": 4, "accumulation": 1, "workers": 0, "jit": "off"},
        lambda p, b: p["w"].sum(),
        optax.sgd(0.1),
        params={"w": np.ones(2, np.float32)},
    )
    with pytest.raises(RuntimeError, match="backward"):
        tuned.step()


@pytest.mark.slow
def test_a_jax_configs_later_processes_load_its_executables_from_the_studys_cache(tmp_path: Path) -> None:
    """Two trial processes of one config with the study's compile cache: the first compiles every
    executable (op by op: each primitive), the second loads them all; the same numerics."""
    job = load_spec(_write(tmp_path, JAX_SPEC))
    launcher = TrialLauncher([job.backend.runner])
    cache = tmp_path / "cache"
    for jit in ("off", "on"):
        config = job.complete({**job.baseline, "jit": jit})
        compiled = dataclasses.replace(job.trial_request(config, "cpu"), compile_cache=str(cache / jit))
        first, second = (launcher.call(job.backend.runner, "run", compiled, 120) for _ in range(2))
        assert first.outcome is Outcome.OK and second.outcome is Outcome.OK, (first.reason, second.reason)
        assert (first.output.compile_cache, second.output.compile_cache) == ("cold", "warm"), jit
        assert any((cache / jit / "jax").iterdir())
        assert first.output.losses.heldout == second.output.losses.heldout  # the same executables
    uncached = dataclasses.replace(job.trial_request(config, "cpu"), compile_cache=None)
    unused = launcher.call(job.backend.runner, "run", uncached, 120)
    assert unused.outcome is Outcome.OK and unused.output.compile_cache is None  # no study cache: nothing said


# ---------------------------------------------------------------- the reference

TINY_GPT = {"vocab": 64, "length": 16, "dim": 32, "layers": 2, "heads": 4, "samples": 128}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("workload", "arguments"),
    [("builtin:mlp", JAX_SPEC["workload_args"]), ("builtin:gpt", TINY_GPT)],
)
def test_the_jax_reference_runs_jitted_and_trains_as_op_by_op(
    launcher: TrialLauncher, tmp_path: Path, workload: str, arguments: dict[str, int]
) -> None:
    """The reference is jitted (one compile, not one for every primitive) with everything else at
    its strictest: strict fp32 matmuls make the jitted step train as the op-by-op one, to rounding.
    The jit knob's reference value, the baseline's default, stays op by op."""
    spec = {**JAX_SPEC, "workload": workload, "workload_args": arguments, "baseline": {"batch_size": 8}}
    job = load_spec(_write(tmp_path, spec))
    assert job.baseline["jit"] == "off" and JAX.knobs["jit"].reference == "off"
    reference = job.reference_config()
    assert reference == {
        "precision": "fp32",
        "batch_size": 8,
        "workers": 0,
        "jit": "on",
        "remat": "none",
        "donate": "off",
        "xla_flags": "default",
        "accumulation": 4,
    }
    untimed = {**spec, "trial": {k: v for k, v in JAX_SPEC["trial"].items() if k != "timeout"}}
    assert load_spec(_write(tmp_path, untimed)).trial_timeout() == TRIAL_TIMEOUT_S  # jit has no timeout factor
    losses = {}
    for jit in ("on", "off"):
        request = job.trial_request({**reference, "jit": jit}, "cpu", measure=False)
        result = launcher.call(job.backend.runner, "run", request, 120)
        assert result.outcome is Outcome.OK, result.reason
        losses[jit] = result.output.losses
    jitted, op_by_op = losses["on"], losses["off"]
    assert jitted.heldout == pytest.approx(op_by_op.heldout, rel=1e-5)
    assert jitted.trajectory == pytest.approx(op_by_op.trajectory, rel=1e-5)


def test_the_probe_traces_the_first_batchs_loss_and_runs_one_that_reads_its_values() -> None:
    """The probe's check traces the loss abstractly (no primitive compiled): a shape error is
    told as running it tells it; a loss whose Python reads a value (not traceable so) is run."""
    from autotuner.backends.jax.workload import first_batch_problem

    data = ArrayDataset(np.ones((8, 4), np.float32), np.zeros(8, np.int32))
    params = {"w": jax.numpy.ones((4, 3))}

    def loss(p: dict, batch: tuple) -> jax.Array:
        return jax.numpy.mean(batch[0] @ p["w"])

    def reads_its_value(p: dict, batch: tuple) -> jax.Array:
        value = loss(p, batch)
        return value if float(value) > 0 else -value  # Python on a value: not traceable abstractly

    def wrong(p: dict, batch: tuple) -> jax.Array:
        return jax.numpy.mean(batch[0] @ p["w"].T)

    def workload(loss_fn: object) -> JaxWorkload:
        return JaxWorkload(params=params, loss_fn=loss_fn, optimizer=optax.sgd(0.1), dataset=data)  # type: ignore[arg-type]

    assert first_batch_problem(workload(loss), 2) is None
    assert first_batch_problem(workload(reads_its_value), 2) is None
    problem = first_batch_problem(workload(wrong), 2)
    assert problem is not None and problem.startswith("loss_fn fails on the first batch: TypeError: dot_general")
