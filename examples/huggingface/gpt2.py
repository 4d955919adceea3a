"""A Hugging Face model as it is: GPT-2 built from a config (random weights, no download), a
dataset of dicts, and the loss the model computes itself.

    autotuner search --spec examples/huggingface/gpt2.yaml     # from the repository's root

The factory below is the whole integration: no loss function (the output's `.loss` is the loss),
no wrapper around the model (a dict batch is passed as `model(**batch)`).
"""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from autotuner.backends.pytorch.workload import TorchWorkload


def make_workload(
    layers: int = 2,
    width: int = 128,
    heads: int = 4,
    vocab: int = 512,
    length: int = 64,
    samples: int = 1024,
    checkpointing: bool = False,
) -> TorchWorkload:
    """`checkpointing`: activation (gradient) checkpointing, turned on as transformers does it (the
    trials train the model as the factory leaves it)."""
    config = GPT2Config(
        vocab_size=vocab, n_positions=length, n_embd=width, n_layer=layers, n_head=heads, bos_token_id=0, eos_token_id=0
    )
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # what it computes anyway (its class name does not say): said, so no warning
    if checkpointing:  # transformers 5 renamed it; 4.x has the old name only
        getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
    tokens = _tokens(samples + 256, length, vocab)
    items = [{"input_ids": row, "labels": row} for row in tokens]  # the model shifts the labels itself
    return TorchWorkload(
        model=model,
        dataset=items[:samples],
        heldout=items[samples:],
        optimizer=lambda params: torch.optim.AdamW(params, lr=3e-4),
        tokens_per_sample=length,
    )


def _tokens(count: int, length: int, vocab: int) -> torch.Tensor:
    """Sequences with structure to learn (each token follows from the one before), seeded."""
    generator = torch.Generator().manual_seed(0)
    step = torch.randint(1, vocab, (count, 1), generator=generator)
    start = torch.randint(vocab, (count, 1), generator=generator)
    return (start + step * torch.arange(length)) % vocab
