"""Telemetry during the measured windows of a trial: the CPU always, the GPU where there is one.

`Telemetry` is what a runner hands to `autotuner.measure.measure_throughput`, which enters it
around the timed windows only (not the warm-up or the calibration window).

* CPU (`CpuSampler`): the CPU time of the trial's process group (the trial process leads its
  own group, so its data-loader workers are counted) over the windows' wall time, as a share of
  the cores the process may run on; and the peak resident memory of the group's processes.
* GPU (`GpuSampler`, NVML from the nvidia-ml-py package): a background thread samples
  utilisation, power and the memory in use; energy comes from the board's energy counter where
  it has one. The trial's CUDA device is found in NVML through `CUDA_VISIBLE_DEVICES`
  (`nvml_device`). Without a GPU or NVML every GPU figure is simply absent.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from collections.abc import Collection, Iterator
from typing import Any

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_stats() -> Iterator[tuple[str, list[str]]]:
    """(pid, the fields of /proc/<pid>/stat after the name: state, ppid, pgrp, ...) of every
    process (Linux; none elsewhere)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                text = stat.read()
        except OSError:  # gone meanwhile
            continue
        yield entry, text.rsplit(")", 1)[1].split()


def _groups_stats(groups: Collection[int]) -> list[tuple[str, list[str]]]:
    """`_proc_stats` of the processes in process groups `groups`."""
    return [(pid, fields) for pid, fields in _proc_stats() if int(fields[2]) in groups]


def _cpu_seconds(stats: list[tuple[str, list[str]]]) -> float:
    return sum(int(fields[11]) + int(fields[12]) for _, fields in stats) / _TICKS  # utime, stime


def groups_cpu_seconds(groups: Collection[int]) -> float:
    """CPU time the live processes of process groups `groups` have used (Linux; 0 elsewhere)."""
    return _cpu_seconds(_groups_stats(groups))


def _peak_rss_mb(pids: list[str]) -> float:
    total_kb = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as status:
                for line in status:
                    if line.startswith("VmHWM:"):
                        total_kb += int(line.split()[1])
                        break
        except OSError:
            continue
    return total_kb / 1024


