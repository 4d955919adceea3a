"""Which configs the hardware can honour (`PYTORCH.unsupported_reason`), and knob value checks."""

from __future__ import annotations

import itertools

import pytest

from autotuner.backends import BACKENDS, Capabilities, get_backend
from autotuner.backends.pytorch import PYTORCH
from autotuner.knobs import DERIVED, KNOBS, Knob, config_key, format_config

CPU = Capabilities(accelerator=False, bf16=True, fp16=True, tf32=False, compile=True, cuda_graphs=False)
GPU = Capabilities(accelerator=True, bf16=True, fp16=True, tf32=True, compile=True, cuda_graphs=True)
OLD_GPU = Capabilities(accelerator=True, bf16=False, fp16=True, tf32=False, compile=True, cuda_graphs=True)


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
    no_compiler = Capabilities(bf16=True, fp16=True, compile=False)
    for mode in ("default", "reduce-overhead", "max-autotune"):
        reason = PYTORCH.unsupported_reason(config(compile=mode), no_compiler)
        assert reason is not None and f"compile={mode}" in reason
    assert PYTORCH.unsupported_reason(config(compile="none"), no_compiler) is None


def test_gpu_runs_everything() -> None:
    for precision, mode in itertools.product(KNOBS["precision"].choices, KNOBS["compile"].choices):
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
    assert caps == Capabilities(bf16=True, tf32=False, cuda_graphs=True)


def test_backend_registry() -> None:
    assert BACKENDS["pytorch"] is PYTORCH and get_backend("pytorch") is PYTORCH
    with pytest.raises(KeyError):
        get_backend("tensorflow")
    assert PYTORCH.resolve_workload("builtin:mlp") == "autotuner.backends.pytorch.workloads:mlp"
    assert PYTORCH.resolve_workload("my.pkg:job") == "my.pkg:job"
    assert "jit" not in PYTORCH.knobs


def test_backend_knob_values_are_in_the_knob_table() -> None:
    for name, allowed in PYTORCH.knobs.items():
        knob = KNOBS[name]
        if allowed is None:
            assert knob.choices is None
        else:
            assert set(allowed) <= set(knob.choices)


# ---------------------------------------------------------------- Knob.check


@pytest.mark.parametrize("value", [1, 2, 1024])
def test_integer_knob_accepts_positive_integers(value: int) -> None:
    assert KNOBS["batch_size"].check(value, None) is None


@pytest.mark.parametrize("value", [0, -4, 1.0, 2.5, "8", None, True, False, [8]])
def test_integer_knob_refuses(value) -> None:
    problem = KNOBS["batch_size"].check(value, None)
    assert problem is not None and ">= 1" in problem


def test_workers_allow_zero_but_not_negative() -> None:
    assert KNOBS["workers"].check(0, None) is None
    assert KNOBS["workers"].check(4, None) is None
    assert ">= 0" in KNOBS["workers"].check(-1, None)
    assert KNOBS["workers"].check(True, None) is not None


def test_choice_knob_uses_the_backend_allowed_values() -> None:
    precision = KNOBS["precision"]
    assert precision.check("bf16", PYTORCH.knobs["precision"]) is None
    problem = precision.check("fp8", PYTORCH.knobs["precision"])
    assert problem is not None and "'fp8'" in problem and "fp32, tf32, bf16, fp16" in problem
    # a backend that honours fewer values than the table knows
    assert precision.check("fp16", ("fp32", "bf16")) is not None
    assert precision.check(None, PYTORCH.knobs["precision"]) is not None


def test_choice_knob_does_not_confuse_booleans_and_numbers() -> None:
    """YAML turns `on`/`off` into booleans; True == 1 must not sneak into an integer choice list."""
    knob = Knob("toy", "a toy", (0, 1), 0)
    assert knob.check(1, (0, 1)) is None
    assert knob.check(True, (0, 1)) is not None
    flag = Knob("flag", "a flag", (True, False), False)
    assert flag.check(True, (True, False)) is None
    assert flag.check(1, (True, False)) is not None
    assert KNOBS["jit"].check(True, KNOBS["jit"].choices) is not None  # YAML `on` is not "on"


def test_derived_and_references() -> None:
    assert DERIVED == ("accumulation",)
    assert {k: KNOBS[k].reference for k in ("precision", "workers", "compile", "accumulation")} == {
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
