"""Which configs the hardware can honour (`PYTORCH.unsupported_reason`), and knob value checks."""

from __future__ import annotations

import itertools

import pytest

from autotuner.backends import BACKENDS, Capabilities, get_backend, knob_named
from autotuner.backends.jax import JAX, JaxCapabilities
from autotuner.backends.pytorch import PYTORCH, TorchCapabilities
from autotuner.config.knobs import (
    ASCENDING,
    BATCH_SIZE,
    COMMON_KNOBS,
    COMMON_TABLE,
    DERIVED,
    PRECISION,
    WORKERS,
    Knob,
    config_key,
    knob_table,
    needs_as_much_memory,
)
from autotuner.output.formatting import format_config
from autotuner.study.fingerprint import describe
from autotuner.trials.probe import Environment

CPU = TorchCapabilities(accelerator=False, bf16=True, fp16=True, tf32=False, compile=True, cuda_graphs=False)
GPU = TorchCapabilities(accelerator=True, bf16=True, fp16=True, tf32=True, compile=True, cuda_graphs=True)
OLD_GPU = TorchCapabilities(accelerator=True, bf16=False, fp16=True, tf32=False, compile=True, cuda_graphs=True)


def config(**changes) -> dict:
    return {"precision": "fp32", "batch_size": 8, "accumulation": 1, "workers": 0, "compile": "none", **changes}


def test_cpu_runs_fp32_and_bf16() -> None:
    assert PYTORCH.unsupported_reason(config(), CPU) is None
    assert PYTORCH.unsupported_reason(config(precision="bf16"), CPU) is None
    assert PYTORCH.unsupported_reason(config(precision="fp16"), CPU) is None
    assert PYTORCH.unsupported_reason(config(compile="default"), CPU) is None
    assert PYTORCH.unsupported_reason(config(compile="max-autotune"), CPU) is None


def test_cpu_refuses_tf32_with_a_reason() -> None:
    reason = PYTORCH.unsupported_reason(config(precision="tf32"), CPU)
    assert reason is not None and reason.startswith("tf32:")
    assert "\n" not in reason


def test_cpu_refuses_cuda_graphs() -> None:
    reason = PYTORCH.unsupported_reason(config(compile="reduce-overhead"), CPU)
    assert reason is not None and "reduce-overhead" in reason and "CUDA graphs" in reason


def test_no_compiler_refuses_every_compile_mode() -> None:
    no_compiler = TorchCapabilities(bf16=True, fp16=True, compile=False)
    for mode in ("default", "reduce-overhead", "max-autotune"):
        reason = PYTORCH.unsupported_reason(config(compile=mode), no_compiler)
        assert reason is not None and f"compile={mode}" in reason
    assert PYTORCH.unsupported_reason(config(compile="none"), no_compiler) is None


def test_gpu_runs_everything() -> None:
    for precision, mode in itertools.product(PYTORCH.knobs["precision"].choices, PYTORCH.knobs["compile"].choices):
        assert PYTORCH.unsupported_reason(config(precision=precision, compile=mode), GPU) is None, (precision, mode)


def test_gpu_without_bf16_refuses_bf16_only() -> None:
    reason = PYTORCH.unsupported_reason(config(precision="bf16"), OLD_GPU)
    assert reason is not None and reason.startswith("bf16:")
    assert PYTORCH.unsupported_reason(config(precision="fp16"), OLD_GPU) is None
    assert PYTORCH.unsupported_reason(config(compile="reduce-overhead"), OLD_GPU) is None
    assert PYTORCH.unsupported_reason(config(precision="tf32"), OLD_GPU) is not None


def test_nothing_at_all_still_runs_the_reference() -> None:
    """The fp32 eager reference must run everywhere, whatever the capabilities."""
    assert PYTORCH.unsupported_reason(config(), Capabilities()) is None


def test_capabilities_from_dict_ignores_unknown_keys_and_coerces() -> None:
    caps = Capabilities.from_dict({"bf16": 1, "tf32": 0, "cuda_graphs": True, "future_feature": True})
    assert caps == Capabilities(bf16=True, tf32=False)


