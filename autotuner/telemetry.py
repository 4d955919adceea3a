"""GPU telemetry from NVML (the nvidia-ml-py package) during a measured window.

A background thread samples utilisation and power; energy comes from the board's energy
counter where it has one. Without a GPU or NVML every figure is simply absent.
"""

from __future__ import annotations

import statistics
import threading
from typing import Any


class GpuSampler:
    """`with GpuSampler(index) as sampler: ...`; then `sampler.summary(samples)`."""

    def __init__(self, index: int, interval_s: float = 0.05):
        self.index, self.interval_s = index, interval_s
        self._util: list[float] = []
        self._power_w: list[float] = []
        self._energy_mj: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None
        self._handle: Any = None

    def __enter__(self) -> GpuSampler:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml, self._handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(self.index)
        except Exception:  # no NVML here: no telemetry, never a failed trial
            return self
        self._energy_mj = (self._energy(), 0)
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
            except Exception:
                return

    def __exit__(self, *exc: object) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        start, _ = self._energy_mj or (-1, 0)
        self._energy_mj = (start, self._energy())

    def summary(self, samples: int) -> dict[str, float]:
        """Mean/max utilisation (%), mean power (W) and energy per sample (J) over the window."""
        out: dict[str, float] = {}
        if self._util:
            out["gpu_util_mean"] = statistics.fmean(self._util)
            out["gpu_util_max"] = max(self._util)
        if self._power_w:
            out["power_w_mean"] = statistics.fmean(self._power_w)
        if self._energy_mj and min(self._energy_mj) >= 0 and samples > 0:
            out["energy_j_per_sample"] = (self._energy_mj[1] - self._energy_mj[0]) / 1000.0 / samples
        return out
