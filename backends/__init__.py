"""Framework backends: each turns a config + a workload into a timed, seeded training run.

This package is the only place that imports torch or jax, and only inside each backend's
`runner` module, which the trial process imports. The backend objects registered here are light:
the engine uses them to validate a spec and to decide which configs the hardware can honour
without importing a framework. A backend defined elsewhere joins them with `register`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from autotuner.backends._base import Backend, Capabilities
from autotuner.backends._formats import ExportFormat
from autotuner.backends.jax import JAX
from autotuner.backends.jax.inference import JAX_INFERENCE
from autotuner.backends.pytorch import PYTORCH
from autotuner.backends.pytorch.inference import PYTORCH_INFERENCE
from autotuner.config.knobs import Knob

BACKENDS: dict[str, Backend] = {}
"""Name -> backend: every backend the engine knows (`register` adds one)."""
INFERENCE: dict[str, Backend] = {}
"""Name -> the backend's inference half (`task: inference`): the backends that serve a model."""


def register(backend: Backend) -> Backend:
    """Make `backend` known to the engine under its name (again for the same backend is a no-op);
    ValueError when another backend has that name. Returns `backend`."""
    known = BACKENDS.get(backend.name)
    if known is not None and type(known) is not type(backend):
        raise ValueError(f"a backend named {backend.name!r} is registered already ({type(known).__name__})")
    BACKENDS[backend.name] = backend
    return backend


register(PYTORCH)
register(JAX)
INFERENCE[PYTORCH.name] = PYTORCH_INFERENCE
INFERENCE[JAX.name] = JAX_INFERENCE


def get_backend(name: str, task: str = "train") -> Backend:
    """The backend registered under `name` for `task` (its training half, or for `inference` its
    serving half); KeyError when there is none."""
    return {"train": BACKENDS, "inference": INFERENCE}[task][name]


def knob_named(name: str) -> Knob | None:
    """The knob `name` as the table of the first registered backend that has it (training's, then
    serving's), or None: for what reads stored configs without knowing their backend (charts, a
    config's one-line form)."""
    tables = [backend.knobs for backend in (*BACKENDS.values(), *INFERENCE.values())]
    return next((knobs[name] for knobs in tables if name in knobs), None)


def export_formats() -> dict[str, ExportFormat]:
    """`autotuner export --format` name -> the format, from every registered backend's table
    (`Backend.formats`, its training and serving halves'); ValueError when two backends offer
    different formats under one name."""
    found: dict[str, ExportFormat] = {}
    for backend in (*BACKENDS.values(), *INFERENCE.values()):
        table: Mapping[str, ExportFormat] = importlib.import_module(backend.formats).FORMATS if backend.formats else {}
        for name, fmt in table.items():
            if found.setdefault(name, fmt) != fmt:
                raise ValueError(f"two export formats are named {name!r}: {found[name].module}, {fmt.module}")
    return found


def formats_help(formats: Mapping[str, ExportFormat]) -> str:
    """What `formats` write, for `autotuner export --help`: the trainers whose arguments they write
    as Python, then each format of files with what it writes."""
    trainers = ", ".join(name for name, fmt in formats.items() if not fmt.files)
    files = [f"{name}: {fmt.what}" for name, fmt in formats.items() if fmt.files]
    return "; ".join([*([f"a trainer's arguments as Python: {trainers}"] if trainers else []), *files])


__all__ = [
    "BACKENDS",
    "Backend",
    "Capabilities",
    "ExportFormat",
    "export_formats",
    "formats_help",
    "get_backend",
    "knob_named",
    "register",
]
