"""What the hardware is: the host CPU's name and the thread settings a step runs under
(`cpu_name`, `thread_settings`), how cores are shared between processes (`core_shares`), and
peak dense FLOP/s per device and precision, for MFU.

Peak FLOP/s are matched by the device's whole name.

The name is what the framework reports (`torch.cuda.get_device_properties(i).name`, JAX's
`device.device_kind`), e.g. "NVIDIA H100 80GB HBM3". It is normalised (`normalise_name`: case,
the "NVIDIA " prefix, hyphens and runs of spaces) and must equal one of `DEVICE_NAMES` exactly:
a fragment is never enough ("NVIDIA L40S" is not an L4, "NVIDIA RTX A1000" not an A100, "NVIDIA
H100 NVL" not an H100 SXM). A MIG slice (`is_mig`) gets no peak: it has only part of the GPU's
SMs, and its share of the whole GPU's peak is not a datasheet figure.

Figures are the vendors' datasheet numbers for dense math. NVIDIA prints the Tensor Core rows
"with sparsity" (2:4 structured sparsity doubles the rate); where a datasheet prints only that
figure, the dense one used here is half of it, as the datasheets' footnotes say. A device missing
here gets no MFU rather than a guess.
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Collection

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "MKL_NUM_THREADS")
"""The environment variables that change how the CPU's threads run a step: the thread counts, and
whether a thread that waits at a barrier spins (OpenMP's default, for a while) or sleeps. On a
CPU, a small batch's step can run at half the speed with `OMP_WAIT_POLICY=PASSIVE`, so a study's
figures hold under the settings it was measured with (`thread_settings`)."""


def thread_settings(*more: str) -> dict[str, str]:
    """The `THREAD_VARIABLES` (and the variables `more` names) this process runs with, those set:
    a trial inherits them from the search, which leaves them as the user's shell has them (as
    their training run will)."""
    return {name: os.environ[name] for name in (*THREAD_VARIABLES, *more) if name in os.environ}


def cpu_name() -> str:
    """The host CPU's model and core count, `AMD EPYC (2 cores)`: the device name of a CPU trial."""
    model = ""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "")
    except OSError:
        pass
    return f"{model or platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


TFLOPS = 1e12


def _peaks(fp32: float, tf32: float, bf16: float, fp16: float | None = None) -> dict[str, float]:
    """Dense TFLOP/s per precision (FP32 on the CUDA cores, the others on the Tensor Cores)."""
    return {
        "fp32": fp32 * TFLOPS,
        "tf32": tf32 * TFLOPS,
        "bf16": bf16 * TFLOPS,
        "fp16": (bf16 if fp16 is None else fp16) * TFLOPS,
    }


