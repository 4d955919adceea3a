"""Exports of a config tuned as several ranks (DDP, FSDP2): the processes and the knobs of the
strategy, built into the real `TrainingArguments` (and the Accelerate objects the Trainer wraps
the model with), Lightning `DDPStrategy` and `FSDPStrategy`, Accelerate
`DistributedDataParallelKwargs` and `FullyShardedDataParallelPlugin`, each value checked against
what `TunedTraining` applies; the `torchrun` format; `autotuner export --format torchrun` on a
study. The formats of one-process configs are tests/backends/integrations/test_integrations.py's; the
torchrun script run across two ranks is tests/e2e/test_torchrun_export.py's."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest
import torch
from optuna.distributions import CategoricalDistribution
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from autotuner.backends.pytorch.apply import DTYPES, POWERSGD_START
from autotuner.backends.pytorch.integrations import (
    ALLOCATOR_LINE,
    FORMATS,
    TRAINERS,
    accumulation_per_process,
    parallel_knobs,
    require,
    snippet,
)
from autotuner.backends.pytorch.integrations import accelerate as accelerate_export
from autotuner.backends.pytorch.integrations import lightning as lightning_export
from autotuner.backends.pytorch.integrations import torchrun as torchrun_export
from autotuner.backends.pytorch.integrations import transformers as transformers_export
from autotuner.cli import main
from autotuner.errors import SpecError
from autotuner.export.reader import TunedConfig, parse_config
from autotuner.results.store import Yardstick, record
from autotuner.spec.job import parse_spec
from autotuner.study.storage import open_storage, open_study
from autotuner.trials.launcher import TrialResult
from autotuner.trials.outcomes import Outcome
from autotuner.trials.probe import Environment
from tests.backends.integrations.test_integrations import tiny_gpt2
from tests.backends.integrations.test_integrations import tuned as one_process
from tests.support.helpers import HELD, measured, reference


def tuned(parallel: str, device: str = "cuda:0", processes: int = 2, **params: Any) -> TunedConfig:
    """An exported config of a job of `processes` ranks training together as `parallel`, as
    `autotuner export` writes it: the global batch counts the ranks, the accumulation is each rank's."""
    knobs = {"precision": "bf16", "batch_size": 16, "accumulation": 4, "workers": 2, "compile": "none", **params}
    data = {
        "version": 1,
        "params": knobs,
        "metrics": {"throughput": 1000.0},
        "baseline": {"params": None, "throughput": 250.0},
        "speedup": 4.0,
        "environment": {"backend": "pytorch", "fingerprint": "f" * 16, "device": device},
        "spec": {
            "identity": "i" * 16,
            "global_batch": knobs["batch_size"] * knobs["accumulation"] * processes,
            "processes": processes,
            "parallel": parallel,
        },
        "study": {"name": "ranks", "trial": 3},
    }
    return parse_config(data, "runs/ranks/best.yaml")


DDP_CONFIGS = [
    tuned("ddp"),  # every DDP knob at its reference value: written all the same
    tuned("ddp", bucket_cap_mb=100, bucket_view=True, static_graph=True, comm_hook="fp16"),
    tuned("ddp", precision="fp32", bucket_cap_mb=4, comm_hook="powersgd"),
    tuned("ddp", comm_hook="bf16", device="cpu", accumulation=2),
]
DDP_IDS = ["reference", "fp16-hook-views-static", "powersgd", "bf16-hook-cpu"]
FSDP_CONFIGS = [
    tuned("fsdp"),
    tuned("fsdp", reshard_after_forward=False, param_dtype="bf16", reduce_dtype="bf16", offload="cpu"),
    tuned("fsdp", precision="fp32", reduce_dtype="bf16"),
    tuned("fsdp", precision="fp32"),
    tuned("fsdp", reshard_after_forward=False, fsdp_mesh="hybrid"),
    tuned("fsdp", fsdp_mesh="hybrid_across"),
]
FSDP_IDS = ["reference", "kept-bf16-offload", "fp32-bf16-reduce", "fp32", "hybrid-kept", "hybrid-across"]
HOOKS = {
    "fp16": default_hooks.fp16_compress_hook,
    "bf16": default_hooks.bf16_compress_hook,
    "powersgd": powerSGD_hook.powerSGD_hook,
}
"""`comm_hook` -> the hook `autotuner.backends.pytorch.apply.distributed_data_parallel` registers."""


