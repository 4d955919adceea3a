"""The hardware/software fingerprint a study is tied to, and its description for humans."""

from __future__ import annotations

import hashlib
import json
from typing import Any

FINGERPRINT_KEYS = ("backend", "device_name", "driver", "versions")


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
        ("bf16", "yes" if caps.get("bf16") else "no"),
        ("fp16", "yes" if caps.get("fp16") else "no"),
        ("tf32", "yes" if caps.get("tf32") else "no"),
        ("torch.compile", "yes" if caps.get("compile") else "no"),
        ("CUDA graphs", "yes" if caps.get("cuda_graphs") else "no"),
        ("peak FLOP/s known", ", ".join(environment.get("peak_flops") or {}) or "no (no MFU)"),
        ("fingerprint", fingerprint(environment)),
    ]
    return rows
