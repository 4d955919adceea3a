"""The job spec: defaults of a minimal spec, one-line errors for every kind of bad input, and what
follows from a valid spec (space, baseline, derived accumulation, identity)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from autotuner.errors import SpecError
from autotuner.spec.job import Job, load_spec, parse_spec
from tests.support.helpers import HELD, ROOT

MINIMAL = {"name": "job", "backend": "pytorch", "workload": "builtin:mlp", "global_batch": 64}
FIRST = ("precision", "batch_size", "workers", "compile")


def write(tmp_path: Path, data: Any, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def spec(tmp_path: Path, **changes: Any) -> Job:
    return load_spec(write(tmp_path, {**MINIMAL, **changes}))


def refused(tmp_path: Path, data: Any, key: str | None, *fragments: str) -> SpecError:
    """Load `data` from a file, expect a SpecError: one line, the file's name, the key and `fragments`."""
    path = write(tmp_path, data)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    message = str(caught.value)
    assert "\n" not in message and "\r" not in message, message
    assert str(path) in message, message
    assert caught.value.source == str(path)
    if key is not None:
        assert caught.value.key == key, message
        assert f": {key}: " in message, message
    for fragment in fragments:
        assert fragment in message, message
    assert caught.value.exit_code == 2
    return caught.value


def changed(**changes: Any) -> dict[str, Any]:
    data = {**MINIMAL}
    for key, value in changes.items():
        if value is _DROP:
            del data[key]
        else:
            data[key] = value
    return data


_DROP = object()


# ---------------------------------------------------------------- a valid spec


def test_minimal_spec_has_the_documented_defaults(tmp_path: Path) -> None:
    job = spec(tmp_path)
    s = job.spec
    assert job.name == "job"
    assert s.device == "auto"
    assert s.workload_args == {}
    assert s.objective.max_drift == 0.01 and s.objective.max_memory_mb is None
    assert s.budget.trials == 30 and s.budget.timeout is None
    t = s.trial
    assert (t.warmup_steps, t.steps, t.windows, t.drift_steps, t.timeout, t.seed) == (3, 10, 3, 5, None, 0)
    assert job.trial_timeout(job.baseline) == 600.0  # the default, for a config that compiles nothing
    assert job.sampler.name == "tpe" and job.sampler.seed is None
    assert job.storage_url() == "sqlite:///runs/job/study.db"
    assert job.storage_url("sqlite:///x.db") == "sqlite:///x.db"
    assert job.workload_path() == "autotuner.backends.pytorch.builtin:mlp"
    # the baseline: the strict reference values, the whole global batch in one micro-batch
    references = {
        "memory_format": "contiguous",
        "optimizer": "as-given",
        "checkpointing": "none",
        "attention": "default",
        "pin_memory": False,
        "prefetch_factor": 2,
        "cudnn_benchmark": False,
        "memory_budget": 1.0,
        "float8": "none",
    }
    assert job.baseline == {"precision": "fp32", "batch_size": 64, "workers": 0, "compile": "none", **references}
    # the space: the default preset, batch sizes that do not divide the global batch dropped
    assert job.space == {
        "precision": ("fp32", "tf32", "bf16", "fp16"),
        "batch_size": (8, 16, 32, 64),
        "workers": (0, 1, 2, 4, 8),
        "compile": ("none", "default", "reduce-overhead", "max-autotune"),
        "memory_format": ("contiguous", "channels_last"),
        "optimizer": ("as-given", "foreach", "fused"),
        "checkpointing": ("none", "blocks"),
        "attention": ("default", "flash", "efficient", "cudnn", "math", "eager"),
        "pin_memory": (False, True),
        "prefetch_factor": (2, 4),
        "cudnn_benchmark": (False, True),
        "memory_budget": (1.0, 0.5, 0.2),
        "float8": ("none",),  # in no preset: held at its reference
    }
    assert job.reference_config() == {
        "precision": "fp32",
        "batch_size": 64,
        "workers": 0,
        "compile": "none",
        **references,
        "accumulation": 1,
    }
    assert job.text == (tmp_path / "job.yaml").read_text()
    assert job.source == str(tmp_path / "job.yaml")