def quiet(function: Any, *args: Any) -> Any:
    """`function(*args)` without the warnings of what needs a line of code (checked below)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return function(*args)


class HookSpy:
    """A stand-in for a DistributedDataParallel that records the communication hook registered on it."""

    def __init__(self) -> None:
        self.registered: list[tuple[Any, Any]] = []

    def register_comm_hook(self, state: Any, hook: Any) -> None:
        self.registered.append((state, hook))


def check_hook(config: TunedConfig, hook: Any, state: Any) -> None:
    """The hook and its state are those `TunedTraining` registers for the config's `comm_hook`."""
    choice = config.params["comm_hook"]
    assert hook is HOOKS.get(choice)
    if choice == "powersgd":  # rank 1, error feedback and warm start, from POWERSGD_START on
        assert (state.matrix_approximation_rank, state.start_powerSGD_iter) == (1, POWERSGD_START)
        assert state.use_error_feedback and state.warm_start and state.process_group is None
    else:
        assert state is None


def check_policy(config: TunedConfig, param_dtype: Any, reduce_dtype: Any) -> None:
    """FSDP's parameter and reduction dtypes are the config's (None: fp32, the parameters' own)."""
    assert (param_dtype, reduce_dtype) == (DTYPES[config.params["param_dtype"]], DTYPES[config.params["reduce_dtype"]])


def test_a_configs_processes_set_the_accumulation_it_is_launched_with() -> None:
    config = tuned("ddp", accumulation=4)  # global batch 16 x 4 x 2 = 128
    assert accumulation_per_process(config) == 4  # on the 2 processes it was tuned as: its own
    assert accumulation_per_process(config, 1) == 8 and accumulation_per_process(config, 8) == 1
    with pytest.raises(SpecError, match=r"global batch 128 \(16 x 4 x 2\) cannot be kept over 3 processes"):
        accumulation_per_process(config, 3)
    assert accumulation_per_process(one_process(accumulation=4)) == 4  # one process: as before


# ------------------------------------------------------------------ Hugging Face Trainer


@pytest.mark.parametrize("config", DDP_CONFIGS, ids=DDP_IDS)
def test_the_trainer_takes_every_ddp_knob(config: TunedConfig, tmp_path: Path) -> None:
    from accelerate.utils import DDPCommunicationHookType
    from transformers import Trainer, TrainingArguments

    params = config.params
    arguments = quiet(transformers_export.training_arguments, config)
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], **{**arguments, "use_cpu": True})  # this CPU
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (16, params["accumulation"])
    assert (args.ddp_bucket_cap_mb, args.ddp_static_graph) == (params["bucket_cap_mb"], params["static_graph"])
    assert args.ddp_find_unused_parameters is False  # the study's DistributedDataParallel does not look
    assert not args.fsdp
    trainer = Trainer(model=tiny_gpt2(), args=args)
    code = transformers_export.trainer_code(config)
    exec("\n".join(code), {"trainer": trainer})
    handler = trainer.accelerator.ddp_handler  # what prepare() wraps the model with
    assert handler.find_unused_parameters is False
    assert (handler.bucket_cap_mb, handler.gradient_as_bucket_view, handler.static_graph) == (
        params["bucket_cap_mb"],
        params["bucket_view"],
        params["static_graph"],
    )
    expected = {"fp16": "FP16", "bf16": "BF16", "powersgd": "POWER_SGD", "none": "NO"}[params["comm_hook"]]
    assert handler.comm_hook is DDPCommunicationHookType[expected]
    spy = HookSpy()
    handler.register_comm_hook(spy)
    if params["comm_hook"] == "none":
        assert spy.registered == []
    else:
        ((state, hook),) = spy.registered
        check_hook(config, hook, state)
    assert bool(code) == (params["bucket_view"] or params["comm_hook"] != "none")
    if code:
        with pytest.warns(UserWarning, match="no place for part of this config; run: .*trainer.accelerator"):
            transformers_export.training_arguments(config)


