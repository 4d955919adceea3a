"""This process's JAX and its devices: what it is set up with before its backend starts (the
platform, the GPUs its client opens, the allocator, the host devices, the XLA flags), and the
devices found after (`resolve_device`, `local_devices`, `device_name`).

A trial process calls `configure_process` before anything starts JAX (`autotuner.backends.jax.process`);
a user's script calls `use_xla_flags(config)` before its first JAX computation, and
`autotuner.backends.jax.apply.TunedTraining` finds its devices here. Importing this module
initialises no device.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping
from typing import ParamSpec, TypeVar

import jax

from autotuner.backends._base import ExportedConfig
from autotuner.backends.jax import JAX, XLA_FLAG_BUNDLES, XLA_FLAGS

PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"
MEMORY_FRACTIONS = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")
"""JAX's GPU allocator settings, read from the environment when its CUDA backend starts
(https://docs.jax.dev/en/latest/gpu_memory_allocation.html)."""
WHOLE_CARD_FRACTION = ("XLA_PYTHON_CLIENT_MEM_FRACTION", "1.0")
"""The fraction a trial without preallocation is given: the card's whole memory. Without one, JAX's
allocator stops at its default fraction (75%) when it does not preallocate as well. The name
every supported jaxlib reads (a newer one reads it where `XLA_CLIENT_MEM_FRACTION` is not set,
and refuses both set at once)."""
VISIBLE_CUDA_DEVICES = "jax_cuda_visible_devices"
"""JAX's own list of the CUDA devices its client opens ("all", or CUDA ordinals)."""
XLA_FLAGS_VARIABLE = "XLA_FLAGS"
"""What XLA reads its flags from, once, when JAX starts its backend."""
CPU_DEVICES = "jax_num_cpu_devices"
"""JAX's count of host (CPU) devices, read when its CPU client starts (JAX >= 0.4.38)."""
HOST_DEVICE_COUNT = "--xla_force_host_platform_device_count"
"""XLA's flag for the same, which older JAX reads from XLA_FLAGS."""
STUCK_COLLECTIVE = ("--xla_cpu_collective_call_terminate_timeout_seconds", 3600)
"""XLA:CPU aborts the process (SIGABRT) when a host device's thread has waited 40 s in a
collective for the others; on a loaded 2-core machine the threads of two host devices can take
that long to meet, and the trial crashed where it was only slow. A trial's own timeout ends one
that hangs, so the abort waits an hour here (unless XLA_FLAGS sets it)."""

Parameters = ParamSpec("Parameters")
Result = TypeVar("Result")


def _spec_ordinal(spec: str) -> int | None:
    """N of `cuda:N` (0 for `cuda`); None for any other spec."""
    match = re.fullmatch(r"cuda(?::(\d+))?", spec)
    return int(match.group(1) or 0) if match else None


def _backend_started() -> bool:
    """Whether this process's JAX has started its backends, after which the platforms, the visible
    devices and the allocator settings no longer change anything (JAX reads them once, then)."""
    try:
        from jax._src import xla_bridge  # no public API says it

        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):  # a JAX without it: a config update after the start is a no-op anyway
        return False


