"""The JAX backend's own knobs beyond jit: `remat`, `donate` and `xla_flags`.

What each value does in `TunedTraining` (remat recomputes without changing the loss or the
gradients, donation leaves the loop and the caller's arrays working, a flag bundle reaches the
trial process's XLA_FLAGS before JAX starts, and a process whose JAX started without it is
refused), what the engine records unsupported and why, and what the probe finds. A small study
over them is tests/e2e/test_jax_knobs.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from autotuner.backends._base import Capabilities
from autotuner.backends.builtin_sizes import MlpSize
from autotuner.backends.jax import JAX, XLA_FLAG_BUNDLES, FlagBundle, JaxCapabilities
from autotuner.backends.jax.apply import TunedTraining
from autotuner.backends.jax.builtin import gpt, mlp
from autotuner.backends.jax.process import _flags_known, _start_flag_check
from autotuner.backends.jax.workload import JaxWorkload, remat_block, remat_scope
from autotuner.search_spaces import load_preset
from autotuner.trials.launcher import TrialLauncher
from autotuner.trials.outcomes import Outcome
from autotuner.trials.request import ProbeRequest
from tests.support.helpers import CPU_BUNDLE, TINY_MLP, small_request
from tests.support.studies import ROOT

HERE = "tests.backends.test_jax_knobs"
RUNNER = "autotuner.backends.jax.runner"
BASE = {
    "precision": "fp32",
    "batch_size": 8,
    "accumulation": 1,
    "workers": 0,
    "jit": "on",
    "remat": "none",
    "donate": "off",
    "xla_flags": "default",
}
TINY_GPT = {"vocab": 64, "length": 16, "dim": 32, "layers": 2, "heads": 4, "samples": 64}
GPU_BUNDLE = "gpu-cublas-gemm"


def _workload(name: str) -> JaxWorkload:
    np.random.seed(0)
    return gpt(**TINY_GPT) if name == "gpt" else mlp(**TINY_MLP)


def _tuned(workload: JaxWorkload, params: Any = None, **config: Any) -> TunedTraining:
    return TunedTraining(
        {**BASE, **config},
        workload.loss_fn,
        workload.optimizer,
        device="cpu",
        params=workload.params if params is None else params,
    )


def _loss_and_grads(tuned: TunedTraining, batch: Any) -> tuple[float, Any]:
    with tuned.autocast():
        loss, grads = tuned.model(tuned.params, tuned.to_device(batch))
    return float(loss), grads


# ---------------------------------------------------------------- the knobs, the presets, unsupported


def test_the_knobs_are_the_backends_with_the_strict_value_as_reference() -> None:
    assert {name: JAX.knobs[name].reference for name in ("remat", "donate", "xla_flags")} == {
        "remat": "none",
        "donate": "off",
        "xla_flags": "default",
    }
    assert XLA_FLAG_BUNDLES["default"].flags == ()
    assert all(b.flags and b.platform in ("gpu", "cpu") for n, b in XLA_FLAG_BUNDLES.items() if n != "default")
    gpu_preset, cpu_preset = load_preset("jax"), load_preset("jax-cpu")
    assert gpu_preset["remat"] == list(JAX.knobs["remat"].choices or ())
    assert gpu_preset["donate"] == ["off", "on"] and gpu_preset["xla_flags"] == list(XLA_FLAG_BUNDLES)
    assert not {"remat", "donate", "xla_flags"} & set(cpu_preset)  # none paid on a CPU: see its comment


CPU = JaxCapabilities(accelerator=False, bf16=True, jit=True, donate=True, xla_flags=True, remat_blocks=True)
GPU = JaxCapabilities(accelerator=True, bf16=True, tf32=True, jit=True, donate=True, xla_flags=True, remat_blocks=True)


@pytest.mark.parametrize(
    ("capabilities", "config", "reason"),
    [
        (CPU, {"xla_flags": GPU_BUNDLE}, f"xla_flags={GPU_BUNDLE}: its flags are XLA:GPU's, and this device is a CPU"),
        (GPU, {"xla_flags": CPU_BUNDLE}, f"xla_flags={CPU_BUNDLE}: its flags are XLA:CPU's, and this device is a GPU"),
        (
            JaxCapabilities(accelerator=True, jit=True, donate=True, xla_flags=False),
            {"xla_flags": GPU_BUNDLE},
            f"xla_flags={GPU_BUNDLE}: this jaxlib does not know every flag of the GPU bundles",
        ),
        (
            CPU,
            {"jit": "off", "donate": "on"},
            "donate=on needs jit=on: only a jitted update takes over the donated buffers",
        ),
        (
            JaxCapabilities(jit=True, donate=False, xla_flags=True),
            {"donate": "on"},
            "donate=on: XLA cannot donate buffers on this device",
        ),
        (Capabilities(), {"donate": "on"}, "jit=on: XLA cannot compile a function here"),
        (
            JaxCapabilities(jit=True, donate=True, xla_flags=True, remat_blocks=False),
            {"remat": "full"},
            "remat=full: the loss marks no remat_block, and checkpointed whole it keeps as much memory as none",
        ),
    ],
)
def test_what_a_device_cannot_honour_is_unsupported_with_its_reason(
    capabilities: Capabilities, config: dict[str, Any], reason: str
) -> None:
    assert JAX.unsupported_reason({**BASE, **config}, capabilities) == reason


def test_every_reference_value_and_every_bundle_of_the_device_is_supported() -> None:
    for capabilities, platform in ((CPU, "cpu"), (GPU, "gpu")):
        for name, bundle in XLA_FLAG_BUNDLES.items():
            if bundle.platform in (None, platform):
                assert JAX.unsupported_reason({**BASE, "xla_flags": name}, capabilities) is None
        for remat in JAX.knobs["remat"].choices or ():
            assert JAX.unsupported_reason({**BASE, "remat": remat, "donate": "on"}, capabilities) is None
    # a value the device cannot use anywhere is one the space can drop before the first trial
    assert JAX.irrelevant("xla_flags", GPU_BUNDLE, CPU) and JAX.irrelevant("xla_flags", "default", CPU) is None
    assert JAX.irrelevant("remat", "dots_saveable", Capabilities()) is None  # checkpointed whole, it keeps less


# ---------------------------------------------------------------- remat


@pytest.mark.slow
@pytest.mark.parametrize("jit", ["on", "off"])
@pytest.mark.parametrize("name", ["gpt", "mlp"])
def test_remat_gives_the_loss_and_gradients_of_none(name: str, jit: str) -> None:
    """Recomputing is computing the same again: the same loss and gradients up to float
    reassociation, whether the loss marks blocks (gpt) or is checkpointed whole (mlp)."""
    workload = _workload(name)
    batch = workload.dataset[np.arange(8)]
    loss, grads = _loss_and_grads(_tuned(workload, jit=jit), batch)
    for remat in ("full", "dots_saveable", "dots_with_no_batch_dims_saveable"):
        remat_loss, remat_grads = _loss_and_grads(_tuned(workload, jit=jit, remat=remat), batch)
        assert remat_loss == pytest.approx(loss, rel=1e-6), remat
        for ours, theirs in zip(jax.tree.leaves(remat_grads), jax.tree.leaves(grads), strict=True):
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-7, err_msg=remat)


def _checkpoints(jaxpr: Any) -> int:
    """`jax.checkpoint` calls in a jaxpr, its sub-jaxprs' included."""
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.primitive.name in ("checkpoint", "remat", "remat2")
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", param)
            if hasattr(inner, "eqns"):
                count += _checkpoints(inner)
    return count


