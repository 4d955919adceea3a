"""A model tuned through an adapter: GPT-2 (built from a config, random weights) with a PEFT LoRA
adapter on its attention, the base weights frozen.

    autotuner search --spec examples/huggingface/lora.yaml     # from the repository's root

The factory returns the `PeftModel` as it is: the optimizer is handed the parameters that
require a gradient (the adapter's), and every knob applies to the wrapped model, as it would in
your own loop. Needs `pip install peft`.
"""

from __future__ import annotations

import torch
from peft import LoraConfig, get_peft_model

from autotuner.backends.pytorch.workload import TorchWorkload
from examples.huggingface import gpt2


def make_workload(rank: int = 8, **gpt2_args: int) -> TorchWorkload:
    """`gpt2_args`: those of `examples.huggingface.gpt2.make_workload` (its size and data)."""
    workload = gpt2.make_workload(**gpt2_args)
    adapter = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=["c_attn"], fan_in_fan_out=True, task_type="CAUSAL_LM"
    )
    workload.model = get_peft_model(workload.model, adapter)
    workload.optimizer = lambda params: torch.optim.AdamW([p for p in params if p.requires_grad], lr=1e-3)
    return workload
