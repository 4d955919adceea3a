"""A masked-LM encoder fine-tuned as a classifier, as it is usually fed: DistilBERT built from a
config (random weights, no download), on token sequences of different lengths that a collate
function pads to the longest in each batch.

    autotuner search --spec examples/huggingface/classifier.yaml           # from the repository's root
    autotuner search --spec examples/huggingface/classifier-serving.yaml   # the same model, served

Padding to each batch's own length means a config's micro-batch changes the shapes the model
sees (a larger batch holds a longer sequence): autotuner measures that cost too, as your job
pays it. The same factory serves (`task: inference`): its model, its data and its collate function
are taken, the labels left out of the call.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DistilBertConfig, DistilBertForSequenceClassification

from autotuner.backends.pytorch.workload import TorchWorkload

LABELS = 4


def make_workload(
    layers: int = 2, width: int = 128, heads: int = 4, vocab: int = 1000, longest: int = 64, samples: int = 1024
) -> TorchWorkload:
    config = DistilBertConfig(
        vocab_size=vocab,
        dim=width,
        n_layers=layers,
        n_heads=heads,
        hidden_dim=4 * width,
        max_position_embeddings=longest,
        num_labels=LABELS,
        pad_token_id=0,
    )
    model = DistilBertForSequenceClassification(config)
    items = [_item(index, vocab, longest) for index in range(samples + 256)]
    return TorchWorkload(
        model=model,
        dataset=items[:samples],
        heldout=items[samples:],
        collate_fn=pad,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-4),
    )


def pad(items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Items of different lengths as one batch, padded (token 0, masked out) to its longest."""
    ids = torch.nn.utils.rnn.pad_sequence([item["input_ids"] for item in items], batch_first=True, padding_value=0)
    mask = torch.nn.utils.rnn.pad_sequence(
        [torch.ones_like(item["input_ids"]) for item in items], batch_first=True, padding_value=0
    )
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([item["labels"] for item in items])}


def _item(index: int, vocab: int, longest: int) -> dict[str, Any]:
    """A sequence of 1 to `longest` non-zero tokens and a label it determines, from its index alone."""
    generator = torch.Generator().manual_seed(index)
    length = int(torch.randint(max(1, longest // 4), longest + 1, (1,), generator=generator))
    ids = torch.randint(1, vocab, (length,), generator=generator)
    return {"input_ids": ids, "labels": int(ids[0]) % LABELS}