def test_sampler_as_a_bare_name(tmp_path: Path) -> None:
    assert spec(tmp_path, sampler="random").sampler.name == "random"
    job = spec(tmp_path, sampler={"name": "nsga2", "seed": 7})
    assert (job.sampler.name, job.sampler.seed) == ("nsga2", 7)


def test_every_point_of_the_space_is_a_config(tmp_path: Path) -> None:
    job = spec(
        tmp_path,
        space={"precision": ["fp32", "bf16"], "batch_size": [16, 64], "workers": [0], "compile": ["none"], **HELD},
    )
    configs = list(job.space.points())
    assert len(configs) == 4
    assert {(c["precision"], c["batch_size"]) for c in configs} == {
        ("fp32", 16),
        ("fp32", 64),
        ("bf16", 16),
        ("bf16", 64),
    }
    assert all(set(c) == {*FIRST, *HELD} for c in configs)


def test_inline_choices_win_over_the_preset(tmp_path: Path) -> None:
    job = spec(tmp_path, space={"preset": "pytorch-cpu", "precision": ["bf16"], "batch_size": [32]})
    assert job.space["precision"] == ("fp32", "bf16")  # the baseline's fp32 is added in front
    assert job.space["batch_size"] == (64, 32)
    assert job.space["workers"] == (0, 1, 2)  # from the pytorch-cpu preset
    assert job.space["compile"] == ("none", "default")


def test_space_as_a_preset_name(tmp_path: Path) -> None:
    job = spec(tmp_path, space="pytorch-cpu")
    preset = yaml.safe_load((ROOT / "search_spaces" / "pytorch-cpu.yaml").read_text())
    assert job.space["precision"] == tuple(preset["precision"])
    assert job.space["batch_size"] == tuple(b for b in preset["batch_size"] if 64 % b == 0) == (8, 16, 32, 64)


def test_a_single_value_is_a_one_choice_list_and_duplicates_go(tmp_path: Path) -> None:
    job = spec(tmp_path, space={"precision": "bf16", "workers": [2, 2, 0]})
    assert job.space["precision"] == ("fp32", "bf16")
    assert job.space["workers"] == (2, 0)


def test_the_baseline_values_are_added_to_the_space(tmp_path: Path) -> None:
    job = spec(
        tmp_path,
        baseline={"precision": "fp16", "batch_size": 32, "workers": 2},
        space={"precision": ["bf16"], "batch_size": [8, 16], "workers": [0], "compile": ["none"], **HELD},
    )
    held = {k: v[0] for k, v in HELD.items()}
    assert job.baseline == {"precision": "fp16", "batch_size": 32, "workers": 2, "compile": "none", **held}
    assert job.space["precision"] == ("fp16", "bf16")
    assert job.space["batch_size"] == (32, 8, 16)
    assert job.space["workers"] == (2, 0)
    assert job.space["compile"] == ("none",)
    assert job.complete({}) == {**job.baseline, "accumulation": 2}
    # the reference keeps the baseline's batching but is strict in everything else
    assert job.reference_config() == {
        "precision": "fp32",
        "batch_size": 32,
        "workers": 0,
        "compile": "none",
        **held,
        "accumulation": 2,
    }


def test_complete_derives_accumulation_and_fills_fixed_knobs(tmp_path: Path) -> None:
    job = spec(
        tmp_path,
        baseline={"workers": 1},
        space={"precision": ["fp32", "bf16"], "batch_size": [8, 16], "workers": [1], **HELD},
    )
    config = job.complete({"precision": "bf16", "batch_size": 8})
    held = {k: v[0] for k, v in HELD.items()}
    assert config == {"precision": "bf16", "batch_size": 8, "workers": 1, "compile": "none", **held, "accumulation": 8}
    assert job.complete({"precision": "fp32", "batch_size": 64})["accumulation"] == 1
    for params in job.space.points():
        full = job.complete(params)
        assert full["batch_size"] * full["accumulation"] == 64


def test_identity_ignores_budget_storage_and_sampler(tmp_path: Path) -> None:
    base = spec(tmp_path).identity()
    assert spec(tmp_path, budget={"trials": 3, "timeout": 60}).identity() == base
    assert spec(tmp_path, storage="sqlite:///elsewhere.db").identity() == base
    assert spec(tmp_path, sampler={"name": "random", "seed": 3}).identity() == base
    assert spec(tmp_path, space="pytorch").identity() == base  # the same resolved space
    assert len(base) == 16


