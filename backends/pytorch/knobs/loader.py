"""`pin_memory` and `prefetch_factor`: how the data loader hands its batches over."""

from __future__ import annotations

from autotuner.backends.pytorch.capabilities import TorchCapabilities
from autotuner.backends.pytorch.knobs._family import Build, TorchFamily
from autotuner.config.knobs import WORKERS, Config, Knob

PIN_MEMORY = Knob(
    "pin_memory",
    "DataLoader `pin_memory` (batches copied to the GPU non-blocking)",
    (False, True),
    False,
    not_run_when="no GPU",
    recommended=(True,),
    compiled=False,
    quiet=True,
    implied=lambda device: device.startswith("cuda"),  # before it was a knob, the loader pinned on a GPU
)
PREFETCH_FACTOR = Knob(
    "prefetch_factor",
    "DataLoader `prefetch_factor`: batches each loader worker loads ahead",
    None,
    2,
    maximum=64,
    compiled=False,
    quiet=True,
    not_run_when="other than 2 without loader workers",
)


def irrelevant(knob: Knob, value: object, caps: TorchCapabilities) -> str | None:
    if knob.name == PIN_MEMORY.name and not caps.accelerator:
        return "pin_memory=True: pinned host memory only speeds copies to a GPU"
    return None


def conflict(config: Config, caps: TorchCapabilities) -> str | None:
    if config.get(PREFETCH_FACTOR.name, PREFETCH_FACTOR.reference) != PREFETCH_FACTOR.reference and not config.get(
        WORKERS.name, 0
    ):
        return "prefetch_factor: only loader workers prefetch (workers=0 loads in the training process)"
    return None


def apply(build: Build) -> None:
    """Pinned batches where the config pins them and the device is a GPU (on a CPU it does nothing).
    The prefetch depth is the loader's (`TunedTraining.make_loader`)."""
    build.pin_memory = bool(PIN_MEMORY.of(build.config)) and build.device.type == "cuda"


FAMILY = TorchFamily((PIN_MEMORY, PREFETCH_FACTOR), irrelevant, conflict, apply)
