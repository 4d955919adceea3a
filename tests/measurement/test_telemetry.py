"""GPU telemetry without a GPU: a fake `pynvml` module (and a fake CUDA driver) stand in for NVML
and libcuda, so what is checked is which device is read and how power and energy are computed."""

from __future__ import annotations

import ctypes
import re
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from autotuner.measurement import nvml as reader
from autotuner.measurement import telemetry

SLOW = bytes(range(16))  # NVML index 0 (the first on the PCI bus), the slower GPU
FAST = bytes(range(0xF0, 0x100))  # NVML index 1, the faster: CUDA's cuda:0 (CUDA_DEVICE_ORDER=FASTEST_FIRST)
SLOW_UUID = "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
FAST_UUID = "GPU-f0f1f2f3-f4f5-f6f7-f8f9-fafbfcfdfeff"
SLICE = bytes(range(0x40, 0x50))
SLICE_UUID = "MIG-40414243-4445-4647-4849-4a4b4c4d4e4f"  # how NVML names a MIG slice


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeGpu:
    uuid: str
    watts: float
    """The rate the energy counter advances at, in the fake clock's seconds."""
    sampled_w: float
    """What nvmlDeviceGetPowerUsage says (a ~1 s trailing average on a real board): not that."""
    counter: bool = True
    utilisation: bool = True
    reads: list[str] = field(default_factory=list)
    processes: dict[int, int | None] = field(default_factory=dict)
    """pid -> device memory NVML counts for it (bytes; None where the driver does not say)."""
    sm: dict[int, list[int]] | None = None
    """pid -> the SM utilisation samples NVML keeps for it (%); None: per-process samples not supported."""
    total_bytes: int = 80 * 2**30
    """The device's memory (a MIG slice's: its own)."""


class FakeNVMLError(Exception):
    pass


def fake_pynvml(gpus: list[FakeGpu], clock: Callable[[], float]) -> types.ModuleType:
    """NVML over `gpus`, in NVML's order (by PCI bus)."""
    module = types.ModuleType("pynvml")

    def by_uuid(uuid: str | bytes) -> FakeGpu:
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for gpu in gpus:
            if gpu.uuid == text:
                return gpu
        raise FakeNVMLError(f"NVML_ERROR_NOT_FOUND: {text}")

    def energy(gpu: FakeGpu) -> int:
        gpu.reads.append("energy")
        if not gpu.counter:
            raise FakeNVMLError("NVML_ERROR_NOT_SUPPORTED")
        return round(gpu.watts * 1000 * clock())  # mJ

    def utilisation(gpu: FakeGpu) -> Any:
        if not gpu.utilisation:
            raise FakeNVMLError("NVML_ERROR_NOT_SUPPORTED")
        return types.SimpleNamespace(gpu=97, memory=40)

    module.NVMLError = FakeNVMLError  # type: ignore[attr-defined]
    module.nvmlInit = lambda: None  # type: ignore[attr-defined]
    module.nvmlSystemGetDriverVersion = lambda: "999.99"  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: len(gpus)  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda index: gpus[index]  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByUUID = by_uuid  # type: ignore[attr-defined]
    module.nvmlDeviceGetUUID = lambda gpu: gpu.uuid  # type: ignore[attr-defined]
    module.nvmlDeviceGetTotalEnergyConsumption = energy  # type: ignore[attr-defined]
    module.nvmlDeviceGetPowerUsage = lambda gpu: round(gpu.sampled_w * 1000)  # type: ignore[attr-defined]  # mW
    module.nvmlDeviceGetUtilizationRates = utilisation  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = lambda gpu: types.SimpleNamespace(  # type: ignore[attr-defined]
        used=3 * 2**30, total=gpu.total_bytes, free=gpu.total_bytes - 3 * 2**30
    )
    module.nvmlDeviceGetComputeRunningProcesses = lambda gpu: [  # type: ignore[attr-defined]
        types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpu.processes.items()
    ]

    def process_utilisation(gpu: FakeGpu, since_us: int) -> list[Any]:
        if gpu.sm is None:
            raise FakeNVMLError("NVML_ERROR_NOT_SUPPORTED")
        samples = [types.SimpleNamespace(pid=pid, smUtil=u) for pid, values in gpu.sm.items() for u in values]
        if not samples:
            raise FakeNVMLError("NVML_ERROR_NOT_FOUND")  # what NVML says when no process ran since then
        return samples

    module.nvmlDeviceGetProcessUtilization = process_utilisation  # type: ignore[attr-defined]
    return module