# device -> precision -> dense FLOP/s.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    # NVIDIA H100 Tensor Core GPU datasheet, "H100 SXM" column: FP32 67 teraFLOPS; TF32 Tensor Core
    # 989 and BFLOAT16/FP16 Tensor Core 1,979 teraFLOPS "with sparsity", halved. (The H100
    # architecture whitepaper's dense figures, 494.7 and 989.4, agree to 0.05%.)
    "H100 SXM": _peaks(67, 989 / 2, 1979 / 2),
    # Same datasheet, "H100 PCIe" column (the earlier datasheet revision that lists it): FP32 51;
    # TF32 756 and BF16/FP16 1,513 teraFLOPS with sparsity, halved.
    "H100 PCIe": _peaks(51, 756 / 2, 1513 / 2),
    # Same datasheet, "H100 NVL" column (per GPU): FP32 60; TF32 835 and BF16/FP16 1,671 teraFLOPS
    # with sparsity, halved.
    "H100 NVL": _peaks(60, 835 / 2, 1671 / 2),
    # NVIDIA H200 product page (nvidia.com/en-us/data-center/h200), "H200 SXM" column: FP32 67;
    # TF32 989 and BF16/FP16 1,979 TFLOPS with sparsity (footnote 2), halved.
    "H200 SXM": _peaks(67, 989 / 2, 1979 / 2),
    # Same page, "H200 NVL" column: FP32 60; TF32 835 and BF16/FP16 1,671 TFLOPS with sparsity,
    # halved. (The page marks its figures preliminary.)
    "H200 NVL": _peaks(60, 835 / 2, 1671 / 2),
    # NVIDIA A100 Tensor Core GPU datasheet (40GB and 80GB, SXM and PCIe alike): FP32 19.5; TF32
    # 156 and BF16/FP16 312 TFLOPS, the dense halves of its "156 TF | 312 TF*" and "312 TF | 624 TF*".
    "A100": _peaks(19.5, 156, 312),
    # NVIDIA L4 datasheet: FP32 30.3; TF32 120 and BF16/FP16 242 teraFLOPS with sparsity, halved.
    "L4": _peaks(30.3, 120 / 2, 242 / 2),
    # NVIDIA L40 datasheet: FP32 90.5; TF32 "90.5 | 181*", BF16/FP16 "181.05 | 362.1*" (dense |
    # sparse): the dense figures.
    "L40": _peaks(90.5, 90.5, 181.05),
    # NVIDIA L40S datasheet: FP32 91.6; TF32 "183 | 366*", BF16/FP16 "362.05 | 733*" (dense |
    # sparse): the dense figures.
    "L40S": _peaks(91.6, 183, 362.05),
    # NVIDIA HGX platform page (nvidia.com/en-us/data-center/hgx), "Individual Blackwell GPU
    # Specifications", HGX B200 column: FP32 75 TFLOPS; TF32 2.2 and FP16/BF16 4.5 PFLOPS, which its
    # footnote gives "in sparse. Dense is one-half sparse spec shown": halved. (An earlier revision
    # of that page printed FP32 80. A GB200's GPUs, at a higher power limit, report another name.)
    "B200": _peaks(75, 2200 / 2, 4500 / 2),
}

DEVICE_NAMES: dict[str, str] = {
    "h100 80gb hbm3": "H100 SXM",
    "h100 pcie": "H100 PCIe",
    "h100 nvl": "H100 NVL",
    "h200": "H200 SXM",
    "h200 nvl": "H200 NVL",
    "a100 sxm4 80gb": "A100",
    "a100 sxm4 40gb": "A100",
    "a100 pcie 40gb": "A100",
    "a100 80gb pcie": "A100",
    "l4": "L4",
    "l40": "L40",
    "l40s": "L40S",
    "b200": "B200",
}
"""`normalise_name` of the names the frameworks report -> the `PEAK_FLOPS` entry."""


def normalise_name(device_name: str) -> str:
    """`device_name` in lower case, without the "NVIDIA " prefix, hyphens and underscores as spaces,
    single spaces: "NVIDIA A100-SXM4-80GB" -> "a100 sxm4 80gb"."""
    name = " ".join(re.sub(r"[-_]", " ", device_name.lower()).split())
    return name.removeprefix("nvidia ")


def is_mig(device_name: str) -> bool:
    """Whether `device_name` names a MIG slice ("NVIDIA A100-SXM4-40GB MIG 1g.5gb")."""
    return "mig" in normalise_name(device_name).split()


def peak_flops(device_name: str) -> dict[str, float]:
    """The peak table of the device called `device_name`, or {} when it is not known or is a MIG
    slice."""
    if is_mig(device_name):
        return {}
    entry = DEVICE_NAMES.get(normalise_name(device_name))
    return dict(PEAK_FLOPS[entry]) if entry is not None else {}


def core_shares(cpus: Collection[int], workers: int) -> list[set[int]]:
    """`cpus` split into `workers` contiguous shares, as even as they go (neighbouring cores, as a
    socket's are numbered); with fewer cores than workers, every worker shares them all."""
    ordered = sorted(cpus)
    if len(ordered) < workers:
        return [set(ordered) for _ in range(workers)]
    return [set(ordered[i * len(ordered) // workers : (i + 1) * len(ordered) // workers]) for i in range(workers)]
