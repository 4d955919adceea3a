"""The PyTorch knobs in a study end to end: a search tries them and refuses what the workload
cannot use, and configs exported before the knobs existed still apply with them at their
reference values."""

from __future__ import annotations

from pathlib import Path

import yaml

from autotuner.apply import load_config
from autotuner.backends.pytorch import PYTORCH
from autotuner.output.formatting import format_config
from tests.support.helpers import HELD
from tests.support.studies import load_study, run_cli, write_spec

# ---------------------------------------------------------------- end to end


def test_a_search_tries_the_knobs_refuses_what_the_workload_cannot_and_exports_them(workdir: Path) -> None:
    spec = write_spec(
        workdir,
        name="knobs",
        workload="tests.support.study_workloads:dropout_attention",
        workload_args={},
        baseline={"precision": "fp32", "batch_size": 16, "workers": 0, "compile": "none"},
        space={
            "preset": "pytorch-cpu",
            "precision": ["fp32"],
            "batch_size": [16],
            "workers": [0],
            "compile": ["none"],
            "optimizer": ["as-given", "fused"],
            "attention": ["default", "flash"],
            "prefetch_factor": [2],
        },
        budget={"trials": 8},  # unsupported configs cost no trial: every one of the 8 is tried
    )
    result = run_cli("search", "--spec", str(spec), cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert "not searched (this device or workload cannot use them): memory_format channels_last" in result.stdout

    study = load_study(workdir, "knobs")
    outcomes = {
        format_config(t.user_attrs["config"]): (t.user_attrs["outcome"], t.user_attrs.get("reason"))
        for t in study.trials
        if "config" in t.user_attrs
    }
    flash = [o for c, o in outcomes.items() if "attention=flash" in c]
    assert all(
        o == ("unsupported", "attention=flash: its kernel cannot compute this model's attention here") for o in flash
    )
    tuned = load_config(workdir / "runs" / "knobs" / "best.yaml")
    assert set(PYTORCH.knobs) <= set(tuned.params)


def test_a_config_exported_before_the_new_knobs_still_applies(workdir: Path) -> None:
    spec = write_spec(workdir, name="old", budget={"trials": 2})
    assert run_cli("search", "--spec", str(spec), cwd=workdir).returncode == 0
    exported = workdir / "runs" / "old" / "best.yaml"
    data = yaml.safe_load(exported.read_text())
    first = ("precision", "batch_size", "accumulation", "workers", "compile")
    data["params"] = {k: v for k, v in data["params"].items() if k in first}
    exported.write_text(yaml.safe_dump(data, sort_keys=False))
    tuned = load_config(exported)
    assert tuned.params["optimizer"] == "as-given" and tuned.params["pin_memory"] is False
    result = run_cli("apply", str(exported), "--spec", str(spec), "--steps", "6", "--no-baseline", cwd=workdir)
    assert result.returncode == 0, result.stderr


def test_an_old_cuda_export_keeps_the_pinned_memory_its_study_ran_with(workdir: Path) -> None:
    spec = write_spec(workdir, name="pinned", budget={"trials": 1})
    assert run_cli("search", "--spec", str(spec), cwd=workdir).returncode == 0
    exported = workdir / "runs" / "pinned" / "best.yaml"
    data = yaml.safe_load(exported.read_text())
    data["params"] = {k: v for k, v in data["params"].items() if k not in HELD}
    for device, pinned in (("cuda:0", True), ("cpu", False)):
        data["environment"]["device"] = device
        exported.write_text(yaml.safe_dump(data, sort_keys=False))
        assert load_config(exported).params["pin_memory"] is pinned