@pytest.mark.parametrize("config", FSDP_CONFIGS, ids=FSDP_IDS)
def test_the_trainer_takes_every_fsdp2_knob(config: TunedConfig, tmp_path: Path) -> None:
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy
    from transformers import TrainingArguments

    params = config.params
    arguments = quiet(transformers_export.training_arguments, config)
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], **{**arguments, "use_cpu": True})  # this CPU
    assert args.gradient_accumulation_steps == params["accumulation"] and args.ddp_bucket_cap_mb is None
    # The plugin the Trainer builds from its arguments (a Trainer with FSDP needs the process group
    # of a distributed run: the plugin is built here as Trainer.__init__ builds it), with the
    # precision the Accelerator gives it.
    plugin = FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)
    if args.mixed_precision != "no":
        plugin.set_mixed_precision(args.mixed_precision)
    assert (plugin.fsdp_version, plugin.reshard_after_forward) == (2, params["reshard_after_forward"])
    assert isinstance(plugin.cpu_offload, CPUOffloadPolicy) == (params["offload"] == "cpu")
    code = transformers_export.trainer_code(config)
    stand_in = SimpleNamespace(accelerator=SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin)))
    exec("\n".join(code), {"trainer": stand_in, "torch": torch})
    policy = plugin.mixed_precision_policy or MixedPrecisionPolicy()  # what fully_shard gets (accelerate)
    check_policy(config, policy.param_dtype, policy.reduce_dtype)
    assert policy.output_dtype is None  # as the study's policy: no cast of the outputs
    # fp32 parameters and reductions without mixed precision: the Trainer's own (no policy) is the study's
    dtypes = (params["param_dtype"], params["reduce_dtype"])
    assert bool(code) == (params["precision"] in ("bf16", "fp16") or dtypes != ("fp32", "fp32"))


def test_the_trainer_arguments_of_one_process_carry_no_strategy() -> None:
    arguments = quiet(transformers_export.training_arguments, one_process())
    assert not {key for key in arguments if key.startswith(("ddp_", "fsdp"))}
    assert transformers_export.trainer_code(one_process()) == []


# ------------------------------------------------------------------ Lightning


@pytest.mark.parametrize("config", DDP_CONFIGS, ids=DDP_IDS)
def test_lightning_takes_every_ddp_knob(config: TunedConfig) -> None:
    from lightning import Trainer
    from lightning.pytorch.strategies import DDPStrategy

    params = config.params
    arguments = quiet(lightning_export.trainer_arguments, config)
    strategy = arguments["strategy"]
    assert isinstance(strategy, DDPStrategy)
    assert strategy._ddp_kwargs == {  # DistributedDataParallel's own arguments
        "bucket_cap_mb": params["bucket_cap_mb"],
        "gradient_as_bucket_view": params["bucket_view"],
        "static_graph": params["static_graph"],
    }
    check_hook(config, strategy._ddp_comm_hook, strategy._ddp_comm_state)
    assert strategy._ddp_comm_wrapper is None
    trainer = Trainer(
        accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False, **arguments
    )
    assert trainer.strategy is strategy and trainer.num_devices == 2
    assert trainer.accumulate_grad_batches == params["accumulation"]


@pytest.mark.parametrize("config", FSDP_CONFIGS, ids=FSDP_IDS)
def test_lightning_takes_every_fsdp2_knob_as_fsdp1(config: TunedConfig) -> None:
    from lightning.pytorch.strategies import FSDPStrategy
    from torch.distributed.fsdp import CPUOffload, ShardingStrategy

    params = config.params
    with pytest.warns(UserWarning, match="FSDPStrategy is FSDP1"):
        arguments = lightning_export.trainer_arguments(config)
    strategy = arguments.pop("strategy")
    assert arguments == {
        "precision": {"bf16": "bf16-mixed", "fp32": "32-true"}[params["precision"]],
        "accumulate_grad_batches": params["accumulation"],
        "devices": 2,
    }
    assert isinstance(strategy, FSDPStrategy)
    # reshard_after_forward=False keeps the gathered parameters to the backward: SHARD_GRAD_OP, or
    # within each node (fsdp_mesh: hybrid) _HYBRID_SHARD_ZERO2 (tests/backends/test_hsdp.py)
    hybrid = params["fsdp_mesh"] == "hybrid"
    expected = {
        (True, False): ShardingStrategy.FULL_SHARD,
        (False, False): ShardingStrategy.SHARD_GRAD_OP,
        (True, True): ShardingStrategy.HYBRID_SHARD,
        (False, True): ShardingStrategy._HYBRID_SHARD_ZERO2,
    }[params["reshard_after_forward"], hybrid]
    assert strategy.sharding_strategy is expected
    assert ("device_mesh" in strategy.kwargs) is hybrid
    assert strategy.cpu_offload == CPUOffload(offload_params=params["offload"] == "cpu")
    policy = strategy.mixed_precision_config  # what Lightning wraps with: ours, not one of its precision
    check_policy(config, policy.param_dtype, policy.reduce_dtype)
    assert policy.buffer_dtype is None


