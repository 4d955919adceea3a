"""`autotuner export --format onnx`: an inference study's winner, when it runs on ONNX Runtime, as
the files a server loads: the model exported through `torch.onnx` (`best.onnx`) and the session
it runs in (`best.onnx.json`: providers, intra-op threads, graph optimisation level, the inputs'
names and the batch size), which `onnxruntime.InferenceSession(path, options, providers=...)` takes.

The model is the workload's, built as the trials built it (the spec's factory and arguments, the
trial's seed), so its weights are the ones the study measured: a factory that loads real weights
exports those.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotuner.backends.pytorch.knobs.runtime import RUNTIME
from autotuner.config.knobs import BATCH_SIZE
from autotuner.errors import SpecError
from autotuner.spec.tasks import INFERENCE

FORMAT = "onnx"
"""This format's name, which the runtimes that run what it writes name (`Runtime.export_format`)."""

if TYPE_CHECKING:
    from autotuner.export.reader import TunedConfig
    from autotuner.spec.job import Job


def write(tuned: TunedConfig, job: Job, path: Path) -> list[Path]:
    """Write the ONNX model of `tuned` (an inference config of `job` on an ONNX runtime) to `path`
    and its session's settings beside it (`<path>.json`); both paths."""
    from autotuner.backends.pytorch.runtimes import runtime_named

    runtime = str(tuned.params.get(RUNTIME.name, tuned.backend))
    served = tuned.spec.get("task") == INFERENCE.name and RUNTIME.name in tuned.params
    if not served or runtime_named(runtime).export_format != FORMAT:
        raise SpecError(
            f"the best config runs on {runtime if tuned.spec.get('task') == 'inference' else 'a training loop'}: "
            "--format onnx writes the model of an inference config on ONNX Runtime",
            key="--format onnx",
        )
    import torch

    from autotuner.backends.pytorch.runtimes.onnxruntime import export_onnx, session_settings
    from autotuner.backends.pytorch.workload import as_inference_workload
    from autotuner.trials.factory import load_factory

    seed = job.spec.trial.seed
    random.seed(seed)
    torch.manual_seed(seed)
    workload = as_inference_workload(load_factory(job.workload_path())(**job.spec.workload_args), job.spec.workload)
    batch = int(tuned.params[BATCH_SIZE.name])
    items = workload.heldout if workload.heldout is not None else workload.dataset
    example = workload.collate([items[k] for k in range(batch)])
    names = export_onnx(workload.model.eval(), example, path)
    settings: dict[str, Any] = {**session_settings(tuned.params), "inputs": names, "batch_size": batch}
    options = path.with_name(f"{path.name}.json")
    options.write_text(json.dumps(settings, indent=2) + "\n")
    return [path, options]