@pytest.mark.parametrize(("name", "checkpoints"), [("gpt", TINY_GPT["layers"]), ("mlp", 1)])
def test_remat_checkpoints_each_marked_block_or_else_the_whole_loss(name: str, checkpoints: int) -> None:
    workload = _workload(name)
    batch = jax.device_put(workload.dataset[np.arange(8)])
    for remat, expected in (("none", 0), ("full", checkpoints)):
        tuned = _tuned(workload, jit="off", remat=remat)
        assert _checkpoints(jax.make_jaxpr(workload.loss_fn)(tuned.params, batch).jaxpr) == 0  # the user's, as it is
        traced = jax.make_jaxpr(tuned.model)(tuned.params, batch)
        assert _checkpoints(traced.jaxpr) == expected, remat
        assert tuned.remat == remat


@pytest.mark.slow
def test_remat_recomputes_what_its_policy_does_not_keep() -> None:
    """XLA's cost analysis of the jitted gradient: every policy adds FLOPs (the recomputation),
    saving nothing adds the most."""
    workload = _workload("gpt")
    batch = jax.device_put(workload.dataset[np.arange(8)])

    def flops(remat: str) -> float:
        tuned = _tuned(workload, remat=remat)
        costs = jax.jit(tuned.model).lower(tuned.params, batch).compile().cost_analysis()
        costs = costs[0] if isinstance(costs, list) else costs  # one entry per computation in older jax
        assert costs is not None
        return float(costs["flops"])

    none, full = flops("none"), flops("full")
    assert none < flops("dots_saveable") <= full and none < flops("dots_with_no_batch_dims_saveable") <= full


