"""The JAX backend's trial process, for every role: the device, its environment, seeding, the
compile cache, memory, the profiler and XLA's errors (`autotuner.trials.process.TrialProcess`).
`JaxProcess` is written once and stands beside each role: `JaxTrial` (training,
`autotuner.backends.jax.runner`) and `JaxServing` (`autotuner.backends.jax.inference_runner`).

Imported by the fork server before any trial: importing jax initialises no device (that happens
in the trial process, on first use), so each trial gets its own XLA client, which `probe` and `run`
set up for the trial's device before anything starts it (`autotuner.backends.jax.devices.configure_process`:
the CPU platform only for `cpu`, CUDA device i only for `cuda:i`, no preallocation), and whose
arrays they keep on that device (JAX's default device throughout); before that, `run` and
`profile` put the config's XLA flag bundle into the process's XLA_FLAGS, which XLA reads when the
backend starts (`autotuner.backends.jax.devices.use_xla_flags`). A trial of `processes: N` with
`parallel: data_parallel` is still this one process: it drives N local devices from its device
on (GPUs `cuda:i` to `cuda:i+N-1`, or N host devices the CPU client starts with), which
`configure_process` opens before JAX starts, and trains over them through `TunedTraining`'s mesh.
The fork server that forks the trial processes imports this module and never starts JAX's
backend, so each trial still chooses its platform and its count of devices. The config is applied
by `autotuner.backends.jax.apply.TunedTraining`, the object users apply an exported config with in their
own loop: a trial trains through it, so what a study measures is exactly what a user gets.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import platform
import resource
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import optax

from autotuner.backends.jax import DATA_PARALLEL, JAX, XLA_FLAG_BUNDLES
from autotuner.backends.jax.devices import (
    XLA_FLAGS_VARIABLE,
    configure_process,
    cuda_ordinal,
    device_name,
    gpus,
    resolve_device,
)
from autotuner.config.knobs import Config
from autotuner.measurement.hardware import cpu_name, peak_flops, thread_settings
from autotuner.measurement.nvml import cuda_uuid, has_energy_counter, memory_total_mb, nvml_driver
from autotuner.trials.probe import Environment

RUNTIME_ERROR: type[Exception] = getattr(jax.errors, "JaxRuntimeError", None) or (
    importlib.import_module("jaxlib.xla_extension").XlaRuntimeError  # jax < 0.4.36 names it only in jaxlib
)
"""What XLA raises when a computation or an allocation fails."""
OUT_OF_MEMORY = "RESOURCE_EXHAUSTED"
"""XLA has no out-of-memory exception type of its own: an allocation it cannot make (on a GPU, or
on the host for the CPU) raises the runtime error above with this status code in its message."""
FLAG_CHECK = "import jax; jax.numpy.zeros(1).block_until_ready()"
"""What a process runs to have XLA parse its XLA_FLAGS: its CPU backend starting is enough, since
XLA knows the flags of every platform, and opens no GPU."""
FLAG_CHECK_TIMEOUT_S = 120.0


# ---------------------------------------------------------------- environment


def _bf16_works(device: jax.Device) -> bool:
    try:
        ones = jax.device_put(np.ones((2, 2), jnp.bfloat16), device)
        return bool((ones @ ones).dtype == jnp.bfloat16)
    except Exception:
        return False


def _jit_works(device: jax.Device) -> bool:
    try:
        return float(jax.jit(lambda x: (x * 2.0).sum())(jax.device_put(np.ones(4, np.float32), device))) == 8.0
    except Exception:
        return False


def _donation_works(device: jax.Device) -> bool:
    """Whether a jitted function takes over a donated input's buffer here (a platform that cannot
    warns and keeps it)."""
    try:
        donated = jax.device_put(np.ones(4, np.float32), device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            jax.jit(lambda x: x + 1.0, donate_argnums=0)(donated).block_until_ready()
        return donated.is_deleted()
    except Exception:
        return False


def _start_flag_check(platform_name: str) -> subprocess.Popen[bytes] | None:
    """A Python that starts XLA with the XLA_FLAGS every bundle for `platform_name` adds (after the
    process's own): XLA aborts a process on a flag it does not know, so a trial must not be the
    first to find one. None when there is no such flag. Started first, waited for last, so the
    probe does its other work meanwhile."""
    bundles = [bundle for bundle in XLA_FLAG_BUNDLES.values() if bundle.platform in (None, platform_name)]
    flags = [flag for bundle in bundles for flag in bundle.flags]
    if not flags:
        return None
    own = os.environ.get(XLA_FLAGS_VARIABLE, "").split()
    env = {**os.environ, XLA_FLAGS_VARIABLE: " ".join([*own, *flags]), "JAX_PLATFORMS": "cpu"}
    return subprocess.Popen(
        [sys.executable, "-c", FLAG_CHECK], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def _flags_known(check: subprocess.Popen[bytes] | None) -> bool:
    if check is None:
        return True
    try:
        return check.wait(FLAG_CHECK_TIMEOUT_S) == 0
    except subprocess.TimeoutExpired:
        check.kill()
        check.wait()
        return False


class JaxProcess:
    """JAX's part of every trial process (`autotuner.trials.process.TrialProcess`), beside a role:
    `class JaxTrial(JaxProcess, TrainingBackend[...])`. JAX is set up for the trial's device before
    anything starts it (`configure_process`), and that device is JAX's default throughout, so what
    the workload and its loss make lands there, not on the process's first device."""

    name = JAX.name
    device_count: int | None
    devices: list[jax.Device]

    def __init__(self) -> None:
        self.device_count = 1
        """The local devices this process drives (`processes` of a data-parallel trial), set
        from the request before JAX starts; None in the probe of a data-parallel job, which
        opens every GPU to count them."""
        self.devices = []
        """The trial's devices, once its training is built."""

    def configure_process(self, device_spec: str, compile_cache: str | None, config: Config | None = None) -> None:
        configure_process(device_spec, self.device_count)
        if compile_cache:  # the study's own: a config's later processes load what its first compiled
            _use_compile_cache(os.path.join(compile_cache, "jax"))

    def compilations(self) -> Callable[[], int]:
        return lambda: _COMPILATIONS[0]

    def resolve_device(self, spec: str) -> jax.Device:
        return resolve_device(spec)

    def on_device(self, device: jax.Device) -> contextlib.AbstractContextManager[object]:
        return jax.default_device(device)

    def environment(self, device: jax.Device) -> Environment:
        """A probe of `cuda:i` opens GPU i only, and reports it as `cuda:i` all the same;
        `device_count` is the GPUs the process sees (all of them for `auto`, what `search --jobs` probes)."""
        flag_check = _start_flag_check("gpu" if device.platform == "gpu" else "cpu")
        if device.platform == "gpu":
            name = device.device_kind
            major, _, minor = str(getattr(device, "compute_capability", "0.0")).partition(".")
            ampere = int(major or 0) >= 8
            driver = nvml_driver()
            capabilities = {"accelerator": True, "bf16": ampere and _bf16_works(device), "fp16": True, "tf32": ampere}
            uuid = self.gpu_uuid(device)
            extra: dict[str, Any] = {
                "compute_capability": f"{major}.{minor}",
                "energy_counter": has_energy_counter(uuid),
            }
            # the card's memory, from NVML: not the allocator's `bytes_limit`, which is the share of
            # it the memory fraction lets JAX take
            if (memory_mb := memory_total_mb(uuid)) is not None:
                extra["memory_mb"] = memory_mb
        else:
            name = cpu_name()
            driver = platform.release()
            capabilities = {"accelerator": False, "bf16": _bf16_works(device), "fp16": False, "tf32": False}
            extra = {}
        capabilities["jit"] = _jit_works(device)
        capabilities["donate"] = _donation_works(device)
        capabilities["xla_flags"] = _flags_known(flag_check)
        return Environment(
            backend=JAX.name,
            device=device_name(device),
            device_name=name,
            device_count=len(gpus()),
            driver=driver,
            versions={
                "python": platform.python_version(),
                "jax": jax.__version__,
                "jaxlib": jaxlib.__version__,
                "optax": optax.__version__,
            },
            capabilities=capabilities,
            threads=thread_settings("XLA_FLAGS"),  # XLA's CPU threads are its own (Eigen's), not OpenMP's
            peak_flops=peak_flops(name) if device.platform == "gpu" else {},
            **extra,
        )

    def parallel_capabilities(self, parallel: str | None, nodes: int) -> dict[str, bool]:
        return {"data_parallel": parallel == DATA_PARALLEL}

    def seed(self, seed: int) -> None:
        np.random.seed(seed)

    def gpu_uuid(self, device: jax.Device) -> str | None:
        return cuda_uuid(cuda_ordinal(device)) if device.platform == "gpu" else None

    def more_gpu_uuids(self, device: jax.Device) -> list[str]:
        """The other GPUs of a data-parallel trial (known once its training is built)."""
        uuids = [self.gpu_uuid(d) for d in self.devices if d != device]
        return [uuid for uuid in uuids if uuid is not None]

    def peak_memory_mb(self, device: jax.Device) -> float:
        """The device's peak where the platform reports it (GPUs; with data parallel, the largest
        of the trial's devices'), else this process's peak RSS."""
        stats = [d.memory_stats() or {} for d in self.devices or [device]]
        if all("peak_bytes_in_use" in s for s in stats):
            return max(float(s["peak_bytes_in_use"]) for s in stats) / 2**20
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux

    @contextlib.contextmanager
    def profiling(self, device: jax.Device, folder: str) -> Iterator[list[str]]:
        """`jax.profiler.trace` with its Perfetto trace (gzipped Chrome trace JSON); the TensorBoard
        profile it writes beside it stays in the trial's folder. Operators only, as torch's profile
        is: without Python's function calls, which the ranking leaves out anyway (an op-by-op step
        of the JAX quickstart's baseline: a 10 MB trace written in 11.6 s with them, 0.45 MB in
        0.8 s without, and the step itself 0.93 s under their tracer against 0.63 s)."""
        written: list[str] = []
        with jax.profiler.trace(folder, create_perfetto_trace=True, **_profile_options()):
            yield written
        traces = sorted(Path(folder).glob("plugins/profile/*/perfetto_trace.json.gz"))
        if not traces:
            raise RuntimeError(f"jax.profiler wrote no Perfetto trace into {folder}")
        written.append(str(traces[-1]))

    def classify_exception(self, exc: BaseException) -> str | None:
        if isinstance(exc, RUNTIME_ERROR) and OUT_OF_MEMORY in str(exc):  # no finer type to go by (see above)
            return "oom"
        return None


_LOOKUPS = {"hit": 0, "miss": 0, "found": 0}
"""This process's lookups in JAX's persistent compilation cache (`_count_lookups`), and the entries
it found there when it took the cache up (`_use_compile_cache`)."""
_LOOKUP_EVENTS = {"/jax/compilation_cache/cache_hits": "hit", "/jax/compilation_cache/cache_misses": "miss"}


def _count_lookups(event: str, **_: object) -> None:
    if event in _LOOKUP_EVENTS:
        _LOOKUPS[_LOOKUP_EVENTS[event]] += 1


_COMPILATIONS = [0]
"""Computations JAX has traced and compiled in this process (`JaxTrial.compilations`)."""


def _count_compilation(event: str, duration_secs: float, **_: str | int) -> None:
    if event.startswith("/jax/core/compile/"):
        _COMPILATIONS[0] += 1


# registered as the fork server imports this module: every trial process counts from its start
jax.monitoring.register_event_duration_secs_listener(_count_compilation)


def _use_compile_cache(folder: str) -> None:
    """JAX's persistent compilation cache in `folder`, for every executable, however quick to
    compile: an op-by-op step's hundred primitives compile in milliseconds each (5.6 s of the JAX
    quickstart baseline's warm-up), and JAX by default caches only what took a second. The same
    executables run from the cache, so nothing a trial measures of its numerics changes; XLA's
    cache key holds the computation, the compile options and XLA_FLAGS. Its hits and misses are
    counted for `compile_cache`."""
    jax.config.update("jax_compilation_cache_dir", folder)
    _LOOKUPS["found"] = len(os.listdir(folder)) if os.path.isdir(folder) else 0
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    jax.monitoring.register_event_listener(_count_lookups)


def _profile_options() -> dict[str, jax.profiler.ProfileOptions]:
    """`jax.profiler.trace`'s options with Python's tracer off, where this JAX has them."""
    if "profiler_options" not in inspect.signature(jax.profiler.trace).parameters:
        return {}
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0
    return {"profiler_options": options}
