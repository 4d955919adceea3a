"""The hardware/software fingerprint a study is tied to, and its description for humans."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from typing import Any

from autotuner.backends import BACKENDS

FINGERPRINT_KEYS = ("backend", "device_name", "driver", "versions")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "MKL_NUM_THREADS")
"""The environment variables that change how the CPU's threads run a step: the thread counts, and
whether a thread that waits at a barrier spins (OpenMP's default, for a while) or sleeps. On a
CPU, a small batch's step can run at half the speed with `OMP_WAIT_POLICY=PASSIVE`, so a study's
figures hold under the settings it was measured with (`thread_settings`)."""


def thread_settings(*more: str) -> dict[str, str]:
    """The `THREAD_VARIABLES` (and the variables `more` names) this process runs with, those set:
    a trial inherits them from the search, which leaves them as the user's shell has them (as
    their training run will)."""
    return {name: os.environ[name] for name in (*THREAD_VARIABLES, *more) if name in os.environ}


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