@pytest.mark.parametrize("name", ["gpt", "mlp"])
def test_the_counted_flops_are_the_models_whatever_the_remat(name: str) -> None:
    """Counted without the recomputation, every remat value gets the model FLOPs of none: those of
    the matmuls alone (the elementwise operations XLA's cost analysis adds are not in them), and a
    checkpointed mlp (the whole loss) alike."""
    from autotuner.backends.jax.runner import TRIAL_BACKEND

    workload = _workload(name)
    counted = {
        remat: TRIAL_BACKEND.flops_per_sample(workload, _tuned(workload, remat=remat))
        for remat in ("none", "full", "dots_saveable")
    }
    assert counted["none"] and counted["full"] == counted["none"] == counted["dots_saveable"]
    if name == "mlp":  # the three matmuls of each layer (forward, both gradients), the first's input gradient unused
        size = MlpSize(**TINY_MLP)
        widths = [size.features] + [size.hidden] * size.depth + [size.classes]
        layers = [a * b for a, b in zip(widths, widths[1:], strict=False)]
        assert counted["none"] == 6 * sum(layers) - 2 * layers[0]


def test_the_flop_count_takes_only_matmuls_and_convolutions_and_what_loops_repeat() -> None:
    from autotuner.backends.jax.runner import dot_flops

    def f(x: jax.Array, w: jax.Array, k: jax.Array) -> jax.Array:
        y = jnp.tanh(x @ w) * 3.0  # 2*4*8*16 for the matmul, nothing for the rest
        image = jax.lax.conv_general_dilated(
            y[None, None], k, (1, 1), "VALID"
        )  # 1x(4-2+1)x(16-2+1) outputs, 2x2 kernel
        z = jax.lax.scan(lambda c, _: (c @ w @ w.T, None), x, None, length=3)[0]  # 3 x (2*4*8*16 + 2*4*16*8)
        return image.sum() + z.sum()

    x, w, k = jnp.ones((4, 8)), jnp.ones((8, 16)), jnp.ones((1, 1, 2, 2))
    expected = 2 * 4 * 8 * 16 + 2 * (3 * 15) * 4 + 3 * 2 * (2 * 4 * 16 * 8)
    assert dot_flops(jax.make_jaxpr(jax.jit(f))(x, w, k).jaxpr) == expected


