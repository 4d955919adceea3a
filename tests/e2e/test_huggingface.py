"""A Hugging Face model as a user has it, tuned end to end: the example spec (GPT-2 from a config,
a dataset of dicts, the loss the model computes) searched, and its export turned into the
Trainer's arguments."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
import yaml

from tests.support.studies import ROOT, run_cli

pytest.importorskip("transformers")

EXAMPLE = ROOT / "examples" / "huggingface" / "gpt2.yaml"


def test_the_example_spec_tunes_a_transformers_model_on_dict_batches(tmp_path: Path) -> None:
    spec = yaml.safe_load(EXAMPLE.read_text())
    # the example as it is, made small: a few seconds a trial instead of tens
    spec["workload_args"] = {"layers": 1, "width": 32, "heads": 2, "vocab": 64, "length": 16, "samples": 128}
    spec["global_batch"] = 8
    spec["baseline"] = {"precision": "fp32", "batch_size": 2, "workers": 0, "compile": "none"}
    spec["space"] = {"precision": ["fp32", "bf16"], "batch_size": [2, 8], "workers": [0], "compile": ["none"]}
    spec["budget"] = {"trials": 3, "remeasure_top": 0}
    spec["profile"] = {"steps": 0}  # profiling is tested on its own (test_profile)
    spec["trial"] = {
        "warmup_steps": 1,
        "steps": 2,
        "windows": 2,
        "drift_steps": 2,
        "min_window_s": 0,
        "timeout": 300,
        "quiet_wait": 0,
    }
    path = tmp_path / "hf.yaml"
    path.write_text(yaml.safe_dump(spec))
    done = run_cli("search", "--spec", str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (counts,) = [line.removeprefix("outcomes: ") for line in done.stdout.splitlines() if line.startswith("outcomes: ")]
    outcomes = {kind: int(n) for kind, n in (part.split() for part in counts.split(", "))}
    assert set(outcomes) <= {"ok", "pruned"} and sum(outcomes.values()) == 3, done.stdout  # a slow config may be pruned
    export = yaml.safe_load((tmp_path / "runs" / "hf-gpt2" / "best.yaml").read_text())
    assert export["metrics"]["drift"] < spec.get("objective", {}).get("max_drift", 0.01)
    assert export["metrics"]["tokens_per_s"] > 0  # the factory's tokens_per_sample carried through

    trainer = run_cli("export", "--spec", str(path), "--format", "hf-trainer", cwd=tmp_path)
    assert trainer.returncode == 0, trainer.stderr
    code = (tmp_path / "runs" / "hf-gpt2" / "best.hf-trainer.py").read_text()
    built = runpy.run_path(str(tmp_path / "runs" / "hf-gpt2" / "best.hf-trainer.py"))  # real TrainingArguments
    args = built["args"]
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 8
    assert args.bf16 == (export["params"]["precision"] == "bf16"), code