@pytest.mark.parametrize(
    "changes",
    [
        {"space": {"precision": ["fp32", "bf16"]}},
        {"space": "pytorch-cpu"},
        {"baseline": {"batch_size": 32}},
        {"global_batch": 128},
        {"workload_args": {"hidden": 8}},
        {"workload": "builtin:cnn"},
        {"objective": {"max_drift": 0.05}},
        {"trial": {"steps": 11}},
    ],
)
def test_identity_changes_with_what_a_trial_measures(tmp_path: Path, changes: dict[str, Any]) -> None:
    assert spec(tmp_path, **changes).identity() != spec(tmp_path).identity()


def test_parse_spec_without_a_file() -> None:
    job = parse_spec(dict(MINIMAL), "inline")
    assert job.name == "job"
    with pytest.raises(SpecError, match="^inline: a job spec is a mapping"):
        parse_spec(["not", "a", "mapping"], "inline")


# ---------------------------------------------------------------- refused: structure


def test_unknown_top_level_key(tmp_path: Path) -> None:
    refused(tmp_path, changed(epochs=3), "epochs", "unknown key", "global_batch")


@pytest.mark.parametrize(
    ("section", "key", "allowed"),
    [
        ("trial", "stepz", "drift_steps"),
        ("objective", "max_dirft", "max_drift"),
        ("budget", "trails", "trials"),
        ("sampler", "nme", "seed"),
    ],
)
def test_unknown_nested_key(tmp_path: Path, section: str, key: str, allowed: str) -> None:
    refused(tmp_path, changed(**{section: {key: 1}}), f"{section}.{key}", "unknown key", allowed)


@pytest.mark.parametrize("missing", ["name", "backend", "workload", "global_batch"])
def test_missing_required_key(tmp_path: Path, missing: str) -> None:
    refused(tmp_path, changed(**{missing: _DROP}), missing, "required")


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"global_batch": "64"}, "global_batch"),
        ({"global_batch": 64.0}, "global_batch"),
        ({"global_batch": True}, "global_batch"),
        ({"trial": {"steps": 1.5}}, "trial.steps"),
        ({"trial": {"seed": "zero"}}, "trial.seed"),
        ({"budget": {"trials": "many"}}, "budget.trials"),
        ({"objective": {"max_drift": "1%"}}, "objective.max_drift"),
        ({"workload_args": [1, 2]}, "workload_args"),
        ({"name": 5}, "name"),
        ({"trial": "fast"}, "trial"),
    ],
)
def test_wrong_types(tmp_path: Path, changes: dict[str, Any], key: str) -> None:
    refused(tmp_path, changed(**changes), key)


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"global_batch": 0}, "global_batch"),
        ({"global_batch": -64}, "global_batch"),
        ({"trial": {"steps": 0}}, "trial.steps"),
        ({"trial": {"windows": 0}}, "trial.windows"),
        ({"trial": {"drift_steps": 0}}, "trial.drift_steps"),
        ({"trial": {"warmup_steps": -1}}, "trial.warmup_steps"),
        ({"trial": {"timeout": 0}}, "trial.timeout"),
        ({"budget": {"trials": 0}}, "budget.trials"),
        ({"budget": {"timeout": -1}}, "budget.timeout"),
        ({"objective": {"max_drift": 0}}, "objective.max_drift"),
        ({"objective": {"max_memory_mb": 0}}, "objective.max_memory_mb"),
        ({"space": {"batch_size": [0]}}, "space.batch_size"),
        ({"space": {"workers": [-1]}}, "space.workers"),
        ({"baseline": {"batch_size": 0}}, "baseline.batch_size"),
        ({"baseline": {"workers": -2}}, "baseline.workers"),
    ],
)
def test_non_positive_sizes(tmp_path: Path, changes: dict[str, Any], key: str) -> None:
    refused(tmp_path, changed(**changes), key)


# ---------------------------------------------------------------- refused: knobs and values


@pytest.mark.parametrize("knob", ["precision", "batch_size", "workers", "compile"])
def test_empty_choice_list(tmp_path: Path, knob: str) -> None:
    refused(tmp_path, changed(space={knob: []}), f"space.{knob}", "empty")


