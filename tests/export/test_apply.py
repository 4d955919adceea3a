"""Applying an exported config: the PyTorch object a user's loop (and every trial) trains through,
reading the export, and what `autotuner apply` prints and warns of a run it measured (the run
given here; `tests/e2e/test_apply.py` runs it). CPU only, real torch."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn
from torch._dynamo.eval_frame import OptimizedModule

from autotuner.backends.pytorch.apply import TunedTraining, set_matmul_precision
from autotuner.errors import SpecError
from autotuner.export.promise import (
    EXIT_CODES,
    AppliedRun,
    Promised,
    Verdict,
    checked_interval,
    first_decision,
    judge,
    look_level,
    print_applied,
    promise_rounds,
    rounds_to_decide,
    verdict_at,
)
from autotuner.export.reader import READS_VERSIONS, TunedConfig, load_config, parse_config
from autotuner.export.writer import EXPORT_VERSION
from autotuner.measurement.interval import DRIFT, LEVEL, Interval, stated_interval
from autotuner.measurement.timing import Throughput
from autotuner.spec.job import load_spec
from autotuner.trials.launcher import TrialLauncher, TrialResult
from autotuner.trials.outcomes import Outcome
from autotuner.trials.probe import Environment
from autotuner.trials.request import TrialRequest
from autotuner.trials.trial_output import Latency, Losses, TrialOutput
from tests.support.studies import write_spec

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

VALID: dict[str, Any] = {
    "version": 1,
    "params": {"precision": "bf16", "batch_size": 8, "accumulation": 2, "workers": 1, "compile": "none"},
    "metrics": {"throughput": 1234.5, "throughput_spread": 0.1, "drift": 0.0002, "heldout_loss": 2.25},
    "baseline": {"params": dict(FP32), "throughput": 500.0, "outcome": "ok"},
    "speedup": 2.469,
    "drift": {"tolerance": 0.01, "reference_noise_floor": 0.0},
    "environment": {"backend": "pytorch", "device": "cpu", "fingerprint": "0123456789abcdef"},
    "spec": {"path": "job.yaml", "identity": "fedcba9876543210", "workload": "builtin:mlp", "global_batch": 16},
    "study": {"name": "job", "storage": "sqlite:///runs/job/study.db", "trial": 4, "trials_ran": 9},
}


def test_load_config_reads_yaml_and_json(tmp_path: Path) -> None:
    (tmp_path / "a.best.yaml").write_text(yaml.safe_dump(VALID))
    (tmp_path / "a.best.json").write_text(json.dumps(VALID))
    from_yaml, from_json = load_config(tmp_path / "a.best.yaml"), load_config(tmp_path / "a.best.json")
    assert isinstance(from_yaml, TunedConfig)
    assert from_yaml.params == from_json.params
    assert {k: from_yaml.params[k] for k in VALID["params"]} == VALID["params"]
    assert from_yaml.params["optimizer"] == "as-given"  # a knob the export lacks: its reference value
    assert from_yaml.throughput == 1234.5 and from_yaml.metrics["heldout_loss"] == 2.25
    assert from_yaml.fingerprint == "0123456789abcdef" and from_yaml.identity == "fedcba9876543210"
    assert from_yaml.study["trial"] == 4 and from_yaml.speedup == pytest.approx(2.469)
    assert EXPORT_VERSION in READS_VERSIONS


def _edited(path: str, value: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(VALID))
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


def _applied(
    tuned_samples_per_s: float, baseline_samples_per_s: float | None, windows: list[float] | None = None
) -> AppliedRun:
    """What `apply_config` returns, for a run that measured these throughputs (and window rates)."""
    tuned = parse_config(VALID, "job.best.yaml")

    def measured(rate: float, windows: list[float] | None = None) -> Throughput:
        return Throughput(
            samples_per_s=rate,
            spread=0.01,
            window_samples_per_s=windows or [rate] * 5,
            warmup_s=0.1,
            measured_s=1.0,
            steps=10,
            windows=5,
            samples_per_step=16,
        )

    return AppliedRun(
        tuned=tuned,
        config=dict(tuned.params),
        environment=Environment("pytorch", "cpu", "test CPU", "6.1", {"python": "3.11"}, {"accelerator": False}),
        throughput=measured(tuned_samples_per_s, windows),
        heldout_loss=None,
        drift_steps=3,
        wall_s=1.0,
        baseline=measured(baseline_samples_per_s) if baseline_samples_per_s else None,
    )


@pytest.mark.parametrize(
    ("tuned", "baseline", "warned"),
    [
        (1234.5, 500.0, None),  # 2.469x, as the export says
        (1234.5, 520.0, None),  # 2.374x: 3.8% under, within the promise
        (1234.5, 560.0, "10.7% below"),  # 2.204x
        (1100.0, 400.0, "11.4% above"),  # 2.750x (the study's baseline was unlucky)
        (1234.5, 470.0, "6.4% above"),  # 2.627x: says by how much, not "5% (more than 5%)"
    ],
)
def test_apply_warns_when_the_speedup_it_delivers_is_not_the_exports(
    tuned: float, baseline: float, warned: str | None
) -> None:
    run = _applied(tuned, baseline)
    out, err = io.StringIO(), io.StringIO()
    print_applied(run, out, err)
    assert run.speedup == pytest.approx(tuned / baseline)
    assert f"speedup: {tuned / baseline:.2f}x here" in out.getvalue() and "2.47x in the export" in out.getvalue()
    assert ("the speedup here is" in err.getvalue()) is bool(warned), err.getvalue()
    assert warned is None or f"the speedup here is {warned} the export's (more than 5%)" in err.getvalue()
    assert run.keeps_promise is (not warned)


def test_the_export_carries_the_speedups_interval_and_the_reader_reads_it(tmp_path: Path) -> None:
    interval = {"estimate": 2.469, "low": 2.31, "high": 2.64, "rounds": 3, "level": 0.9}
    (tmp_path / "a.best.yaml").write_text(yaml.safe_dump({**VALID, "speedup_interval": interval}))
    read = load_config(tmp_path / "a.best.yaml")
    assert read.speedup_interval == Interval(2.469, 2.31, 2.64, 3, 0.9)
    assert parse_config(VALID, "job.best.yaml").speedup_interval is None  # one round, or an older export
    bad = {**VALID, "speedup_interval": {**interval, "rounds": 1}}
    with pytest.raises(SpecError, match="speedup_interval.rounds"):
        parse_config(bad, "job.best.yaml")


def _with_intervals(export: list[float] | None, rounds: list[float]) -> AppliedRun:
    """An applied run whose promise check measured `rounds` (as many as it could: its last look),
    of an export whose speedup's rounds were `export`."""
    run = _applied(1234.5, 500.0)
    study = stated_interval(export) if export else None
    tuned = dataclasses.replace(run.tuned, speedup=study.estimate if study else 2.469, speedup_interval=study)
    return dataclasses.replace(run, tuned=tuned, rounds=tuple(rounds), most_rounds=len(rounds))


