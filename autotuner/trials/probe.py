"""The probe: what a trial process finds out, before anything is stored or run, about the device,
the software around it and the workload, as one typed `Environment`.

A search, `autotuner apply`, `autotuner env` and `--jobs` each probe once (the engine-side
`autotuner.backends.Backend.probe` starts the process; the trial side is
`autotuner.trials.process.probe`). The environment is built once, in the probe, and never changed
after: the search and every stage after it read its fields, and a study stores it (`as_dict`), so
the export, the report and the dashboard read it back (`from_dict`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

PROBE_TIMEOUT_S = 300.0
"""How long a probe process may take: it imports the framework and builds the workload once."""


@dataclass(frozen=True)
class Environment:
    """A device and the software around it, as a probe found it."""

    backend: str
    """The backend's name (`pytorch`, `jax`, ...)."""
    device: str
    """The device resolved (`cpu`, `cuda:0`)."""
    device_name: str
    """The device's model (`NVIDIA H100 80GB HBM3`), or the CPU's (`AMD EPYC (2 cores)`)."""
    driver: str
    """The GPU driver's version, or the kernel's release on a CPU."""
    versions: Mapping[str, object]
    """Python, the framework and its toolchain, by name, as each reports its version (a string,
    cuDNN's an integer): each backend has its own set, and the fingerprint hashes them as they are."""
    capabilities: Mapping[str, bool]
    """What the device and the workload can do, by name: the fields of the backend's
    `autotuner.backends.Capabilities` subclass (`Backend.capabilities` builds it from these)."""
    peak_flops: Mapping[str, float] = field(default_factory=dict)
    """Peak dense FLOP/s per precision (`autotuner.measurement.hardware.peak_flops`); empty: no MFU."""
    device_count: int = 0
    """The GPUs the probe process sees (`search --jobs` starts one worker per GPU)."""
    threads: Mapping[str, object] | None = None
    """The thread settings a step runs under (`autotuner.measurement.hardware.thread_settings`,
    and the framework's own count): an open set, as the environment variables are. None where an
    export or a study predates them."""
    memory_mb: float | None = None
    """The device's memory (the host's on a CPU), in MiB, where the backend can tell."""
    compute_capability: str | None = None
    """A CUDA GPU's compute capability (`9.0`)."""
    energy_counter: bool = False
    """Whether NVML reads the GPU's energy counter (`objective.energy` needs it)."""
    framework_start_s: float | None = None
    """Seconds from asking for the first process to its running: the interpreter and the framework
    imported, which every run of the job pays before its first line (`autotuner.results.run_time`)."""

    @property
    def accelerator(self) -> bool:
        """Whether the device is an accelerator (a GPU), not the host's CPU."""
        return bool(self.capabilities.get("accelerator"))

    def as_dict(self) -> dict[str, object]:
        """The stored form (a study user attr, the export's `environment`): JSON, the fields that
        are set."""
        return {k: dict(v) if isinstance(v, Mapping) else v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Environment:
        """From `as_dict`'s form read back; keys it does not know (an export's `fingerprint`) are
        left out, and what a study made by an older autotuner did not store takes its default."""
        known = {f.name for f in fields(cls)}
        stored = {k: v for k, v in data.items() if k in known and v is not None}
        unset: dict[str, Any] = {"backend": "", "device": "", "device_name": "", "driver": ""}
        return cls(**{**unset, "versions": {}, "capabilities": {}, **stored})


@dataclass(frozen=True)
class ProbeResult:
    """What a probe process sends back: the environment, and why the workload cannot be tuned
    (one line: it does not import, does not build, or its data cannot train), or None."""

    environment: Environment
    workload_error: str | None = None