@pytest.mark.parametrize(
    ("changes", "key", "fragment"),
    [
        ({"space": {"precision": ["fp32", "fp8"]}}, "space.precision", "'fp8'"),
        ({"space": {"compile": "fast"}}, "space.compile", "reduce-overhead"),
        ({"space": {"workers": [True]}}, "space.workers", "True"),
        ({"space": {"batch_size": ["big"]}}, "space.batch_size", "'big'"),
        ({"baseline": {"precision": "fp8"}}, "baseline.precision", "fp32, tf32, bf16, fp16"),
        ({"baseline": {"compile": False}}, "baseline.compile", "none"),
    ],
)
def test_unknown_knob_values(tmp_path: Path, changes: dict[str, Any], key: str, fragment: str) -> None:
    refused(tmp_path, changed(**changes), key, fragment)


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"space": {"jit": ["on", "off"]}}, "space.jit"),
        ({"baseline": {"jit": "on"}}, "baseline.jit"),
        ({"space": {"accumulation": [2]}}, "space.accumulation"),  # derived, never searched
        ({"baseline": {"accumulation": 2}}, "baseline.accumulation"),
        ({"space": {"channels_last": [True]}}, "space.channels_last"),
    ],
)
def test_knob_the_backend_does_not_have(tmp_path: Path, changes: dict[str, Any], key: str) -> None:
    refused(tmp_path, changed(**changes), key, "pytorch backend has no knob", "precision, batch_size, workers, compile")


def test_space_batch_size_must_divide_global_batch(tmp_path: Path) -> None:
    refused(tmp_path, changed(space={"batch_size": [16, 48]}), "space.batch_size", "48", "64")


def test_baseline_batch_size_must_divide_global_batch(tmp_path: Path) -> None:
    refused(tmp_path, changed(baseline={"batch_size": 48}), "baseline.batch_size", "48", "64")


def test_preset_batch_sizes_that_do_not_divide_are_dropped(tmp_path: Path) -> None:
    assert spec(tmp_path, global_batch=48).space["batch_size"] == (48, 8, 16)


def test_minimal_spec_with_an_odd_global_batch_is_valid(tmp_path: Path) -> None:
    job = spec(tmp_path, global_batch=100)
    assert 100 in job.space["batch_size"]


@pytest.mark.parametrize(
    ("space", "key"), [("nope", "space"), ({"preset": "nope"}, "space.preset"), ({"preset": 3}, "space.preset")]
)
def test_preset_that_does_not_exist(tmp_path: Path, space: Any, key: str) -> None:
    refused(tmp_path, changed(space=space), key, "pytorch-cpu")


@pytest.mark.parametrize(
    ("workload", "fragment"),
    [
        ("builtin:vgg", "builtin:mlp"),
        ("not a path", "package.module:function"),
        ("module_without_function", "package.module:function"),
        ("pkg.mod:fn()", "package.module:function"),
    ],
)
def test_bad_workload_reference(tmp_path: Path, workload: str, fragment: str) -> None:
    refused(tmp_path, changed(workload=workload), "workload", fragment)


def test_unknown_backend_and_device(tmp_path: Path) -> None:
    refused(tmp_path, changed(backend="tensorflow"), "backend", "pytorch, jax")
    refused(tmp_path, changed(device="tpu"), "device", "cuda:N")


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", ".hidden", "", "x" * 65, "white space", "a\\b"])
def test_study_name_cannot_be_a_path(tmp_path: Path, name: str) -> None:
    refused(tmp_path, changed(name=name), "name")


def test_error_stays_one_line_for_a_key_with_a_newline(tmp_path: Path) -> None:
    refused(
        tmp_path,
        '{"name": "job", "backend": "pytorch", "workload": "builtin:mlp", "global_batch": 64, "a\\nb": 1}\n',
        None,
    )


# ---------------------------------------------------------------- refused: the file itself


def test_broken_yaml(tmp_path: Path) -> None:
    error = refused(tmp_path, "name: job\nbackend: [pytorch\nworkload: builtin:mlp\n", None, "not valid YAML", "line ")
    assert error.key is None


def test_yaml_python_tags_are_refused_and_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    text = (
        "name: job\nbackend: pytorch\nworkload: builtin:mlp\nglobal_batch: 64\n"
        f'workload_args: !!python/object/apply:os.system ["touch {marker}"]\n'
    )
    refused(tmp_path, text, None, "not valid YAML")
    assert not marker.exists()
    text = f'!!python/object/apply:os.system ["touch {marker}"]\n'
    refused(tmp_path, text, None, "not valid YAML")
    assert not marker.exists()


