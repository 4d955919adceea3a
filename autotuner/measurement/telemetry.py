"""Telemetry during the measured windows of a trial: the CPU always, the GPU where there is one.

`Telemetry` is what a runner hands to `autotuner.measurement.measured_phase.measure_throughput`, which enters it
around the timed windows only (not the warm-up or the calibration window).

* CPU (`CpuSampler`): the CPU time of the trial's process group (the trial process leads its
  own group, so its data-loader workers are counted) over the windows' wall time, as a share of
  the cores the process may run on; the peak resident memory of the group's processes; and the
  CPU time everything else took on those cores meanwhile (other processes, interrupts, a
  hypervisor's steal: `/proc/stat` less the group's), what `autotuner.measurement.contention` judges a
  busy machine by.
* GPU (`autotuner.measurement.nvml.GpuSampler`, NVML from the nvidia-ml-py package): a background
  thread samples utilisation and the memory in use; energy and mean power come from the board's
  energy counter where it has one, else from NVML's ~1 s power readings. Without a GPU, its UUID
  or NVML every GPU figure is simply absent.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Collection, Iterator, Sequence

from autotuner.measurement.nvml import GpuSampler

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
    # utime, stime, and cutime, cstime: what the children each one has reaped used, so that a
    # process of the group that ended meanwhile (a compile worker the pool quiesced, a loader
    # worker that was not persistent) still counts as the group's, not as other work
    return sum(sum(int(fields[i]) for i in (11, 12, 13, 14)) for _, fields in stats) / _TICKS


def groups_cpu_seconds(groups: Collection[int]) -> float:
    """CPU time the processes of process groups `groups` have used (Linux; 0 elsewhere): the live
    ones', and that of the children they reaped."""
    return _cpu_seconds(_groups_stats(groups))


MIN_OTHERS_WALL_S = 0.5
"""The shortest windows (in all) whose other work is told: the kernel counts CPU time in ticks of
10 ms, per CPU and per process, so over a tenth of a second a tick or two either way would read as
10% of a core; over half a second, as 2-4% (under the 10% a trial is contended by). Windows
that another process slowed unevenly can come out shorter than `trial.min_window_s` (calibrated
while it took more of the CPU than it did later), so a trial's windows may last under a second."""
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
"""The fields of a `cpuN` line of /proc/stat that are work: user, nice, system, irq, softirq and
steal (idle and iowait are not)."""


