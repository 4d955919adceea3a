"""Serving a Hugging Face classifier as it is: BERT built from a config (random weights, no
download), a dataset of dicts with labels, tuned for inference.

    autotuner search --spec examples/huggingface/bert-serving.yaml     # from the repository's root

The factory is the whole integration: the model and its inputs. A dict batch is passed as
`model(**batch)` with its `labels` left out (serving computes no loss); the output's `logits` are
what drift and the top-1 agreement compare; the labels give the accuracy beside them.
"""

from __future__ import annotations

import torch
from transformers import BertConfig, BertForSequenceClassification

from autotuner.backends.pytorch.workload import InferenceWorkload


def make_workload(
    layers: int = 2, width: int = 128, heads: int = 4, vocab: int = 1000, length: int = 64, samples: int = 1024
) -> InferenceWorkload:
    config = BertConfig(
        vocab_size=vocab,
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * width,
        max_position_embeddings=length,
        num_labels=4,
    )
    model = BertForSequenceClassification(config)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(vocab, (samples + 256, length), generator=generator)
    items = [{"input_ids": row, "attention_mask": torch.ones_like(row), "labels": int(row.sum()) % 4} for row in tokens]
    return InferenceWorkload(model=model, dataset=items[:samples], heldout=items[samples:], tokens_per_sample=length)
