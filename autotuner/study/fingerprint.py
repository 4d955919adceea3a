"""The hardware/software fingerprint a study is tied to, and its description for humans."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from autotuner.backends import BACKENDS

FINGERPRINT_KEYS = ("backend", "device_name", "driver", "versions")


def thread_mismatch(measured: dict[str, Any], environment: dict[str, Any]) -> str | None:
    """Why the thread settings `environment` was probed with differ from those of `measured`'s
    environment (an export's), or None when they are the same (or `measured` predates them)."""
    if "threads" not in measured:
        return None
    then, now = measured["threads"], environment.get("threads", {})
    if then == now:
        return None
    return f"its figures were measured with threads {describe_threads(then)}; this run has {describe_threads(now)}"


def describe_threads(threads: dict[str, Any]) -> str:
    """`2 intra-op, OMP_WAIT_POLICY=PASSIVE`; `default` for nothing set."""
    parts = [f"{threads['intra_op']} intra-op"] if "intra_op" in threads else []
    parts += [f"{name}={value}" for name, value in threads.items() if name != "intra_op"]
    return ", ".join(parts) or "default"


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
    if "threads" in environment:
        rows.append(("threads", describe_threads(environment["threads"])))
    if isinstance(environment.get("framework_start_s"), (int, float)):
        rows.append(("framework start", f"{environment['framework_start_s']:.1f} s (interpreter and framework import)"))
    if isinstance(environment.get("memory_mb"), (int, float)):
        rows.append(("memory", f"{environment['memory_mb']:,.0f} MiB (a trial's peak memory is a share of it)"))
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
