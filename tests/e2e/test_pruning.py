"""Losing trials stop early, end to end: a search trial whose steps show it cannot reach the best
feasible throughput so far is stopped, stored as Optuna PRUNED with the reason, the rates it was
judged on and the bound it missed, its drift not measured, and the report shows it. When it is
stopped is the rule's, decided on a scripted clock in tests/measurement/test_pruning.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from optuna.trial import TrialState

from autotuner.measurement.contention import CONTENDED_SHARE
from tests.support.studies import SMALL_SPEC, load_study, run_cli, write_spec


@pytest.mark.parametrize("prune_after", [2, 0])
def test_a_config_that_cannot_win_is_pruned_in_the_search(tmp_path: Path, prune_after: int) -> None:
    # bf16 takes 20 ms more per forward pass (tests.support.study_workloads:slow_bf16): far behind fp32.
    spec = write_spec(
        tmp_path,
        workload="tests.support.study_workloads:slow_bf16",
        space={"precision": ["fp32", "bf16"], "batch_size": [16, 64], "workers": [0], "compile": ["none"]},
        budget={"trials": 4},
        # windows of 0.2 s: the baseline's (0.8 s in all) tell whether other work took the CPU, and it is
        # run again if so: the best so far, which the bf16 trials are judged against, is not one it slowed
        trial={**SMALL_SPEC["trial"], "warmup_steps": 3, "windows": 4, "min_window_s": 0.2, "prune_after": prune_after},
    )
    done = run_cli("search", "--spec", str(spec), cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    study = load_study(tmp_path)
    bf16 = [t for t in study.trials if t.params.get("precision") == "bf16"]
    assert len(bf16) == 2 and all(t.user_attrs["role"] == "search" for t in bf16)
    if not prune_after:
        assert all(t.state is TrialState.COMPLETE and "drift" in t.user_attrs for t in bf16)
        assert "pruned" not in done.stdout
        return
    trials = "; ".join(  # what a failure shows: the bound each trial was judged against came from these
        f"#{t.number} {t.params['precision']} {t.params['batch_size']} {t.state.name} windows "
        f"{t.user_attrs.get('throughput_windows')} contention {t.user_attrs.get('contention')}"
        for t in study.trials
    )
    pruned = []
    for t in bf16:
        # behind, but not pruned while other work took the CPU: each time it held off is recorded
        held = t.user_attrs.get("prune_held_off", [])
        assert all(share > CONTENDED_SHARE for share in held)
        if t.state is TrialState.COMPLETE:  # held off each time it would have been pruned
            assert held and t.user_attrs["outcome"] == "ok", trials
            continue
        pruned.append(t)
        attrs = t.user_attrs
        assert t.state is TrialState.PRUNED and t.values is None, trials  # what optuna-dashboard shows
        assert attrs["outcome"] == "pruned" and "behind the best so far" in attrs["reason"]
        judged = attrs["throughput_windows"]  # the rates of the stretches judged behind
        assert list(t.intermediate_values.values()) == judged and len(judged) >= 2 + len(held)
        assert attrs["prune_bound"] == max(judged) < attrs["prune_floor"] and "drift" not in attrs
        line = f"pruned after {attrs['trained_s']:.1f} s, {attrs['prune_bound']:,.0f}/s at most"
        assert f"#{t.number} " in done.stdout and line in done.stdout, done.stdout
    fp32 = [t for t in study.trials if t.params.get("precision") == "fp32"]
    assert all(t.state is TrialState.COMPLETE for t in fp32)  # the baseline is never pruned
    report = run_cli("report", "--spec", str(spec), cwd=tmp_path)
    assert report.returncode == 0, report.stdout + report.stderr
    html = (tmp_path / "runs" / "small" / "report.html").read_text()
    outcomes = f"ok {4 - len(pruned)}" + (f", pruned {len(pruned)}" if pruned else "")
    assert "4 (4 ran a process)" in html and f">{outcomes}</td>" in html
