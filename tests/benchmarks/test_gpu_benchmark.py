"""benchmarks/gpu.py's own functions: the figures its apply part reads from what `autotuner apply`
prints on a GPU, a command stopped at its part's time limit, which result files a run may replace
(the committed GPU results are kept from dry runs and from other devices' runs), and its install
notes. Its parts run dry end to end in tests/e2e/test_gpu_benchmark*.py."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support.benchmarks import GPU_PY, RESULTS, digests, import_benchmark
from tests.support.studies import ROOT


def test_apply_figures_are_read_as_a_gpu_prints_them() -> None:
    """On a GPU the baseline runs after the config, not in lockstep: the same lines, read alike."""
    gpu = import_benchmark("gpu")
    output = """runs/gpu-gpt/best.yaml: precision=bf16 batch=64x1 workers=2 compile=default (trial #5 of gpu-gpt)
ran 120 optimizer steps of 64 samples (24 windows of 5, after 31.20 s of warm-up) on cuda:0 (NVIDIA H100 80GB HBM3)
throughput: 612 samples/s here (spread 0.4%), 608 samples/s in the study (spread 0.3%): ratio 1.01
speedup: 10.21x here (over the baseline precision=fp32 batch=8x8 workers=0 compile=none, 60 samples/s, \
run here for 120 optimizer steps in 40 windows of 3, after it), 10.02x in the export: ratio 1.02
promise: 10.10x, 90% interval 9.80-10.40x here (3 rounds of the config beside the baseline, \
each a fresh process of both, measured as the study re-measured them), 10.02x, 90% interval \
9.70-10.35x in the export: kept (here 10.10x, 92% interval 9.75-10.46x, \
within the export's interval widened by 10%, 8.82-11.39x)
held-out loss after 3 steps: 4.1 here, 4.1 in the study (identical)"""
    assert gpu.parse_apply(output) == {
        "steps_run": 120,
        "samples_per_step": 64,
        "device": "cuda:0",
        "device_name": "NVIDIA H100 80GB HBM3",
        "throughput_here": 612.0,
        "throughput_study": 608.0,
        "throughput_ratio": 1.01,
        "speedup_delivered": 10.21,
        "baseline_throughput_here": 60.0,
        "baseline_steps_run": 120,
        "export_speedup_printed": 10.02,
        "promise_ratio_printed": 1.02,
        "speedup_checked": 10.10,
        "interval_checked": [9.80, 10.40],
        "rounds_checked": 3,
        "promise_verdict": "kept",
        "promise_agrees": True,
    }


def test_a_command_past_the_parts_time_limit_is_interrupted(tmp_path: Path) -> None:
    gpu = import_benchmark("gpu")
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    ran = gpu.run_command(sleeper, tmp_path, gpu.time.monotonic() + 1, tmp_path / "log")
    assert ran["stopped_at_time_limit"] is True and ran["killed"] is False
    assert ran["exit_code"] != 0 and ran["wall_s"] < 30


H100 = {"part": "study", "tiny": False, "device_requested": "the spec's (auto)", "device_name": "NVIDIA H100 80GB HBM3"}


@pytest.mark.parametrize(
    ("existing", "new", "dry", "force", "refused"),
    [
        (None, {"device_name": "AMD EPYC (2 cores)"}, True, False, False),  # no file yet
        ({**H100, "tiny": True}, {"device_name": "AMD EPYC (2 cores)"}, True, False, False),  # a dry run's
        ({**H100, "device_name": None}, {"device_name": "NVIDIA H200"}, False, False, False),  # it named none
        (H100, {"device_name": "AMD EPYC (2 cores)"}, True, False, True),  # a dry run, over a GPU run's
        (H100, {"device_name": "AMD EPYC (2 cores)"}, True, True, True),  # ... even with --force
        (H100, {"device_name": "NVIDIA H100 80GB HBM3"}, False, False, False),  # the same device
        (H100, {"device_name": "NVIDIA H200"}, False, False, True),  # another device
        (H100, {"device_name": "NVIDIA H200"}, False, True, False),  # ... told to
        (H100, {"device_name": None}, False, False, True),  # a run that stopped before it knew its device
    ],
)
def test_a_result_is_replaced_only_by_a_run_on_its_device(
    existing: dict[str, Any] | None, new: dict[str, Any], dry: bool, force: bool, refused: bool
) -> None:
    gpu = import_benchmark("gpu")
    reason = gpu.replacement_refused(existing, new, dry=dry, force=force)
    assert bool(reason) == refused, reason
    if refused:
        assert "NVIDIA H100 80GB HBM3" in reason


def test_the_committed_gpu_results_are_gpu_runs() -> None:
    """What benchmarks/tables.py renders as the GPU evidence: no dry run's file in its place."""
    files = sorted(RESULTS.glob("gpu-*.json"))
    assert files
    for path in files:
        data = json.loads(path.read_text())
        assert data["tiny"] is False and data["device_requested"] != "cpu" and data["device_name"], path.name


@pytest.mark.parametrize("args", [("--tiny",), ("--device", "cpu", "--tiny"), ("--device", "cpu")])
def test_a_dry_run_refuses_the_committed_results_before_it_runs(args: tuple[str, ...], tmp_path: Path) -> None:
    gpu = import_benchmark("gpu")
    before = digests()
    for out in (RESULTS, RESULTS / "sub"):
        with pytest.raises(SystemExit) as stopped:
            gpu.main([*args, "--out", str(out), "--work", str(tmp_path / "work"), "--force"])
        assert stopped.value.code == 2
    assert digests() == before and not (tmp_path / "work").exists()
    # its default is its work folder's
    ctx = gpu.Context(gpu.argument_parser().parse_args([*args, "--work", str(tmp_path / "work")]))
    assert ctx.out == (tmp_path / "work").resolve() / "results"
    assert gpu.Context(gpu.argument_parser().parse_args([])).out == RESULTS.resolve()


def test_a_dry_run_refuses_a_folder_holding_a_gpu_result(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gpu = import_benchmark("gpu")
    out = tmp_path / "results"
    shutil.copytree(RESULTS, out)
    before = digests(out)
    with pytest.raises(SystemExit) as stopped:
        gpu.main(["--part", "jax", "--device", "cpu", "--tiny", "--out", str(out), "--work", str(tmp_path / "w")])
    assert stopped.value.code == 2 and "never replaces" in capsys.readouterr().err
    assert digests(out) == before


def _gpu_run(gpu: ModuleType, tmp_path: Path, *args: str) -> Any:
    return gpu.Context(
        gpu.argument_parser().parse_args(["--out", str(tmp_path / "out"), "--work", str(tmp_path / "w"), *args])
    )


@pytest.mark.parametrize(
    ("device_name", "force", "replaced"),
    [
        (None, False, False),  # it stopped before it knew its device
        ("NVIDIA H200", False, False),
        ("NVIDIA H200", True, True),
        ("NVIDIA H100 80GB HBM3", False, True),
    ],
)
def test_a_gpu_run_keeps_another_devices_result(
    device_name: str | None, force: bool, replaced: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The part's file stays beside its logs; the results folder gets it only where it may replace
    what is there, and the script exits 1 where it may not."""
    gpu = import_benchmark("gpu")
    (tmp_path / "out").mkdir()
    committed = tmp_path / "out" / "gpu-study.json"
    committed.write_text(json.dumps(H100))

    def part_study(ctx: Any, result: dict[str, Any]) -> None:
        if device_name is None:
            raise gpu.PartError("torch sees no GPU here")
        result["device_name"] = device_name

    monkeypatch.setattr(gpu, "check_device", lambda ctx, part: None)
    monkeypatch.setattr(gpu, "part_study", part_study)
    ctx = _gpu_run(gpu, tmp_path, *(["--force"] if force else []))
    result = gpu.run_part(ctx, "study")
    kept = json.loads((tmp_path / "w" / "logs" / "gpu-study.json").read_text())
    assert kept["device_name"] == device_name == result["device_name"]
    written = json.loads(committed.read_text())
    if replaced:
        assert written["device_name"] == device_name and "study" not in ctx.refused
    else:
        assert written == H100 and "--force" in ctx.refused["study"]


def test_the_jax_install_notes_name_the_cuda_13_plugin() -> None:
    """The GPU machines carry jax 0.11.2 with the CUDA 13 plugin: every note that says which JAX
    to install names it (CUDA 12 only beside it, for a machine whose driver is CUDA 12)."""
    gpu = import_benchmark("gpu")
    assert "jax[cuda13]" in gpu.JAX_CUDA_INSTALL
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    notes = readme[readme.index("#### Installing on a GPU machine") : readme.index("## Results")]
    assert "jax-cuda13-plugin" in notes and "jax-cuda13-pjrt" in notes and "jax[cuda13]" in notes
    for path in (GPU_PY, ROOT / "benchmarks" / "README.md", ROOT / "backends" / "jax" / "devices.py"):
        text = path.read_text()
        assert "cuda13" in text, path.name
        if "cuda12" in text:
            assert text.index("cuda13") < text.index("cuda12"), path.name
