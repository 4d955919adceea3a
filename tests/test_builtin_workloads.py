"""The built-in PyTorch workloads as jobs to tune: their step must cost the same late in training
as in the short trials that measured it, or no speedup a study exports can hold."""

from __future__ import annotations

import torch

from autotuner.backends.pytorch.workloads import mlp

STEPS = 1_000
"""Past the ~800 steps it takes AdamW's first moment (x0.9 per step) to decay from a gradient's
size into subnormal floats once that gradient is zero."""


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
