"""The CLI as a user drives it: real CPU trials end to end, checked in the export and the storage."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml

from autotuner.config.knobs import config_key
from autotuner.measurement.interval import stated_interval
from autotuner.results.records import baseline, records, speedup
from autotuner.study.optuna_adapter import study_id, study_storage
from tests.support.helpers import HELD
from tests.support.studies import ROOT, load_study, run_cli, write_hang_spec, write_spec

EXPORT_KEYS = {"params", "metrics", "baseline", "speedup", "environment", "spec", "study"}


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One small study searched once; the tests below read what it left."""
    workdir = tmp_path_factory.mktemp("search")
    budget = {"trials": 3, "remeasure_top": 1, "remeasure_runs": 2, "remeasure_windows": 3}
    # paced: the baseline's four micro-batches a step keep it behind, however busy the machine,
    # so a config is the best and is re-measured beside it
    spec = write_spec(workdir, budget=budget, workload="tests.support.study_workloads:paced_mlp")
    done = run_cli("search", "--spec", str(spec), cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    return workdir, done.stdout


def test_search_exports_the_best_config_with_its_evidence(searched: tuple[Path, str]) -> None:
    workdir, stdout = searched
    export = yaml.safe_load((workdir / "runs" / "small" / "best.yaml").read_text())
    assert EXPORT_KEYS <= set(export)
    assert set(export["params"]) == {"precision", "batch_size", "accumulation", "workers", "compile", *HELD}
    assert export["params"]["batch_size"] * export["params"]["accumulation"] == 64
    metrics = export["metrics"]
    for key in ("throughput", "drift", "peak_memory_mb", "warmup_s", "throughput_spread", "throughput_windows"):
        assert key in metrics, key
    assert metrics["drift"] <= 0.01
    assert len(metrics["throughput_windows"]) == 2  # the trial's own windows
    assert export["baseline"]["params"]["batch_size"] == 16
    # The speedup is over the baseline measured beside the winner (`test_the_best_and_the_baseline_...`).
    assert export["speedup"] == pytest.approx(
        speedup(next(t for t in records(load_study(workdir)) if t.number == export["study"]["trial"]), None)
    )
    assert export["environment"]["fingerprint"]
    assert export["study"]["name"] == "small"
    assert export["study"]["storage"] == "sqlite:///runs/small/study.db"
    assert "dashboard: optuna-dashboard sqlite:///runs/small/study.db" in stdout
    assert "best" in stdout and "baseline" in stdout


def test_the_best_and_the_baseline_are_remeasured_before_the_best_is_declared(searched: tuple[Path, str]) -> None:
    workdir, stdout = searched
    export = yaml.safe_load((workdir / "runs" / "small" / "best.yaml").read_text())
    winner, base = export["metrics"], export["baseline"]
    assert f"re-measured #{export['study']['trial']}" in stdout and "re-measured #0 (baseline)" in stdout
    study = load_study(workdir)
    stored = {
        k: v for k, v in study_storage(study).get_study_system_attrs(study_id(study)).items() if "remeasure:" in k
    }
    for number, measured in ((export["study"]["trial"], winner), (0, base)):
        # the trial's process, then one more a round: two rounds, the fewest an interval needs
        # (budget.remeasure_runs 2); one where the only config fell behind the baseline in the first
        rounds = len(stored[f"autotuner:remeasure:{number}"]["throughputs"])
        assert measured["remeasured"] and 1 <= rounds <= 2 and len(measured["throughput_runs"]) == 1 + rounds
        assert measured["trial_throughput"] == measured["throughput_runs"][0]
        runs = measured["throughput_runs"]
        middle = statistics.median(runs)
        assert measured["throughput_run_spread"] == pytest.approx((max(runs) - min(runs)) / middle)
        # Each re-run measures budget.remeasure_windows (3, where a trial measures 2); the throughput
        # is the median of the re-runs' windows (the trial that got the config chosen is left out).
        rerun_windows = stored[f"autotuner:remeasure:{number}"]["windows"]
        assert [len(w) for w in rerun_windows] == [3] * rounds
        assert measured["throughput"] == statistics.median(sum(rerun_windows, []))
        # Measured in lockstep (a CPU) with a process of the baseline beside it every round: the
        # baseline's own, or where it came in a later pass (a newcomer to the top), more of it.
        claim = stored[f"autotuner:remeasure:{number}"]
        assert claim["lockstep"] is True and 0 in claim["group"] and len(claim["baseline_windows"]) == 3 * rounds
        if claim["group"] == stored["autotuner:remeasure:0"]["group"]:
            assert claim["baseline_windows"] == sum(stored["autotuner:remeasure:0"]["windows"], [])
    # the speedup: the geometric mean of the rounds' speedups over the baseline beside it, with its interval
    if export["study"]["trial"] != 0:
        rounds = stored[f"autotuner:remeasure:{export['study']['trial']}"]["speedups"]
        assert len(rounds) == 2 and export["speedup"] == pytest.approx(statistics.geometric_mean(rounds))
        assert export["speedup_interval"] == stated_interval(rounds).as_dict()
        assert f"({stated_interval(rounds).text()}, 2 rounds)" in " ".join(stdout.split())
    assert "in lockstep with" in stdout
    # The winner and the baseline at least (a config that led before its re-measurement too).
    assert {f"autotuner:remeasure:{export['study']['trial']}", "autotuner:remeasure:0"} <= set(stored)
    assert all(v["status"] == "done" and 1 <= len(v["throughputs"]) <= 2 for v in stored.values())
    assert study.trials[export["study"]["trial"]].values[0] == winner["trial_throughput"]  # the trial keeps its own


def test_search_stores_everything_on_the_study(searched: tuple[Path, str]) -> None:
    workdir, _ = searched
    study = load_study(workdir)
    assert study.metric_names == ["throughput", "drift"]
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    reference = study.user_attrs["reference"]
    assert reference["config"]["precision"] == "fp32" and reference["config"]["compile"] == "none"
    assert reference["noise_floor"] == 0.0  # two fp32 CPU runs are bitwise identical
    assert len(study.user_attrs["fingerprint"]) == 16 and study.user_attrs["environment"]["device"] == "cpu"
    trials = study.get_trials(deepcopy=False)
    assert trials[0].user_attrs["role"] == "baseline"
    held = {k: v[0] for k, v in HELD.items()}
    assert trials[0].params == {"precision": "fp32", "batch_size": 16, "workers": 0, "compile": "none", **held}
    for t in trials:
        assert t.state is optuna.trial.TrialState.COMPLETE
        assert t.user_attrs["outcome"] in {"ok", "unsupported", "oom", "nan", "timeout", "crash", "error"}
        assert "reason" in t.user_attrs and "config" in t.user_attrs
        assert len(t.system_attrs["constraints"]) == 3
        feasible = all(c <= 0 for c in t.system_attrs["constraints"])
        assert feasible == t.user_attrs["feasible"]
    keys = [config_key(t.params) for t in trials]
    assert len(keys) == len(set(keys)), "a config ran twice"
    ran = [t for t in trials if t.user_attrs["outcome"] != "unsupported"]
    assert len(ran) == 3
    for t in ran:  # CPU telemetry of the measured windows, on every trial that ran
        metrics = t.user_attrs
        assert 0 < metrics["cpu_util_mean"] and metrics["cpu_cores"] >= 1 and metrics["peak_rss_mb"] > 0


def test_unsupported_values_are_recorded_without_running(searched: tuple[Path, str]) -> None:
    workdir, _ = searched
    study = load_study(workdir)
    # Ask for every config, so tf32 (which a CPU has not) is certainly proposed.
    done = run_cli("search", "--spec", str(workdir / "small.yaml"), "--trials", "6", cwd=workdir)
    assert done.returncode == 0, done.stderr
    trials = study.get_trials(deepcopy=False)
    tf32 = [t for t in trials if t.params["precision"] == "tf32"]
    assert tf32, "the space was exhausted without proposing tf32"
    for t in tf32:
        assert t.user_attrs["outcome"] == "unsupported"
        assert "tf32" in t.user_attrs["reason"]
        assert "startup_s" not in t.user_attrs or t.user_attrs["startup_s"] is None  # no process was started
        assert t.values[0] == 0.0 and t.system_attrs["constraints"][1] > 0


def test_rerun_resumes_without_rerunning_finished_trials(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, name="resume", budget={"trials": 2})
    first = run_cli("search", "--spec", str(spec), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    study = load_study(tmp_path, "resume")
    before = {t.number: (t.params, t.values, t.datetime_complete) for t in study.get_trials()}
    again = run_cli("search", "--spec", str(spec), cwd=tmp_path)  # budget already spent: runs nothing
    assert again.returncode == 0, again.stderr
    assert {t.number: (t.params, t.values, t.datetime_complete) for t in study.get_trials()} == before
    more = run_cli("search", "--spec", str(spec), "--trials", "3", cwd=tmp_path)
    assert more.returncode == 0, more.stderr
    after = study.get_trials()
    for number, (params, values, completed) in before.items():
        assert (after[number].params, after[number].values, after[number].datetime_complete) == (
            params,
            values,
            completed,
        )
    assert sum(t.user_attrs["outcome"] != "unsupported" for t in after) == 3
    assert "reference" in study.user_attrs and len(study.user_attrs["reference"]["runs_heldout"]) == 2


def test_export_command_writes_the_same_file_from_the_storage(searched: tuple[Path, str]) -> None:
    workdir, _ = searched
    written = yaml.safe_load((workdir / "runs" / "small" / "best.yaml").read_text())
    out = workdir / "again.json"
    done = run_cli("export", "--spec", str(workdir / "small.yaml"), "--format", "json", "-o", str(out), cwd=workdir)
    assert done.returncode == 0, done.stderr
    exported = json.loads(out.read_text())
    assert exported == written
    by_url = run_cli(
        "export", "--study", "small", "--storage", "sqlite:///runs/small/study.db", "-o", "x.yaml", cwd=workdir
    )
    assert by_url.returncode == 0, by_url.stderr
    assert yaml.safe_load((workdir / "x.yaml").read_text()) == written


@pytest.mark.parametrize("fmt", ["hf-trainer", "lightning", "accelerate"])
def test_export_for_a_trainer_prints_and_writes_its_arguments(searched: tuple[Path, str], fmt: str) -> None:
    from autotuner.apply import load_config
    from autotuner.backends.pytorch.integrations import accelerate, lightning, transformers
    from tests.backends.integrations.test_integrations import literals

    workdir, _ = searched
    done = run_cli("export", "--spec", str(workdir / "small.yaml"), "--format", fmt, cwd=workdir)
    assert done.returncode == 0, done.stderr
    *code, path = done.stdout.splitlines()
    assert path == f"runs/small/best.{fmt}.py"
    written = (workdir / path).read_text()
    assert written == "\n".join(code) + "\n"  # what it printed is what it wrote
    compile(written, path, "exec")
    config = load_config(workdir / "runs" / "small" / "best.yaml")
    found = literals(written)
    if fmt == "hf-trainer":
        assert found == {"tuned": transformers.training_arguments(config)}
        assert found["tuned"]["per_device_train_batch_size"] == config.params["batch_size"]
        assert found["tuned"]["gradient_accumulation_steps"] == config.params["accumulation"]
    else:
        module = lightning if fmt == "lightning" else accelerate
        assert found["loader_arguments"] == module.dataloader_arguments(config)
        arguments = found["trainer_arguments" if fmt == "lightning" else "accelerator_arguments"]
        accumulation = arguments["accumulate_grad_batches" if fmt == "lightning" else "gradient_accumulation_steps"]
        assert accumulation * found["loader_arguments"]["batch_size"] == 64  # the spec's global batch
    out = workdir / "mine.py"
    again = run_cli("export", "--spec", str(workdir / "small.yaml"), "--format", fmt, "-o", str(out), cwd=workdir)
    assert again.returncode == 0 and out.read_text() == written


def test_diverging_fp16_config_is_infeasible(tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        name="overflow",
        workload_args={"features": 32, "hidden": 64, "depth": 2, "samples": 1024, "input_scale": 1.0e6},
        baseline={"precision": "fp32", "batch_size": 64, "workers": 0, "compile": "none"},
        space={"precision": ["fp32", "fp16"], "batch_size": [64], "workers": [0], "compile": ["none"]},
        budget={"trials": 2},
    )
    done = run_cli("search", "--spec", str(spec), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    trials = {t.params["precision"]: t for t in load_study(tmp_path, "overflow").get_trials()}
    fp16 = trials["fp16"]
    assert fp16.user_attrs["outcome"] == "nan", fp16.user_attrs
    assert fp16.user_attrs["feasible"] is False
    assert fp16.values[1] == float("inf")
    export = yaml.safe_load((tmp_path / "runs" / "overflow" / "best.yaml").read_text())
    assert export["params"]["precision"] == "fp32"


def test_oom_rules_out_larger_batches_without_running_them(tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        name="ceiling",
        workload="tests.support.study_workloads:memory_ceiling",
        workload_args={"ceiling": 32},
        baseline={"precision": "fp32", "batch_size": 8, "workers": 0, "compile": "none"},
        space={"precision": ["fp32"], "batch_size": [8, 16, 32, 64], "workers": [0], "compile": ["none"]},
        budget={"trials": 10},
    )
    done = run_cli("search", "--spec", str(spec), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    trials = load_study(tmp_path, "ceiling").get_trials()
    outcomes = {t.params["batch_size"]: t.user_attrs["outcome"] for t in trials}
    assert outcomes[8] == outcomes[16] == "ok"
    assert "oom" in outcomes.values()
    first_oom = min(t.number for t in trials if t.user_attrs["outcome"] == "oom")
    oom_batch = trials[first_oom].params["batch_size"]
    later_larger = [t for t in trials if t.number > first_oom and t.params["batch_size"] >= oom_batch]
    assert later_larger == [], "a batch an OOM had ruled out was run"
    assert "every config of the space has been tried" in done.stdout


def test_bad_spec_exits_2_with_one_line_and_writes_nothing(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, space={"precision": ["fp8"]})
    done = run_cli("search", "--spec", str(spec), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert str(spec) in done.stderr and "space.precision" in done.stderr and "fp32" in done.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"workload": "no_such_module:factory"}, ["workload", "no_such_module"]),
        ({"workload": "tests.support.study_workloads:missing"}, ["workload", "missing"]),
        ({"device": "cuda:3"}, ["device"]),
    ],
)
def test_unusable_workload_or_device_exits_2_before_anything_is_stored(
    tmp_path: Path, changes: dict, words: list[str]
) -> None:
    if changes.get("device", "").startswith("cuda") and os.path.exists("/dev/nvidia0"):
        pytest.skip("this machine has a GPU")
    spec = write_spec(tmp_path, **changes)
    done = run_cli("search", "--spec", str(spec), cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    for word in words:
        assert word in done.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_more_ranks_than_the_cpu_has_cores_exits_2_before_anything_is_stored(tmp_path: Path, device: str) -> None:
    """512 ranks on a machine of a few cores: refused in one line, never started (where the
    search would have started 512 processes and hung). With `device: cpu` before any probe."""
    if device == "auto" and os.path.exists("/dev/nvidia0"):
        pytest.skip("this machine has a GPU")
    spec = write_spec(
        tmp_path,
        device=device,
        processes=512,
        parallel="ddp",
        global_batch=512,
        space={"precision": ["fp32"], "batch_size": [1], "workers": [0], "compile": ["none"]},
        baseline={"precision": "fp32", "batch_size": 1, "workers": 0, "compile": "none"},
    )
    done = run_cli("search", "--spec", str(spec), cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "processes" in done.stderr and "512 ranks on the CPU need a core each" in done.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "storage, words",
    [
        ("not a url", ["storage", "not a SQLAlchemy database URL"]),
        ("nosuchdb://x/y", ["storage", "nosuchdb"]),
        ("grpc://127.0.0.1:13000", ["storage", "gRPC storage proxy", "claims", "postgresql://"]),
        ("sqlite:///no/such/folder/x.db", ["storage", "does not exist"]),
        ("postgresql://nobody@127.0.0.1:1/none", ["storage", "cannot open"]),
    ],
)
def test_bad_storage_exits_2(tmp_path: Path, storage: str, words: list[str]) -> None:
    # what is wrong in the URL itself is said before the probe (which would refuse this workload);
    # a server that does not answer, once the probe is done
    connects = storage.startswith("postgresql")
    spec = write_spec(tmp_path, **({} if connects else {"workload": "no_such_module:factory"}))
    done = run_cli("search", "--spec", str(spec), "--storage", storage, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    for word in words:
        assert word in done.stderr


def test_bad_arguments_exit_2(tmp_path: Path) -> None:
    done = run_cli("search", "--spec", "x.yaml", "--trials", "-3", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    missing = run_cli("search", "--spec", "nope.yaml", cwd=tmp_path)
    assert missing.returncode == 2 and "nope.yaml" in missing.stderr and missing.stderr.count("\n") == 1


def test_env_prints_device_versions_support_and_fingerprint(tmp_path: Path) -> None:
    done = run_cli("env", "--device", "cpu", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for word in ("device", "torch", "bf16", "tf32", "fingerprint"):
        assert word in done.stdout


@pytest.mark.skipif(not os.environ.get("AUTOTUNER_TEST_POSTGRES_URL"), reason="AUTOTUNER_TEST_POSTGRES_URL is not set")
def test_search_on_postgresql(tmp_path: Path) -> None:
    url = os.environ["AUTOTUNER_TEST_POSTGRES_URL"]
    name = f"pg_{os.getpid()}_{tmp_path.name[-8:]}".replace("-", "_")
    spec = write_spec(tmp_path, name=name, budget={"trials": 2})
    try:
        done = run_cli("search", "--spec", str(spec), "--storage", url, cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        study = optuna.load_study(study_name=name, storage=url)
        assert sum(t.user_attrs["outcome"] != "unsupported" for t in study.get_trials()) == 2
        export = yaml.safe_load((tmp_path / "runs" / name / "best.yaml").read_text())
        assert export["study"]["storage"] == url
    finally:
        try:
            optuna.delete_study(study_name=name, storage=url)
        except KeyError:
            pass


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_records_the_running_trial_as_failed_and_rerun_retries_it(tmp_path: Path, signum: int) -> None:
    """Ctrl-C, and SIGTERM as `kill` and batch schedulers send it, end the search cleanly."""
    # Trial 1 (the fourth process that trains) hangs until the signal.
    spec = write_hang_spec(tmp_path, "interrupt", hang_at=4, workers=0, trials=3)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # SIGINT as a terminal sends it; a shell may have left it ignored for background children.
    process = subprocess.Popen(
        [sys.executable, "-m", "autotuner", "search", "--spec", str(spec)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not any(tmp_path.glob("hang-*")) and process.poll() is None:
        time.sleep(0.2)
    trials = load_study(tmp_path, "interrupt").get_trials(deepcopy=False)
    running = next((t for t in trials if t.state is optuna.trial.TrialState.RUNNING), None)
    assert running is not None and running.number >= 1, process.communicate() if process.poll() is not None else trials
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stdout + stderr
    assert "Traceback" not in stderr
    trials = load_study(tmp_path, "interrupt").get_trials()
    cut = trials[running.number]
    assert cut.state is optuna.trial.TrialState.FAIL
    assert (tmp_path / "runs" / "interrupt" / "best.yaml").exists()  # exported from what finished
    finished_before = {t.number: t.values for t in trials if t.state is optuna.trial.TrialState.COMPLETE}
    again = run_cli("search", "--spec", str(spec), cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    after = load_study(tmp_path, "interrupt").get_trials()
    assert {t.number: t.values for t in after if t.number in finished_before} == finished_before
    retried = [t for t in after if t.user_attrs.get("retry_of") == running.number]
    assert (
        len(retried) == 1 and retried[0].params == cut.params and retried[0].state is optuna.trial.TrialState.COMPLETE
    )
    assert (
        sum(t.state is optuna.trial.TrialState.COMPLETE and t.user_attrs["outcome"] != "unsupported" for t in after)
        == 3
    )


def test_memory_limit_makes_trials_infeasible_and_no_feasible_config_exits_1(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, name="tight", objective={"max_drift": 0.01, "max_memory_mb": 1.0}, budget={"trials": 1})
    done = run_cli("search", "--spec", str(spec), cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no feasible config" in done.stdout
    (trial,) = load_study(tmp_path, "tight").get_trials()
    assert trial.user_attrs["outcome"] == "ok" and trial.user_attrs["feasible"] is False
    assert "memory" in trial.user_attrs["reason"]
    assert trial.system_attrs["constraints"][2] > 0
    assert not (tmp_path / "runs" / "tight" / "best.yaml").exists()


def test_a_study_refuses_other_hardware_and_a_changed_job(searched: tuple[Path, str]) -> None:
    workdir, _ = searched
    spec = workdir / "small.yaml"
    study = load_study(workdir)
    changed = yaml.safe_load(spec.read_text())
    changed["global_batch"] = 128
    other = workdir / "changed" / "small.yaml"
    other.parent.mkdir()
    other.write_text(yaml.safe_dump(changed))
    done = run_cli("search", "--spec", str(other), "--storage", "sqlite:///runs/small/study.db", cwd=workdir)
    assert done.returncode == 2 and "different job" in done.stderr and "Traceback" not in done.stderr
    fingerprint = study.user_attrs["fingerprint"]
    study.set_user_attr("fingerprint", "0123456789abcdef")
    try:
        done = run_cli("search", "--spec", str(spec), cwd=workdir)
    finally:
        study.set_user_attr("fingerprint", fingerprint)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "fingerprint 0123456789abcdef" in done.stderr and done.stderr.count("\n") == 1


def test_export_top_lists_the_best_feasible_configs_in_order(searched: tuple[Path, str]) -> None:
    workdir, _ = searched
    done = run_cli("export", "--spec", str(workdir / "small.yaml"), "--top", "2", "-o", "top.yaml", cwd=workdir)
    assert done.returncode == 0, done.stderr
    top = yaml.safe_load((workdir / "top.yaml").read_text())["top"]
    # Ranked as the best is chosen: by the speedup, over the baseline beside it where re-measured.
    trials = records(load_study(workdir))
    feasible = sorted((t for t in trials if t.feasible), key=lambda t: -(speedup(t, baseline(trials)) or 0))
    assert [entry["trial"] for entry in top] == [t.number for t in feasible[:2]]
    assert [entry["throughput"] for entry in top] == [t.throughput for t in feasible[:2]]
    assert [entry["rank"] for entry in top] == [1, 2]
    assert "1. #" in done.stdout


def test_a_study_stored_where_0_1_kept_it_is_named_with_how_to_resume_it(tmp_path: Path) -> None:
    """autotuner 0.1 kept a study's database at studies/<name>.db. A search of that study with the
    default storage says where it is and how to resume it, instead of silently starting afresh
    in runs/<name>/; with the new database present, or a storage named, it says nothing."""
    spec = write_spec(tmp_path, name="moved")
    (tmp_path / "studies").mkdir(exist_ok=True)
    optuna.create_study(study_name="moved", storage=f"sqlite:///{tmp_path}/studies/moved.db")
    # an unusable device stops the search before anything is stored: the note comes first
    done = run_cli("search", "--spec", str(spec), "--device", "cuda:7", cwd=tmp_path)
    assert done.returncode == 2
    note = done.stderr.splitlines()[0]
    assert "studies/moved.db" in note and "--storage sqlite:///studies/moved.db" in note, done.stderr
    assert not (tmp_path / "runs" / "moved" / "study.db").exists()
    named = run_cli("search", "--spec", str(spec), "--device", "cuda:7", "--storage", "sqlite:///x.db", cwd=tmp_path)
    assert "studies/moved.db" not in named.stderr