# ------------------------------------------------------------------ Accelerate


@pytest.fixture
def fresh_accelerate() -> Any:
    from accelerate.state import AcceleratorState

    yield
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.mark.usefixtures("fresh_accelerate")
@pytest.mark.parametrize("config", DDP_CONFIGS, ids=DDP_IDS)
def test_accelerate_takes_every_ddp_knob(config: TunedConfig) -> None:
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    params = config.params
    arguments = quiet(accelerate_export.accelerator_arguments, config)
    (handler,) = arguments["kwargs_handlers"]
    assert isinstance(handler, DistributedDataParallelKwargs)
    assert (handler.bucket_cap_mb, handler.gradient_as_bucket_view, handler.static_graph) == (
        params["bucket_cap_mb"],
        params["bucket_view"],
        params["static_graph"],
    )
    assert handler.find_unused_parameters is False and handler.comm_wrapper.value == "no"
    spy = HookSpy()
    handler.register_comm_hook(spy)
    if params["comm_hook"] == "none":
        assert spy.registered == []
    else:
        ((state, hook),) = spy.registered
        check_hook(config, hook, state)
    accelerator = Accelerator(cpu=True, **arguments)
    assert accelerator.ddp_handler is handler and accelerator.gradient_accumulation_steps == params["accumulation"]


@pytest.mark.parametrize("config", FSDP_CONFIGS, ids=FSDP_IDS)
def test_accelerate_takes_every_fsdp2_knob(config: TunedConfig) -> None:
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    params = config.params
    arguments = quiet(accelerate_export.accelerator_arguments, config)
    assert arguments["gradient_accumulation_steps"] == params["accumulation"]
    plugin = arguments["fsdp_plugin"]
    assert isinstance(plugin, FullyShardedDataParallelPlugin)
    assert (plugin.fsdp_version, plugin.reshard_after_forward) == (2, params["reshard_after_forward"])
    assert isinstance(plugin.cpu_offload, CPUOffloadPolicy) == (params["offload"] == "cpu")
    # The Accelerator hands its mixed precision to the plugin (AcceleratorState): an explicit policy stays.
    plugin.set_mixed_precision(arguments["mixed_precision"] if arguments["mixed_precision"] != "no" else "fp32")
    policy = plugin.mixed_precision_policy
    assert isinstance(policy, MixedPrecisionPolicy)
    check_policy(config, policy.param_dtype, policy.reduce_dtype)
    assert policy.output_dtype is None


# ------------------------------------------------------------------ the printed code builds the same objects


def built(code: str) -> dict[str, Any]:
    """The dicts a snippet assigns, evaluated with its imports: the real objects its code builds."""
    tree = ast.parse(code)
    kept = [
        node
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        or (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Dict))
    ]
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body=kept, type_ignores=[]), "snippet", "exec"), namespace)
    assigned = [node.targets[0] for node in kept if isinstance(node, ast.Assign)]
    names = [target.id for target in assigned if isinstance(target, ast.Name)]
    return {name: namespace[name] for name in names}


def same(one: Any, other: Any) -> bool:
    """Whether two strategy objects hold the same settings (what the checks above read)."""
    if type(one) is not type(other):
        return False
    if isinstance(one, list):
        return len(one) == len(other) and all(same(a, b) for a, b in zip(one, other, strict=True))
    name = type(one).__name__
    if name == "DDPStrategy":
        state = [
            (s.matrix_approximation_rank, s.start_powerSGD_iter) if s else None
            for s in (one._ddp_comm_state, other._ddp_comm_state)
        ]
        return bool(
            one._ddp_kwargs == other._ddp_kwargs and one._ddp_comm_hook is other._ddp_comm_hook and state[0] == state[1]
        )
    if name == "FSDPStrategy":
        return bool(
            (one.sharding_strategy, one.cpu_offload, one.mixed_precision, one.kwargs.get("device_mesh"))
            == (other.sharding_strategy, other.cpu_offload, other.mixed_precision, other.kwargs.get("device_mesh"))
        )
    if name == "FullyShardedDataParallelPlugin":
        fields = ("fsdp_version", "reshard_after_forward", "mixed_precision_policy", "cpu_offload")
        return all(getattr(one, f) == getattr(other, f) for f in fields)
    return bool(one == other)


