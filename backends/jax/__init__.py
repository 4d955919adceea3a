"""The JAX backend, engine side: knobs, built-in workloads, what a device can honour.

A trial is one process whatever the spec's `processes`: with `processes: N` and `parallel:
data_parallel`, that process drives N local devices (JAX's single controller: a mesh over them,
each micro-batch split between them, `autotuner.backends.jax.apply.TunedTraining`).

Importing this module does not import jax (the engine validates specs and decides what is
unsupported without it). The trial-process half is `autotuner.backends.jax.runner`; user workloads return
a `autotuner.backends.jax.workload.JaxWorkload`; `autotuner.backends.jax.apply.TunedTraining` applies a config to a
JAX training loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotuner.backends._base import Backend, Capabilities, capability
from autotuner.config.knobs import ACCUMULATION, BATCH_SIZE, PRECISION, WORKERS, Config, Knob, knob_table

JIT = Knob("jit", "XLA jit", ("on", "off"), "off", recommended=("on",))
REMAT = Knob(
    "remat",
    "jax.checkpoint of the loss's marked blocks (else of the whole loss): what the backward pass recomputes "
    "instead of keeping (full: everything; dots_saveable: all but matmul outputs; "
    "dots_with_no_batch_dims_saveable: all but the weights' matmul outputs)",
    ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable"),
    "none",
    quiet=True,
    # No memory_order: the values rank by memory only where the loss marks its blocks. Checkpointed
    # whole, `full` keeps as much as none and the dots policies less (XLA on an H100), and on a CPU
    # XLA keeps more with any policy than with none: an out-of-memory trial rules out its value only.
)
DONATE = Knob(
    "donate",
    "the parameters and optimizer state donated to the jitted update, which writes the new ones into their buffers",
    ("off", "on"),
    "off",
    recommended=("on",),
    quiet=True,
)
PARAM_SHARDING = Knob(
    "param_sharding",
    "parallel: data_parallel: the parameters and optimizer state whole on every device (replicated), or each "
    "split along its largest axis the devices divide, FSDP-like, XLA gathering them where they are used (sharded)",
    ("replicated", "sharded"),
    "replicated",
    memory_order=("sharded", "replicated"),
    quiet=True,
)
DATA_PARALLEL = "data_parallel"
"""The JAX backend's way of training a trial over several devices: one process, a mesh of N local
devices, each micro-batch split between them."""


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
    "a named bundle of XLA flags (`XLA_FLAG_BUNDLES`), added to the process's XLA_FLAGS before JAX starts",
    tuple(XLA_FLAG_BUNDLES),
    "default",
    quiet=True,
)


@dataclass(frozen=True)
class JaxCapabilities(Capabilities):
    jit: bool = capability("XLA jit")
    """XLA can compile a whole function here (JAX jit)."""
    donate: bool = capability("buffer donation")
    """A jitted function can take over its donated inputs' buffers here (the platform implements donation)."""
    xla_flags: bool = capability("XLA flag bundles")
    """This jaxlib knows every flag of the bundles for this device's platform (`XLA_FLAG_BUNDLES`)."""
    remat_blocks: bool = capability("workload: blocks marked for remat")
    """The workload's loss calls a `remat_block` (the probe traces it): `remat` checkpoints those."""
    data_parallel: bool = capability("data parallel over local devices")
    """The job trains each trial over several local devices (`parallel: data_parallel`)."""


class JaxBackend(Backend):
    name = "jax"
    runner = "autotuner.backends.jax.runner"
    knobs = knob_table(
        PRECISION.restricted("fp32", "tf32", "bf16"),
        BATCH_SIZE,
        ACCUMULATION,
        WORKERS,
        JIT,
        REMAT,
        DONATE,
        XLA_FLAGS,
        PARAM_SHARDING,
    )
    capabilities_type = JaxCapabilities
    parallel = (DATA_PARALLEL,)
    builtin_workloads = {
        "mlp": "autotuner.backends.jax.builtin:mlp",
        "gpt": "autotuner.backends.jax.builtin:gpt",
    }
    default_space = "jax"
    requires = ("jax", "optax")
    install = "pip install 'autotuner[jax]'"

    def job_knobs(self, parallel: str | None) -> dict[str, Knob]:
        """`param_sharding` only in a data-parallel job: one device has nothing to split."""
        if parallel == DATA_PARALLEL:
            return dict(self.knobs)
        return {name: knob for name, knob in self.knobs.items() if name != PARAM_SHARDING.name}

    def irrelevant(self, knob: str, value: Any, capabilities: Capabilities) -> str | None:
        """A value the device or this jaxlib cannot honour in any config (a plain `Capabilities`,
        with no probe of JAX's, has none of JAX's own)."""
        if knob not in self.knobs or value == self.knobs[knob].reference:
            return None
        if knob == PARAM_SHARDING.name and not getattr(capabilities, "data_parallel", False):
            return f"param_sharding={value}: a knob of parallel: {DATA_PARALLEL} (a trial over several devices)"
        if knob == "jit" and not getattr(capabilities, "jit", False):
            return "jit=on: XLA cannot compile a function here"
        if knob == "remat" and value == "full" and not getattr(capabilities, "remat_blocks", False):
            return "remat=full: the loss marks no remat_block, and checkpointed whole it keeps as much memory as none"
        if knob == "donate" and not getattr(capabilities, "donate", False):
            return "donate=on: XLA cannot donate buffers on this device"
        if knob == "xla_flags":
            platform = XLA_FLAG_BUNDLES[value].platform
            here = "gpu" if capabilities.accelerator else "cpu"
            if platform not in (None, here):
                return f"xla_flags={value}: its flags are XLA:{platform.upper()}'s, and this device is a {here.upper()}"
            if not getattr(capabilities, "xla_flags", False):
                return f"xla_flags={value}: this jaxlib does not know every flag of the {here.upper()} bundles"
        return None

    def reference_overrides(self) -> Config:
        """The reference runs jitted: under the fp32 precision's strict matmuls
        (`jax.default_matmul_precision`) a jitted step is strict fp32 too, and it compiles a few
        executables where op by op every primitive compiles (on a GPU, each with XLA's GEMM
        autotuning) in each of the reference's two processes."""
        return {JIT.name: "on"}

    def unsupported_reason(self, config: Config, capabilities: Capabilities) -> str | None:
        precision = self.unsupported_precision(config.get(PRECISION.name, "fp32"), capabilities)
        if precision:
            return precision
        for knob, value in config.items():
            reason = self.irrelevant(knob, value, capabilities)
            if reason:
                return reason
        if config.get("donate", "off") == "on" and config.get("jit", "off") != "on":
            return "donate=on needs jit=on: only a jitted update takes over the donated buffers"
        return None


JAX = JaxBackend()

__all__ = [
    "DATA_PARALLEL",
    "DONATE",
    "JAX",
    "JIT",
    "PARAM_SHARDING",
    "REMAT",
    "XLA_FLAGS",
    "XLA_FLAG_BUNDLES",
    "FlagBundle",
    "JaxBackend",
    "JaxCapabilities",
]