EXPORT = [2.5, 2.4, 2.45]
"""An export's rounds: 2.45x, 90% interval 2.35-2.56x as stated; widened by 10%, 2.13-2.81x."""


@pytest.mark.parametrize(
    ("export", "rounds", "verdict", "code"),
    [
        (EXPORT, [2.45, 2.5, 2.42], "kept", 0),  # here 2.36-2.56x (92%): within 2.13-2.81x
        (EXPORT, [2.25, 2.28, 2.26], "kept", 0),  # 2.20-2.33x: 8% below the export's 2.45x, within its promise
        (EXPORT, [1.9, 1.95, 1.92], "not kept", 1),  # 1.85-1.99x: wholly below
        (EXPORT, [2.9, 2.95, 2.92], "not kept", 1),  # 2.83-3.02x: faster than promised is not the promise
        (EXPORT, [2.3, 2.6], "undecided", 3),  # two rounds far apart: 1.66-3.60x
        (None, [2.45, 2.5, 2.42], "kept", 0),  # an export of one round: its speedup widened, 2.24-2.72x
        (None, [1.9, 1.95, 1.92], "not kept", 1),
    ],
)
def test_apply_says_whether_the_promise_is_kept_not_kept_or_undecided(
    export: list[float] | None, rounds: list[float], verdict: str, code: int
) -> None:
    run = _with_intervals(export, rounds)
    out, err = io.StringIO(), io.StringIO()
    print_applied(run, out, err)
    here, checked, promised = stated_interval(rounds), run.checked, run.promised
    assert here is not None and run.interval == here and checked is not None and promised is not None
    assert checked.level == pytest.approx(look_level(len(rounds), len(rounds)))
    assert run.verdict is not None and run.verdict.value == verdict and EXIT_CODES[run.verdict] == code
    line = next(line for line in out.getvalue().splitlines() if line.startswith("promise:"))
    assert line.startswith(f"promise: {here.estimate:.2f}x, 90% interval {here.low:.2f}-{here.high:.2f}x here")
    assert f"{len(rounds)} rounds of the config beside the baseline" in line
    shown = f"here {checked.estimate:.2f}x, {checked.level:.0%} interval {checked.low:.2f}-{checked.high:.2f}x"
    assert f": {verdict} ({shown}, " in line and f"widened by 10%, {promised.low:.2f}-{promised.high:.2f}x)" in line
    if export:
        study = stated_interval(export)
        assert study is not None and (promised.low, promised.high) == (study.low / 1.1, study.high * 1.1)
        assert f"{study.estimate:.2f}x, 90% interval {study.low:.2f}-{study.high:.2f}x in the export" in line
        assert "the export's interval widened" in line
    else:
        assert "(no interval in the export)" in line and "the export's speedup widened" in line
    assert ("is outside the export's promise" in err.getvalue()) is (verdict == "not kept"), err.getvalue()
    if verdict == "undecided":
        needed = run.rounds_to_decide
        assert needed is not None and needed > len(rounds) and f"about {needed} rounds would decide it" in line


