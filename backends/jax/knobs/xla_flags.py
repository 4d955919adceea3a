"""`xla_flags`: a named bundle of XLA flags, added to the process's XLA_FLAGS before JAX starts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from autotuner.backends.jax.capabilities import JaxCapabilities
from autotuner.backends.jax.knobs._family import JaxFamily
from autotuner.config.knobs import Knob


@dataclass(frozen=True)
class FlagBundle:
    """A named set of XLA flags: one value of the `xla_flags` knob."""

    flags: tuple[str, ...]
    platform: str | None
    """The platform whose compiler reads them (`gpu`, `cpu`); None: any."""
    description: str


XLA_FLAG_BUNDLES = {
    "default": FlagBundle((), None, "no flag added: XLA's defaults (and the user's own XLA_FLAGS, as they are)"),
    "gpu-latency-hiding": FlagBundle(
        ("--xla_gpu_enable_latency_hiding_scheduler=true",),
        "gpu",
        "XLA's latency-hiding scheduler: orders the kernels so copies and other asynchronous work overlap compute",
    ),
    "gpu-cublas-gemm": FlagBundle(
        ("--xla_gpu_enable_triton_gemm=false",),
        "gpu",
        "every matmul through cuBLAS, none through the Triton kernels XLA generates (NVIDIA's JAX images set it)",
    ),
    "gpu-triton-gemm": FlagBundle(
        ("--xla_gpu_triton_gemm_any=true",),
        "gpu",
        "the Triton matmul emitter for any matmul it supports, so XLA can fuse the matmul's neighbours into it",
    ),
    "cpu-onednn": FlagBundle(
        ("--xla_cpu_use_onednn=true",),
        "cpu",
        "oneDNN kernels for the matmuls and convolutions (and their fused neighbours) of XLA's CPU backend",
    ),
}
"""The `xla_flags` knob's values. XLA reads XLA_FLAGS once, when JAX starts its backend, and aborts
the process on a flag it does not know, so the probe checks that this jaxlib knows the device's
bundles' flags (`JaxCapabilities.xla_flags`) before a trial sets any. The flags' names and
meanings are XLA's (`xla/debug_options_flags.cc`; https://docs.jax.dev/en/latest/gpu_performance_tips.html)."""

XLA_FLAGS = Knob(
    "xla_flags",
    "a named bundle of XLA flags in the trial process's `XLA_FLAGS` (`default`: none added)",
    tuple(XLA_FLAG_BUNDLES),
    "default",
    not_run_when="another platform's bundle; a jaxlib that does not know every flag of this platform's bundles",
    quiet=True,
)


def irrelevant(knob: Knob, value: object, caps: JaxCapabilities) -> str | None:
    platform = XLA_FLAG_BUNDLES[str(value)].platform
    here = "gpu" if caps.accelerator else "cpu"
    if platform not in (None, here):
        return f"xla_flags={value}: its flags are XLA:{platform.upper()}'s, and this device is a {here.upper()}"
    if not caps.xla_flags:
        return f"xla_flags={value}: this jaxlib does not know every flag of the {here.upper()} bundles"
    return None


def start(config: Mapping[str, object]) -> None:
    """The bundle's flags in this process's XLA_FLAGS, before JAX starts its backend
    (`autotuner.backends.jax.devices.use_xla_flags`: a RuntimeError where it started without them)."""
    from autotuner.backends.jax.devices import use_xla_flags

    use_xla_flags(config)


FAMILY = JaxFamily((XLA_FLAGS,), irrelevant, start=start)