def test_a_remat_block_outside_a_tuned_loss_is_the_function_itself() -> None:
    def layer(x: jax.Array, scale: float) -> jax.Array:
        return jnp.tanh(x * scale)

    block = remat_block(layer, static_argnums=(1,))
    x = jnp.arange(4.0)
    assert block(x, 2.0).tolist() == layer(x, 2.0).tolist()
    assert _checkpoints(jax.make_jaxpr(block, static_argnums=1)(x, 2.0).jaxpr) == 0
    with remat_scope("full") as scope:
        assert _checkpoints(jax.make_jaxpr(block, static_argnums=1)(x, 2.0).jaxpr) == 1
    assert scope.marked


# ---------------------------------------------------------------- donate


def _train(tuned: TunedTraining, dataset: Any, steps: int) -> list[float]:
    """The mean loss of each of `steps` optimizer steps over `dataset`'s micro-batches, in one seeded order."""
    losses: list[float] = []
    batches = iter(tuned.make_loader(dataset, seed=0))
    while len(losses) < steps:
        total = 0.0
        for _ in range(tuned.accumulation):
            loss, grads = _loss_and_grads(tuned, next(batches))
            tuned.backward(grads)
            total += loss
            tuned.step()
        losses.append(total / tuned.accumulation)
    return losses


@pytest.mark.slow
def test_donate_keeps_the_loop_and_the_callers_arrays_working() -> None:
    """Over several accumulated steps and a restart: the same losses as without donation, the
    caller's parameters (device arrays, which `device_put` would hand back as they are) intact,
    and the arrays the update took over really deleted."""
    workload = _workload("gpt")
    params = jax.device_put(workload.params, jax.devices("cpu")[0])
    config = {"batch_size": 4, "accumulation": 2}
    kept = _tuned(workload, params=params, **config)
    donating = _tuned(workload, params=params, donate="on", **config)
    assert donating.donate and not kept.donate
    before = donating.params
    expected = _train(kept, workload.dataset, 4)
    assert _train(donating, workload.dataset, 4) == pytest.approx(expected, rel=1e-6)
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(before))
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(params))
    donating.restart(params)  # the runner's drift phase: the initial weights again, a fresh optimizer
    assert _train(donating, workload.dataset, 1) == pytest.approx(expected[:1], rel=1e-6)


def test_donate_without_jit_is_refused() -> None:
    with pytest.raises(ValueError, match="donate=on needs jit=on"):
        _tuned(_workload("mlp"), jit="off", donate="on")


def jax_array_params(samples: int = 64) -> JaxWorkload:
    """A trial-process factory (`tests.backends.test_jax_knobs:jax_array_params`): the tiny mlp with its
    parameters already JAX arrays on the device, as a user's `jax.random` initialisation gives them."""
    workload = mlp(**{**TINY_MLP, "samples": samples})
    workload.params = jax.tree.map(jnp.asarray, workload.params)
    return workload


@pytest.mark.slow
def test_a_donating_trial_restores_the_initial_weights_for_its_drift_phase(launcher: TrialLauncher) -> None:
    """The measured phase donates the parameters step after step; the drift phase then restarts
    from the workload's own (device) arrays, which must still be there, and ends where a trial
    without donation does."""
    results = {
        donate: launcher.call(
            RUNNER, "run", small_request(f"{HERE}:jax_array_params", {**BASE, "batch_size": 4, "donate": donate}), 120
        )
        for donate in ("off", "on")
    }
    for result in results.values():
        assert result.outcome is Outcome.OK and result.output is not None, result.reason
    on, off = (results[d].output for d in ("on", "off"))
    assert on is not None and off is not None
    assert on.losses.heldout == pytest.approx(off.losses.heldout, rel=1e-6)


# ---------------------------------------------------------------- xla_flags


def recording_xla_flags(record: str) -> JaxWorkload:
    """A trial-process factory: writes the XLA_FLAGS the trial process runs with into `record`."""
    Path(record).write_text(os.environ.get("XLA_FLAGS", ""))
    return mlp(**TINY_MLP)