def test_the_checks_own_interval_allows_for_the_drift_the_export_does() -> None:
    """The check's rounds are a session too: its interval allows for the drift the export's
    interval allowed for (the study's `budget.remeasure_drift`); an export without an interval,
    for the default."""
    rounds = [2.45, 2.5, 2.42]
    run = _with_intervals(EXPORT, rounds)
    noisy = stated_interval(EXPORT, drift=0.05)
    assert noisy is not None
    on_noisy = dataclasses.replace(run, tuned=dataclasses.replace(run.tuned, speedup_interval=noisy))
    assert run.interval == stated_interval(rounds) and on_noisy.interval == stated_interval(rounds, drift=0.05)
    assert on_noisy.checked is not None and run.checked is not None
    assert on_noisy.checked.half_width > run.checked.half_width
    assert _with_intervals(None, rounds).interval == stated_interval(rounds, drift=DRIFT)


def test_kept_means_within_the_exports_interval_widened_by_the_tolerance() -> None:
    export = Interval(2.0, 1.9, 2.1, 5)
    promised = Promised.of(export, 2.0, 0.10)
    assert promised is not None and (promised.low, promised.high) == pytest.approx((1.9 / 1.1, 2.1 * 1.1))
    here = Interval(1.8, 1.74, 1.86, 5)  # 10% below the export's speedup: within its promise widened by 10%
    assert judge(here, promised) is Verdict.KEPT
    tighter = Promised.of(export, 2.0, 0.05)
    assert tighter is not None and judge(here, tighter) is Verdict.UNDECIDED  # 1.74 is below 1.9 / 1.05
    assert judge(Interval(2.6, 2.5, 2.7, 5), tighter) is Verdict.NOT_KEPT  # faster than promised is not the promise
    alone = Promised.of(None, 2.0, 0.05)  # an export of one round: its speedup widened
    assert alone is not None and (alone.low, alone.high) == pytest.approx((2.0 / 1.05, 2.1))
    assert Promised.of(None, None, 0.05) is None


