"""An inference study end to end, from the command line: the built-in encoder served on the CPU,
int8 dynamic quantization and ONNX Runtime measured with their drift, a config whose drift is over
the tolerance refused, a latency limit, the export read back as a serving config; and a Hugging
Face model built from a config (no download) tuned the same way."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from autotuner.apply import load_config
from autotuner.backends.pytorch.serving import TunedInference, primary_output
from autotuner.results.records import records
from tests.support.studies import assert_applied, load_study, run_cli

ENCODER: dict[str, Any] = {
    "name": "served",
    "backend": "pytorch",
    "task": "inference",
    "workload": "builtin:encoder",
    "workload_args": {"width": 64, "heads": 2, "layers": 2, "length": 16, "vocab": 500, "samples": 512},
    "device": "cpu",
    "global_batch": 32,
    "baseline": {"precision": "fp32", "batch_size": 8},
    "space": {
        "batch_size": [8, 32],
        "precision": ["fp32", "bf16"],
        "quantization": ["none", "int8-dynamic"],
        "runtime": ["pytorch", "onnxruntime-cpu"],
        "compile": ["none"],
        "threads": [0],
    },
    # bf16's outputs come out about 1% from fp32's: over this tolerance, int8 dynamic's too
    "objective": {"max_drift": 0.002, "max_latency_ms": 10_000},
    "budget": {"trials": 8, "remeasure_top": 1, "remeasure_runs": 2, "remeasure_windows": 3},
    "trial": {
        "warmup_steps": 1,
        "steps": 2,
        "windows": 2,
        "min_window_s": 0.05,
        "prune_after": 0,
        "timeout": 120,
        "quiet_wait": 0,  # the suite's other workers keep the machine busy: run a contended trial again at once
    },
    "profile": {"steps": 0},
    "sampler": {"name": "tpe", "seed": 0},
}


JAX_MLP: dict[str, Any] = {
    "name": "served-jax",
    "backend": "jax",
    "task": "inference",
    "workload": "builtin:mlp",
    "workload_args": {"features": 32, "hidden": 64, "depth": 2, "classes": 10, "samples": 512},
    "device": "cpu",
    "global_batch": 32,
    "trial": {
        "warmup_steps": 1,
        "steps": 2,
        "windows": 2,
        "min_window_s": 0.05,
        "prune_after": 0,
        "timeout": 120,
        "quiet_wait": 0,  # the suite's other workers keep the machine busy: run a contended trial again at once
    },
    "profile": {"steps": 0},
    "sampler": {"name": "tpe", "seed": 0},
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("served")
    spec = folder / "served.yaml"
    spec.write_text(yaml.safe_dump(ENCODER))
    # every config of the grid the budget allows, int8 and ONNX Runtime among them, whatever TPE samples
    done = run_cli("search", "--spec", str(spec), cwd=folder)
    assert done.returncode == 0, done.stdout + done.stderr
    return folder, done.stdout


def test_an_inference_study_measures_latency_and_output_drift(served: tuple[Path, str]) -> None:
    folder, stdout = served
    assert "fp32 reference: the model's outputs in strict fp32 eager" in stdout
    trials = {t.number: t for t in records(load_study(folder, "served"))}
    ok = [t for t in trials.values() if t.outcome == "ok"]
    assert ok, stdout
    for t in ok:
        metrics = t.metrics
        assert metrics["throughput"] > 0 and 0 < metrics["latency_p50_ms"] <= metrics["latency_p99_ms"]
        assert metrics["latency_calls"] >= 2 * metrics["throughput_windows"].__len__()
        assert metrics["top1_agreement"] is not None and 0 <= metrics["top1_agreement"] <= 1
    baseline = trials[0]
    assert baseline.config["runtime"] == "pytorch" and baseline.metrics["drift"] == 0.0  # fp32 eager: the reference
    for t in ok:
        config = t.config
        if config["precision"] == "bf16" or config["quantization"] == "int8-dynamic":
            # their outputs drift, by more than this study's tolerance: refused
            assert t.metrics["drift"] > 0.002 and not t.feasible and "drift" in t.reason, t
        if config["runtime"] == "onnxruntime-cpu" and config["precision"] == "fp32":
            assert t.metrics["drift"] < 1e-5 and t.feasible, t  # the same fp32 graph in another runtime
    unsupported = [t for t in trials.values() if t.outcome == "unsupported"]
    assert all("ONNX Runtime" in t.reason or "exported in fp32" in t.reason for t in unsupported)


def test_the_export_is_a_serving_config(served: tuple[Path, str]) -> None:
    folder, _ = served
    export = yaml.safe_load((folder / "runs" / "served" / "best.yaml").read_text())
    assert export["spec"]["task"] == "inference"
    assert export["metrics"]["latency_p99_ms"] > 0 and export["metrics"]["drift"] <= 0.002
    tuned = load_config(folder / "runs" / "served" / "best.yaml")
    from autotuner.backends.pytorch.inference_builtin import encoder

    workload = encoder(**ENCODER["workload_args"])
    batch = torch.stack([workload.dataset[k][0] for k in range(tuned.params["batch_size"])])
    serving = TunedInference(tuned, workload.model, device="cpu", example=batch)
    assert primary_output(serving(batch)).shape == (tuned.params["batch_size"], 8)
    # apply serves it here beside the baseline and checks the promise, the latency and the drift
    done = run_cli("apply", "runs/served/best.yaml", "--rounds", "2", "--spec", str(folder / "served.yaml"), cwd=folder)
    assert_applied(done)
    assert f"latency of a batch of {tuned.params['batch_size']}: p50 " in done.stdout
    # the p99 here is held to the spec's objective.max_latency_ms, whichever way it comes out
    assert "; within the limit of 10000 ms" in done.stdout or "is over the job's limit of 10000 ms" in done.stderr
    assert "output drift from the fp32 model here: " in done.stdout and "promise: " in done.stdout
    # the report's top configs carry each one's latency of a batch
    reported = run_cli("report", "--spec", str(folder / "served.yaml"), "--format", "md", cwd=folder)
    assert reported.returncode == 0, reported.stdout + reported.stderr
    report = (folder / "runs" / "served" / "report.md").read_text()
    assert "| latency p50 / p99 |" in report and re.search(r"\| [\d.]+ / [\d.]+ ms \|", report)


def test_a_latency_limit_makes_slower_configs_infeasible(tmp_path: Path) -> None:
    spec = {
        **ENCODER,
        "name": "limited",
        "space": {**ENCODER["space"], "quantization": ["none"], "runtime": ["pytorch"], "precision": ["fp32"]},
        "objective": {"max_drift": 0.01, "max_latency_ms": 0.001},  # no batch is served in a microsecond
        "budget": {"trials": 2, "remeasure_top": 0},
    }
    (tmp_path / "limited.yaml").write_text(yaml.safe_dump(spec))
    done = run_cli("search", "--spec", str(tmp_path / "limited.yaml"), cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr  # nothing feasible
    trials = records(load_study(tmp_path, "limited"))
    assert trials and all(not t.feasible and "p99 latency" in t.reason and "0.001 ms" in t.reason for t in trials)


def test_optimizing_latency_ranks_configs_by_the_time_of_one_call(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    spec = {
        **JAX_MLP,
        "name": "latency",
        "baseline": {"precision": "fp32", "jit": "off"},
        "space": {"precision": ["fp32", "bf16"], "jit": ["off", "on"], "workers": [0]},
        "objective": {"max_drift": 0.05, "optimize": "latency"},
        "budget": {"trials": 3, "remeasure_top": 0},
    }
    (tmp_path / "latency.yaml").write_text(yaml.safe_dump(spec))
    done = run_cli("search", "--spec", str(tmp_path / "latency.yaml"), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    trials = records(load_study(tmp_path, "latency"))
    assert trials and all(t.config["batch_size"] == 32 and t.config["accumulation"] == 1 for t in trials)
    assert re.search(r"best: trial #\d+ .*; a batch of 32 in [\d.]+ ms at p50", " ".join(done.stdout.split()))


def test_a_hugging_face_classifier_built_from_a_config_is_tuned_for_serving(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from tests.support.helpers import ROOT

    spec = yaml.safe_load((ROOT / "examples" / "huggingface" / "bert-serving.yaml").read_text())
    # the example as it is, made small
    spec["workload_args"] = {"layers": 1, "width": 32, "heads": 2, "vocab": 100, "length": 16, "samples": 128}
    spec["global_batch"] = 8
    spec["space"] = {
        "batch_size": [2, 8],
        "precision": ["fp32"],
        "runtime": ["pytorch", "onnxruntime-cpu"],
        "quantization": ["none"],
        "compile": ["none"],
        "threads": [0],
    }
    spec["budget"] = {"trials": 3, "remeasure_top": 0}
    spec["profile"] = {"steps": 0}
    spec["trial"] = {
        "warmup_steps": 1,
        "steps": 2,
        "windows": 2,
        "min_window_s": 0.05,
        "prune_after": 0,
        "timeout": 300,
        "quiet_wait": 0,
    }
    (tmp_path / "bert.yaml").write_text(yaml.safe_dump(spec))
    done = run_cli("search", "--spec", str(tmp_path / "bert.yaml"), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    trials = records(load_study(tmp_path, "hf-bert-serving"))
    ok = [t for t in trials if t.outcome == "ok"]
    assert len(ok) == 3, [(t.config, t.reason) for t in trials]
    for t in ok:  # logits compared; the labels give both accuracies
        assert t.metrics["drift"] < 1e-4 and t.metrics["top1_agreement"] == 1.0
        assert t.metrics["accuracy"] == t.metrics["reference_accuracy"]
        assert t.metrics["tokens_per_s"] == pytest.approx(16 * t.metrics["throughput"])


def test_an_onnx_winner_is_exported_as_its_model_and_session(tmp_path: Path) -> None:
    onnxruntime = pytest.importorskip("onnxruntime")
    spec = {
        **ENCODER,
        "name": "onnx",
        "baseline": {"precision": "fp32", "batch_size": 8, "runtime": "onnxruntime-cpu"},
        "space": {**ENCODER["space"], "runtime": ["onnxruntime-cpu"], "precision": ["fp32"], "quantization": ["none"]},
        "budget": {"trials": 2, "remeasure_top": 0},
    }
    (tmp_path / "onnx.yaml").write_text(yaml.safe_dump(spec))
    done = run_cli("search", "--spec", str(tmp_path / "onnx.yaml"), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    exported = run_cli("export", "--spec", str(tmp_path / "onnx.yaml"), "--format", "onnx", cwd=tmp_path)
    assert exported.returncode == 0, exported.stdout + exported.stderr
    model, options = tmp_path / "runs" / "onnx" / "best.onnx", tmp_path / "runs" / "onnx" / "best.onnx.json"
    assert exported.stdout.split() == ["runs/onnx/best.onnx", "runs/onnx/best.onnx.json"]
    settings = yaml.safe_load(options.read_text())
    assert settings["providers"] == ["CPUExecutionProvider"] and settings["inputs"] == ["input_0"]
    session = onnxruntime.InferenceSession(str(tmp_path / model), providers=settings["providers"])
    from autotuner.backends.pytorch.inference_builtin import encoder

    torch.manual_seed(0)  # the trials' seed: the weights the study measured
    workload = encoder(**ENCODER["workload_args"])
    tokens = torch.stack([workload.heldout[k][0] for k in range(settings["batch_size"])])
    (logits,) = session.run(None, {"input_0": tokens.numpy()})
    expected = workload.model.eval()(tokens).detach()
    assert torch.allclose(torch.from_numpy(logits), expected, rtol=1e-4, atol=1e-5)


def test_a_jax_model_is_tuned_for_serving_with_the_same_drift_rule(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    spec = {
        **JAX_MLP,
        "baseline": {"precision": "fp32", "batch_size": 8, "jit": "off"},
        "space": {"precision": ["fp32", "bf16", "tf32"], "batch_size": [8, 32], "jit": ["off", "on"], "workers": [0]},
        "objective": {"max_drift": 0.001},  # bf16's outputs drift by more
        "budget": {"trials": 5, "remeasure_top": 0},
    }
    (tmp_path / "jax.yaml").write_text(yaml.safe_dump(spec))
    done = run_cli("search", "--spec", str(tmp_path / "jax.yaml"), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    trials = records(load_study(tmp_path, "served-jax"))
    ok = [t for t in trials if t.outcome == "ok"]
    assert len(ok) == 5, [(t.config, t.reason) for t in trials]
    assert all(t.config["precision"] != "tf32" for t in ok)  # no TF32 on a CPU: dropped before the first trial
    for t in ok:
        assert 0 < t.metrics["latency_p50_ms"] <= t.metrics["latency_p99_ms"] and t.metrics["top1_agreement"] > 0.9
        assert t.metrics["accuracy"] is not None and t.metrics["reference_accuracy"] is not None
        if t.config["precision"] == "bf16":
            assert t.metrics["drift"] > 0.001 and not t.feasible and "drift" in t.reason, t
        else:
            assert t.metrics["drift"] < 1e-5 and t.feasible, t
    from autotuner.backends.jax.inference_builtin import mlp
    from autotuner.backends.jax.serving import TunedInference as JaxTunedInference

    tuned = load_config(tmp_path / "runs" / "served-jax" / "best.yaml")
    workload = mlp(**spec["workload_args"])
    serving = JaxTunedInference(tuned, workload.apply_fn, "cpu", params=workload.params)
    inputs = workload.heldout.arrays[0][: tuned.params["batch_size"]]
    assert serving.synchronize(serving(inputs)).shape == (tuned.params["batch_size"], 10)
