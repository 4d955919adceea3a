"""The sampler: fresh configs only, OOM rules, and learning from infeasible trials.

Everything here runs real Optuna studies (in memory) with the real samplers; no trial processes:
the "measurements" come from a synthetic problem, recorded the way `autotuner.results.store.record`
records trials (COMPLETE, objective values, the `constraints` system attr, the `outcome` user attr).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from autotuner.backends import Capabilities
from autotuner.backends.pytorch import TorchCapabilities
from autotuner.config.knobs import BATCH_SIZE, PRECISION, Knob, config_key, knob_table
from autotuner.proposals.guided_start import rule_of_thumb
from autotuner.proposals.sampler import ATTEMPTS, FreshConfigSampler, make_base_sampler, make_sampler
from autotuner.results.store import record_pruned
from autotuner.results.tried import oom_rules_out
from autotuner.study.optuna_adapter import study_storage, trial_id
from autotuner.trials.probe import Environment

CPU_MACHINE = Environment("pytorch", "cpu", "test CPU", "test", {"python": "3.11"}, {"accelerator": False})

optuna.logging.set_verbosity(optuna.logging.ERROR)


def all_configs(space: dict[str, list[Any]]) -> list[dict[str, Any]]:
    return [dict(zip(space, values, strict=True)) for values in itertools.product(*space.values())]


def make_study(
    space: dict[str, list[Any]], base: str = "tpe", seed: int = 0
) -> tuple[optuna.Study, FreshConfigSampler]:
    configs = all_configs(space)
    sampler = FreshConfigSampler(make_base_sampler(base, seed), space, lambda: configs, seed)
    study = optuna.create_study(
        directions=["maximize", "minimize"], sampler=sampler, storage=optuna.storages.InMemoryStorage()
    )
    return study, sampler


def record(
    study: optuna.Study, trial: optuna.Trial, values: list[float], constraints: list[float], outcome: str = "ok"
) -> None:
    """What `autotuner.results.store.record` stores, as far as a sampler can see it."""
    trial.set_user_attr("outcome", outcome)
    trial.storage.set_trial_system_attr(trial_id(trial), "constraints", constraints)
    study.tell(trial, values)


def oom_trial(
    params: dict[str, Any], space: dict[str, list[Any]], outcome: str = "oom", state: TrialState = TrialState.COMPLETE
):
    return create_trial(
        state=state,
        params=params,
        distributions={k: CategoricalDistribution(space[k]) for k in params},
        values=[0.0, math.inf] if state is TrialState.COMPLETE else None,
        user_attrs={"outcome": outcome},
    )


SMALL = {"precision": ["fp32", "bf16", "fp16"], "batch_size": [8, 16, 32, 64]}


# ---------------------------------------------------------------- fresh configs only


@pytest.mark.parametrize("base", ["tpe", "random", "nsga2"])
def test_never_proposes_a_config_already_in_the_study_until_the_space_is_used_up(base: str) -> None:
    study, sampler = make_study(SMALL, base, seed=3)
    seen = set()
    for number in range(len(all_configs(SMALL))):
        trial = study.ask(sampler.space)
        key = config_key(trial.params)
        assert key not in seen, f"trial {number} repeats {trial.params}"
        seen.add(key)
        fast = {"fp32": 1.0, "bf16": 2.0, "fp16": 2.1}[trial.params["precision"]] * trial.params["batch_size"]
        record(study, trial, [fast, 0.0], [0.0, 0.0, 0.0])
    assert len(seen) == 12
    assert sampler.fresh_configs(study) == []


def test_a_running_trial_of_another_worker_is_not_proposed_again() -> None:
    study, sampler = make_study(SMALL, seed=1)
    study.enqueue_trial({"precision": "bf16", "batch_size": 16})
    running = study.ask(sampler.space)  # left RUNNING, as in another worker
    assert running.params == {"precision": "bf16", "batch_size": 16}
    assert {"precision": "bf16", "batch_size": 16} not in sampler.fresh_configs(study)
    assert len(sampler.fresh_configs(study)) == 11
    for _ in range(11):
        trial = study.ask(sampler.space)
        assert trial.params != running.params
        record(study, trial, [1.0, 0.0], [0.0, 0.0, 0.0])
    assert sampler.fresh_configs(study) == []


def test_failed_trials_do_not_block_their_config() -> None:
    """An interrupted (FAIL) trial is retried: its config stays fresh."""
    study, sampler = make_study(SMALL)
    trial = study.ask(sampler.space)
    study.tell(trial, state=TrialState.FAIL)
    assert trial.params in sampler.fresh_configs(study)
    assert len(sampler.fresh_configs(study)) == 12


def test_enqueued_params_are_used_as_they_are() -> None:
    study, sampler = make_study(SMALL, seed=0)
    record(study, study.ask(sampler.space), [1.0, 0.0], [0.0, 0.0, 0.0])
    done = study.trials[0].params
    study.enqueue_trial(done)  # a retry of a config the study already has
    trial = study.ask(sampler.space)
    assert trial.params == done
    # the caller sees it is not fresh (search.py then records it as FAIL without running it)
    assert not sampler.is_fresh(trial.params, study.get_trials(deepcopy=False), exclude=trial.number)
    assert sampler.is_fresh(
        trial.params, [t for t in study.get_trials(deepcopy=False) if t.number == trial.number], exclude=trial.number
    )


# ---------------------------------------------------------------- OOM rules


def test_oom_rules_out_larger_batches_with_the_other_knobs_equal() -> None:
    oom = oom_trial({"precision": "fp32", "batch_size": 16}, SMALL)
    assert oom_rules_out({"precision": "fp32", "batch_size": 32}, [oom]) is oom
    assert oom_rules_out({"precision": "fp32", "batch_size": 64}, [oom]) is oom
    assert oom_rules_out({"precision": "fp32", "batch_size": 16}, [oom]) is oom


def test_oom_does_not_rule_out_smaller_batches() -> None:
    oom = oom_trial({"precision": "fp32", "batch_size": 16}, SMALL)
    assert oom_rules_out({"precision": "fp32", "batch_size": 8}, [oom]) is None


def test_oom_does_not_rule_out_other_knobs() -> None:
    oom = oom_trial({"precision": "fp32", "batch_size": 16}, SMALL)
    assert oom_rules_out({"precision": "bf16", "batch_size": 64}, [oom]) is None
    space = {**SMALL, "workers": [0, 1]}
    oom = oom_trial({"precision": "fp32", "batch_size": 16, "workers": 0}, space)
    assert oom_rules_out({"precision": "fp32", "batch_size": 32, "workers": 1}, [oom]) is None
    assert oom_rules_out({"precision": "fp32", "batch_size": 32, "workers": 0}, [oom]) is oom


CHECKPOINTING = Knob(
    "checkpointing", "activation checkpointing", ("none", "blocks"), "none", memory_order=("blocks", "none")
)
MEMORY_KNOBS = knob_table(PRECISION, BATCH_SIZE, CHECKPOINTING)
MEMORY_SPACE = {"precision": ["fp32"], "batch_size": [128, 256, 512, 1024], "checkpointing": ["none", "blocks"]}


def test_oom_rules_out_the_configs_that_need_at_least_as_much_memory_knob_by_knob() -> None:
    def rules_out(oom: optuna.trial.FrozenTrial, batch: int, checkpointing: str) -> bool:
        params = {"precision": "fp32", "batch_size": batch, "checkpointing": checkpointing}
        return oom_rules_out(params, [oom], MEMORY_KNOBS) is oom

    oom = oom_trial({"precision": "fp32", "batch_size": 512, "checkpointing": "none"}, MEMORY_SPACE)
    assert rules_out(oom, 512, "none") and rules_out(oom, 1024, "none")
    assert not rules_out(oom, 256, "none")
    assert not rules_out(oom, 512, "blocks") and not rules_out(oom, 1024, "blocks")  # checkpointing may fit it

    oom = oom_trial({"precision": "fp32", "batch_size": 256, "checkpointing": "blocks"}, MEMORY_SPACE)
    assert all(rules_out(oom, b, c) for b in (256, 512, 1024) for c in ("none", "blocks"))
    assert not rules_out(oom, 128, "blocks") and not rules_out(oom, 128, "none")

    # without the backend's table, a knob with no order must be equal, as it always had to
    assert oom_rules_out({"precision": "fp32", "batch_size": 512, "checkpointing": "none"}, [oom]) is None


def test_a_batch_that_fits_only_with_checkpointing_is_found() -> None:
    # Memory need: the micro-batch, halved by checkpointing; 512 fits. The fastest config is the
    # largest batch that fits, which needs checkpointing.
    configs = all_configs(MEMORY_SPACE)
    sampler = make_sampler("tpe", 0, MEMORY_SPACE, lambda: configs, knobs=MEMORY_KNOBS)
    study = optuna.create_study(
        directions=["maximize", "minimize"], sampler=sampler, storage=optuna.storages.InMemoryStorage()
    )
    study.enqueue_trial({"precision": "fp32", "batch_size": 128, "checkpointing": "none"})
    ran = []
    while sampler.fresh_configs(study):
        trial = study.ask(sampler.space)
        params = trial.params
        assert oom_rules_out(params, study.get_trials(deepcopy=False), MEMORY_KNOBS) is None, params
        ran.append((params["batch_size"], params["checkpointing"]))
        need = params["batch_size"] // (2 if params["checkpointing"] == "blocks" else 1)
        if need > 512:
            record(study, trial, [0.0, math.inf], [0.0, 1.0, 0.0], outcome="oom")
        else:
            rate = params["batch_size"] * (0.9 if params["checkpointing"] == "blocks" else 1.0)
            record(study, trial, [rate, 0.0], [0.0, 0.0, 0.0])
    assert (1024, "blocks") in ran
    best = max((t for t in study.trials if t.values[1] == 0.0), key=lambda t: t.values[0])
    assert best.params == {"precision": "fp32", "batch_size": 1024, "checkpointing": "blocks"}


def test_only_completed_oom_trials_rule_out() -> None:
    params = {"precision": "fp32", "batch_size": 16}
    bigger = {"precision": "fp32", "batch_size": 64}
    assert oom_rules_out(bigger, [oom_trial(params, SMALL, outcome="crash")]) is None
    assert oom_rules_out(bigger, [oom_trial(params, SMALL, outcome="ok")]) is None
    assert oom_rules_out(bigger, [oom_trial(params, SMALL, state=TrialState.FAIL)]) is None
    assert oom_rules_out(bigger, []) is None


def test_the_sampler_never_proposes_a_config_an_oom_ruled_out() -> None:
    study, sampler = make_study(SMALL, seed=5)
    study.enqueue_trial({"precision": "bf16", "batch_size": 16})
    trial = study.ask(sampler.space)
    record(study, trial, [0.0, math.inf], [0.0, 1.0, 0.0], outcome="oom")
    ruled_out = [{"precision": "bf16", "batch_size": b} for b in (16, 32, 64)]
    fresh = sampler.fresh_configs(study)
    assert len(fresh) == 12 - 3
    assert all(c not in fresh for c in ruled_out)
    for _ in range(9):
        trial = study.ask(sampler.space)
        assert trial.params not in ruled_out, trial.params
        record(study, trial, [float(trial.params["batch_size"]), 0.0], [0.0, 0.0, 0.0])
    assert sampler.fresh_configs(study) == []


def test_make_base_sampler() -> None:
    assert isinstance(make_base_sampler("tpe", 0), optuna.samplers.TPESampler)
    assert isinstance(make_base_sampler("random", 0), optuna.samplers.RandomSampler)
    assert isinstance(make_base_sampler("nsga2", 0), optuna.samplers.NSGAIISampler)
    with pytest.raises(ValueError, match="unknown sampler"):
        make_base_sampler("cmaes", 0)


# ---------------------------------------------------------------- learning from infeasible trials

# A synthetic tuning problem: four precisions x sixteen batch sizes. "d" is the fastest but always
# drifts far over the 1% tolerance (like an fp16 that diverges): it is infeasible everywhere.
PROBLEM = {"precision": ["a", "b", "c", "d"], "batch_size": list(range(1, 17))}
SPEED = {"a": 1.0, "b": 1.3, "c": 1.6, "d": 3.0}
DRIFT = {"a": 0.0, "b": 0.002, "c": 0.004, "d": 0.5}
TOLERANCE = 0.01
TRIALS = 40
SEEDS = (0, 1, 2, 3)
UNIFORM_LATER = (TRIALS // 2) * 0.25 * len(SEEDS)
"""How often uniform random picks "d" in the later halves over all seeds: 20."""


def measure(params: dict[str, Any]) -> tuple[list[float], list[float]]:
    """Objective values and constraint violations [drift, outcome, memory] as `record` makes them."""
    drift = DRIFT[params["precision"]]
    throughput = SPEED[params["precision"]] * 100 * math.log2(1 + params["batch_size"])
    return [throughput, drift], [drift - TOLERANCE, 0.0, 0.0]


def later_half_infeasible(study: optuna.Study, ask, infeasible_state: TrialState = TrialState.COMPLETE) -> int:
    proposed = []
    for _ in range(TRIALS):
        trial = ask(study)
        proposed.append(trial.params["precision"])
        values, constraints = measure(trial.params)
        if trial.params["precision"] == "d" and infeasible_state is TrialState.FAIL:
            study.tell(trial, state=TrialState.FAIL)
        else:
            record(study, trial, values, constraints)
    return proposed[TRIALS // 2 :].count("d")


def plain_tpe_run(seed: int, infeasible_state: TrialState) -> int:
    distributions = {k: CategoricalDistribution(v) for k, v in PROBLEM.items()}
    study = optuna.create_study(
        directions=["maximize", "minimize"],
        sampler=make_base_sampler("tpe", seed),
        storage=optuna.storages.InMemoryStorage(),
    )
    return later_half_infeasible(study, lambda s: s.ask(distributions), infeasible_state)


def test_tpe_learns_from_infeasible_trials_recorded_as_complete_with_constraints() -> None:
    """The base sampler as autotuner configures it reads the `constraints` system attr: the fastest
    config is never feasible, and TPE learns to stop proposing it although its throughput is the
    highest. (Optuna 5's TPE reads the stored constraints by itself; 4.x read them only when the
    sampler was given a `constraints_func`, which `make_base_sampler` does not pass.)"""
    later = [plain_tpe_run(seed, TrialState.COMPLETE) for seed in SEEDS]
    assert sum(later) <= UNIFORM_LATER / 2, later


def test_the_declared_optuna_is_one_whose_tpe_reads_stored_constraints() -> None:
    import re
    import tomllib

    from tests.support.helpers import ROOT

    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    optuna_requirement = next(d for d in dependencies if re.match(r"optuna\s*[<>=!~]", d))
    lower = re.search(r">=\s*([0-9]+)", optuna_requirement)
    assert lower is not None and int(lower.group(1)) >= 5, optuna_requirement


def test_tpe_ignores_infeasible_trials_told_as_fail() -> None:
    """Why infeasible trials are COMPLETE and not FAIL: TPE never looks at FAIL trials, so it would
    keep proposing the infeasible value (here far more often than uniform random would)."""
    later = [plain_tpe_run(seed, TrialState.FAIL) for seed in SEEDS]
    assert sum(later) >= UNIFORM_LATER, later


def test_uniform_random_baseline_of_the_learning_test() -> None:
    """Calibration: the fresh-config sampler over a random base picks "d" about a quarter of the time."""
    later = []
    for seed in SEEDS:
        study, sampler = make_study(PROBLEM, "random", seed)
        later.append(later_half_infeasible(study, lambda s, sp=sampler: s.ask(sp.space)))
    assert UNIFORM_LATER / 2 < sum(later) < UNIFORM_LATER * 2, later


def test_the_search_sampler_learns_from_infeasible_trials() -> None:
    later = []
    for seed in SEEDS:
        study, sampler = make_study(PROBLEM, "tpe", seed)
        later.append(later_half_infeasible(study, lambda s, sp=sampler: s.ask(sp.space)))
    assert sum(later) <= UNIFORM_LATER / 2, (
        f"infeasible value in the later halves: {later} (uniform: {UNIFORM_LATER:g} in all)"
    )


def test_the_search_sampler_learns_from_pruned_trials() -> None:
    """A precision far behind the others is pruned after two windows (`record_pruned`: PRUNED, its
    windows as intermediate values, no objective values): the sampler proposes it less and less."""
    problem = {"precision": ["a", "b", "c", "e"], "batch_size": list(range(1, 17))}
    later = []
    for seed in SEEDS:
        study, sampler = make_study(problem, "tpe", seed)
        proposed = []
        for _ in range(TRIALS):
            trial = study.ask(sampler.space)
            precision = trial.params["precision"]
            proposed.append(precision)
            if precision == "e":  # a tenth of "a"'s throughput
                windows = [10.0 * math.log2(1 + trial.params["batch_size"])] * 2
                record_pruned(
                    study, trial, dict(trial.params), "behind", {"throughput_windows": windows}, role="search"
                )
            else:
                record(study, trial, *measure(trial.params))
        later.append(proposed[TRIALS // 2 :].count("e"))
    assert all(t.intermediate_values for t in study.trials if t.state is TrialState.PRUNED)
    assert sum(later) <= UNIFORM_LATER / 2, f"pruned value in the later halves: {later} (uniform: {UNIFORM_LATER:g})"


# ---------------------------------------------------------------- what `record` stores is what the samplers read


def test_record_stores_infeasible_trials_as_complete_with_violated_constraints() -> None:
    """The learning tests above record trials the way `autotuner.results.store.record` does; check that."""
    from autotuner.results.store import Yardstick
    from autotuner.results.store import record as study_record
    from autotuner.spec.job import parse_spec
    from autotuner.trials.launcher import TrialResult
    from autotuner.trials.outcomes import Outcome
    from tests.support.helpers import measured
    from tests.support.helpers import reference as fp32_reference

    job = parse_spec(
        {
            "name": "rec",
            "backend": "pytorch",
            "workload": "builtin:mlp",
            "global_batch": 64,
            "space": {"precision": ["fp32", "fp16"], "batch_size": [64], "workers": [0], "compile": ["none"]},
        },
        "rec.yaml",
    )
    study = optuna.create_study(directions=["maximize", "minimize"], storage=optuna.storages.InMemoryStorage())
    space = {k: CategoricalDistribution(v) for k, v in job.space.items()}
    reference = fp32_reference(2.0, [2.5, 2.2])

    def one(params: dict[str, Any], result: TrialResult):
        study.enqueue_trial(params)
        trial = study.ask(space)
        study_record(
            study,
            trial,
            job.complete(trial.params),
            result,
            role="search",
            against=Yardstick(job, reference, CPU_MACHINE),
        )
        return study.trials[-1]

    fp32 = {"precision": "fp32", "batch_size": 64, "workers": 0, "compile": "none"}
    ok = one(fp32, TrialResult(Outcome.OK, output=measured(900.0, 2.0, [2.5, 2.2])))
    drifted = one({**fp32, "precision": "fp16"}, TrialResult(Outcome.OK, output=measured(2000.0, 3.0, [2.5, 2.9])))
    oom = one(fp32, TrialResult(Outcome.OOM, "OutOfMemoryError: CUDA out of memory."))

    assert ok.state is TrialState.COMPLETE and ok.values == [900.0, 0.0]
    assert all(v <= 0 for v in ok.constraints.values()) and ok.user_attrs["feasible"] is True

    assert drifted.state is TrialState.COMPLETE and drifted.values == [2000.0, 0.5]
    assert drifted.system_attrs["constraints"] == pytest.approx([0.5 - 0.01, 0.0, 0.0])
    assert drifted.user_attrs["feasible"] is False and "over the tolerance" in drifted.user_attrs["reason"]

    assert oom.state is TrialState.COMPLETE and oom.values == [0.0, math.inf]
    assert oom.system_attrs["constraints"] == [0.0, 1.0, 0.0]
    assert oom.user_attrs["outcome"] == "oom"
    # and the OOM rule reads it back from the stored trial
    assert oom_rules_out(dict(oom.params), study.get_trials(deepcopy=False)) is not None


# ---------------------------------------------------------------- what the wrapped sampler sees

ORDERED = {"precision": ["fp32", "bf16"], "batch_size": [64, 8, 32], "workers": [0, 1, 2], "compile": ["none"]}


class Recorder(optuna.samplers.BaseSampler):
    """A wrapped sampler that records what it is shown and proposes `fixed`, else each knob's
    last value (the largest index of an integer knob)."""

    def __init__(self, fixed: dict[str, Any] | None = None):
        self.fixed = fixed or {}
        self.seen: list[tuple[str, Any, int, list[dict[str, Any]]]] = []

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def sample_independent(self, study, trial, param_name, param_distribution):
        done = [dict(t.params) for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
        self.seen.append((param_name, param_distribution, len(study.directions), done))
        if param_name in self.fixed:
            return self.fixed[param_name]
        if isinstance(param_distribution, IntDistribution):
            return param_distribution.high
        return param_distribution.choices[-1]


def test_integer_knobs_reach_the_wrapped_sampler_as_indices_and_map_back() -> None:
    base = Recorder()
    configs = all_configs(ORDERED)
    sampler = FreshConfigSampler(base, ORDERED, lambda: configs, 0)
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
    trial = study.ask(sampler.space)
    assert trial.params == {"precision": "bf16", "batch_size": 64, "workers": 2, "compile": "none"}
    shown = {name: distribution for name, distribution, _, _ in base.seen}
    assert shown == {
        "precision": CategoricalDistribution(["fp32", "bf16"]),
        "batch_size": IntDistribution(0, 2),  # 8, 32, 64
        "workers": IntDistribution(0, 2),
    }, "a knob with a single value is not sampled"
    record(study, trial, [100.0, 0.5], [0.49, 0.0, 0.0])

    base.seen.clear()
    base.fixed = {"batch_size": 0, "workers": 1}
    trial = study.ask(sampler.space)
    assert trial.params == {"precision": "bf16", "batch_size": 8, "workers": 1, "compile": "none"}
    _, _, objectives, done = base.seen[0]
    assert objectives == 1, "the wrapped sampler sees the throughput as the one objective"
    assert done == [{"precision": "bf16", "batch_size": 2, "workers": 2}], "finished trials in its encoding"
    assert study.trials[0].params == {"precision": "bf16", "batch_size": 64, "workers": 2, "compile": "none"}


def test_a_wrapped_sampler_that_repeats_itself_is_asked_a_few_times_then_the_nearest_fresh_config_runs() -> None:
    space = {"precision": ["fp32", "bf16"], "batch_size": [8, 16, 32]}
    configs = all_configs(space)
    base = Recorder()  # always bf16 at batch 32
    sampler = FreshConfigSampler(base, space, lambda: configs, 0)
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
    record(study, study.ask(sampler.space), [3.0, 0.0], [0.0, 0.0, 0.0])
    assert study.trials[0].params == {"precision": "bf16", "batch_size": 32}
    base.seen.clear()
    trial = study.ask(sampler.space)
    assert len(base.seen) == ATTEMPTS * 2  # two knobs sampled per attempt
    assert sum(trial.params[k] != v for k, v in study.trials[0].params.items()) == 1, trial.params


# ---------------------------------------------------------------- the rule of thumb

CPU = TorchCapabilities(bf16=True, fp16=True, compile=True)
AMPERE = TorchCapabilities(accelerator=True, bf16=True, fp16=True, tf32=True, compile=True, cuda_graphs=True)
VOLTA = TorchCapabilities(accelerator=True, fp16=True, compile=True, cuda_graphs=True)
PYTORCH_SPACE = {
    "precision": ["fp32", "tf32", "bf16", "fp16"],
    "batch_size": [8, 16, 32, 64, 128, 256, 512, 1024],
    "workers": [0, 1, 2, 4, 8],
    "compile": ["none", "default", "reduce-overhead", "max-autotune"],
}


def unsupported_on(capabilities: Capabilities):
    from autotuner.backends.pytorch import PYTORCH

    return lambda params: PYTORCH.unsupported_reason(params, capabilities)


def test_the_rule_of_thumb_is_the_fastest_supported_precision_the_largest_batch_middle_workers_compile_on() -> None:
    expected = {"precision": "bf16", "batch_size": 1024, "workers": 2, "compile": "default"}
    assert rule_of_thumb(PYTORCH_SPACE, unsupported_on(AMPERE)) == expected
    assert rule_of_thumb(PYTORCH_SPACE, unsupported_on(VOLTA)) == {**expected, "precision": "fp16"}
    no_low_precision = TorchCapabilities(compile=False)
    assert rule_of_thumb(PYTORCH_SPACE, unsupported_on(no_low_precision)) == {
        **expected,
        "precision": "fp32",
        "compile": "none",
    }
    cpu_preset = {"precision": ["fp32", "bf16"], "batch_size": [8, 16, 32], "workers": [0, 1, 2], "compile": ["none"]}
    assert rule_of_thumb(cpu_preset, unsupported_on(CPU)) == {
        "precision": "bf16",
        "batch_size": 32,
        "workers": 1,
        "compile": "none",
    }
    jax = {"precision": ["fp32", "tf32", "bf16"], "workers": [0, 1, 2, 4], "jit": ["off", "on"]}
    assert rule_of_thumb(jax) == {"precision": "bf16", "workers": 2, "jit": "on"}
    assert rule_of_thumb({"workers": [4]}) == {"workers": 4}


# ---------------------------------------------------------------- the guided start

CPU_SPACE = {"precision": ["fp32", "bf16"], "batch_size": [8, 16, 32, 64], "workers": [0, 1, 2], "compile": ["none"]}
CPU_BASELINE = {"precision": "fp32", "batch_size": 8, "workers": 0, "compile": "none"}


def guided_study(
    space: dict[str, list[Any]] = CPU_SPACE, seed: int = 0, unsupported=None
) -> tuple[optuna.Study, FreshConfigSampler]:
    configs = all_configs(space)
    sampler = make_sampler("tpe", seed, space, lambda: configs, unsupported)
    study = optuna.create_study(
        directions=["maximize", "minimize"], sampler=sampler, storage=optuna.storages.InMemoryStorage()
    )
    return study, sampler


def speed(params: dict[str, Any]) -> float:
    """A CPU-like job: bf16 faster, bigger batches faster, one worker best."""
    precision = {"fp32": 1.0, "bf16": 2.0}[params["precision"]]
    return precision * math.log2(params["batch_size"]) * (1.5 if params["workers"] == 1 else 1.0)


def run_ok(study: optuna.Study, sampler: FreshConfigSampler, rate=speed) -> optuna.trial.FrozenTrial:
    trial = study.ask(sampler.space)
    record(study, trial, [rate(trial.params), 0.0], [-0.01, 0.0, 0.0])
    return study.trials[-1]


def one_knob_apart(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return sum(a[k] != b[k] for k in a) == 1


def test_make_sampler_guides_the_default_only() -> None:
    configs = all_configs(SMALL)
    assert make_sampler("tpe", 0, SMALL, lambda: configs).rule is not None
    for name in ("random", "nsga2"):
        assert make_sampler(name, 0, SMALL, lambda: configs).rule is None


def test_the_default_runs_the_rule_of_thumb_after_the_baseline_then_its_neighbours() -> None:
    study, sampler = guided_study(unsupported=unsupported_on(CPU))
    study.enqueue_trial(CPU_BASELINE)
    assert run_ok(study, sampler).params == CPU_BASELINE
    rule = {"precision": "bf16", "batch_size": 64, "workers": 1, "compile": "none"}
    assert run_ok(study, sampler).params == rule
    neighbours = [run_ok(study, sampler).params for _ in range(4)]
    assert neighbours == [
        {**rule, "precision": "fp32"},  # precision first
        {**rule, "batch_size": 32},  # an integer knob one step down and up its values
        {**rule, "workers": 0},
        {**rule, "workers": 2},
    ]


def test_the_local_search_moves_to_the_best_after_scanning_its_neighbours() -> None:
    study, sampler = guided_study()
    study.enqueue_trial(CPU_BASELINE)
    run_ok(study, sampler)
    two_workers = lambda p: speed(p) * (3.0 if p["workers"] == 2 and p["batch_size"] == 64 else 1.0)  # noqa: E731
    for _ in range(5):  # the rule of thumb and its four neighbours
        run_ok(study, sampler, two_workers)
    best = {"precision": "bf16", "batch_size": 64, "workers": 2, "compile": "none"}
    assert best in [t.params for t in study.trials]
    following = run_ok(study, sampler, two_workers).params
    assert one_knob_apart(following, best), following  # the new centre's neighbours


def test_the_guided_start_never_repeats_a_config_and_covers_the_space() -> None:
    for seed in range(3):
        study, sampler = guided_study(seed=seed)
        study.enqueue_trial(CPU_BASELINE)
        seen = set()
        for _ in range(len(all_configs(CPU_SPACE))):
            key = config_key(run_ok(study, sampler).params)
            assert key not in seen
            seen.add(key)
        assert sampler.fresh_configs(study) == []


def test_the_guided_start_steps_the_batch_down_after_an_out_of_memory() -> None:
    study, sampler = guided_study()
    study.enqueue_trial(CPU_BASELINE)
    run_ok(study, sampler)
    trial = study.ask(sampler.space)
    assert trial.params == {"precision": "bf16", "batch_size": 64, "workers": 1, "compile": "none"}
    record(study, trial, [0.0, math.inf], [0.0, 1.0, 0.0], outcome="oom")
    assert study.ask(sampler.space).params == {"precision": "bf16", "batch_size": 32, "workers": 1, "compile": "none"}


def test_the_guided_start_goes_back_to_the_strict_precision_when_the_rule_of_thumb_drifts() -> None:
    study, sampler = guided_study()
    study.enqueue_trial(CPU_BASELINE)
    run_ok(study, sampler)
    trial = study.ask(sampler.space)
    record(study, trial, [speed(trial.params), 0.3], [0.29, 0.0, 0.0])  # over the drift tolerance
    assert study.ask(sampler.space).params == {"precision": "fp32", "batch_size": 64, "workers": 1, "compile": "none"}


def test_the_guided_start_skips_what_the_device_cannot_run() -> None:
    no_bf16 = TorchCapabilities(fp16=True)
    study, sampler = guided_study(unsupported=unsupported_on(no_bf16))
    assert sampler.rule is not None and sampler.rule["precision"] == "fp32"
    study.enqueue_trial(CPU_BASELINE)
    run_ok(study, sampler)
    guided = [run_ok(study, sampler).params for _ in range(5)]  # the rule, then ring 1 and 2 without bf16
    assert guided == [
        {"precision": "fp32", "batch_size": 64, "workers": 1, "compile": "none"},
        {"precision": "fp32", "batch_size": 32, "workers": 1, "compile": "none"},
        {"precision": "fp32", "batch_size": 64, "workers": 0, "compile": "none"},
        {"precision": "fp32", "batch_size": 64, "workers": 2, "compile": "none"},
        {"precision": "fp32", "batch_size": 16, "workers": 1, "compile": "none"},
    ]


def test_a_start_another_worker_runs_is_not_proposed_again() -> None:
    study, sampler = guided_study()
    study.enqueue_trial(CPU_BASELINE)
    run_ok(study, sampler)
    running = study.ask(sampler.space)  # left RUNNING, as in another worker
    rule = {"precision": "bf16", "batch_size": 64, "workers": 1, "compile": "none"}
    assert running.params == rule
    configs = all_configs(CPU_SPACE)
    other = make_sampler("tpe", 1, CPU_SPACE, lambda: configs)  # the other worker's own sampler
    worker = optuna.load_study(study_name=study.study_name, storage=study_storage(study), sampler=other)
    assert worker.ask(other.space).params == {**rule, "precision": "fp32"}, "a neighbour of the running start"
    assert worker.ask(other.space).params == {**rule, "batch_size": 32}


def test_from_any_centre_every_supported_value_of_every_knob_is_one_move_away() -> None:
    """A value another knob's value rules out (ONNX Runtime runs fp32 only; no loader workers
    without the default prefetch depth) is reached by the move that resets that knob (or every
    other knob) to its reference value."""
    import itertools

    from autotuner.backends.pytorch import PYTORCH, TorchCapabilities
    from autotuner.backends.pytorch.inference import PYTORCH_INFERENCE, InferenceCapabilities
    from autotuner.proposals.guided_start import LocalSearch

    cases = [
        (
            PYTORCH_INFERENCE,
            InferenceCapabilities(bf16=True, fp16=True, compile=True, torchao=True, onnxruntime=True, ort_cpu=True),
            {
                "precision": ["fp32", "bf16", "fp16"],
                "batch_size": [8, 64],
                "quantization": ["none", "int8-dynamic"],
                "runtime": ["pytorch", "onnxruntime-cpu"],
                "compile": ["none", "default"],
            },
        ),
        (
            PYTORCH,
            TorchCapabilities(bf16=True, compile=True),
            {"precision": ["fp32", "bf16"], "workers": [0, 1, 2], "prefetch_factor": [2, 4], "batch_size": [16, 64]},
        ),
    ]
    for backend, capabilities, space in cases:
        reference = {name: backend.knobs[name].reference for name in space}
        reference["batch_size"] = space["batch_size"][0]

        def supported(
            params: dict[str, object], backend: Any = backend, capabilities: Any = capabilities, base: Any = reference
        ) -> bool:
            return backend.unsupported_reason({**base, **params, "accumulation": 1}, capabilities) is None

        search = LocalSearch(space, supported, reference)
        configs = [dict(zip(space, values, strict=True)) for values in itertools.product(*space.values())]
        for centre in filter(supported, configs):
            reached = [move for ring in (1, 2) for move in search.moves(centre, ring)]
            assert all(supported(move) for move in reached)
            for knob, values in space.items():
                for value in values:
                    # a value the device runs with the other knobs at their reference values
                    if value == centre[knob] or not supported({**reference, knob: value}):
                        continue
                    assert any(move[knob] == value for move in reached), f"{centre} {knob} {value} {reached}"


def _stored(space: dict[str, list[Any]], trials: list[tuple[dict[str, Any], float]]) -> list[Any]:
    study = optuna.create_study(directions=["maximize", "minimize"])
    for params, rate in trials:
        study.add_trial(
            create_trial(
                params=params,
                distributions={k: optuna.distributions.CategoricalDistribution(v) for k, v in space.items()},
                values=[rate, 0.0],
                system_attrs={"constraints": [-0.01, 0.0, 0.0]},
            )
        )
    return study.get_trials()


ORDER_SPACE = {
    "precision": ["fp32", "bf16"],
    "batch_size": [8, 16, 32],
    "workers": [0, 1, 2],
    "optimizer": ["as-given", "fused"],
    "compile": ["none", "default"],
}
CENTRE = {"precision": "bf16", "batch_size": 32, "workers": 1, "optimizer": "as-given", "compile": "none"}


def test_the_local_search_tries_first_the_moves_that_paid_elsewhere_and_last_those_that_did_not() -> None:
    from autotuner.proposals.guided_start import LocalSearch, one_knob_moves

    elsewhere = {**CENTRE, "batch_size": 8}
    done = _stored(
        ORDER_SPACE,
        [
            (elsewhere, 100.0),
            ({**elsewhere, "optimizer": "fused"}, 101.0),  # 1%: within a trial's noise
            ({**elsewhere, "precision": "fp32"}, 80.0),  # lost a fifth
            ({**elsewhere, "compile": "default"}, 150.0),  # gained half
            ({**elsewhere, "workers": 0, "optimizer": "fused", "precision": "fp32"}, 10.0),  # two knobs from any other
            (CENTRE, 120.0),
        ],
    )
    made = one_knob_moves(done)
    assert made[("compile", "none", "default")] == pytest.approx(math.log(1.5))
    assert made[("compile", "default", "none")] == pytest.approx(-math.log(1.5))
    assert made[("precision", "bf16", "fp32")] == pytest.approx(math.log(0.8))
    assert made[("batch_size", 8, 32)] == pytest.approx(math.log(1.2))
    assert ("workers", 1, 0) not in made
    search = LocalSearch(ORDER_SPACE, lambda params: True)
    moved = [
        next(f"{k}={v}" for k, v in move.items() if v != CENTRE[k])
        for move in search.move_order(CENTRE, list(search.moves(CENTRE, 1)), made)
    ]
    # compile paid elsewhere; then the moves never made, in the space's order; last the
    # optimizer's (within noise), then the precision's (it lost)
    assert moved == ["compile=default", "batch_size=16", "workers=0", "workers=2", "optimizer=fused", "precision=fp32"]


def _pruned(params: dict[str, Any], bound: float) -> Any:
    """A stored pruned trial of `params` whose rule judged it at `bound` at most."""
    return create_trial(
        params=params,
        distributions={k: optuna.distributions.CategoricalDistribution(v) for k, v in ORDER_SPACE.items()},
        state=optuna.trial.TrialState.PRUNED,
        user_attrs={"outcome": "pruned", "prune_bound": bound, "prune_floor": 85.0, "throughput_windows": [bound]},
        intermediate_values={0: bound},
    )


def test_a_pruned_trials_bound_counts_as_a_loss_and_a_move_that_lost_that_much_is_not_made_again() -> None:
    """bf16 on a CPU without its instructions: pruned at a ninth of the centre's pace. At the next
    centre (another batch), the same move is not made again; every other one is."""
    from autotuner.proposals.guided_start import LocalSearch, one_knob_moves
    from autotuner.results.tried import TriedConfigs

    fp32 = {**CENTRE, "precision": "fp32", "batch_size": 8}
    study = optuna.create_study(directions=["maximize", "minimize"])
    for trial in _stored(ORDER_SPACE, [(fp32, 90.0), ({**fp32, "batch_size": 32}, 200.0)]):
        study.add_trial(trial)
    study.add_trial(_pruned({**fp32, "precision": "bf16"}, 10.0))
    study.add_trial(_pruned({**fp32, "precision": "bf16", "workers": 2}, 9.0))  # two bounds: no pair
    trials = study.get_trials()
    made = one_knob_moves(trials)
    assert made[("precision", "fp32", "bf16")] == pytest.approx(math.log(10.0 / 90.0))
    assert ("workers", 1, 2) not in made
    search = LocalSearch(ORDER_SPACE, lambda params: True)
    centre = {**fp32, "batch_size": 32}
    order = search.move_order(centre, list(search.moves(centre, 1)), made)
    assert {**centre, "precision": "bf16"} not in order
    assert len(order) == len(list(search.moves(centre, 1))) - 1
    following = search.next_config(trials, TriedConfigs(trials), last=None)
    assert following is not None and following.get("precision") == "fp32"


def test_the_sampler_does_not_propose_a_value_that_lost_big_wherever_it_was_tried() -> None:
    """After the guided start, TPE still explores; a value every move to which lost more than
    `LOST` (bf16 pruned at a ninth of fp32's pace) is left out of what it may run, while the space
    has other configs."""
    from autotuner.proposals.guided_start import lost_values, one_knob_moves

    space = {"precision": ["fp32", "bf16"], "batch_size": [8, 16, 32], "workers": [0, 1]}
    fp32 = {"precision": "fp32", "batch_size": 8, "workers": 0}
    study = optuna.create_study(directions=["maximize", "minimize"])
    for trial in _stored(space, [(fp32, 90.0)]):
        study.add_trial(trial)
    study.add_trial(
        create_trial(
            params={**fp32, "precision": "bf16"},
            distributions={k: optuna.distributions.CategoricalDistribution(v) for k, v in space.items()},
            state=optuna.trial.TrialState.PRUNED,
            user_attrs={"outcome": "pruned", "prune_bound": 10.0, "throughput_windows": [10.0]},
        )
    )
    assert lost_values(one_knob_moves(study.get_trials())) == {("precision", "bf16")}
    configs = [dict(zip(space, values, strict=True)) for values in itertools.product(*space.values())]
    sampler = FreshConfigSampler(optuna.samplers.RandomSampler(seed=0), space, lambda: configs, seed=0)
    study.sampler = sampler
    for _ in range(4):  # the fp32 configs left: every one before any bf16
        trial = study.ask(dict(sampler.space))
        assert trial.params["precision"] == "fp32", trial.params
        study._storage.set_trial_system_attr(trial._trial_id, "constraints", [-0.01, 0.0, 0.0])
        study.tell(trial, [50.0, 0.0])


def test_the_wrapped_sampler_sees_a_pruned_trial_as_one_of_its_bound() -> None:
    from autotuner.proposals.wrapped_sampler import SpaceEncoding, encoded_trial

    study = optuna.create_study(directions=["maximize", "minimize"])
    study.add_trial(_pruned(CENTRE, 12.5))
    seen = encoded_trial(study.get_trials()[0], SpaceEncoding(ORDER_SPACE))
    assert seen.state is optuna.trial.TrialState.COMPLETE and seen.values == [12.5]


def test_a_trial_far_ahead_of_the_centre_becomes_the_centre_before_its_ring_is_used_up() -> None:
    from autotuner.proposals.guided_start import LEAP, LocalSearch
    from autotuner.results.tried import TriedConfigs

    far = {**CENTRE, "precision": "fp32"}
    for rate, expected in ((100.0 * (1 + LEAP) * 1.1, far), (100.0 * (1 + LEAP) * 0.9, CENTRE)):
        done = _stored(ORDER_SPACE, [(CENTRE, 100.0), (far, rate)])
        tried = TriedConfigs(done)
        following = LocalSearch(ORDER_SPACE, lambda params: True).next_config(done, tried, last=0)
        assert following is not None and one_knob_apart(following, expected), (rate, following)
        assert following not in (CENTRE, far)


def test_a_batch_move_tries_the_largest_batch_before_the_next_one() -> None:
    """A larger batch at equal knobs is rarely slower: from a centre two or more batches below the
    largest, the batch's first move is to the largest, then one step down and up."""
    from autotuner.proposals.guided_start import LocalSearch

    search = LocalSearch(CPU_SPACE, lambda params: True)

    def batches(centre: dict[str, Any]) -> list[int]:
        return [m["batch_size"] for m in search.moves(centre, 1) if m["batch_size"] != centre["batch_size"]]

    assert batches(CPU_BASELINE) == [64, 16]
    assert batches({**CPU_BASELINE, "batch_size": 16}) == [64, 8, 32]
    assert batches({**CPU_BASELINE, "batch_size": 32}) == [16, 64]


def test_when_the_rule_of_thumb_loses_to_the_baseline_the_baseline_at_the_largest_batch_runs_next() -> None:
    """What a batch finder would give (the baseline's knobs at the largest batch) is one move from
    the baseline, and the guided start makes it within two trials of the rule of thumb."""
    study, sampler = guided_study()
    study.enqueue_trial(CPU_BASELINE, user_attrs={"role": "baseline"})
    slow_bf16 = lambda p: speed(p) * (0.1 if p["precision"] == "bf16" else 1.0)  # noqa: E731
    ran = [run_ok(study, sampler, slow_bf16).params for _ in range(4)]
    assert ran[1]["precision"] == "bf16", "the rule of thumb"
    assert {**CPU_BASELINE, "batch_size": 64} in ran[2:]