def test_spec_that_is_not_a_mapping(tmp_path: Path) -> None:
    refused(tmp_path, "- name\n- job\n", None, "mapping")
    refused(tmp_path, "", None, "empty")


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.yaml"
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert str(caught.value) == f"{path}: no such file"


def test_unreadable_file(tmp_path: Path) -> None:
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    with pytest.raises(SpecError) as caught:
        load_spec(folder)
    assert str(caught.value).startswith(f"{folder}: cannot read the spec")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00name")
    with pytest.raises(SpecError) as caught:
        load_spec(binary)
    assert "\n" not in str(caught.value) and str(binary) in str(caught.value)


def test_the_shipped_example_specs_are_valid() -> None:
    specs = sorted((ROOT / "studies").glob("*.yaml"))
    for path in specs:
        job = load_spec(path)
        assert job.baseline and job.space


# ---------------------------------------------------------------- task: inference


def test_an_inference_spec_has_the_inference_knobs(tmp_path: Path) -> None:
    job = load_spec(write(tmp_path, changed(task="inference", baseline={"batch_size": 8})))
    assert job.spec.task == "inference" and job.backend.runner.endswith("inference_runner")
    assert {"quantization", "runtime", "threads"} <= set(job.space)
    assert job.baseline["runtime"] == "pytorch" and job.baseline["quantization"] == "none"
    assert job.complete({**job.baseline, "batch_size": 8})["accumulation"] == job.spec.global_batch // 8


@pytest.mark.parametrize(
    ("changes", "key", "fragment"),
    [
        ({"objective": {"max_latency_ms": 50}}, "objective.max_latency_ms", "which task: inference measures"),
        ({"task": "inference", "processes": 2}, "processes", "serves from one process"),
        ({"task": "inference", "run": {"steps": 100}}, "run", "task: inference has none"),
        ({"task": "serve"}, "task", "choose between 'train' or 'inference'"),
        ({"task": "inference", "baseline": {"optimizer": "fused"}}, "baseline.optimizer", "has no knob 'optimizer'"),
        ({"objective": {"optimize": "latency"}}, "objective.optimize", "latency is what task: inference measures"),
        (
            {"task": "inference", "objective": {"optimize": "latency"}, "space": {"batch_size": [8, 16]}},
            "space.batch_size",
            "serves each request of global_batch",
        ),
        (
            {"task": "inference", "objective": {"optimize": "latency"}, "baseline": {"batch_size": 8}},
            "baseline.batch_size",
            "batch_size is",
        ),
    ],
)
def test_keys_of_the_other_task_are_refused(tmp_path: Path, changes: dict[str, Any], key: str, fragment: str) -> None:
    refused(tmp_path, changed(**changes), key, fragment)


def test_optimizing_latency_serves_every_request_in_one_call(tmp_path: Path) -> None:
    job = spec(tmp_path, task="inference", objective={"optimize": "latency"})
    whole = job.spec.global_batch
    assert job.space["batch_size"] == (whole,) and job.baseline["batch_size"] == whole
    assert job.complete(job.baseline)["accumulation"] == 1
    assert job.identity() != spec(tmp_path, task="inference").identity()
    # its trials time a window by the calls it served, not by the loading between them
    assert job.trial_request(job.baseline, "cpu").time_calls
    assert not spec(tmp_path, task="inference").trial_request(job.baseline, "cpu").time_calls


def test_keys_added_later_at_their_defaults_keep_a_studys_identity(tmp_path: Path) -> None:
    # a study (and its export) made before `task` and `objective.max_latency_ms` existed keeps its identity
    before = spec(tmp_path).identity()
    assert spec(tmp_path, task="train").identity() == before
    assert spec(tmp_path, objective={"max_drift": 0.01, "max_latency_ms": None}).identity() == before
    assert spec(tmp_path, objective={"max_drift": 0.01, "optimize": "throughput"}).identity() == before
    assert spec(tmp_path, task="inference", baseline={"batch_size": 8}).identity() != before


# ---------------------------------------------------------------- ranks the machine can hold