def test_the_rounds_a_decision_needs_are_none_when_the_speedup_here_sits_on_the_promises_edge() -> None:
    export = stated_interval(EXPORT)
    promised = Promised.of(export, None, 0.10)
    assert export is not None and promised is not None
    # 2.10x against a promise that starts at 2.13x: within the session's drift of its edge, however many rounds
    assert rounds_to_decide([2.1, 2.15, 2.05], export, promised) is None
    assert rounds_to_decide([2.2, 2.6], export, promised) == 6
    # rounds that go on as those went (the same log mean and standard deviation), in a check of
    # n rounds at most judged at its last look (`look_level`), decide it at 6, not at 5
    mean, spread = (math.log(2.2) + math.log(2.6)) / 2, abs(math.log(2.6 / 2.2)) / math.sqrt(2)
    as_they_went = {
        5: [mean - spread, mean + spread] * 2 + [mean],  # log sd exactly `spread`
        6: [mean - spread * math.sqrt(5 / 6), mean + spread * math.sqrt(5 / 6)] * 3,
    }
    for n, logs in as_they_went.items():
        assert statistics.stdev(logs) == pytest.approx(spread) and statistics.fmean(logs) == pytest.approx(mean)
        checked = checked_interval([math.exp(x) for x in logs], export, look_level(n, n))
        assert checked is not None and (judge(checked, promised) is Verdict.UNDECIDED) is (n == 5)


def test_the_promise_checks_looks_share_its_error_so_a_verdict_is_wrong_at_most_one_time_in_ten() -> None:
    """The check looks after rounds 2 to `most` and stops at the first that decides: the looks'
    errors (1 - level) add up to 1 - LEVEL at most, a fifth of it on the looks before the last."""
    assert look_level(2, 2) == pytest.approx(LEVEL)  # one look
    assert look_level(2, 3) == pytest.approx(1 - 0.2 * (1 - LEVEL)) and look_level(3, 3) == pytest.approx(0.92)
    for most in range(3, 12):
        errors = [1 - look_level(rounds, most) for rounds in range(2, most + 1)]
        assert sum(errors) == pytest.approx(1 - LEVEL)
        assert errors[-1] == pytest.approx(0.8 * (1 - LEVEL))
        assert all(e == pytest.approx(errors[0]) for e in errors[:-1])  # the early looks in equal parts
    assert look_level(2, 5) == pytest.approx(1 - 0.02 / 3)


class _Rounds:
    """A launcher whose processes measure the rates given for their config's micro-batch, in
    order (the config's, then the baseline's); a rate of 0 fails the process."""

    def __init__(self, rates: dict[int, list[float]], windows: int = 4):
        self.rates = {batch: iter(values) for batch, values in rates.items()}
        self.windows = windows
        self.steps: dict[int, int] = {}
        self.tick: Callable[[], None] = lambda: None

    def call(self, runner: str, function: str, request: TrialRequest, timeout_s: float) -> TrialResult[TrialOutput]:
        rate = next(self.rates[request.config["batch_size"]])
        self.tick()
        self.steps[request.config["batch_size"]] = request.steps
        if not rate:
            return TrialResult(Outcome.CRASH, "signal 9")
        assert request.windows == self.windows and not request.drift and request.compile_cache == "cache"
        throughput = Throughput(rate, 0.01, [rate] * 4, 0.1, 1.0, 10, 4, 16)
        return TrialResult(Outcome.OK, output=TrialOutput(Losses(math.nan, []), throughput=throughput))


@pytest.mark.parametrize(
    ("config", "baseline", "expected", "error"),
    [
        ([2000.0] * 5, [1000.0, 1010.0, 990.0, 1000.0, 1000.0], 4, None),  # narrow after two rounds: on to the cap
        ([2000.0] * 5, [800.0, 1000.0, 800.0, 1000.0, 800.0], 4, None),  # wide: every round of the cap
        ([2000.0, 2000.0, 0.0], [800.0, 1000.0, 800.0], 2, "round 3: crash: signal 9"),  # kept what it had
    ],
)
def test_the_promise_check_runs_every_round_of_its_cap_without_a_decision_to_stop_at(
    tmp_path: Path, config: list[float], baseline: list[float], expected: int, error: str | None
) -> None:
    job = load_spec(write_spec(tmp_path, budget={"trials": 2, "remeasure_runs": 4, "remeasure_windows": 4}))
    configs = [job.complete({**job.baseline, "batch_size": 8}), job.complete(job.baseline)]
    launcher = _Rounds({8: config, job.baseline["batch_size"]: baseline})
    notes: list[str] = []
    speedups, failed = promise_rounds(job, cast(TrialLauncher, launcher), configs, "cuda:0", "cache", notes.append)
    assert len(speedups) == expected and failed == error
    assert speedups == [c / b for c, b in zip(config, baseline, strict=False)][:expected]
    assert notes[0] == "checking the promise: round 1 of at most 4, the config beside the baseline, 4 windows a process"


