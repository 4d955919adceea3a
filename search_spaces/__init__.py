"""Search-space presets: YAML files mapping each knob to its choices, one per backend at least.

A spec names a preset under `space.preset` (or gives `space` as a preset name); choices given
inline in the spec replace the preset's for that knob.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml


def available() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in resources.files(__name__).iterdir() if p.name.endswith(".yaml"))


def load_preset(name: str) -> dict[str, Any]:
    """The preset called `name`; KeyError when there is none."""
    if name not in available():
        raise KeyError(name)
    data = yaml.safe_load(resources.files(__name__).joinpath(f"{name}.yaml").read_text())
    return dict(data or {})