@pytest.mark.slow
@pytest.mark.parametrize("bundle", ["default", CPU_BUNDLE])
def test_a_flag_bundle_reaches_the_xla_flags_of_a_trial_process(
    launcher: TrialLauncher, tmp_path: Path, bundle: str
) -> None:
    record = tmp_path / "xla_flags"
    request = small_request(f"{HERE}:recording_xla_flags", {**BASE, "xla_flags": bundle}, {"record": str(record)})
    result = launcher.call(RUNNER, "run", request, 120)
    assert result.outcome is Outcome.OK, result.reason
    flags = record.read_text().split()
    assert all(flag in flags for flag in XLA_FLAG_BUNDLES[bundle].flags)
    others = {flag for name, b in XLA_FLAG_BUNDLES.items() if name != bundle for flag in b.flags}
    assert not others & set(flags)


def test_tuned_training_refuses_a_jax_started_without_the_bundles_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's JAX started long ago: XLA read its XLA_FLAGS then, and no later change counts."""
    jax.devices("cpu")
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    with pytest.raises(RuntimeError, match=f"xla_flags={CPU_BUNDLE}: JAX started without --xla_cpu_use_onednn=true"):
        _tuned(_workload("mlp"), xla_flags=CPU_BUNDLE)
    assert "XLA_FLAGS" not in os.environ
    monkeypatch.setenv("XLA_FLAGS", f"--xla_force_host_platform_device_count=1 {XLA_FLAG_BUNDLES[CPU_BUNDLE].flags[0]}")
    assert _tuned(_workload("mlp"), xla_flags=CPU_BUNDLE).config["xla_flags"] == CPU_BUNDLE


def test_use_xla_flags_before_jax_starts_adds_the_bundle_after_the_users_own_flags() -> None:
    code = f"""
        import json, os
        import jax
        from autotuner.backends.jax.apply import use_xla_flags
        use_xla_flags({{**{BASE!r}, "xla_flags": {CPU_BUNDLE!r}}})
        flags = os.environ["XLA_FLAGS"]
        use_xla_flags({{**{BASE!r}, "xla_flags": {CPU_BUNDLE!r}}})  # there already: nothing added
        assert os.environ["XLA_FLAGS"] == flags
        print(json.dumps({{"flags": flags, "sum": float(jax.jit(lambda x: x.sum())(jax.numpy.ones(3)))}}))
    """
    env = {**os.environ, "XLA_FLAGS": "--xla_cpu_enable_fast_math=false", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"flags": f"--xla_cpu_enable_fast_math=false {XLA_FLAG_BUNDLES[CPU_BUNDLE].flags[0]}", "sum": 3.0}


@pytest.mark.slow
def test_the_flag_check_knows_the_bundles_flags_and_catches_an_unknown_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's check runs XLA on the flags: an unknown one makes XLA abort that Python, not a trial."""
    assert _flags_known(_start_flag_check("cpu")) and _flags_known(_start_flag_check("gpu"))
    monkeypatch.setitem(XLA_FLAG_BUNDLES, "cpu-unknown", FlagBundle(("--xla_cpu_no_such_flag=true",), "cpu", ""))
    assert not _flags_known(_start_flag_check("cpu"))
    assert _flags_known(_start_flag_check("gpu"))


@pytest.mark.slow
@pytest.mark.parametrize(("workload", "arguments", "marks"), [("gpt", TINY_GPT, True), ("mlp", TINY_MLP, False)])
def test_the_probe_finds_donation_the_cpu_bundles_flags_and_the_blocks_a_loss_marks(
    launcher: TrialLauncher, workload: str, arguments: dict[str, Any], marks: bool
) -> None:
    ref = JAX.resolve_workload(f"builtin:{workload}")
    probed = launcher.call(RUNNER, "probe", ProbeRequest("cpu", ref, arguments, global_batch=8), 120)
    assert probed.outcome is Outcome.OK and probed.output is not None, probed.reason
    assert probed.output.workload_error is None
    capabilities = probed.output.environment.capabilities
    assert capabilities["donate"] is True and capabilities["xla_flags"] is True
    assert capabilities["remat_blocks"] is marks