def test_the_promise_check_stops_within_the_time_of_the_run_before_it(tmp_path: Path) -> None:
    """Given the run's seconds, the rounds measure as many windows as let three fit (three at
    least), in the windows the run calibrated, and from the third on stop before one that would
    not fit: here each round takes 4 s on the script's clock, and the run took 10 s."""
    job = load_spec(write_spec(tmp_path, budget={"trials": 2, "remeasure_runs": 5, "remeasure_windows": 10}))
    configs = [job.complete({**job.baseline, "batch_size": 8}), job.complete(job.baseline)]
    launcher = _Rounds({8: [2000.0] * 5, job.baseline["batch_size"]: [800.0, 1000.0] * 3}, windows=3)
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0  # each read a second later: a round, read twice, is 1 s plus its processes' 3 s
        return now[0]

    launcher.tick = lambda: now.__setitem__(0, now[0] + 1.5)
    measured = [
        Throughput(2000.0, 0.01, [2000.0] * 4, 0.1, 2.0, 12, 4, 16),
        Throughput(900.0, 0.01, [900.0] * 4, 0.1, 2.0, 5, 4, 16),
    ]
    notes: list[str] = []
    speedups, failed = promise_rounds(
        job,
        cast(TrialLauncher, launcher),
        configs,
        "cuda:0",
        "cache",
        notes.append,
        measured=measured,
        seconds=10.0,
        clock=clock,
    )
    assert failed is None and len(speedups) == 2, notes  # a third round (4 s) would not fit in the 2 s left
    assert launcher.steps == {8: 12, job.baseline["batch_size"]: 5}  # the run's calibrated windows
    assert "3 windows a process, 10 s left" in notes[0] and "6 s left" in notes[1]


def test_an_undecided_promise_check_runs_more_rounds_up_to_its_cap(tmp_path: Path) -> None:
    """Given what decides the promise, the rounds go on past a narrow interval and past the run's
    time while it cannot decide, to the cap, and stop at the first round that decides."""
    job = load_spec(write_spec(tmp_path, budget={"trials": 2, "remeasure_runs": 3, "remeasure_windows": 4}))
    configs = [job.complete({**job.baseline, "batch_size": 8}), job.complete(job.baseline)]
    rates = {8: [2000.0] * 8, job.baseline["batch_size"]: [1000.0] * 8}
    for decide_at, cap, expected in ((None, 6, 6), (4, 6, 4), (None, None, 3)):
        launcher = _Rounds({batch: list(values) for batch, values in rates.items()})
        speedups, failed = promise_rounds(
            job,
            cast(TrialLauncher, launcher),
            configs,
            "cuda:0",
            "cache",
            lambda text: None,
            seconds=0.001,  # a run too short for a third round: it does not stop an undecided check
            decided=lambda done, at=decide_at: at is not None and len(done) >= at,
            most=cap,
        )
        assert failed is None and len(speedups) == expected


def test_apply_compares_its_run_time_with_the_studys_prediction_for_as_many_steps() -> None:
    run = _applied(1234.5, None)
    run = dataclasses.replace(
        run,
        tuned=dataclasses.replace(
            run.tuned,
            metrics={**run.tuned.metrics, "setup_s": 0.5, "warmup_s": 2.0, "warmup_steps": 3},
            environment={**run.tuned.environment, "framework_start_s": 1.5},
        ),
        throughput=dataclasses.replace(run.throughput, steps_taken=103, trained_s=4.0),
        setup_s=0.4,
        start_s=1.2,
    )
    # here: start 1.2 s + set-up 0.4 s + 4.0 s of steps;
    # the study: start 1.5 s + 0.5 s + 2.0 s + (103 - 3) steps x 16 samples / 1234.5 per s
    assert run.run_s == pytest.approx(5.6)
    assert run.predicted_run_s == pytest.approx(1.5 + 0.5 + 2.0 + 100 * 16 / 1234.5)
    out = io.StringIO()
    print_applied(run, out, io.StringIO())
    took = "run time: 103 optimizer steps took 5.6 s here, start, build and warm-up included (compile cache unused); "
    assert took in out.getvalue()
    assert f"the study predicts {run.predicted_run_s:.1f} s for as many: ratio {5.6 / run.predicted_run_s:.2f}" in (
        out.getvalue()
    )