class FakeLibcuda:
    """The CUDA driver's view: ordinal -> device -> UUID bytes, in CUDA's order."""

    def __init__(self, uuids: list[bytes], v2: bool = True) -> None:
        self.uuids, self.initialised = uuids, False
        if v2:
            self.cuDeviceGetUuid_v2 = self._uuid

    def cuInit(self, flags: int) -> int:
        self.initialised = True
        return 0

    def cuDeviceGet(self, device: Any, ordinal: Any) -> int:
        if not self.initialised:
            return 3  # CUDA_ERROR_NOT_INITIALIZED
        if not 0 <= ordinal.value < len(self.uuids):
            return 101  # CUDA_ERROR_INVALID_DEVICE
        device.contents.value = 7 + ordinal.value  # a CUdevice is an opaque int
        return 0

    def _uuid(self, out: Any, device: Any) -> int:
        ctypes.memmove(out, self.uuids[device.value - 7], 16)
        return 0

    def cuDeviceGetUuid(self, out: Any, device: Any) -> int:  # the pre-11.4 entry point
        return self._uuid(out, device)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def install(monkeypatch: pytest.MonkeyPatch, clock: Callable[[], float]) -> tuple[FakeGpu, FakeGpu]:
    """Two GPUs: NVML lists the slow one first, CUDA (fastest first) the fast one."""
    slow = FakeGpu(SLOW_UUID, watts=100.0, sampled_w=90.0, counter=False)
    fast = FakeGpu(FAST_UUID, watts=400.0, sampled_w=350.0)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([slow, fast], clock))
    monkeypatch.setattr(reader, "_libcuda", lambda: FakeLibcuda([FAST, SLOW]))
    return slow, fast


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> tuple[FakeGpu, FakeGpu]:
    return install(monkeypatch, clock)


def test_a_uuid_is_written_as_nvml_writes_it() -> None:
    assert reader.format_uuid(SLOW) == SLOW_UUID
    assert reader.format_uuid(SLICE, prefix="MIG-") == SLICE_UUID
    with pytest.raises(ValueError):
        reader.format_uuid(b"\x00" * 15)


def test_the_cuda_driver_gives_the_uuid_of_a_cuda_ordinal(machine: tuple[FakeGpu, FakeGpu]) -> None:
    assert reader.cuda_uuid(0) == FAST_UUID  # cuda:0 is NVML's GPU 1
    assert reader.cuda_uuid(1) == SLOW_UUID
    assert reader.cuda_uuid(2) is None  # no such device
    assert reader.cuda_uuid(None) is None  # a JAX device without a local_hardware_id


def test_a_driver_older_than_cuda_11_4_gives_the_uuid_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "_libcuda", lambda: FakeLibcuda([FAST], v2=False))
    assert reader.cuda_uuid(0) == FAST_UUID


def test_without_a_cuda_driver_there_is_no_uuid_and_no_error() -> None:
    # this machine has no libcuda.so.1 (or, with a GPU, no device 10**6)
    assert reader.cuda_uuid(10**6) is None
    uuid = reader.cuda_uuid(0)
    assert uuid is None or re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", uuid)


def test_the_trial_device_is_found_in_nvml_by_uuid_not_by_its_cuda_ordinal(monkeypatch: pytest.MonkeyPatch) -> None:
    slow, fast = install(monkeypatch, time.perf_counter)  # the counters run on the sampler's own clock
    assert reader.has_energy_counter(reader.cuda_uuid(0)) is True  # the fast GPU has one
    assert reader.has_energy_counter(reader.cuda_uuid(1)) is False  # the slow one does not
    assert reader.has_energy_counter(None) is False
    trial = telemetry.Telemetry(gpu_uuid=reader.cuda_uuid(0))
    began = time.perf_counter()
    with trial:
        time.sleep(0.2)
    outer_s = time.perf_counter() - began
    summary = trial.summary(100)
    # the fast GPU's 400 W (not NVML index 0's, nor the 350 W its power reading says), within what
    # a preemption between reading the counter and the clock could add
    assert summary["power_w_mean"] == pytest.approx(400.0, rel=0.05)
    assert 400.0 * 0.2 / 100 * 0.999 <= summary["energy_j_per_sample"] <= 400.0 * outer_s / 100
    assert slow.reads == ["energy"]  # has_energy_counter's probe only: the trial never read it


def test_a_devices_memory_is_the_whole_of_it_as_nvml_reads_it(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    card = FakeGpu(FAST_UUID, 400.0, 350.0, total_bytes=141 * 2**30)
    piece = FakeGpu(SLICE_UUID, 0.0, 0.0, counter=False, total_bytes=18 * 2**30)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([card, piece], clock))
    assert reader.memory_total_mb(FAST_UUID) == 141 * 1024
    assert (
        reader.memory_total_mb("GPU-" + SLICE_UUID.removeprefix("MIG-")) == 18 * 1024
    )  # as cuda_uuid writes a slice's
    assert reader.memory_total_mb(SLOW_UUID) is None  # no such device
    assert reader.memory_total_mb(None) is None
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML at all: no figure, no error
    assert reader.memory_total_mb(FAST_UUID) is None


