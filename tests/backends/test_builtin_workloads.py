"""The built-in PyTorch workloads as jobs to tune: their step must cost the same late in training
as in the short trials that measured it, or no speedup a study exports can hold."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from autotuner.backends.pytorch.builtin import BasicBlock, mlp, resnet

STEPS = 1_000
"""Past the ~800 steps it takes AdamW's first moment (x0.9 per step) to decay from a gradient's
size into subnormal floats once that gradient is zero."""


@pytest.mark.slow
def test_the_mlp_keeps_every_gradient_and_moment_out_of_zero_and_subnormal_floats() -> None:
    # With ReLU this built-in (the quickstart's job, at its full size) had 2.0 million weights
    # with a zero gradient after 1,000 steps of 8 samples, and 1.5 million subnormal moments: on
    # a Xeon its bf16 step 26-34% slower, long after the trials.
    torch.manual_seed(0)
    job = mlp()
    optimizer = job.optimizer(job.model.parameters())
    inputs, labels = job.dataset.tensors  # type: ignore[attr-defined]
    batch = 8
    for step in range(STEPS):
        start = step * batch % len(inputs)
        optimizer.zero_grad(set_to_none=True)
        job.loss_fn(job.model(inputs[start : start + batch]), labels[start : start + batch]).backward()
        optimizer.step()

    tiny = torch.finfo(torch.float32).tiny
    zero_gradients = sum(int((p.grad == 0).sum()) for p in job.model.parameters())  # type: ignore[operator]
    moments = [m for state in optimizer.state.values() for key, m in state.items() if key != "step"]
    subnormal = sum(int(((m != 0) & (m.abs() < tiny)).sum()) for m in moments)
    assert (zero_gradients, subnormal) == (0, 0)


SMALL_RESNET = {"size": 16, "width": 4, "blocks": [1, 2], "samples": 64}
"""Two stages, one of them downsampling, with a block whose shortcut is the identity and two
whose shortcut is a projection (the stem's width to the first stage's is equal: identity)."""


def test_the_resnet_trains_on_images_that_depend_only_on_their_index() -> None:
    torch.manual_seed(0)
    job = resnet(**SMALL_RESNET)
    again = resnet(**SMALL_RESNET)
    for index in (5, 0, 63):
        (image, label), (same, same_label) = job.dataset[index], again.dataset[index]
        assert image.shape == (3, 16, 16)
        assert torch.equal(image, same) and int(label) == int(same_label)
    assert not torch.equal(job.dataset[1][0], job.dataset[2][0])

    batch = torch.utils.data.default_collate([job.dataset[i] for i in range(16)])
    optimizer = job.optimizer(job.model.parameters())
    losses = []
    for _ in range(8):
        optimizer.zero_grad(set_to_none=True)
        loss = job.loss(job.model, batch)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]


def test_the_resnets_repeated_block_is_its_largest_repeated_module_type() -> None:
    # What activation checkpointing of "the largest repeated submodule type" wraps.
    model = resnet(**SMALL_RESNET).model
    modules = [m for m in model.modules() if m is not model]
    repeated = {t for t, n in Counter(type(m) for m in modules).items() if n > 1}
    largest = max((m for m in modules if type(m) in repeated), key=lambda m: sum(p.numel() for p in m.parameters()))
    assert type(largest) is BasicBlock
    assert sum(isinstance(m, BasicBlock) for m in modules) == 3
    assert sum(getattr(m, "projects", False) for m in modules) == 1


def test_the_resnet_computes_the_same_in_channels_last() -> None:
    job = resnet(**SMALL_RESNET)
    job.model.eval()
    images = torch.stack([job.dataset[i][0] for i in range(4)])
    with torch.no_grad():
        contiguous = job.model(images)
        job.model.to(memory_format=torch.channels_last)
        channels_last = job.model(images.contiguous(memory_format=torch.channels_last))
    assert isinstance(job.model.stem, nn.Conv2d)
    assert job.model.stem.weight.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(channels_last, contiguous, rtol=1e-4, atol=1e-5)


def test_the_resnets_declared_flops_are_what_torchs_flop_counter_counts() -> None:
    for size in (SMALL_RESNET, {"size": 32, "samples": 8}):
        job = resnet(**size)
        batch = torch.utils.data.default_collate([job.dataset[i] for i in range(2)])
        with FlopCounterMode(display=False) as counter:
            job.loss(job.model, batch).backward()
        assert job.flops_per_sample == counter.get_total_flops() / 2


def test_the_resnets_step_is_the_same_at_any_micro_batch() -> None:
    # No BatchNorm: its statistics per micro-batch made every micro-batch but the reference's
    # drift over the tolerance, so none could be tuned.
    torch.manual_seed(0)
    job = resnet(**SMALL_RESNET)
    batch = torch.utils.data.default_collate([job.dataset[i] for i in range(32)])
    heldout = torch.utils.data.default_collate([job.heldout[i] for i in range(16)])  # type: ignore[index]

    def heldout_loss(micro: int) -> float:
        model = copy.deepcopy(job.model)
        optimizer = job.optimizer(model.parameters())
        for _ in range(2):
            optimizer.zero_grad(set_to_none=True)
            for start in range(0, 32, micro):
                part = [t[start : start + micro] for t in batch]
                (job.loss(model, part) * micro / 32).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            return float(job.loss(model, heldout))

    assert heldout_loss(32) == pytest.approx(heldout_loss(8), rel=1e-4)
