"""The peak FLOP/s table behind MFU: a device is matched by its whole name, never by a fragment of
it, and a MIG slice has no peak."""

from __future__ import annotations

import pytest

from autotuner.measurement import hardware

T = 1e12


@pytest.mark.parametrize(
    ("name", "entry"),
    [
        # as torch's get_device_properties(i).name and JAX's device_kind report them
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100-SXM4-40GB", "A100"),
        ("NVIDIA A100-PCIE-40GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40", "L40"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA B200", "B200"),
        # case, spacing and hyphens do not matter
        ("nvidia  l40s", "L40S"),
        ("NVIDIA A100 SXM4 80GB", "A100"),
        ("H100 NVL", "H100 NVL"),
    ],
)
def test_each_known_device_gets_its_own_entry(name: str, entry: str) -> None:
    assert hardware.peak_flops(name) == hardware.PEAK_FLOPS[entry]


@pytest.mark.parametrize(
    ("name", "bf16", "tf32", "fp32"),
    [
        # dense datasheet figures (the Tensor Core rows printed "with sparsity" halved)
        ("NVIDIA L4", 121 * T, 60 * T, 30.3 * T),
        ("NVIDIA L40", 181.05 * T, 90.5 * T, 90.5 * T),
        ("NVIDIA L40S", 362.05 * T, 183 * T, 91.6 * T),
        ("NVIDIA H100 80GB HBM3", 989.5 * T, 494.5 * T, 67 * T),
        ("NVIDIA H100 NVL", 835.5 * T, 417.5 * T, 60 * T),
        ("NVIDIA H200 NVL", 835.5 * T, 417.5 * T, 60 * T),
        ("NVIDIA A100-SXM4-40GB", 312 * T, 156 * T, 19.5 * T),
        ("NVIDIA B200", 2250 * T, 1100 * T, 75 * T),
    ],
)
def test_the_peaks_are_the_dense_datasheet_figures(name: str, bf16: float, tf32: float, fp32: float) -> None:
    peaks = hardware.peak_flops(name)
    assert peaks["bf16"] == pytest.approx(bf16) and peaks["fp16"] == pytest.approx(bf16)
    assert peaks["tf32"] == pytest.approx(tf32) and peaks["fp32"] == pytest.approx(fp32)


def test_a_longer_name_is_not_matched_by_a_shorter_one_inside_it() -> None:
    l4 = hardware.peak_flops("NVIDIA L4")
    assert hardware.peak_flops("NVIDIA L40")["bf16"] > 1.4 * l4["bf16"]  # L40 is not an L4
    assert hardware.peak_flops("NVIDIA L40S")["bf16"] > 2.9 * l4["bf16"]  # nor is L40S
    sxm = hardware.peak_flops("NVIDIA H100 80GB HBM3")
    assert hardware.peak_flops("NVIDIA H100 NVL")["bf16"] < 0.85 * sxm["bf16"]  # NVL is not an SXM
    assert hardware.peak_flops("NVIDIA H200 NVL")["bf16"] < 0.85 * hardware.peak_flops("NVIDIA H200")["bf16"]


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA RTX A1000",  # "a100" is in its name
        "NVIDIA RTX A1000 6GB Laptop GPU",
        "NVIDIA H100",  # no such name from the frameworks: which H100 is it?
        "NVIDIA H800",
        "NVIDIA GeForce RTX 4090",
        "NVIDIA L4X",
        "NVIDIA GB200",
        "AMD Instinct MI300X",
        "",
    ],
)
def test_an_unknown_device_gets_no_peak(name: str) -> None:
    assert hardware.peak_flops(name) == {}


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
        "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
        "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
        "NVIDIA H100 NVL MIG 7g.94gb",  # even the whole-GPU profile: no datasheet peak of its own
        "NVIDIA H200 MIG 1g.18gb",
    ],
)
def test_a_mig_slice_gets_no_peak(name: str) -> None:
    assert hardware.is_mig(name)
    assert hardware.peak_flops(name) == {}


@pytest.mark.parametrize("name", ["NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3", "NVIDIA RTX A1000", "Migrator 9"])
def test_a_whole_gpu_is_no_mig_slice(name: str) -> None:
    assert not hardware.is_mig(name)


def test_every_entry_has_every_precision_and_a_name_that_reaches_it() -> None:
    assert set(hardware.DEVICE_NAMES.values()) == set(hardware.PEAK_FLOPS)
    for entry, peaks in hardware.PEAK_FLOPS.items():
        assert set(peaks) == {"fp32", "tf32", "bf16", "fp16"}, entry
        assert peaks["bf16"] > peaks["fp32"] and peaks["tf32"] >= peaks["fp32"], entry
    for name in hardware.DEVICE_NAMES:
        assert hardware.normalise_name(name) == name  # keys are written normalised


def test_the_table_handed_out_is_a_copy() -> None:
    hardware.peak_flops("NVIDIA L4")["bf16"] = 0.0
    assert hardware.peak_flops("NVIDIA L4")["bf16"] == 121 * T


def test_thread_settings_are_described_and_compared(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotuner.measurement.hardware import thread_settings
    from autotuner.study.fingerprint import describe_threads, thread_mismatch
    from autotuner.trials.probe import Environment

    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert thread_settings()["OMP_WAIT_POLICY"] == "PASSIVE" and "OMP_NUM_THREADS" not in thread_settings()
    assert describe_threads({"intra_op": 2, "OMP_WAIT_POLICY": "PASSIVE"}) == "2 intra-op, OMP_WAIT_POLICY=PASSIVE"
    assert describe_threads({}) == "default"
    same = Environment.from_dict({"threads": {"intra_op": 2}})
    assert thread_mismatch(same, same) is None
    assert thread_mismatch(Environment.from_dict({}), same) is None  # an export from before they were recorded
    passive = Environment.from_dict({"threads": {"intra_op": 2, "OMP_WAIT_POLICY": "PASSIVE"}})
    assert thread_mismatch(passive, same) == (
        "its figures were measured with threads 2 intra-op, OMP_WAIT_POLICY=PASSIVE; this run has 2 intra-op"
    )