@pytest.mark.parametrize(
    "config", DDP_CONFIGS + FSDP_CONFIGS, ids=[f"ddp-{i}" for i in DDP_IDS] + [f"fsdp-{i}" for i in FSDP_IDS]
)
def test_each_snippet_builds_the_objects_its_functions_return(config: TunedConfig) -> None:
    code = {fmt: snippet(fmt, config) for fmt in TRAINERS}
    for fmt, text in code.items():
        compile(text, f"best.{fmt}.py", "exec")
        assert f"--format {fmt}" in text.splitlines()[0]
        assert "x 2 processes" in text.splitlines()[1]
    lightning = built(code["lightning"])["trainer_arguments"]
    expected = quiet(lightning_export.trainer_arguments, config)
    assert lightning.keys() == expected.keys() and same(lightning.pop("strategy"), expected.pop("strategy"))
    assert lightning == expected
    accelerate = built(code["accelerate"])["accelerator_arguments"]
    expected = quiet(accelerate_export.accelerator_arguments, config)
    assert accelerate.keys() == expected.keys()
    assert all(same(accelerate[key], expected[key]) for key in expected)
    assert built(code["hf-trainer"])["tuned"] == quiet(transformers_export.training_arguments, config)
    assert all(line in code["hf-trainer"].splitlines() for line in transformers_export.trainer_code(config))
    launch = {
        "hf-trainer": "torchrun --standalone --nproc-per-node 2 your_training.py",
        "torchrun": "torchrun --standalone --nproc-per-node 2 your_training.py",
        "accelerate": "accelerate launch --num_processes 2 your_training.py",
        "lightning": "python your_training.py, the Trainer starting its 2 processes",
    }
    for fmt, line in launch.items():
        assert code[fmt].splitlines()[2].startswith(f"# launch: {line}"), fmt


# ------------------------------------------------------------------ torchrun


def test_torchrun_needs_no_other_library() -> None:
    require("torchrun")  # torch is autotuner's own dependency
    assert FORMATS["torchrun"].library == "torch"


@pytest.mark.parametrize(
    ("config", "backend", "device"),
    [
        (DDP_CONFIGS[1], 'dist.init_process_group("nccl")', 'device=f"cuda:{local_rank}"'),
        (FSDP_CONFIGS[1], 'dist.init_process_group("nccl")', 'device=f"cuda:{local_rank}"'),
        (DDP_CONFIGS[3], 'dist.init_process_group("gloo")', 'device="cpu"'),
    ],
    ids=["ddp-cuda", "fsdp-cuda", "ddp-cpu"],
)
def test_the_torchrun_snippet_launches_the_ranks_and_trains_through_tuned_training(
    config: TunedConfig, backend: str, device: str
) -> None:
    text = torchrun_export.snippet(config)
    compile(text, "best.torchrun.py", "exec")
    lines = text.splitlines()
    assert lines[2].startswith("# launch: torchrun --standalone --nproc-per-node 2 your_training.py;")
    assert lines[3] == ALLOCATOR_LINE  # the allocator the study measured with
    assert f"{config.parallel}: it" in lines[4]
    for name, value in parallel_knobs(config).items():
        assert f"{name}={value}" in lines[4]  # the knobs TunedTraining applies, said
    assert backend in text and f"TunedTraining(config, model, optimizer, dataset, {device})" in text
    assert "config = load_config('runs/ranks/best.yaml')" in text  # the file the config came from
    assert "tuned.loader.sampler.set_epoch(epoch)" in text and text.endswith("dist.destroy_process_group()\n")
    assert lines[-2].startswith("tuned.finish()")  # the ranks' end, before the group's (see finish)
    assert "load_config('elsewhere.yaml')" in torchrun_export.snippet(config, "elsewhere.yaml")


