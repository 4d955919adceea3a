"""The hardware/software fingerprint a study is tied to, and an environment described for humans."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from autotuner.backends import BACKENDS
from autotuner.trials.probe import Environment

FINGERPRINT_KEYS = ("backend", "device_name", "driver", "versions")


def fingerprint(environment: Environment) -> str:
    """A short hash of the backend, the device model, the driver and the framework versions."""
    data = {key: getattr(environment, key) for key in FINGERPRINT_KEYS}
    data["versions"] = dict(environment.versions)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def thread_mismatch(measured: Environment, environment: Environment) -> str | None:
    """Why the thread settings `environment` was probed with differ from those `measured` (an
    export's environment) was measured with, or None when they are the same (or `measured`
    predates them)."""
    if measured.threads is None:
        return None
    then, now = measured.threads, environment.threads or {}
    if then == now:
        return None
    return f"its figures were measured with threads {describe_threads(then)}; this run has {describe_threads(now)}"


def describe_threads(threads: Mapping[str, Any]) -> str:
    """`2 intra-op, OMP_WAIT_POLICY=PASSIVE`; `default` for nothing set."""
    parts = [f"{threads['intra_op']} intra-op"] if "intra_op" in threads else []
    parts += [f"{name}={value}" for name, value in threads.items() if name != "intra_op"]
    return ", ".join(parts) or "default"


def describe(environment: Environment) -> list[tuple[str, str]]:
    """Rows for `autotuner env` and reports: (what, value)."""
    caps = environment.capabilities
    rows = [
        ("backend", environment.backend),
        ("device", f"{environment.device} - {environment.device_name}"),
        ("driver", environment.driver),
    ]
    rows += [(name, str(version)) for name, version in environment.versions.items() if version is not None]
    if environment.threads is not None:
        rows.append(("threads", describe_threads(environment.threads)))
    if environment.framework_start_s is not None:
        rows.append(("framework start", f"{environment.framework_start_s:.1f} s (interpreter and framework import)"))
    if environment.memory_mb is not None:
        rows.append(("memory", f"{environment.memory_mb:,.0f} MiB (a trial's peak memory is a share of it)"))
    if environment.compute_capability is not None:
        rows.append(("compute capability", environment.compute_capability))
    rows += [
        (label, "yes" if caps[key] else "no") for key, label in capability_labels(environment).items() if key in caps
    ]
    rows += [
        ("peak FLOP/s known", ", ".join(environment.peak_flops) or "no (no MFU)"),
        ("fingerprint", fingerprint(environment)),
    ]
    return rows


def capability_labels(environment: Environment) -> dict[str, str]:
    """Capability -> label, as the environment's backend names them (a backend not registered
    here: the capabilities' own names)."""
    backend = BACKENDS.get(environment.backend)
    if backend is not None:
        return backend.capabilities_type.labels()
    return {key: key for key in environment.capabilities if key != "accelerator"}


def framework_versions(environment: Environment) -> str:
    """`torch 2.3.0, cuda 12.1` or `jax 0.4.30, jaxlib 0.4.30, optax 0.2.3`: what the backend
    reported, Python aside."""
    versions = environment.versions
    return ", ".join(f"{name} {version}" for name, version in versions.items() if name != "python" and version)


def machine(environment: Environment) -> str:
    """`NVIDIA H100 80GB HBM3 (torch 2.3.0, cuda 12.1, driver 550.54)`: a machine in a message."""
    return f"{environment.device_name} ({framework_versions(environment)}, driver {environment.driver})"
