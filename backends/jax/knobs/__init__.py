"""The JAX backend's knobs, one family a module: each module holds its knobs' definitions and the
rules that decide where they can run (`autotuner.backends._base.Family`: when a value cannot matter
on a device, when it conflicts with the rest of a config). The backend's knob tables and
`families` are assembled here; what a config does to a training loop is
`autotuner.backends.jax.apply.TunedTraining`, which applies the families in `APPLY`'s order, and,
served, `autotuner.backends.jax.serving.TunedInference`. Imports no framework: a family's functions
import jax when they are called.

Adding a knob: a module here with its `Knob` and its `FAMILY` (a `JaxFamily`: its rules, its
`apply`, what it does to a training run as `TunedTraining` builds it, and its `start`, what it does
to the process before JAX starts), the family in `TRAINING` (or `SERVING`) and in `APPLY`, and the
knob in the presets that should search it (`search_spaces/`).
"""

from __future__ import annotations

from autotuner.backends.jax.knobs import donate, jit, param_sharding, remat, xla_flags

TRAINING = (jit.FAMILY, remat.FAMILY, donate.FAMILY, xla_flags.FAMILY, param_sharding.FAMILY)
"""The training knobs' families (beside the common knobs), in the knob table's order."""
APPLY = (xla_flags.FAMILY, remat.FAMILY, jit.FAMILY, donate.FAMILY, param_sharding.FAMILY)
"""The order `TunedTraining` applies the families in: every family's `JaxFamily.start` before it
finds its devices (XLA's flags), then their `JaxFamily.apply`: the loss checkpointed, the step's
functions compiled, the update donating, and the parameters placed over the devices."""
SERVING = (jit.FAMILY,)
"""`task: inference`'s."""