def test_the_torchrun_snippet_of_one_process_is_the_plain_loop() -> None:
    config = one_process(precision="bf16", compile="default")
    text = snippet("torchrun", config)
    compile(text, "best.torchrun.py", "exec")
    assert "# launch: python your_training.py (one process)" in text
    assert "dist." not in text and "tuned = TunedTraining(config, model, optimizer, dataset)" in text
    assert "config = load_config('best.yaml')" in text  # tuned() reads it from best.yaml


# ------------------------------------------------------------------ the command line, on a study


ENVIRONMENT = Environment(
    backend="pytorch",
    device="cpu",
    device_name="test CPU",
    driver="test",
    versions={"python": "3.11", "torch": "2.x"},
    capabilities={"bf16": True, "ddp": True},
)


def _ranks_study(url: str) -> optuna.Study:
    """A study of a job of two DDP ranks in `url` with two trials recorded (its baseline, then a
    faster config with DDP knobs off their reference values), as workers record them."""
    job = parse_spec(
        {
            "name": "ranks",
            "backend": "pytorch",
            "workload": "builtin:mlp",
            "processes": 2,
            "parallel": "ddp",
            "global_batch": 64,
            "baseline": {"precision": "fp32", "batch_size": 16, "workers": 0, "compile": "none"},
            "space": {
                **HELD,
                "precision": ["fp32", "bf16"],
                "batch_size": [8, 16],
                "workers": [0],
                "compile": ["none"],
                "bucket_cap_mb": [25, 100],
                "bucket_view": [False, True],
                "comm_hook": ["none", "fp16"],
                "static_graph": [False],
            },
        },
        "ranks.yaml",
    )
    study = open_study(open_storage(url), job, ENVIRONMENT)
    ref = reference(2.0, [2.5, 2.2], {"precision": "fp32"})
    study.set_user_attr("reference", ref.as_dict())
    space = {k: CategoricalDistribution(v) for k, v in job.space.items()}
    trials = [
        ({"precision": "fp32", "batch_size": 16}, 1000.0),
        (
            {"precision": "bf16", "batch_size": 8, "bucket_cap_mb": 100, "bucket_view": True, "comm_hook": "fp16"},
            3000.0,
        ),
    ]
    for number, (params, rate) in enumerate(trials):
        study.enqueue_trial({"workers": 0, "compile": "none", **params})
        trial = study.ask(space)
        result = TrialResult(Outcome.OK, output=measured(rate, 2.0, [2.5, 2.0]))
        role = "baseline" if number == 0 else "search"
        record(study, trial, job.complete(trial.params), result, role=role, against=Yardstick(job, ref, ENVIRONMENT))
    return study


def test_export_format_torchrun_writes_the_launch_line_and_the_tuned_training_call(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path}/ranks.db"
    _ranks_study(url)
    assert main(["export", "--study", "ranks", "--storage", url, "--format", "torchrun"]) == 0
    *printed, path = capsys.readouterr().out.splitlines()
    assert path == "runs/ranks/best.torchrun.py"
    written = (tmp_path / path).read_text()
    assert written == "\n".join(printed) + "\n"  # what it printed is what it wrote
    compile(written, path, "exec")
    lines = written.splitlines()
    assert "comm_hook=fp16" in lines[0] and "bucket_cap_mb=100" in lines[0]  # the winner
    assert lines[1].startswith("# Global batch 64 = 8 per micro-batch x 4 accumulation x 2 processes (parallel: ddp)")
    assert lines[2].startswith("# launch: torchrun --standalone --nproc-per-node 2 your_training.py;")
    assert lines[3] == ALLOCATOR_LINE
    assert "parallel=ddp: it wraps the model in DistributedDataParallel" in lines[4]
    assert "(bucket_cap_mb=100, bucket_view=True, static_graph=False, comm_hook=fp16)" in lines[4]
    assert "config = load_config('runs/ranks/best.yaml')" in written  # where autotuner search writes it
    assert 'dist.init_process_group("gloo")' in written  # tuned on a CPU
    # The export itself carries the ranks: what the script loads.
    assert main(["export", "--study", "ranks", "--storage", url]) == 0
    from autotuner.apply import load_config

    exported = load_config(tmp_path / "runs" / "ranks" / "best.yaml")
    assert (exported.processes, exported.parallel) == (2, "ddp")
    assert exported.params["comm_hook"] == "fp16" and exported.params["accumulation"] == 4
