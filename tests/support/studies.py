"""Studies the tests run: a spec small enough to search end to end in seconds on two CPU cores
(`SMALL_SPEC`, `write_spec`), the installed command as a user runs it (`run_cli`), the dashboard
served from it (`dashboard_server`), and a study read back from its folder (`load_study`)."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import TrialState

from tests.support.helpers import ROOT

# A study small enough to run end to end in seconds on two CPU cores.
SMALL_SPEC: dict[str, Any] = {
    "name": "small",
    "backend": "pytorch",
    "workload": "builtin:mlp",
    "workload_args": {"features": 32, "hidden": 64, "depth": 2, "samples": 1024},
    "device": "cpu",
    "global_batch": 64,
    "baseline": {"precision": "fp32", "batch_size": 16, "workers": 0, "compile": "none"},
    "space": {"precision": ["fp32", "bf16", "tf32"], "batch_size": [16, 64], "workers": [0], "compile": ["none"]},
    "budget": {"trials": 3},
    "trial": {"warmup_steps": 1, "steps": 3, "windows": 2, "min_window_s": 0.05, "drift_steps": 3, "timeout": 120},
    "sampler": {"name": "tpe", "seed": 0},
}


def write_spec(folder: Path, **changes: Any) -> Path:
    """SMALL_SPEC with `changes`. Unless `budget`, `trial` or `profile` asks for them (the tests of
    each do): its best is not re-measured, so that trial counts stay those of the search loop; no
    trial is pruned, so that every trial that ran is COMPLETE whatever the machine's timings; a
    contended trial is run again at once, not after waiting for a quiet machine, which one the
    suite's other workers share seldom is; and no profile runs after the search, so that the
    processes that trained are the search's. A space of knobs without a `preset` holds every knob
    it does not name at the baseline's value, so that a test's space is the knobs it names (a
    preset would search the rest)."""
    spec = held_space({**SMALL_SPEC, **changes})
    spec["budget"] = {"remeasure_top": 0, **spec["budget"]}
    spec["trial"] = {"prune_after": 0, "quiet_wait": 0, **spec["trial"]}
    spec.setdefault("profile", {"steps": 0})
    path = folder / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def held_space(spec: dict[str, Any]) -> dict[str, Any]:
    """`spec` with a space of knobs without a `preset` completed: every knob of its backend (and
    `parallel`) it does not name held at the baseline's value, or the knob's reference, so that
    the space searched is the knobs it names (a preset would search the rest)."""
    space = spec.get("space")
    if not isinstance(space, dict) or "preset" in space:
        return spec
    from autotuner.backends import BACKENDS, INFERENCE
    from autotuner.config.knobs import DERIVED

    backend = (INFERENCE if spec.get("task") == "inference" else BACKENDS).get(spec["backend"])
    parallel = spec.get("parallel") or ((backend.parallel or (None,))[0] if spec.get("processes", 1) > 1 else None)
    knobs = backend.job_knobs(parallel) if backend is not None else {}
    baseline = spec.get("baseline") or {}
    held = {
        name: [baseline.get(name, knob.reference)]
        for name, knob in knobs.items()
        if name not in space and name not in DERIVED and knob.reference is not None
    }
    return {**spec, "space": {**space, **held}}


def write_hang_spec(folder: Path, name: str, *, hang_at: int, workers: int, trials: int) -> Path:
    """A spec of `tests.support.study_workloads:hang_once`: its `hang_at`-th training process (1-2: the
    reference, 3: the baseline, then the trials) hangs, with `workers` loader workers running."""
    return write_spec(
        folder,
        name=name,
        workload="tests.support.study_workloads:hang_once",
        workload_args={"folder": str(folder), "hang_at": hang_at},
        global_batch=32,
        baseline={"precision": "fp32", "batch_size": 8, "workers": workers, "compile": "none"},
        space={"precision": ["fp32", "bf16"], "batch_size": [8, 16, 32], "workers": [workers], "compile": ["none"]},
        budget={"trials": trials},
        trial={"warmup_steps": 1, "steps": 2, "windows": 2, "drift_steps": 2, "min_window_s": 0, "timeout": 600},
    )


def run_cli(*args: str, cwd: Path, timeout: float = 600, fresh: bool = False) -> subprocess.CompletedProcess[str]:
    """`autotuner ARGS` from `cwd` (where runs/ lands): its exit code and what it printed.

    By default it runs in this process, through the command's own `main` with its output captured,
    and its trials run from this process's fork server: what a new interpreter would add (seconds
    to import the framework in a fork server of its own) is the same for every test, and the
    tests of it say `fresh`. With `fresh`, the installed command runs in a new interpreter, as a
    user runs it: for what only a process of its own shows (its environment read at start, the
    signals it is sent, a fork server of its own)."""
    if fresh:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "COLUMNS": "200",
        }
        command = [sys.executable, "-m", "autotuner", *args]
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return _run_main(list(args), cwd, timeout)


def assert_applied(done: subprocess.CompletedProcess[str]) -> None:
    """`autotuner apply` ran to its end, its exit code the verdict its promise line states (0 kept,
    or no promise checked; 1 not kept; 3 undecided): which verdict a busy test machine gives is
    the machine's, not the test's."""
    codes = {"kept": 0, "not kept": 1, "undecided": 3}
    found = re.search(r"^promise: .*?: (kept|not kept|undecided) \(here ", done.stdout, re.MULTILINE)
    expected = codes[found.group(1)] if found else 0
    assert done.returncode == expected, f"exit {done.returncode}, expected {expected}\n{done.stdout}{done.stderr}"


class CommandTimeout(Exception):
    """An in-process command ran past its timeout."""


def _run_main(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """`autotuner.cli.main(args)` in this process, from `cwd`, with COLUMNS=200 as `run_cli` sets
    it, stdout and stderr captured (the loggers' too), and SIGTERM's handler, the environment and
    the working directory as they were afterwards; `CommandTimeout` past `timeout` seconds."""
    from autotuner.cli import main

    out, err = io.StringIO(), io.StringIO()
    streams = [h for h in _stream_handlers() if h.stream in (sys.stderr, sys.__stderr__)]
    before = {h: h.stream for h in streams}
    columns, term = os.environ.get("COLUMNS"), signal.getsignal(signal.SIGTERM)

    def expired(signum: int, frame: object) -> None:
        raise CommandTimeout(f"autotuner {' '.join(args)} ran past {timeout:g} s")

    alarm = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    os.environ["COLUMNS"] = "200"
    try:
        for handler in streams:
            handler.setStream(err)
        with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(args)
            except SystemExit as exc:  # argparse's own exit (bad arguments, --help)
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, alarm)
        signal.signal(signal.SIGTERM, term)
        for handler, stream in before.items():
            handler.setStream(stream)
        if columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = columns
    return subprocess.CompletedProcess(["autotuner", *args], code, out.getvalue(), err.getvalue())


def _stream_handlers() -> list[logging.StreamHandler[Any]]:
    """The stream handlers of the root logger and of every logger below it (Optuna's among them)
    that hold a stream of their own: logging's last-resort handler, which some libraries attach,
    writes to whatever `sys.stderr` is, which `redirect_stderr` replaces."""
    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in logging.root.manager.loggerDict)]
    return [
        h
        for logger in loggers
        for h in getattr(logger, "handlers", [])
        if isinstance(h, logging.StreamHandler) and not isinstance(getattr(type(h), "stream", None), property)
    ]


@contextlib.contextmanager
def dashboard_server(*args: str, cwd: Path) -> Iterator[tuple[str, int]]:
    """`autotuner dashboard ARGS --port <a free port>` run from `cwd`: (its URL, its port) once it
    answers; stopped afterwards."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = subprocess.Popen(
        [sys.executable, "-m", "autotuner", "dashboard", *args, "--port", str(port)],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/studies", timeout=2) as response:
                    assert response.status == 200
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the dashboard did not start: {server.communicate()[0]}") from None
                time.sleep(0.3)
        yield url, port
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:  # a loaded machine: it is stopped all the same
            server.kill()
            server.wait()


def load_study(folder: Path, name: str = "small") -> optuna.Study:
    """The study `name` that `autotuner search` run from `folder` wrote (its default storage)."""
    return optuna.load_study(study_name=name, storage=f"sqlite:///{folder}/runs/{name}/study.db")


def ran(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    """The trials that ran a process."""
    return [
        t
        for t in trials
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and t.user_attrs["outcome"] != "unsupported"
    ]


def trial_processes(trials: list[optuna.trial.FrozenTrial]) -> int:
    """The processes the trials that ran trained in: one each, and one more for a trial measured
    while other work took the CPU (on a busy 2-core machine, the other workers' trials), which is
    run again once the machine is quiet (`autotuner.search.dispatch`)."""
    done = ran(trials)
    return len(done) + sum("contention_first_run" in t.user_attrs for t in done)


TINY_TRIAL = {"warmup_steps": 1, "steps": 2, "windows": 2, "drift_steps": 2, "timeout": 120, "min_window_s": 0}


JAX_SPEC: dict[str, Any] = {
    "name": "small-jax",
    "backend": "jax",
    "workload": "builtin:mlp",
    "workload_args": {"features": 16, "hidden": 32, "depth": 1, "samples": 256},
    "device": "cpu",
    "global_batch": 32,
    "baseline": {"precision": "fp32", "batch_size": 8, "workers": 0, "jit": "on"},
    "space": {
        "precision": ["fp32", "tf32"],
        "batch_size": [8],
        "workers": [0],
        "jit": ["on"],
        # held at their reference values: the jax preset would search them
        "remat": ["none"],
        "donate": ["off"],
        "xla_flags": ["default"],
    },
    # More trials than the space's feasible configs: every config is tried; the best re-measured once.
    "budget": {"trials": 2, "remeasure_top": 1, "remeasure_runs": 1},
    "trial": {
        "warmup_steps": 1,
        "steps": 3,
        "windows": 2,
        "min_window_s": 0.05,
        "drift_steps": 2,
        "timeout": 120,
        "quiet_wait": 0,  # the suite's other workers keep the machine busy: run a contended trial again at once
    },
    "sampler": {"name": "tpe", "seed": 0},
}


def _write(folder: Path, spec: dict[str, Any]) -> Path:
    path = folder / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path