def test_power_is_the_energy_counters_increase_over_the_measured_time(
    machine: tuple[FakeGpu, FakeGpu], clock: FakeClock
) -> None:
    sampler = reader.GpuSampler(FAST_UUID, interval_s=0.002, clock=clock)
    with sampler:  # a first measured window: 2 s at 400 W
        clock.now += 2.0
        time.sleep(0.02)
    clock.now += 30.0  # between windows (another trial's turn, the drift phase): not measured
    with sampler:  # a second one: 0.5 s
        clock.now += 0.5
        time.sleep(0.02)
    summary = sampler.summary(samples=1000)
    assert summary["power_w_mean"] == pytest.approx(400.0)  # not the sampled 350 W
    assert summary["energy_j_per_sample"] == pytest.approx(400.0 * 2.5 / 1000)
    assert "power_w_sampled_mean" not in summary
    assert summary["gpu_util_mean"] == 97.0 and summary["gpu_memory_used_mb_max"] == 3 * 1024


def test_without_an_energy_counter_power_is_only_the_sampled_figure(
    machine: tuple[FakeGpu, FakeGpu], clock: FakeClock
) -> None:
    sampler = reader.GpuSampler(SLOW_UUID, interval_s=0.002, clock=clock)
    with sampler:
        clock.now += 1.0
        time.sleep(0.03)
    summary = sampler.summary(samples=10)
    assert summary["power_w_sampled_mean"] == pytest.approx(90.0)
    assert "power_w_mean" not in summary and "energy_j_per_sample" not in summary


def test_a_counter_that_fails_midway_gives_no_energy(machine: tuple[FakeGpu, FakeGpu], clock: FakeClock) -> None:
    _, fast = machine
    sampler = reader.GpuSampler(FAST_UUID, interval_s=0.002, clock=clock)
    with sampler:
        clock.now += 1.0
        time.sleep(0.02)
    fast.counter = False
    with sampler:
        clock.now += 1.0
        time.sleep(0.02)
    fast.counter = True  # back again: the energy over the spans stays unknown
    with sampler:
        clock.now += 1.0
        time.sleep(0.02)
    summary = sampler.summary(samples=10)
    assert "energy_j_per_sample" not in summary and "power_w_mean" not in summary
    assert summary["power_w_sampled_mean"] == pytest.approx(350.0)


def test_a_counter_that_runs_backwards_gives_no_energy(machine: tuple[FakeGpu, FakeGpu], clock: FakeClock) -> None:
    sampler = reader.GpuSampler(FAST_UUID, interval_s=0.002, clock=clock)
    with sampler:
        clock.now -= 1.0  # the driver was reloaded: the counter restarted
        time.sleep(0.01)
    assert "energy_j_per_sample" not in sampler.summary(samples=10)