def test_apply_without_the_baseline_says_nothing_of_the_speedup() -> None:
    run = _applied(1234.5, None)
    out, err = io.StringIO(), io.StringIO()
    print_applied(run, out, err)
    assert run.speedup is None and run.keeps_promise is None
    assert "speedup" not in out.getvalue() + err.getvalue()


@pytest.mark.parametrize(("p99_ms", "within"), [(8.0, True), (12.5, False)])
def test_apply_holds_an_inference_configs_p99_latency_to_the_jobs_limit(p99_ms: float, within: bool) -> None:
    run = dataclasses.replace(
        _applied(1234.5, 500.0), latency=Latency(p50_ms=6.0, p99_ms=p99_ms, mean_ms=6.5, calls=200), latency_limit_ms=10
    )
    out, err = io.StringIO(), io.StringIO()
    print_applied(run, out, err)
    assert run.within_latency_limit is within
    assert ("within the limit of 10 ms" in out.getvalue()) is within
    assert (f"the p99 latency here ({p99_ms:.2f} ms) is over the job's limit of 10 ms" in err.getvalue()) is not within
    assert dataclasses.replace(run, latency_limit_ms=None).within_latency_limit is None


@pytest.mark.parametrize(
    ("windows", "slowdown"),
    [
        # 16 windows: the last quarter 30% slower than the first (a step that slows as it trains)
        ([1000.0] * 4 + [980.0] * 8 + [700.0] * 4, 0.3),
        ([1000.0, 900.0, 1100.0] * 4 + [950.0] * 4, 0.05),  # noise around a level: no warning
        ([700.0] * 4 + [1000.0] * 12, -3 / 7),  # faster at the end: no warning
        ([1000.0] * 8 + [500.0] * 3, None),  # too few windows to tell
    ],
)
def test_apply_warns_when_the_step_gets_slower_as_the_job_trains(windows: list[float], slowdown: float | None) -> None:
    run = _applied(1234.5, 500.0, windows)
    out, err = io.StringIO(), io.StringIO()
    print_applied(run, out, err)
    assert run.slowdown == (None if slowdown is None else pytest.approx(slowdown))
    warned = "slower over the last quarter of the run" in err.getvalue()
    assert warned is (slowdown is not None and slowdown > 0.2), err.getvalue()
    if warned:
        assert "(700 samples/s) than over the first (1,000 samples/s)" in err.getvalue()


def test_the_check_stops_at_the_first_look_that_decides() -> None:
    """Rounds run one after another: a plain verdict at an early look (its level near 99%) stands,
    whatever later rounds would have made of it; undecided only when no look decides."""
    export = stated_interval(EXPORT)
    promised = Promised.of(export, None, 0.10)
    assert export is not None and promised is not None
    plain = [1.9, 1.91, 1.9, 2.5, 2.6]  # wholly below 2.13x by the third round
    assert verdict_at(plain[:2], export, promised, 5) is Verdict.UNDECIDED  # two rounds at 99.3%: not yet
    assert verdict_at(plain[:3], export, promised, 5) is Verdict.NOT_KEPT
    assert verdict_at(plain, export, promised, 5) is not Verdict.NOT_KEPT  # the last look alone would not say so
    assert first_decision(plain, export, promised, 5) is Verdict.NOT_KEPT
    assert first_decision([2.3, 2.6], export, promised, 5) is Verdict.UNDECIDED
    assert first_decision([2.45], export, promised, 5) is Verdict.UNDECIDED  # one round: no interval
