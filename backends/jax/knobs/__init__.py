"""The JAX backend's knobs, one family a module: each module holds its knobs' definitions and the
rules that decide where they can run (`autotuner.backends._base.Family`). What a config does is
`autotuner.backends.jax.apply.TunedTraining` and, served, `autotuner.backends.jax.serving.TunedInference`.
Imports no framework.
"""

from __future__ import annotations

from autotuner.backends.jax.knobs import donate, jit, param_sharding, remat, xla_flags

TRAINING = (jit.FAMILY, remat.FAMILY, donate.FAMILY, xla_flags.FAMILY, param_sharding.FAMILY)
"""The training knobs' families (beside the common knobs), in the knob table's order."""
SERVING = (jit.FAMILY,)
"""`task: inference`'s."""
