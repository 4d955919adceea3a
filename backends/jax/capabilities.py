"""What the JAX backend's probe reports: the device's capabilities, jaxlib's and the workload's
(`autotuner.backends.jax.runner`), which its knobs' families decide by
(`autotuner.backends.jax.knobs`). Imports no framework."""

from __future__ import annotations

from dataclasses import dataclass

from autotuner.backends._base import Capabilities, capability


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
