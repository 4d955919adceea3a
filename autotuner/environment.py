"""The hardware/software fingerprint a study is tied to, and its description for humans."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from typing import Any

from autotuner.backends import BACKENDS

FINGERPRINT_KEYS = ("backend", "device_name", "driver", "versions")


def cpu_name() -> str:
    """The host CPU's model and core count, `AMD EPYC (2 cores)`: the device name of a CPU trial."""
    model = ""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "")
    except OSError:
        pass
    return f"{model or platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def fingerprint(environment: dict[str, Any]) -> str:
    """A short hash of the device model, driver and framework versions."""
    data = {k: environment.get(k) for k in FINGERPRINT_KEYS}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def describe(environment: dict[str, Any]) -> list[tuple[str, str]]:
    """Rows for `autotuner env` and reports: (what, value)."""
    caps = environment.get("capabilities", {})
    versions = environment.get("versions", {})
    rows = [
        ("backend", str(environment.get("backend"))),
        ("device", f"{environment.get('device')} - {environment.get('device_name')}"),
        ("driver", str(environment.get("driver"))),
    ]
    rows += [(name, str(version)) for name, version in versions.items() if version is not None]
    if "compute_capability" in environment:
        rows.append(("compute capability", str(environment["compute_capability"])))
    rows += [
        (label, "yes" if caps[key] else "no") for key, label in capability_labels(environment).items() if key in caps
    ]
    rows += [
        ("peak FLOP/s known", ", ".join(environment.get("peak_flops") or {}) or "no (no MFU)"),
        ("fingerprint", fingerprint(environment)),
    ]
    return rows


def capability_labels(environment: dict[str, Any]) -> dict[str, str]:
    """Capability -> label, as the environment's backend names them (a backend not registered
    here: the capabilities' own names)."""
    backend = BACKENDS.get(str(environment.get("backend")))
    if backend is not None:
        return backend.capabilities_type.labels()
    return {key: key for key in environment.get("capabilities", {}) if key != "accelerator"}


def framework_versions(environment: dict[str, Any]) -> str:
    """`torch 2.3.0, cuda 12.1` or `jax 0.4.30, jaxlib 0.4.30, optax 0.2.3`: what the backend
    reported, Python aside."""
    versions = environment.get("versions") or {}
    return ", ".join(f"{name} {version}" for name, version in versions.items() if name != "python" and version)
