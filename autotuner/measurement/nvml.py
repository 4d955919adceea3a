"""The GPU as NVML reads it (nvidia-ml-py's `pynvml`), for a trial's telemetry and a probe: the
driver's version, a CUDA ordinal's UUID (`cuda_uuid`), whether the board has an energy counter,
and `GpuSampler`, which a trial's `autotuner.measurement.telemetry.Telemetry` enters around the
measured windows.

The sampler's background thread samples utilisation and the memory in use; energy and mean power
come from the board's energy counter (its increase over the measured spans, over their wall time)
where it has one, and only without one from NVML's ~1 s power readings (`power_w_sampled_mean`).
The trial's device is found in NVML by its UUID, which the CUDA driver gives for the trial's CUDA
ordinal (`cuda_uuid`): CUDA numbers devices fastest first by default (`CUDA_DEVICE_ORDER`), among
those `CUDA_VISIBLE_DEVICES` shows, NVML by PCI bus, so an ordinal is no NVML index. Without a GPU,
its UUID or NVML every GPU figure is simply absent. Nothing here initialises CUDA.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import statistics
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any


def _in_this_group(pid: int) -> bool:
    """Whether process `pid` is of this process's group (a trial's loader workers are); one this
    process cannot see (another PID namespace, or gone) is not."""
    try:
        return os.getpgid(pid) == os.getpgrp()
    except OSError:
        return False


def nvml_driver() -> str:
    """The NVIDIA driver version NVML reports, or `unknown`."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return str(pynvml.nvmlSystemGetDriverVersion())
    except Exception:
        return "unknown"