def available_memory_mb() -> float | None:
    """The memory the kernel says can be allocated without swapping (MemAvailable); None where
    there is no /proc/meminfo."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


class CpuSampler:
    """CPU utilisation and peak RSS of this process group between enter and exit (Linux /proc);
    entered more than once (a lockstep trial's windows), over all the spans together."""

    def __init__(self) -> None:
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        self._start: tuple[float, float] | None = None
        self._wall = self._busy = self._peak_rss_mb = 0.0
        self._processes = 0

    def __enter__(self) -> CpuSampler:
        self._start = (time.perf_counter(), groups_cpu_seconds([os.getpgrp()]))
        return self

    def __exit__(self, *exc: object) -> None:
        stats = _groups_stats([os.getpgrp()])  # one pass over /proc
        pids = [pid for pid, _ in stats]
        if self._start is None or not pids:  # no /proc: nothing to tell
            return
        self._wall += time.perf_counter() - self._start[0]
        self._busy += _cpu_seconds(stats) - self._start[1]
        self._peak_rss_mb = max(self._peak_rss_mb, _peak_rss_mb(pids))
        self._processes = max(self._processes, len(pids))

    def summary(self) -> dict[str, float]:
        """`cpu_util_mean` (% of the `cpu_cores` available), `processes` and `peak_rss_mb`
        (the sum of each process's own peak: an upper bound of the group's)."""
        if self._wall <= 0:
            return {}
        return {
            "cpu_util_mean": 100.0 * self._busy / (self._wall * self.cores),
            "cpu_cores": float(self.cores),
            "processes": float(self._processes),
            "peak_rss_mb": self._peak_rss_mb,
        }


def nvml_driver() -> str:
    """The NVIDIA driver version NVML reports, or `unknown`."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return str(pynvml.nvmlSystemGetDriverVersion())
    except Exception:
        return "unknown"


def nvml_device(cuda_index: int, visible: str | None = None) -> int | str:
    """NVML's name for CUDA device `cuda_index`: an NVML index, or a UUID (or its prefix).

    NVML counts every GPU of the machine; CUDA counts only those in `CUDA_VISIBLE_DEVICES`
    (`visible`, read from the environment when None), in that variable's order, and stops at its
    first entry that names no device. So with `CUDA_VISIBLE_DEVICES=2,0`, `cuda:0` is NVML's GPU 2.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    if visible is None:
        return cuda_index
    entries = []
    for entry in (part.strip() for part in visible.split(",")):
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break
        entries.append(entry)
    if cuda_index >= len(entries):
        raise ValueError(f"cuda:{cuda_index} is not among CUDA_VISIBLE_DEVICES={visible!r}")
    entry = entries[cuda_index]
    return int(entry) if entry.isdigit() else entry


def nvml_handle(pynvml: Any, cuda_index: int) -> Any:
    """The NVML handle of CUDA device `cuda_index` (`nvml_device`); NVML is initialised."""
    pynvml.nvmlInit()
    device = nvml_device(cuda_index)
    if isinstance(device, int):
        return pynvml.nvmlDeviceGetHandleByIndex(device)
    for index in range(pynvml.nvmlDeviceGetCount()):  # CUDA_VISIBLE_DEVICES may hold a UUID's prefix
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        if (uuid.decode() if isinstance(uuid, bytes) else str(uuid)).startswith(device):
            return handle
    return pynvml.nvmlDeviceGetHandleByUUID(device)  # a MIG instance: not among the indexed GPUs


def has_energy_counter(cuda_index: int) -> bool:
    """Whether NVML reads CUDA device `cuda_index`'s energy counter (Volta and newer), which energy
    per sample and the optional energy objective need."""
    try:
        import pynvml

        pynvml.nvmlDeviceGetTotalEnergyConsumption(nvml_handle(pynvml, cuda_index))
    except Exception:
        return False
    return True


class GpuSampler:
    """`with GpuSampler(cuda_index) as sampler: ...`; then `sampler.summary(samples)`. Entered
    more than once, it samples every span and adds up their energy."""

    def __init__(self, cuda_index: int, interval_s: float = 0.05):
        self.cuda_index, self.interval_s = cuda_index, interval_s
        self._util: list[float] = []
        self._power_w: list[float] = []
        self._memory_mb: list[float] = []
        self._energy_mj: int | None = 0
        """Energy used over the spans so far; None once the counter failed to read."""
        self._energy_start = -1
        self._spans = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None
        self._handle: Any = None

    def __enter__(self) -> GpuSampler:
        try:
            import pynvml

            self._nvml, self._handle = pynvml, nvml_handle(pynvml, self.cuda_index)
        except Exception:  # no NVML here: no telemetry, never a failed trial
            return self
        self._energy_start = self._energy()
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _energy(self) -> int:
        try:
            return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except Exception:
            return -1

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._util.append(float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu))
                self._power_w.append(self._nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0)
                self._memory_mb.append(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used / 2**20)
            except Exception:
                return

    def __exit__(self, *exc: object) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._spans += 1
        end = self._energy()
        if self._energy_mj is not None:
            self._energy_mj = self._energy_mj + end - self._energy_start if min(end, self._energy_start) >= 0 else None

    def summary(self, samples: int) -> dict[str, float]:
        """Mean/max utilisation (%), mean power (W), the most memory in use on the device (MB, every
        process's: NVML's view) and energy per sample (J) over the windows."""
        out: dict[str, float] = {}
        if self._util:
            out["gpu_util_mean"] = statistics.fmean(self._util)
            out["gpu_util_max"] = max(self._util)
        if self._power_w:
            out["power_w_mean"] = statistics.fmean(self._power_w)
        if self._memory_mb:
            out["gpu_memory_used_mb_max"] = max(self._memory_mb)
        if self._energy_mj is not None and self._spans and samples > 0:
            out["energy_j_per_sample"] = self._energy_mj / 1000.0 / samples
        return out


class Telemetry:
    """The samplers of one trial, entered together around the measured windows."""

    def __init__(self, cuda_index: int | None = None):
        self.cpu = CpuSampler()
        self.gpu = GpuSampler(cuda_index) if cuda_index is not None else None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Telemetry:
        self._stack.enter_context(self.cpu)
        if self.gpu is not None:
            self._stack.enter_context(self.gpu)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def summary(self, samples: int) -> dict[str, float]:
        """Every figure the samplers have, for `samples` samples processed inside the windows."""
        out = self.cpu.summary()
        if self.gpu is not None:
            out.update(self.gpu.summary(samples))
        return out