def test_each_backend_reads_its_own_capabilities_from_the_probe() -> None:
    """The framework-specific capabilities belong to their backend: a probe's report becomes the
    backend's own type, and `autotuner env` labels them as the backend names them."""
    report = {"bf16": True, "compile": 1, "cuda_graphs": False, "jit": True}
    assert PYTORCH.capabilities(report) == TorchCapabilities(bf16=True, compile=True)
    assert JAX.capabilities(report) == JaxCapabilities(bf16=True, jit=True)
    assert not hasattr(Capabilities(), "compile") and not hasattr(Capabilities(), "jit")
    rows = dict(describe(Environment.from_dict({"backend": "pytorch", "capabilities": report})))
    assert rows["torch.compile"] == "yes" and rows["CUDA graphs"] == "no" and "XLA jit" not in rows
    rows = dict(describe(Environment.from_dict({"backend": "jax", "capabilities": report})))
    assert rows["XLA jit"] == "yes" and "torch.compile" not in rows
    # a study stored by a backend this Python does not have: its capabilities under their own names
    assert (
        dict(describe(Environment.from_dict({"backend": "tensorflow", "capabilities": {"xla": True}})))["xla"] == "yes"
    )


def test_backend_registry() -> None:
    assert BACKENDS["pytorch"] is PYTORCH and get_backend("pytorch") is PYTORCH
    with pytest.raises(KeyError):
        get_backend("tensorflow")
    assert PYTORCH.resolve_workload("builtin:mlp") == "autotuner.backends.pytorch.builtin:mlp"
    assert PYTORCH.resolve_workload("my.pkg:job") == "my.pkg:job"
    assert "jit" not in PYTORCH.knobs


def test_every_backend_has_the_common_knobs_and_defines_its_own() -> None:
    for backend in BACKENDS.values():
        for common in COMMON_KNOBS:
            knob = backend.knobs[common.name]
            assert knob.reference == common.reference and knob.minimum == common.minimum
            if common.choices is None:
                assert knob.choices is None
            else:
                assert set(knob.choices) <= set(common.choices)
    assert JAX.knobs["precision"].choices == ("fp32", "tf32", "bf16")  # no fp16 autocast in JAX
    assert JAX.knobs["precision"].recommended == ("bf16", "tf32")
    assert "jit" in JAX.knobs and "compile" not in JAX.knobs
    assert knob_named("compile") is PYTORCH.knobs["compile"] and knob_named("jit") is JAX.knobs["jit"]
    assert knob_named("no-such-knob") is None


def test_a_knob_restricted_to_values_it_does_not_have_is_refused() -> None:
    with pytest.raises(ValueError, match="fp8"):
        PRECISION.restricted("fp32", "fp8")


# ---------------------------------------------------------------- Knob.check


@pytest.mark.parametrize("value", [1, 2, 1024])
def test_integer_knob_accepts_positive_integers(value: int) -> None:
    assert BATCH_SIZE.check(value) is None


@pytest.mark.parametrize("value", [0, -4, 1.0, 2.5, "8", None, True, False, [8]])
def test_integer_knob_refuses(value) -> None:
    problem = BATCH_SIZE.check(value)
    assert problem is not None and ">= 1" in problem


def test_workers_allow_zero_but_not_negative() -> None:
    assert WORKERS.check(0) is None
    assert WORKERS.check(4) is None
    assert ">= 0" in WORKERS.check(-1)
    assert WORKERS.check(True) is not None


def test_choice_knob_uses_the_backend_allowed_values() -> None:
    precision = PYTORCH.knobs["precision"]
    assert precision.check("bf16") is None
    problem = precision.check("fp8")
    assert problem is not None and "'fp8'" in problem and "fp32, tf32, bf16, fp16" in problem
    # a backend that honours fewer values than the table knows
    assert PRECISION.restricted("fp32", "bf16").check("fp16") is not None
    assert JAX.knobs["precision"].check("fp16") is not None
    assert precision.check(None) is not None


def test_choice_knob_does_not_confuse_booleans_and_numbers() -> None:
    """YAML turns `on`/`off` into booleans; True == 1 must not sneak into an integer choice list."""
    knob = Knob("toy", "a toy", (0, 1), 0)
    assert knob.check(1) is None
    assert knob.check(True) is not None
    flag = Knob("flag", "a flag", (True, False), False)
    assert flag.check(True) is None
    assert flag.check(1) is not None
    assert JAX.knobs["jit"].check(True) is not None  # YAML `on` is not "on"