def format_uuid(raw: bytes, prefix: str = "GPU-") -> str:
    """A device's 16-byte UUID as NVML and nvidia-smi write it: `GPU-` and 32 hex digits in groups of
    8-4-4-4-12."""
    if len(raw) != 16:
        raise ValueError(f"a device UUID has 16 bytes, not {len(raw)}")
    text = raw.hex()
    return f"{prefix}{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def _libcuda() -> ctypes.CDLL | None:
    """The CUDA driver library, or None where there is none."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def cuda_uuid(ordinal: int | None) -> str | None:
    """The UUID of CUDA device `ordinal` (`GPU-...`), from the CUDA driver; None without a driver or
    that device (or for None: a JAX device whose `local_hardware_id`, its CUDA ordinal, is unknown).

    The driver numbers devices as the frameworks do (they number them through it): only those
    `CUDA_VISIBLE_DEVICES` shows, in `CUDA_DEVICE_ORDER` (fastest first by default, which need not
    be NVML's PCI bus order), so the UUID names the device a trial really runs on. It initialises
    the driver (`cuInit`) but creates no context. Call it in a trial process only, never at import:
    the fork server that forks trial processes must not initialise CUDA. On a MIG slice it is the
    slice's UUID (`cuDeviceGetUuid_v2`), with the same `GPU-` prefix: `nvml_handle` tries it as
    `MIG-` as well.
    """
    if ordinal is None:
        return None
    lib = _libcuda()
    if lib is None:
        return None
    try:
        if lib.cuInit(0) != 0:
            return None
        device = ctypes.c_int()
        if lib.cuDeviceGet(ctypes.pointer(device), ctypes.c_int(ordinal)) != 0:
            return None
        for name in ("cuDeviceGetUuid_v2", "cuDeviceGetUuid"):  # _v2: CUDA 11.4 and newer
            get_uuid = getattr(lib, name, None)
            if get_uuid is None:
                continue
            raw = (ctypes.c_char * 16)()
            if get_uuid(raw, device) == 0:
                return format_uuid(bytes(raw))
    except Exception:  # anything odd in the driver: no UUID, no GPU telemetry, never a failed trial
        return None
    return None


def nvml_handle(pynvml: ModuleType, uuid: str) -> object:
    """The NVML handle of the device (a GPU, or a MIG slice) with UUID `uuid`; NVML is initialised.

    `cuda_uuid` writes every UUID as `GPU-...`; NVML knows a MIG slice's as `MIG-...` (the same
    bytes), so a `GPU-` UUID that NVML does not know is tried as `MIG-`."""
    pynvml.nvmlInit()
    try:
        return pynvml.nvmlDeviceGetHandleByUUID(uuid)
    except Exception:
        if not uuid.startswith("GPU-"):
            raise
        return pynvml.nvmlDeviceGetHandleByUUID("MIG-" + uuid.removeprefix("GPU-"))


def has_energy_counter(gpu_uuid: str | None) -> bool:
    """Whether NVML reads the energy counter of the device with UUID `gpu_uuid` (`cuda_uuid`; Volta
    and newer, not a MIG slice), which energy per sample, power and the optional energy objective
    need. False for None (no GPU, or no UUID)."""
    if gpu_uuid is None:
        return False
    try:
        import pynvml

        pynvml.nvmlDeviceGetTotalEnergyConsumption(nvml_handle(pynvml, gpu_uuid))
    except Exception:
        return False
    return True


def memory_total_mb(gpu_uuid: str | None) -> int | None:
    """The memory of the device with UUID `gpu_uuid` (`cuda_uuid`; a MIG slice's own), in MiB, as
    NVML reads it (`nvmlDeviceGetMemoryInfo`'s total): the card's, whatever share of it a
    framework's allocator is set to take. None without NVML or that device, and for None."""
    if gpu_uuid is None:
        return None
    try:
        import pynvml

        return int(pynvml.nvmlDeviceGetMemoryInfo(nvml_handle(pynvml, gpu_uuid)).total) // 2**20
    except Exception:
        return None


class GpuSampler:
    """`with GpuSampler(gpu_uuid) as sampler: ...`; then `sampler.summary(samples)`. Entered more
    than once, it samples every span and adds up their energy and their wall time.

    Power and energy come from the board's energy counter (`nvmlDeviceGetTotalEnergyConsumption`,
    mJ): its increase over each span, read at the span's edges, summed over the spans; the mean
    power is that energy over the spans' wall time (`clock`, `time.perf_counter`). NVML's power
    reading (`nvmlDeviceGetPowerUsage`) is an average over about the last second, longer than a
    measured window, so it is sampled only as a fallback for a device without a counter (or whose
    counter failed): `power_w_sampled_mean`, never `power_w_mean`.
    """

    def __init__(self, gpu_uuid: str, interval_s: float = 0.05, clock: Callable[[], float] = time.perf_counter):
        self.gpu_uuid, self.interval_s, self._clock = gpu_uuid, interval_s, clock
        self._util: list[float] = []
        self._power_w: list[float] = []
        self._memory_mb: list[float] = []
        self._process_memory_mb: list[float] = []
        self._other_processes: list[float] = []
        self._others_sm: list[float] = []
        """Per span, the SM utilisation (%) NVML gives the processes of other process groups."""
        self._others_sm_ok = True
        self._energy_mj: int | None = 0
        """Energy used over the spans so far; None once the counter failed to read."""
        self._energy_start = -1
        self._wall_s = 0.0
        """Wall time of the spans so far, between the counter's readings."""
        self._span_start = self._span_wall_start = 0.0
        self._spans = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None
        self._handle: object = None

    def __enter__(self) -> GpuSampler:
        try:
            import pynvml

            self._nvml, self._handle = pynvml, nvml_handle(pynvml, self.gpu_uuid)
        except Exception:  # no NVML here: no telemetry, never a failed trial
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        self._energy_start = self._energy()
        self._span_start = self._clock()
        self._span_wall_start = time.time()
        return self

    def _energy(self) -> int:
        try:
            return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except Exception:
            return -1

    def _sample(self) -> None:
        readings: dict[str, tuple[list[float], Callable[[], float]]] = {
            "util": (self._util, lambda: float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)),
            "power": (self._power_w, lambda: self._nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0),
            "memory": (self._memory_mb, lambda: self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used / 2**20),
            "process memory": (self._process_memory_mb, self._process_memory_mb_now),
            "other processes": (self._other_processes, self._other_processes_now),
        }
        while readings and not self._stop.wait(self.interval_s):
            for name, (values, read) in list(readings.items()):
                try:
                    values.append(read())
                except Exception:  # not supported here (a MIG slice has no utilisation): stop asking
                    del readings[name]

    def _process_memory_mb_now(self) -> float:
        """The device memory NVML counts for this process (its CUDA context included); raises where
        NVML does not list it (another PID namespace, a driver that does not say)."""
        pid = os.getpid()
        for process in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle):
            if process.pid == pid and process.usedGpuMemory is not None:
                return float(process.usedGpuMemory) / 2**20
        raise LookupError(f"NVML lists no process {pid} on this device")

    def _other_processes_now(self) -> float:
        """How many processes of other process groups than the trial's NVML lists on the device;
        raises where NVML does not list this process (another PID namespace: it cannot tell)."""
        pids = self._device_pids()
        if os.getpid() not in pids:
            raise LookupError(f"NVML lists no process {os.getpid()} on this device")
        return float(sum(not _in_this_group(pid) for pid in pids))

    def _device_pids(self) -> set[int]:
        listed = list(self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle))
        with contextlib.suppress(Exception):  # graphics processes: a desktop's, on a workstation
            listed += list(self._nvml.nvmlDeviceGetGraphicsRunningProcesses(self._handle))
        return {int(process.pid) for process in listed}

    def _others_sm_since(self, since_s: float) -> float | None:
        """The SM utilisation (%, summed over processes) that NVML's per-process samples since
        `since_s` (`time.time()`) give the processes of other process groups; None where NVML does
        not say (no per-process samples on this device or driver)."""
        try:
            samples = self._nvml.nvmlDeviceGetProcessUtilization(self._handle, int(since_s * 1e6))
        except Exception as error:
            if "NOT_FOUND" in str(error).upper():  # no process ran a kernel since then
                return 0.0
            return None
        by_pid: dict[int, list[float]] = {}
        for sample in samples:
            if not _in_this_group(int(sample.pid)) and 0 <= sample.smUtil <= 100:  # drivers send junk samples
                by_pid.setdefault(int(sample.pid), []).append(float(sample.smUtil))
        return min(100.0, sum(statistics.fmean(values) for values in by_pid.values()))

    def __exit__(self, *exc: object) -> None:
        if self._thread is None:
            return
        if self._others_sm_ok:
            others = self._others_sm_since(self._span_wall_start)
            self._others_sm_ok = others is not None
            if others is not None:
                self._others_sm.append(others)
        end = self._energy()
        self._wall_s += self._clock() - self._span_start
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._spans += 1
        if self._energy_mj is not None:
            ok = min(end, self._energy_start) >= 0 and end >= self._energy_start
            self._energy_mj = self._energy_mj + end - self._energy_start if ok else None

    def summary(self, samples: int) -> dict[str, float]:
        """Mean/max utilisation (%); the most memory in use on the device (MB, every process's:
        NVML's view) and by this process (`gpu_process_memory_mb_max`, its CUDA context included);
        with a working energy counter, the mean power (W) and the energy per sample
        (J) over the spans, from the counter (`power_w_mean`, `energy_j_per_sample`); without one,
        the mean of NVML's sampled power readings instead (`power_w_sampled_mean`: about 1 s
        averages, a coarse figure). Other work on the device: the most processes of other process
        groups listed on it at once (`gpu_other_processes_max`) and the SM utilisation NVML's
        per-process samples give them over the spans (`gpu_others_sm_util_mean`, %), each where
        NVML tells it."""
        out: dict[str, float] = {}
        if self._util:
            out["gpu_util_mean"] = statistics.fmean(self._util)
            out["gpu_util_max"] = max(self._util)
        if self._memory_mb:
            out["gpu_memory_used_mb_max"] = max(self._memory_mb)
        if self._process_memory_mb:
            out["gpu_process_memory_mb_max"] = max(self._process_memory_mb)
        if self._other_processes:
            out["gpu_other_processes_max"] = max(self._other_processes)
        if self._others_sm and self._others_sm_ok:
            out["gpu_others_sm_util_mean"] = statistics.fmean(self._others_sm)
        if self._energy_mj is not None and self._spans and self._wall_s > 0:
            out["power_w_mean"] = self._energy_mj / 1000.0 / self._wall_s
            if samples > 0:
                out["energy_j_per_sample"] = self._energy_mj / 1000.0 / samples
        elif self._power_w:
            out["power_w_sampled_mean"] = statistics.fmean(self._power_w)
        return out