def usable_cpus() -> set[int]:
    """The CPUs this process may run on."""
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def cpus_busy_seconds(cpus: Collection[int]) -> float | None:
    """CPU time spent working on `cpus` by anything (every process, interrupts, and the steal of a
    hypervisor serving other machines) since boot, from /proc/stat; None where there is none."""
    try:
        with open("/proc/stat") as stat:
            lines = stat.readlines()
    except OSError:
        return None
    ticks = 0
    for line in lines:
        label, _, rest = line.partition(" ")
        if label.startswith("cpu") and label[3:].isdigit() and int(label[3:]) in cpus:
            fields = rest.split()
            ticks += sum(int(fields[i]) for i in _BUSY_FIELDS if i < len(fields))
    return ticks / _TICKS


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
        self._cpus = usable_cpus()
        self.cores = len(self._cpus)
        self._start: tuple[float, float, float | None] | None = None
        self._wall = self._busy = self._peak_rss_mb = 0.0
        self._others: float | None = 0.0
        self._processes = 0

    def __enter__(self) -> CpuSampler:
        self._start = (time.perf_counter(), groups_cpu_seconds([os.getpgrp()]), cpus_busy_seconds(self._cpus))
        return self

    def __exit__(self, *exc: object) -> None:
        stats = _groups_stats([os.getpgrp()])  # one pass over /proc
        machine = cpus_busy_seconds(self._cpus)
        pids = [pid for pid, _ in stats]
        if self._start is None or not pids:  # no /proc: nothing to tell
            return
        group = _cpu_seconds(stats)
        self._wall += time.perf_counter() - self._start[0]
        self._busy += group - self._start[1]
        others = self._others_in_span(machine, group)
        self._others = None if others is None or self._others is None else self._others + others
        self._peak_rss_mb = max(self._peak_rss_mb, _peak_rss_mb(pids))
        self._processes = max(self._processes, len(pids))

    def _others_in_span(self, machine: float | None, group: float) -> float | None:
        """The CPU time everything outside the group took on the cores since the span began, given
        the machine's and the group's CPU time now; None without /proc/stat. (The group's own time
        on other CPUs would count against it: it has none, its processes inherit the affinity.)"""
        assert self._start is not None
        _, group_before, machine_before = self._start
        if machine is None or machine_before is None:
            return None
        return max(0.0, machine - machine_before - (group - group_before))

    @property
    def group_cpu_s(self) -> float:
        """The CPU time the process group used over the spans so far (its reaped children's too)."""
        return self._busy

    def others_share(self) -> float:
        """The share of the cores that everything outside the group took so far, read while the
        sampler is entered (over its spans before, too); 0 where it cannot be told (as `summary`,
        over less than `MIN_OTHERS_WALL_S`)."""
        if self._start is None or self._others is None:
            return 0.0
        others = self._others_in_span(cpus_busy_seconds(self._cpus), groups_cpu_seconds([os.getpgrp()]))
        wall = self._wall + time.perf_counter() - self._start[0]
        if others is None or wall < MIN_OTHERS_WALL_S:
            return 0.0
        return (self._others + others) / (wall * self.cores)

    def summary(self) -> dict[str, float]:
        """`cpu_util_mean` (% of the `cpu_cores` available), `processes`, `peak_rss_mb` (the sum of
        each process's own peak: an upper bound of the group's) and `cpu_others_cores`, the cores
        everything outside the group kept busy on average (absent without /proc/stat, and over
        less than `MIN_OTHERS_WALL_S`)."""
        if self._wall <= 0:
            return {}
        out = {
            "cpu_util_mean": 100.0 * self._busy / (self._wall * self.cores),
            "cpu_cores": float(self.cores),
            "processes": float(self._processes),
            "peak_rss_mb": self._peak_rss_mb,
        }
        if self._others is not None and self._wall >= MIN_OTHERS_WALL_S:
            out["cpu_others_cores"] = self._others / self._wall
        return out


ADDED = ("energy_j_per_sample", "power_w_mean", "power_w_sampled_mean")
"""GPU figures of a trial on several GPUs that add up over them; the others are the GPUs' mean
(`_util_mean`, `_sm_util_mean`) or most (`_max`)."""


def combined(summaries: list[dict[str, float]]) -> dict[str, float]:
    """The GPU figures of a trial's GPUs (`GpuSampler.summary` of each) as the trial's: energy
    and power summed, utilisation averaged, peaks their most. A figure some GPU lacks is left out."""
    out: dict[str, float] = {}
    for key in set.intersection(*(set(s) for s in summaries)) if summaries else ():
        values = [s[key] for s in summaries]
        out[key] = sum(values) if key in ADDED else max(values) if key.endswith("_max") else statistics.fmean(values)
    return out


class Telemetry:
    """The samplers of one trial, entered together around the measured windows. `gpu_uuid`: the
    trial's GPU (`cuda_uuid` of its CUDA ordinal), or None for no GPU telemetry; `more_gpus`: the
    other GPUs of a trial of several processes, whose figures are combined with it (`combined`)."""

    def __init__(self, gpu_uuid: str | None = None, more_gpus: Sequence[str] = ()):
        self.cpu = CpuSampler()
        self.gpu = GpuSampler(gpu_uuid) if gpu_uuid is not None else None
        self.more_gpus = [GpuSampler(uuid) for uuid in more_gpus] if self.gpu is not None else []
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Telemetry:
        self._stack.enter_context(self.cpu)
        for gpu in (self.gpu, *self.more_gpus):
            if gpu is not None:
                self._stack.enter_context(gpu)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def summary(self, samples: int) -> dict[str, float]:
        """Every figure the samplers have, for `samples` samples processed inside every span it
        was entered for (`autotuner.measurement.timing.Throughput.telemetry_samples`)."""
        out = self.cpu.summary()
        if self.gpu is not None:
            out.update(combined([gpu.summary(samples) for gpu in (self.gpu, *self.more_gpus)]))
        return out
