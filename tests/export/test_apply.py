"""Applying an exported config: the PyTorch object a user's loop (and every trial) trains through,
and reading the export (`load_config`). What `autotuner apply` prints of a run is
`tests/output/test_apply_console.py`; `tests/e2e/test_apply.py` runs it. CPU only, real torch."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn
from torch._dynamo.eval_frame import OptimizedModule

from autotuner.backends.pytorch.apply import TunedTraining, set_matmul_precision
from autotuner.errors import SpecError
from autotuner.export.reader import READS_VERSIONS, TunedConfig, load_config, parse_config
from autotuner.export.writer import EXPORT_VERSION
from autotuner.measurement.interval import Interval
from tests.support.helpers import EXPORTED

FP32 = {"precision": "fp32", "batch_size": 4, "accumulation": 4, "workers": 0, "compile": "none"}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def _data(samples: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(samples, 8, generator=generator), torch.randint(3, (samples,), generator=generator)


@pytest.fixture(autouse=True)
def _restore_matmul_flags() -> Iterator[None]:
    """TunedTraining sets process-wide precision flags: put back what this test process had."""
    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
    )
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
    torch.set_float32_matmul_precision(saved[2])


# ------------------------------------------------------------------ TunedTraining


def test_accumulated_gradients_equal_the_whole_batch_gradients() -> None:
    inputs, target = _data(16)
    whole = _model()
    F.cross_entropy(whole(inputs), target).backward()
    expected = [p.grad.clone() for p in whole.parameters() if p.grad is not None]

    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    at_step: list[list[torch.Tensor]] = []
    optimizer.register_step_pre_hook(
        lambda *_: at_step.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    )
    tuned = TunedTraining(FP32, model, optimizer, device="cpu")
    for start in range(0, 16, 4):  # 4 micro-batches of 4
        with tuned.autocast():
            loss = F.cross_entropy(tuned.model(inputs[start : start + 4]), target[start : start + 4])
        tuned.backward(loss)
        tuned.step()
    assert len(at_step) == 1 and len(at_step[0]) == len(expected)
    for got, want in zip(at_step[0], expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert all(p.grad is None for p in model.parameters()), "the step must zero the gradients"


def test_step_steps_the_optimizer_exactly_once_every_accumulation_calls() -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps: list[int] = []
    optimizer.register_step_post_hook(lambda *_: steps.append(1))
    tuned = TunedTraining({**FP32, "batch_size": 2, "accumulation": 3}, model, optimizer, device="cpu")
    inputs, target = _data(2)
    reported = []
    for _ in range(9):
        tuned.backward(F.cross_entropy(tuned.model(inputs), target))
        reported.append(tuned.step())
    assert reported == [False, False, True] * 3
    assert len(steps) == 3
    assert tuned.global_batch == 6


def test_one_process_has_nothing_to_finish() -> None:
    """`finish` ends the training of a rank of several (tests/e2e/test_torchrun_export.py runs
    two): one process has no ranks to wait for and keeps its model as it is."""
    model = _model()
    tuned = TunedTraining(FP32, model, torch.optim.SGD(model.parameters(), lr=0.1), device="cpu")
    tuned.finish()
    assert tuned.model is model and tuned.module is model


@pytest.mark.parametrize(
    "precision, scaled, dtype",
    [("fp16", True, torch.float16), ("bf16", False, torch.bfloat16), ("fp32", False, torch.float32)],
)
def test_only_fp16_gets_an_enabled_grad_scaler_and_autocast_follows_the_precision(
    precision: str, scaled: bool, dtype: torch.dtype
) -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tuned = TunedTraining({**FP32, "precision": precision, "accumulation": 1}, model, optimizer, device="cpu")
    assert isinstance(tuned.scaler, torch.amp.GradScaler)
    assert tuned.scaler.is_enabled() is scaled
    inputs, target = _data(4)
    with tuned.autocast():
        output = tuned.model(inputs)
        loss = F.cross_entropy(output, target)
    assert output.dtype == dtype
    before = [p.detach().clone() for p in model.parameters()]
    tuned.backward(loss)
    assert tuned.step() is True
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)), "no update"


def test_precision_flags_are_tf32_for_tf32_and_strict_otherwise() -> None:
    TunedTraining({**FP32, "precision": "tf32"}, _model(), torch.optim.SGD(_model().parameters(), lr=0.1), device="cpu")
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert torch.get_float32_matmul_precision() == "high"
    TunedTraining({**FP32, "precision": "bf16"}, _model(), torch.optim.SGD(_model().parameters(), lr=0.1), device="cpu")
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert torch.get_float32_matmul_precision() == "highest"
    set_matmul_precision("fp32")


@pytest.mark.parametrize("mode, autotune", [("default", False), ("max-autotune", True)])
def test_compile_wraps_the_model_with_the_mode(mode: str, autotune: bool) -> None:
    # Asserted on the wrapper without running it: a CPU compile costs ~20 s per model.
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tuned = TunedTraining({**FP32, "compile": mode}, model, optimizer, device="cpu")
    assert isinstance(tuned.model, OptimizedModule)
    assert tuned.model._orig_mod is model
    assert tuned.model.get_compiler_config()["max_autotune"] is autotune
    again = TunedTraining({**FP32, "compile": mode}, tuned.model, optimizer, device="cpu")
    assert again.model is tuned.model, "a compiled model must not be compiled twice"
    assert TunedTraining(FP32, model, optimizer, device="cpu").model is model


def test_loader_has_the_micro_batch_workers_pinning_and_fork_of_the_trials() -> None:
    inputs, target = _data(20)
    dataset = torch.utils.data.TensorDataset(inputs, target)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tuned = TunedTraining({**FP32, "workers": 2}, model, optimizer, dataset, device="cpu")
    loader = tuned.loader
    assert isinstance(loader, torch.utils.data.DataLoader)
    assert loader.batch_size == 4 and loader.drop_last
    assert loader.num_workers == 2 and loader.persistent_workers
    assert loader.pin_memory is False  # pinned on CUDA only
    assert loader.multiprocessing_context is not None
    assert loader.multiprocessing_context.get_start_method() == "fork"
    batches = [tuned.to_device(batch) for batch in loader]
    assert [b[0].shape[0] for b in batches] == [4] * 5
    assert sorted(torch.cat([b[1] for b in batches]).tolist()) == sorted(target.tolist())
    del batches, loader, tuned  # persistent workers end with their loader

    plain = TunedTraining(FP32, model, optimizer, device="cpu").make_loader(dataset, shuffle=False, seed=0)
    assert plain.num_workers == 0 and not plain.persistent_workers and plain.multiprocessing_context is None


def test_a_config_that_is_not_a_pytorch_config_is_refused() -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="precision"):
        TunedTraining({**FP32, "precision": "fp8"}, model, optimizer, device="cpu")
    with pytest.raises(ValueError, match="jit"):
        TunedTraining({**FP32, "jit": "on"}, model, optimizer, device="cpu")


# ------------------------------------------------------------------ load_config


def test_load_config_reads_yaml_and_json(tmp_path: Path) -> None:
    (tmp_path / "a.best.yaml").write_text(yaml.safe_dump(EXPORTED))
    (tmp_path / "a.best.json").write_text(json.dumps(EXPORTED))
    from_yaml, from_json = load_config(tmp_path / "a.best.yaml"), load_config(tmp_path / "a.best.json")
    assert isinstance(from_yaml, TunedConfig)
    assert from_yaml.params == from_json.params
    assert {k: from_yaml.params[k] for k in EXPORTED["params"]} == EXPORTED["params"]
    assert from_yaml.params["optimizer"] == "as-given"  # a knob the export lacks: its reference value
    assert from_yaml.throughput == 1234.5 and from_yaml.metrics["heldout_loss"] == 2.25
    assert from_yaml.fingerprint == "0123456789abcdef" and from_yaml.identity == "fedcba9876543210"
    assert from_yaml.study["trial"] == 4 and from_yaml.speedup == pytest.approx(2.469)
    assert EXPORT_VERSION in READS_VERSIONS


def _edited(path: str, value: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(EXPORTED))
    *parents, last = path.split(".")
    node = data
    for part in parents:
        node = node[part]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return data


@pytest.mark.parametrize(
    "text, words",
    [
        ("params: [unclosed", ["not valid YAML"]),
        ("- a\n- list\n", ["mapping", "not list"]),
        ("", ["mapping", "not nothing"]),
        (yaml.safe_dump(_edited("params", KeyError)), ["params", "required key is missing"]),
        (yaml.safe_dump(_edited("params.precision", "fp8")), ["params.precision", "fp32"]),
        (yaml.safe_dump(_edited("params.workers", KeyError)), ["params.workers", "missing"]),
        (yaml.safe_dump(_edited("params.jit", "on")), ["params.jit", "no knob"]),
        (yaml.safe_dump(_edited("params.accumulation", 4)), ["params.accumulation", "global_batch is 16"]),
        (yaml.safe_dump(_edited("metrics.throughput", "fast")), ["metrics.throughput", "fast"]),
        (yaml.safe_dump(_edited("environment.fingerprint", KeyError)), ["environment.fingerprint", "missing"]),
        (yaml.safe_dump(_edited("environment.backend", "mxnet")), ["environment.backend", "pytorch"]),
        (yaml.safe_dump(_edited("version", 99)), ["version", "99"]),
    ],
)
def test_load_config_refuses_a_malformed_file_with_one_line(tmp_path: Path, text: str, words: list[str]) -> None:
    path = tmp_path / "bad.best.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as caught:
        load_config(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(str(path))
    for word in words:
        assert word in message


def test_load_config_refuses_a_missing_file_and_bad_json(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no such file"):
        load_config(tmp_path / "nope.best.yaml")
    (tmp_path / "bad.best.json").write_text('{"params": ')
    with pytest.raises(SpecError, match="not valid JSON"):
        load_config(tmp_path / "bad.best.json")


def test_the_export_carries_the_speedups_interval_and_the_reader_reads_it(tmp_path: Path) -> None:
    interval = {"estimate": 2.469, "low": 2.31, "high": 2.64, "rounds": 3, "level": 0.9}
    (tmp_path / "a.best.yaml").write_text(yaml.safe_dump({**EXPORTED, "speedup_interval": interval}))
    read = load_config(tmp_path / "a.best.yaml")
    assert read.speedup_interval == Interval(2.469, 2.31, 2.64, 3, 0.9)
    assert parse_config(EXPORTED, "job.best.yaml").speedup_interval is None  # one round, or an older export
    bad = {**EXPORTED, "speedup_interval": {**interval, "rounds": 1}}
    with pytest.raises(SpecError, match="speedup_interval.rounds"):
        parse_config(bad, "job.best.yaml")
