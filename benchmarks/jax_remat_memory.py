"""What each `remat` value costs and saves, as XLA plans it: the temporary memory and the FLOPs of
the compiled gradient of the built-in gpt, with its layers checkpointed (the blocks it marks) and
with the loss checkpointed whole (what a loss that marks no block gets).

    python benchmarks/jax_remat_memory.py [--device cuda:0] [--workload-args '{"layers": 8}'] [--batch 32]

Nothing runs: each gradient is lowered and compiled, and XLA's `memory_analysis` and
`cost_analysis` of it are read, so the figures are the compiler's plan for this device, free of
timing noise. Writes benchmarks/results/jax_remat_memory.json, or `--out`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from autotuner.backends.jax import REMAT
from autotuner.backends.jax.devices import configure_process

H100_GPT = {"layers": 8, "dim": 512, "length": 256, "vocab": 4096, "heads": 8}
"""The gpt the H100 figures are of: activations, not weights, fill its memory at micro-batch 32."""


def _plan(compiled: Any) -> dict[str, float]:
    costs = compiled.cost_analysis()
    costs = (costs[0] if isinstance(costs, list) else costs) or {}  # one entry per computation in older jax
    return {"temp_mib": compiled.memory_analysis().temp_size_in_bytes / 2**20, "gflops": costs.get("flops", 0.0) / 1e9}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workload-args", default=json.dumps(H100_GPT))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "jax_remat_memory.json"))
    args = parser.parse_args()
    configure_process(args.device)  # before anything starts JAX: its own device, no preallocation

    import jax
    import jaxlib
    import numpy as np

    from autotuner.backends.jax.apply import TunedTraining
    from autotuner.backends.jax.builtin import gpt
    from autotuner.backends.jax.devices import resolve_device
    from autotuner.backends.jax.workload import REMAT_POLICIES

    device = resolve_device(args.device)
    precision = "bf16" if device.platform == "gpu" else "fp32"
    np.random.seed(0)
    workload = gpt(**json.loads(args.workload_args))
    batch = jax.device_put(workload.dataset[np.arange(args.batch)], device)
    config = {"precision": precision, "batch_size": args.batch, "accumulation": 1, "workers": 0, "jit": "on"}
    layers: dict[str, Any] = {}
    whole: dict[str, Any] = {}
    for remat in REMAT.choices or ():
        tuned = TunedTraining(
            {**config, "remat": remat, "donate": "off", "xla_flags": "default"},
            workload.loss_fn,
            workload.optimizer,
            device=device,
            params=workload.params,
        )
        with tuned.autocast():
            layers[remat] = _plan(jax.jit(tuned.model).lower(tuned.params, batch).compile())
            loss = workload.loss_fn
            if remat != "none":
                loss = jax.checkpoint(loss, policy=REMAT_POLICIES[remat])
            whole[remat] = _plan(jax.jit(jax.value_and_grad(loss)).lower(tuned.params, batch).compile())
    results = {
        "device": device.device_kind,
        "versions": {"jax": jax.__version__, "jaxlib": jaxlib.__version__},
        "settings": {"workload_args": json.loads(args.workload_args), "batch": args.batch},
        "layers_checkpointed": {"precision": precision, **layers},
        "whole_loss_checkpointed": {"precision": "fp32", **whole},
    }
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