def _environment(accelerator: bool, gpus: int = 0) -> Any:
    from autotuner.trials.probe import Environment

    return Environment(
        "pytorch",
        "cuda:0" if accelerator else "cpu",
        "test",
        "test",
        {},
        {"accelerator": accelerator},
        device_count=gpus,
    )


@pytest.mark.parametrize(
    ("device", "environment", "processes", "cpus", "fragment"),
    [
        (
            "cpu",
            None,
            512,
            2,
            "512 ranks on the CPU need a core each; this machine gives the search 2 (processes: 2 at most)",
        ),
        ("auto", False, 3, 2, "3 ranks on the CPU need a core each"),
        ("cuda:1", True, 4, 64, "4 ranks from cuda:1 need GPUs up to cuda:4; 2 are visible"),
    ],
)
def test_more_ranks_than_the_machine_holds_is_one_line_naming_processes(
    tmp_path: Path, device: str, environment: bool | None, processes: int, cpus: int, fragment: str
) -> None:
    job = spec(tmp_path, processes=processes, global_batch=processes * 8)
    probed = None if environment is None else _environment(environment, gpus=2)
    with pytest.raises(SpecError) as error:
        job.check_ranks(probed, device, job.source, set(range(cpus)))
    assert error.value.key == "processes" and fragment in str(error.value)


def test_as_many_ranks_as_cores_or_gpus_are_held(tmp_path: Path) -> None:
    job = spec(tmp_path, processes=2, global_batch=16)
    job.check_ranks(None, "cpu", job.source, {0, 1})
    job.check_ranks(_environment(True, gpus=2), "cuda:0", job.source, {0})


def test_every_task_a_spec_may_name_is_a_registered_task() -> None:
    from typing import get_args

    from autotuner.spec.keys import JobSpec
    from autotuner.spec.tasks import TASKS

    assert set(get_args(JobSpec.model_fields["task"].annotation)) == set(TASKS)
    assert [t.name for t in TASKS.values() if t.latency] == ["inference"]  # what the refusals name


# ---------------------------------------------------------------- nodes


@pytest.mark.parametrize(
    ("changes", "key", "fragment"),
    [
        ({"nodes": 2}, "rendezvous", "nodes: 2 needs rendezvous: host:port"),
        ({"nodes": 2, "rendezvous": "node0"}, "rendezvous", "'node0' is not host:port"),
        ({"nodes": 2, "rendezvous": "node0:99999"}, "rendezvous", "a port from 1 to 65535"),
        ({"rendezvous": "node0:29500"}, "rendezvous", "set nodes: 2 or more, or leave it out"),
        ({"nodes": 2, "rendezvous": "node0:29500", "backend": "jax"}, "nodes", "runs a trial on one machine"),
        ({"nodes": 2, "rendezvous": "node0:29500", "task": "inference"}, "nodes", "serves from one process"),
        (
            {"nodes": 3, "rendezvous": "node0:29500", "processes": 2},
            "processes",
            "not a multiple of nodes x processes (6)",
        ),
        ({"nodes": 0}, "nodes", "greater than 0"),
    ],
)
def test_nodes_that_cannot_run_are_one_line(tmp_path: Path, changes: dict[str, Any], key: str, fragment: str) -> None:
    refused(tmp_path, changed(**changes), key, fragment)


def test_a_job_across_nodes_splits_its_global_batch_over_every_rank(tmp_path: Path) -> None:
    job = spec(tmp_path, nodes=2, processes=2, rendezvous="node0:29500", global_batch=64)
    assert job.spec.world == 4 and job.rank_batch == 16 and job.parallel == "ddp"
    request = job.trial_request(job.reference_config(), "cpu")
    assert (request.nodes, request.processes, request.rendezvous, request.node_rank) == (2, 2, "node0:29500", 0)
    assert job.complete({**job.baseline, "batch_size": 8})["accumulation"] == 2
    one_node = spec(tmp_path, processes=2, global_batch=64)
    assert job.identity() != one_node.identity()  # two nodes measure another job
    moved = spec(tmp_path, nodes=2, processes=2, rendezvous="elsewhere:1234", global_batch=64)
    assert moved.identity() == job.identity()  # where they meet is not what they measure


def test_a_job_on_one_node_keeps_the_identity_it_had_before_nodes_existed(tmp_path: Path) -> None:
    assert spec(tmp_path, nodes=1).identity() == spec(tmp_path).identity()
