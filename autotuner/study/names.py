"""The names of what a study stores, in one place.

Everything autotuner knows about a study lives in its Optuna storage under these names: the
study's user attrs (its settings, environment, fingerprint, reference, run plan), each trial's
user attrs (its config, role, outcome and what it measured), the constraint values Optuna's
samplers and optuna-dashboard read, and the claims that coordinate the workers of a study (study
system attrs under `CLAIM_PREFIX`, `autotuner.study.claims`). The modules that write the storage
and those that read it back name them from here; the storage keeps them as they are, so a name
changed here is a change of the stored format that older studies must still be read in.
"""

from __future__ import annotations

from typing import Literal

from optuna.trial import TrialState

# ------------------------------------------------------------------ the study's user attrs

SETTINGS = "autotuner"
"""The job's settings: its identity and spec path, backend, workload, global batch, drift tolerance
and memory limit."""
ENVIRONMENT = "environment"
"""The probed `autotuner.trials.probe.Environment`, as its `as_dict`."""
FINGERPRINT = "fingerprint"
"""The hardware/software fingerprint the study is tied to (`autotuner.study.fingerprint`)."""
CONSTRAINTS = "constraints"
"""The names of a trial's constraint values, in their order (`CONSTRAINT_NAMES`)."""
STUDY_ATTRS = (SETTINGS, ENVIRONMENT, FINGERPRINT, CONSTRAINTS)
"""The study user attrs a study's creator writes; until all are there, its `IDENTITY_CLAIM` decides."""
REFERENCE = "reference"
"""The fp32 reference (`autotuner.results.evidence.Reference`, as its `as_dict`)."""
RUN = "run"
"""The real run the study ranks for (`autotuner.results.run_time.RunPlan`, as its `as_dict`), or None."""
NOT_SEARCHED = "not_searched"
"""The knob values dropped from the space as irrelevant on this device and workload, with why."""

# ------------------------------------------------------------------ the objectives and constraints

METRIC_NAMES = ("throughput", "drift")
"""The study's objective values, in order (Optuna's metric names: the dashboard's axes)."""
DIRECTIONS: tuple[Literal["maximize", "minimize"], ...] = ("maximize", "minimize")
ENERGY = "energy_j_per_sample"
"""The optional third objective (`objective.energy`), minimized; also a trial metric."""
CONSTRAINT_NAMES = ("drift", "outcome", "memory")
"""The constraint values in the order a trial's `TRIAL_CONSTRAINTS` system attr lists them: drift
over the tolerance, an outcome other than ok, peak memory over the limit (> 0: violated)."""
DRIFT_LIMIT, OUTCOME_OK, MEMORY_LIMIT = CONSTRAINT_NAMES
LATENCY_LIMIT = "latency"
INFERENCE_CONSTRAINT_NAMES = (*CONSTRAINT_NAMES, LATENCY_LIMIT)
"""An inference study's constraint values: those of `CONSTRAINT_NAMES`, then a batch's p99 latency
over `objective.max_latency_ms` (> 0: violated)."""

# ------------------------------------------------------------------ a trial's user attrs

CONFIG = "config"
"""Every knob's value, `accumulation` included."""
ROLE = "role"
"""`BASELINE` or `SEARCH`."""
BASELINE = "baseline"
SEARCH = "search"
OUTCOME = "outcome"
"""The outcome class (`autotuner.trials.outcomes.Outcome`'s value)."""
REASON = "reason"
"""The outcome's one-line reason."""
TRACEBACK = "traceback"
"""For an `error` outcome: the user code's traceback."""
FEASIBLE = "feasible"
"""Whether the trial met every constraint."""
RETRY_OF = "retry_of"
"""The number of the cut-off trial a trial runs again."""
GIVEN_UP = "given_up"
"""Why a worker gave the trial up without running it (another trial has its config, ...)."""
DUPLICATE_OF = "duplicate_of"
"""The number of the trial that has the config a given-up trial asked for."""
RECORD_ATTRS = (CONFIG, ROLE, OUTCOME, REASON, FEASIBLE, TRACEBACK)
"""The trial user attrs that are not metrics (`autotuner.results.records.TrialRecord` reads them
as fields; every other user attr is a metric)."""
COLD_WARMUP = "cold_warmup_s"
"""Trial metric, derived when read: the warm-up its config pays from a cold compile cache, where
its own found it warm."""

# ------------------------------------------------------------------ a trial's system attrs

TRIAL_CONSTRAINTS = "constraints"
"""Optuna's own: the constraint values its samplers and optuna-dashboard read (<= 0: met)."""
FIXED_PARAMS = "fixed_params"
"""Optuna's own: the params a queued trial was enqueued with."""
OWNER = "autotuner:worker"
"""The search process that runs the trial (`autotuner.workers.ownership.SearchProcess`)."""
SLOT = "autotuner:slot"
"""The budget slot the trial holds (`autotuner.workers.coordination.BudgetSlots`)."""

# ------------------------------------------------------------------ the study's system attrs

CLAIM_PREFIX = "autotuner:"
"""Every claim's key starts with it (`autotuner.study.claims`); the claims' names follow."""
IDENTITY_CLAIM = "identity"
"""The study's creator: its fingerprint, job identity and environment."""
REFERENCE_CLAIM = "reference"
"""The worker that runs the fp32 reference."""
CONFIG_CLAIM = "config:"
"""`config:<hash>`: the trial that runs a config."""
SLOT_CLAIM = "slot:"
"""`slot:<k>`: the trial that holds budget slot k."""
REMEASURE_CLAIM = "remeasure:"
"""`remeasure:<trial number>`: that trial's config's re-measurement, and once done its result."""
REMEASURE_SLOT_CLAIM = "remeasure-slot:"
"""`remeasure-slot:<k>`: the k-th config re-measured."""
RETRY_CLAIM = "retry:"
"""`retry:<trial number>`: the worker that runs a cut-off trial again."""
WARM_START_CLAIM = "warm-start"
"""The worker that enqueues a warm start's configs (`autotuner.search.warm_start`)."""
PROFILE_PREFIX = "profile:"
"""`profile:<trial number>`: that trial's profile (`autotuner.results.profiles.Profile`)."""

# ------------------------------------------------------------------ trial states

LIVE = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
"""The states of a trial whose config is taken (an interrupted, FAIL, trial's config is free)."""