def configure_process(device_spec: str, devices: int | None = 1) -> None:
    """Set up this process's JAX for a trial on `device_spec` before its backend starts: trial
    processes overlap (`--jobs` workers, a process that outlives its trial), so each must hold only
    what it uses, on its own GPUs only. `devices`: the local devices the process drives from
    `device_spec` on (data parallel, `TunedTraining(devices=N)`); None: every GPU (the probe of a
    data-parallel job, which counts them).

    - No preallocation (`XLA_PYTHON_CLIENT_PREALLOCATE=false`, unless the environment already sets
      it or a memory fraction): by default every JAX process reserves 75% of every GPU it opens,
      and the next process to overlap it fails with RESOURCE_EXHAUSTED, which a study records as
      `oom` and takes as ruling out a batch size that fits.
    - Without preallocation and without a memory fraction of the user's, the whole card
      (`XLA_PYTHON_CLIENT_MEM_FRACTION=1.0`, `WHOLE_CARD_FRACTION`): the fraction is also the
      allocator's limit, 75% by default with preallocation off too, so a batch size that needs
      more of the card would be recorded `oom` and rule out every larger one. Allocating on
      demand, a process still holds only what it uses.
    - `cpu`: only the CPU platform (`jax_platforms=cpu`), so no CUDA context is created at all.
    - `cuda:i` (`cuda` is `cuda:0`): JAX's CUDA client opens CUDA device i only, or i to
      i+devices-1 (`jax_cuda_visible_devices`, set unless the process set it already). JAX numbers
      its devices after the user's CUDA_VISIBLE_DEVICES, and a restricted GPU keeps its CUDA
      ordinal as its `local_hardware_id`, so `cuda:i` still names it (`device_name`).
    - `auto` opens every GPU: only probes get it (trials get the device the probe resolved), and
      the probe's `device_count` is what `search --jobs` starts its workers by.
    - `cpu` and `auto` with `devices` above 1: JAX's CPU client starts with that many host devices
      (`jax_num_cpu_devices`, or XLA's `--xla_force_host_platform_device_count` in an older JAX).

    Once JAX's backend has started (a user's script that ran JAX before), none of it could take
    effect, so nothing is changed and nothing raises.
    """
    if _backend_started():
        return
    if not any(os.environ.get(name) for name in MEMORY_FRACTIONS):  # a fraction is a preallocation asked for
        os.environ.setdefault(PREALLOCATE, "false")
        if os.environ[PREALLOCATE] in ("false", "False", "0"):  # off, as jaxlib reads it: never 100% preallocated
            name, whole = WHOLE_CARD_FRACTION
            os.environ[name] = whole
    spec = str(device_spec)
    if spec == "cpu":
        jax.config.update("jax_platforms", "cpu")
    if spec in ("cpu", "auto"):
        _host_devices(devices or 1)
        return
    ordinal = _spec_ordinal(spec)
    # "all" is JAX's default; a list the process set itself stands; None: a JAX without the option
    if ordinal is not None and devices is not None and jax.config.values.get(VISIBLE_CUDA_DEVICES) == "all":
        jax.config.update(VISIBLE_CUDA_DEVICES, ",".join(str(ordinal + i) for i in range(devices)))


def _host_devices(count: int) -> None:
    """JAX's CPU client to start with `count` host devices (nothing changed for one), whose
    collectives may wait as long as the trial does (`STUCK_COLLECTIVE`)."""
    if count <= 1:
        return
    flag, seconds = STUCK_COLLECTIVE
    if not any(f.startswith(f"{flag}=") for f in _flags_set()):
        os.environ[XLA_FLAGS_VARIABLE] = " ".join([*_flags_set(), f"{flag}={seconds}"])
    if CPU_DEVICES in jax.config.values:
        jax.config.update(CPU_DEVICES, count)
        return
    kept = [flag for flag in _flags_set() if not flag.startswith(f"{HOST_DEVICE_COUNT}=")]
    os.environ[XLA_FLAGS_VARIABLE] = " ".join([*kept, f"{HOST_DEVICE_COUNT}={count}"])


def _flags_set() -> list[str]:
    return os.environ.get(XLA_FLAGS_VARIABLE, "").split()


def use_xla_flags(config: ExportedConfig | Mapping[str, object]) -> None:
    """Add the flags of `config`'s `xla_flags` bundle to this process's XLA_FLAGS (after the ones
    it holds, so they win), for XLA to read when JAX starts its backend: call it before the first
    JAX computation. Once the backend has started, XLA has read XLA_FLAGS already: a RuntimeError
    then when they lack a flag of the bundle (the config would not run as it was measured)."""
    bundle = XLA_FLAGS.of(JAX.config_params(config))
    missing = [flag for flag in XLA_FLAG_BUNDLES[bundle].flags if flag not in _flags_set()]
    if not missing:
        return
    if _backend_started():
        raise RuntimeError(
            f"xla_flags={bundle}: JAX started without {' '.join(missing)} in XLA_FLAGS; "
            "call use_xla_flags(config) before the script's first JAX computation"
        )
    os.environ[XLA_FLAGS_VARIABLE] = " ".join([*_flags_set(), *missing])