def test_a_mig_slice_is_found_by_its_uuid_and_has_no_energy(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> None:
    # the CUDA driver gives a slice's UUID bytes; NVML knows them as MIG-...; a slice has no
    # counter, no power reading and no utilisation of its own, only its memory
    piece = FakeGpu(SLICE_UUID, watts=0.0, sampled_w=0.0, counter=False, utilisation=False)
    nvml = fake_pynvml([FakeGpu(SLOW_UUID, 100.0, 90.0), piece], clock)
    nvml.nvmlDeviceGetPowerUsage = lambda gpu: (_ for _ in ()).throw(FakeNVMLError("NOT_SUPPORTED"))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(reader, "_libcuda", lambda: FakeLibcuda([SLICE]))
    uuid = reader.cuda_uuid(0)
    assert uuid == "GPU-" + SLICE_UUID.removeprefix("MIG-")
    assert reader.nvml_handle(nvml, uuid) is piece
    assert reader.has_energy_counter(uuid) is False
    sampler = reader.GpuSampler(uuid, interval_s=0.002, clock=clock)
    with sampler:
        clock.now += 1.0
        time.sleep(0.03)
    assert sampler.summary(samples=10) == {"gpu_memory_used_mb_max": 3 * 1024}


def test_a_uuid_nvml_does_not_know_gives_no_gpu_telemetry(machine: tuple[FakeGpu, FakeGpu], clock: FakeClock) -> None:
    unknown = "GPU-ffffffff-ffff-ffff-ffff-ffffffffffff"
    assert reader.has_energy_counter(unknown) is False
    sampler = reader.GpuSampler(unknown, interval_s=0.002, clock=clock)
    with sampler:
        time.sleep(0.01)
    assert sampler.summary(100) == {}


def test_without_a_gpu_uuid_there_is_no_gpu_sampler() -> None:
    assert telemetry.Telemetry().gpu is None
    assert telemetry.Telemetry(gpu_uuid=None).gpu is None


def test_without_a_gpu_the_gpu_telemetry_is_absent_and_the_trial_goes_on() -> None:
    # nvidia-ml-py is installed, the NVIDIA driver is not: NVML fails to initialise
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pytest.skip("NVML runs here: this test is for a machine without a GPU")
    sampler = reader.GpuSampler(FAST_UUID, interval_s=0.01)
    with sampler:
        time.sleep(0.05)
    assert sampler.summary(100) == {}
    assert reader.has_energy_counter(FAST_UUID) is False


def test_the_memory_nvml_counts_for_this_process_is_its_own(machine: tuple[FakeGpu, FakeGpu], clock: FakeClock) -> None:
    """Another process's memory on the same GPU is not this trial's; without an entry for this
    process (another PID namespace) there is no figure."""
    import os

    _, fast = machine
    fast.processes = {os.getpid() + 1: 40 * 2**30, os.getpid(): 2 * 2**30}
    sampler = reader.GpuSampler(FAST_UUID, interval_s=0.002, clock=clock)
    with sampler:
        time.sleep(0.03)
    assert sampler.summary(samples=1)["gpu_process_memory_mb_max"] == 2 * 1024
    fast.processes = {os.getpid() + 1: 40 * 2**30}
    sampler = reader.GpuSampler(FAST_UUID, interval_s=0.002, clock=clock)
    with sampler:
        time.sleep(0.03)
    assert "gpu_process_memory_mb_max" not in sampler.summary(samples=1)


def test_other_processes_on_the_device_are_counted_and_their_sm_share_is_contention(
    machine: tuple[FakeGpu, FakeGpu], clock: FakeClock
) -> None:
    """Process 1 (init: another process group) on the trial's GPU beside this one; its SM samples
    are its share of the device, this process's own are not counted (nor junk over 100%)."""
    import os

    from autotuner.measurement.contention import contention

    _, fast = machine
    fast.processes = {os.getpid(): 2**30, 1: 2**30}
    fast.sm = {os.getpid(): [90, 95], 1: [30, 50, 255]}
    sampler = reader.GpuSampler(FAST_UUID, interval_s=0.002, clock=clock)
    with sampler:
        time.sleep(0.03)
    summary = sampler.summary(samples=1)
    assert summary["gpu_other_processes_max"] == 1 and summary["gpu_others_sm_util_mean"] == 40.0
    assert contention({**summary, "cpu_others_cores": 0.1, "cpu_cores": 2.0}) == 0.4  # the larger share
    fast.sm = {}  # no process ran a kernel in the span
    sampler = reader.GpuSampler(FAST_UUID, interval_s=0.002, clock=clock)
    with sampler:
        time.sleep(0.03)
    assert sampler.summary(samples=1)["gpu_others_sm_util_mean"] == 0.0
    fast.sm, fast.processes = None, {1: 2**30}  # no per-process samples; this process not listed
    sampler = reader.GpuSampler(FAST_UUID, interval_s=0.002, clock=clock)
    with sampler:
        time.sleep(0.03)
    summary = sampler.summary(samples=1)
    assert "gpu_others_sm_util_mean" not in summary and "gpu_other_processes_max" not in summary


def test_a_trial_on_several_gpus_adds_their_energy_and_averages_their_use() -> None:
    """The ranks of one trial each have a GPU: the trial's energy per sample is all of theirs for
    its global samples, its power their sum, its utilisation their mean, its peaks their most."""
    first = {"energy_j_per_sample": 0.5, "power_w_mean": 300.0, "gpu_util_mean": 80.0, "gpu_util_max": 90.0}
    second = {"energy_j_per_sample": 0.25, "power_w_mean": 200.0, "gpu_util_mean": 60.0, "gpu_util_max": 99.0}
    assert telemetry.combined([first, second]) == {
        "energy_j_per_sample": 0.75,
        "power_w_mean": 500.0,
        "gpu_util_mean": 70.0,
        "gpu_util_max": 99.0,
    }
    assert telemetry.combined([first, {"gpu_util_mean": 50.0}]) == {"gpu_util_mean": 65.0}  # what every GPU has
    assert telemetry.combined([first]) == first
