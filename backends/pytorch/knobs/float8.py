"""`float8`: the model's linear layers trained in fp8 through torchao (`convert_to_float8_training`,
one of its recipes), and with `parallel: fsdp` FSDP2's all-gather of their weights in fp8 and the
scales of those weights computed once per optimizer step."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from autotuner.backends.pytorch.capabilities import TorchCapabilities
from autotuner.backends.pytorch.knobs._family import Build, TorchFamily, import_torchao
from autotuner.config.knobs import PRECISION, Config, Knob

if TYPE_CHECKING:
    import torch

FLOAT8 = Knob(
    "float8",
    "torchao's float8 training of the linear layers (`convert_to_float8_training` with the recipe "
    "`Float8LinearConfig.from_recipe_name`: `tensorwise` scales, `rowwise` scales rounded to powers of two), "
    "before torch.compile and FSDP2; layers whose dimensions are not multiples of 16 stay as they are",
    ("none", "tensorwise", "rowwise"),
    "none",
    quiet=True,
    not_run_when="no NVIDIA GPU of compute capability 8.9 or later (Ada, Hopper), or no torchao "
    "(`pip install torchao`); with `precision: fp16` (torchao's recipes train in bf16 or fp32)",
)
ALL_GATHER = Knob(
    "float8_all_gather",
    "FSDP2 gathers the float8 layers' weights in fp8 (torchao's `enable_fsdp_float8_all_gather`): half the "
    "bytes of bf16",
    (False, True),
    False,
    quiet=True,
    not_run_when="not `parallel: fsdp`; where `float8` cannot run; without `float8: tensorwise` (torchao "
    "gathers tensorwise-scaled weights only)",
)
PRECOMPUTE = Knob(
    "float8_precompute",
    "the fp8 scales of the gathered weights computed for all layers in one all-reduce after each optimizer step "
    "(torchao's `precompute_float8_dynamic_scale_for_fsdp`), not layer by layer in the forward",
    (False, True),
    False,
    quiet=True,
    not_run_when="not `parallel: fsdp`; without `float8_all_gather: true` (the scales it computes are the "
    "gathered weights')",
)
FSDP_FLOAT8_KNOBS = (ALL_GATHER, PRECOMPUTE)
"""The knobs of `parallel: fsdp` this family holds (`autotuner.backends.pytorch.knobs.PARALLEL`)."""
FP8_DIVISOR = 16
"""fp8 matmuls (`torch._scaled_mm`) take dimensions that are multiples of 16."""


def irrelevant(knob: Knob, value: object, caps: TorchCapabilities) -> str | None:
    if knob.name != FLOAT8.name and not caps.fsdp:
        return f"{knob.name}={value}: a knob of parallel: fsdp (a trial of several processes)"
    if not caps.fp8_training:
        return (
            f"{knob.name}={value}: fp8 training needs an NVIDIA GPU of compute capability 8.9 or later (Ada, "
            "Hopper) and torchao (pip install torchao)"
        )
    return None


def _value(config: Mapping[str, object], knob: Knob) -> object:
    return config.get(knob.name, knob.reference)


def conflict(config: Config, caps: TorchCapabilities) -> str | None:
    recipe = _value(config, FLOAT8)
    if recipe != "none" and config.get(PRECISION.name) == "fp16":
        return f"float8={recipe} with precision=fp16: torchao's float8 training takes bf16 or fp32 around fp8 matmuls"
    if _value(config, ALL_GATHER) is True and recipe != "tensorwise":
        return f"float8_all_gather=true with float8={recipe}: torchao gathers tensorwise-scaled fp8 weights only"
    if _value(config, PRECOMPUTE) is True and _value(config, ALL_GATHER) is not True:
        return "float8_precompute=true without float8_all_gather: the scales it computes are the gathered weights'"
    return None


def float8_layer(module: torch.nn.Module, name: str) -> bool:
    """Whether `convert_to_float8_training` converts `module` (its `module_filter_fn`): a linear
    layer under the model (not the model itself), not converted yet, both dimensions multiples of
    16, as torchtitan filters."""
    import torch
    from torchao.float8.float8_linear import Float8Linear

    return (
        bool(name)
        and isinstance(module, torch.nn.Linear)
        and not isinstance(module, Float8Linear)
        and module.in_features % FP8_DIVISOR == 0
        and module.out_features % FP8_DIVISOR == 0
    )


def float8_training(model: torch.nn.Module, recipe: str, *, all_gather: bool = False) -> torch.nn.Module:
    """`model`'s linear layers (`float8_layer`) swapped in place for torchao's `Float8Linear` with
    the recipe `recipe` (`tensorwise`, `rowwise`), their weights gathered in fp8 by FSDP2 with
    `all_gather`; layers converted already are kept (a model tuned before). Returns `model`."""
    import dataclasses

    import_torchao("torchao.float8")
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(recipe)
    if all_gather:
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    convert_to_float8_training(model, config=config, module_filter_fn=float8_layer)
    return model


def apply(build: Build) -> None:
    """The user's module converted before checkpointing, DDP or FSDP2 and torch.compile wrap it (as
    torchtitan converts), the optimizer over its parameters as they are then (the fp8 all-gather
    wraps each weight in a parameter of its own); with precomputed scales, they are computed after
    each optimizer step."""
    recipe = FLOAT8.of(build.config)
    if recipe == "none":
        return
    from autotuner.backends.pytorch.knobs.fsdp import over_parameters

    fsdp = build.parallel == "fsdp"
    names = {id(p): name for name, p in build.module.named_parameters()}
    float8_training(build.module, recipe, all_gather=fsdp and bool(ALL_GATHER.of(build.config)))
    build.optimizer = over_parameters(build.optimizer, names, build.module)
    if fsdp and PRECOMPUTE.of(build.config):
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

        module = build.module
        build.after_step = lambda: precompute_float8_dynamic_scale_for_fsdp(module)


TUNED_IMPORT = "from autotuner.backends.pytorch.apply import "


def setup(config: Mapping[str, object]) -> list[str]:
    recipe = _value(config, FLOAT8)
    if recipe == "none":
        return []
    all_gather = _value(config, ALL_GATHER) is True
    gather = ", all_gather=True" if all_gather else ""
    lines = [
        f"{TUNED_IMPORT}float8_training",
        f'float8_training(model, "{recipe}"{gather})  # float8={recipe}: torchao\'s fp8 linear layers, before '
        "compile and sharding" + (" (float8_all_gather: FSDP2 gathers them in fp8)" if all_gather else ""),
    ]
    if _value(config, PRECOMPUTE) is True:
        lines += [
            "from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp",
            "from torch.optim.optimizer import register_optimizer_step_post_hook",
            "register_optimizer_step_post_hook(lambda optimizer, args, kwargs: "
            "precompute_float8_dynamic_scale_for_fsdp(model))  # float8_precompute: the scales after each step",
        ]
    return lines


FAMILY = TorchFamily((FLOAT8, *FSDP_FLOAT8_KNOBS), irrelevant, conflict, apply, setup)