def gpus() -> list[jax.Device]:
    """The CUDA GPUs JAX sees (none with a CPU-only jaxlib; only its own in a `cuda:i` trial process)."""
    try:
        return list(jax.devices("gpu"))
    except RuntimeError:  # no GPU platform in this jaxlib, or none initialised
        return []


def cuda_ordinal(device: jax.Device) -> int:
    """A GPU's CUDA device number (what `cuda:N` and CUDA_VISIBLE_DEVICES count): its
    `local_hardware_id`, which a process that sees only some GPUs keeps, unlike its place in `gpus()`."""
    hardware_id = getattr(device, "local_hardware_id", None)
    return int(hardware_id) if hardware_id is not None else gpus().index(device)


def resolve_device(spec: str | jax.Device | None) -> jax.Device:
    """`auto` (or None): the first GPU if JAX has one, else the CPU; `cpu`, `cuda` or `cuda:N` (CUDA
    device N, found by its number, since a `cuda:N` trial process sees no other)."""
    if isinstance(spec, jax.Device):
        return spec
    spec = "auto" if spec is None else str(spec)
    if spec == "auto":
        visible = gpus()
        return visible[0] if visible else jax.devices("cpu")[0]
    if spec == "cpu":
        return jax.devices("cpu")[0]
    index = _spec_ordinal(spec)
    if index is None:
        raise ValueError(f"device {spec!r}: the jax backend runs on cpu or cuda")
    visible = gpus()
    if not visible:
        raise ValueError(
            f"device {spec!r}: JAX sees no CUDA GPU {index} here (a CUDA jaxlib is `pip install 'jax[cuda13]'`, "
            "`'jax[cuda12]'` on a CUDA 12 driver; "
            "cuda:N counts the GPUs CUDA_VISIBLE_DEVICES leaves visible, from 0)"
        )
    for gpu in visible:
        if cuda_ordinal(gpu) == index:
            return gpu
    names = ", ".join(device_name(gpu) for gpu in visible)
    raise ValueError(f"device {spec!r}: JAX sees {names} here")


def local_devices(first: jax.Device, count: int) -> list[jax.Device]:
    """`count` local devices from `first` on, of its platform: host devices by id, GPUs by CUDA
    ordinal (`cuda:i` to `cuda:i+count-1`). ValueError, saying what JAX has, when there are fewer."""
    if first.platform == "cpu":
        host = sorted(jax.devices("cpu"), key=lambda d: d.id)
        chosen = host[host.index(first) :][:count]
        if len(chosen) < count:
            raise ValueError(
                f"data parallel over {count} devices: JAX started with {len(host)} host device(s) here; set "
                f"jax.config.update({CPU_DEVICES!r}, {count}) (or XLA_FLAGS={HOST_DEVICE_COUNT}={count}) "
                "before the first JAX computation"
            )
        return chosen
    by_ordinal = {cuda_ordinal(gpu): gpu for gpu in gpus()}
    start = cuda_ordinal(first)
    wanted = range(start, start + count)
    if any(ordinal not in by_ordinal for ordinal in wanted):
        names = ", ".join(device_name(gpu) for gpu in by_ordinal.values())
        raise ValueError(
            f"data parallel over {count} GPUs from cuda:{start} needs cuda:{start} to cuda:{start + count - 1}; "
            f"JAX sees {names}"
        )
    return [by_ordinal[ordinal] for ordinal in wanted]


def device_name(device: jax.Device) -> str:
    """`cpu` or `cuda:N` (N its CUDA device number), as specs and `--jobs` workers name devices."""
    return "cpu" if device.platform == "cpu" else f"cuda:{cuda_ordinal(device)}"


def on_device(device: jax.Device, fn: Callable[Parameters, Result]) -> Callable[Parameters, Result]:
    """`fn` run with `device` as JAX's default device, so what it makes (and what a jitted call with
    uncommitted inputs computes) lands on `device`, not on the process's first device."""

    @functools.wraps(fn)
    def placed(*args: Parameters.args, **kwargs: Parameters.kwargs) -> Result:
        with jax.default_device(device):
            return fn(*args, **kwargs)

    return placed
