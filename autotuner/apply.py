"""Reading an exported config in your own training loop: `load_config(path)` returns a
`TunedConfig`, which a backend's `TunedTraining` (`autotuner.backends.pytorch.apply`,
`autotuner.backends.jax.apply`) applies to your model, optimizer and dataset.

Importing it loads neither a framework nor Optuna.
"""

from __future__ import annotations

from autotuner.export.reader import TunedConfig, load_config, parse_config

__all__ = ["TunedConfig", "load_config", "parse_config"]
