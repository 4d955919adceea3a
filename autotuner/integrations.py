"""The former import path of PyTorch's export formats, now `autotuner.backends.pytorch.integrations`
(a backend's formats live in its package). Scripts written against this path keep working: it names
that package and its format modules, so `from autotuner.integrations.transformers import apply`
imports the same function. New code imports the backend's path."""

from __future__ import annotations

import sys

from autotuner.backends.pytorch import integrations
from autotuner.backends.pytorch.integrations import accelerate, lightning, onnx, torchrun, transformers

for _module in (accelerate, lightning, onnx, torchrun, transformers):
    sys.modules[f"{__name__}.{_module.__name__.rpartition('.')[2]}"] = _module
sys.modules[__name__] = integrations