def test_derived_and_references() -> None:
    assert DERIVED == ("accumulation",)
    assert {k: PYTORCH.knobs[k].reference for k in ("precision", "workers", "compile", "accumulation")} == {
        "precision": "fp32",
        "workers": 0,
        "compile": "none",
        "accumulation": 1,
    }


def test_config_key_ignores_order_and_format_config_shows_the_batch() -> None:
    a = config(batch_size=16, accumulation=4)
    b = dict(reversed(list(a.items())))
    assert config_key(a) == config_key(b)
    assert config_key(a) != config_key(config(batch_size=16, accumulation=4, workers=1))
    assert format_config(a) == "precision=fp32 batch=16x4 workers=0 compile=none"


# ---------------------------------------------------------------- the order of memory

CHECKPOINTING = Knob(
    "checkpointing", "activation checkpointing", ("none", "blocks"), "none", memory_order=("blocks", "none")
)
REMAT = Knob(
    "remat",
    "jax.checkpoint of the loss with a policy",
    ("none", "full", "dots_saveable", "offload"),
    "none",
    memory_order=("full", "dots_saveable", "none"),  # "offload" is not placed
)


def test_a_larger_micro_batch_needs_more_memory() -> None:
    assert BATCH_SIZE.memory_order == ASCENDING
    assert BATCH_SIZE.needs_as_much_memory(64, 32) and BATCH_SIZE.needs_as_much_memory(32, 32)
    assert not BATCH_SIZE.needs_as_much_memory(16, 32)


def test_a_knob_ranks_its_values_by_its_memory_order_and_leaves_the_others_apart() -> None:
    assert CHECKPOINTING.needs_as_much_memory("none", "blocks")
    assert not CHECKPOINTING.needs_as_much_memory("blocks", "none")
    assert REMAT.needs_as_much_memory("none", "full") and REMAT.needs_as_much_memory("dots_saveable", "full")
    assert not REMAT.needs_as_much_memory("dots_saveable", "none")
    assert REMAT.needs_as_much_memory("offload", "offload")
    assert not REMAT.needs_as_much_memory("offload", "full") and not REMAT.needs_as_much_memory("none", "offload")
    # no order: only the same value
    assert PRECISION.memory_order is None and WORKERS.memory_order is None
    assert not PRECISION.needs_as_much_memory("fp32", "bf16") and not PRECISION.needs_as_much_memory("bf16", "fp32")
    assert not WORKERS.needs_as_much_memory(2, 1)


def test_a_memory_order_must_name_the_knobs_own_values() -> None:
    with pytest.raises(ValueError, match="blocks2"):
        Knob("checkpointing", "", ("none", "blocks"), "none", memory_order=("blocks2", "none"))
    with pytest.raises(ValueError, match="integer"):
        Knob("checkpointing", "", ("none", "blocks"), "none", memory_order=ASCENDING)
    assert CHECKPOINTING.restricted("none").memory_order == ("none",)
    assert REMAT.restricted("none", "offload", "full").memory_order == ("full", "none")


def test_a_config_needs_as_much_memory_as_another_when_it_does_knob_by_knob() -> None:
    knobs = knob_table(*COMMON_KNOBS, CHECKPOINTING)

    def config(batch: int, checkpointing: str, precision: str = "fp32") -> dict:
        return {"precision": precision, "batch_size": batch, "checkpointing": checkpointing}

    assert needs_as_much_memory(config(512, "none"), config(256, "blocks"), knobs)
    assert needs_as_much_memory(config(256, "blocks"), config(256, "blocks"), knobs)
    # a partial order: more batch and less checkpointing's saving rank neither way
    assert not needs_as_much_memory(config(512, "blocks"), config(256, "none"), knobs)
    assert not needs_as_much_memory(config(256, "none"), config(512, "blocks"), knobs)
    # a knob with no order, or one not in the table, must be equal; so must the knobs set
    assert not needs_as_much_memory(config(512, "none", "bf16"), config(256, "none"), knobs)
    assert not needs_as_much_memory(config(512, "none"), config(256, "blocks"), COMMON_TABLE)
    assert needs_as_much_memory(config(512, "none"), config(256, "none"), COMMON_TABLE)
    assert not needs_as_much_memory({"batch_size": 512}, config(256, "none"), knobs)
