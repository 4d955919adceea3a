"""The sampler: fresh configs only, OOM rules, and learning from infeasible trials.

Everything here runs real Optuna studies (in memory) with the real samplers; no trial processes:
the "measurements" come from a synthetic problem, recorded the way `autotuner.study.record`
records trials (COMPLETE, objective values, the `constraints` system attr, the `outcome` user attr).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from autotuner.knobs import config_key
from autotuner.sampler import FreshConfigSampler, make_base_sampler, oom_rules_out

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
    """What `autotuner.study.record` stores, as far as a sampler can see it."""
    trial.set_user_attr("outcome", outcome)
    trial.storage.set_trial_system_attr(trial._trial_id, "constraints", constraints)
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

    from tests.helpers import ROOT

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


# ---------------------------------------------------------------- what `record` stores is what the samplers read


def test_record_stores_infeasible_trials_as_complete_with_violated_constraints() -> None:
    """The learning tests above record trials the way `autotuner.study.record` does; check that."""
    from autotuner.outcomes import Outcome
    from autotuner.spec import parse_spec
    from autotuner.study import record as study_record
    from autotuner.trial import TrialResult

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
    reference = {"heldout": 2.0, "trajectory": [2.5, 2.2]}
    throughput = {
        "samples_per_s": 900.0,
        "spread": 0.01,
        "window_samples_per_s": [900.0],
        "warmup_s": 0.1,
        "measured_s": 1.0,
    }

    def one(params: dict[str, Any], result: TrialResult):
        study.enqueue_trial(params)
        trial = study.ask(space)
        study_record(
            study, trial, job, job.complete(trial.params), result, role="search", reference=reference, environment={}
        )
        return study.trials[-1]

    fp32 = {"precision": "fp32", "batch_size": 64, "workers": 0, "compile": "none"}
    ok = one(
        fp32,
        TrialResult(
            Outcome.OK, result={"throughput": throughput, "losses": {"heldout": 2.0, "trajectory": [2.5, 2.2]}}
        ),
    )
    drifted = one(
        {**fp32, "precision": "fp16"},
        TrialResult(
            Outcome.OK,
            result={
                "throughput": {**throughput, "samples_per_s": 2000.0},
                "losses": {"heldout": 3.0, "trajectory": [2.5, 2.9]},
            },
        ),
    )
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
    assert oom_rules_out({**fp32}, study.get_trials(deepcopy=False)) is not None
