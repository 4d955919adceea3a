"""A warm start: an earlier study's best configs tried first (`autotuner search --warm-start`).

A user who re-tunes after a small change to the job, or moves it to another machine, has the
earlier study's evidence of which configs are fast. The warm start reads that study's feasible
configs in the order of its results (`autotuner.results.records.ranked`: re-measured configs by
their re-measurement), keeps those within `WITHIN` of its best, at most a `SHARE` of this study's
budget, and enqueues them after the baseline, so they run before the sampler proposes anything;
the guided start's local search then centres on the best of them. Only the configs cross over:
nothing measured there counts here, each is run and measured as any trial is. A config this job
cannot take is dropped, with the count of each reason said: a knob value outside this space (a
knob this job has and the other had not takes the baseline's value), what this device cannot run,
what this study has tried already.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import optuna

from autotuner.config.knobs import DERIVED, Params, Value, config_key
from autotuner.errors import SpecError
from autotuner.results.records import TrialRecord, baseline, ranked, speedup
from autotuner.spec.job import Job
from autotuner.study.claims import Claims
from autotuner.study.names import ROLE, WARM_START_CLAIM
from autotuner.study.storage import open_storage, shown_url, study_settings

WITHIN = 0.85
"""The earlier study's configs a warm start takes: at least this share of its best's speedup
(or throughput), those that could still win here; a slower one is left to the search."""
SHARE = 3
"""At most a third of this study's trial budget goes to the earlier study's configs (one at least)."""
WARM_START = "warm_start"
"""The study attribute that says a warm start was enqueued, from where: once per study, so a
resumed study or a second worker does not enqueue it again."""
ORIGIN = "warm_start_from"
"""The trial attribute of an enqueued config: the earlier study's trial it comes from."""


@dataclass(frozen=True)
class EarlierStudy:
    """Where a warm start's configs come from (`--warm-start`, `--warm-start-study`)."""

    storage: str
    """Its storage: `runs/<name>/study.db` or a URL (`source_url`)."""
    name: str | None = None
    """The study, where the storage holds several; else its only one, or the one named like the job."""


@dataclass
class WarmStart:
    """What a warm start takes from an earlier study."""

    source: str
    """The earlier study, as the console names it: its name and storage."""
    configs: list[tuple[int, Params]] = field(default_factory=list)
    """Its trial number and the config, in the order they are tried."""
    dropped: dict[str, int] = field(default_factory=dict)
    """Why configs were dropped -> how many."""


def source_url(source: str) -> str:
    """A storage URL, or a SQLite file's path (`runs/<name>/study.db`) made one; SpecError when the
    file does not exist."""
    if "://" in source:
        return source
    if not Path(source).is_file():
        raise SpecError(
            f"{source} is no study database (give runs/<name>/study.db or a storage URL)", key="--warm-start"
        )
    return f"sqlite:///{Path(source).resolve()}"


def load_earlier(source: EarlierStudy, job: Job) -> tuple[optuna.Study, str]:
    """The earlier study `source` names and how the console names it; one SpecError line when there
    is none to take or it was made for another backend or task."""
    url, name = source_url(source.storage), source.name
    try:
        storage = open_storage(url, create=False)
    except SpecError as exc:  # said of --warm-start, not of this study's storage
        raise SpecError(str(exc).removeprefix(f"{exc.key}: ").split("; run ")[0], key="--warm-start") from None
    names = [s.study_name for s in optuna.study.get_all_study_summaries(storage, include_best_trial=False)]
    chosen = name or (names[0] if len(names) == 1 else job.name if job.name in names else None)
    if chosen not in names:
        held = ", ".join(names) or "none"
        raise SpecError(
            f"{shown_url(url)} holds the studies {held}: name one with --warm-start-study", key="--warm-start"
        )
    earlier = optuna.load_study(study_name=chosen, storage=storage)
    settings = study_settings(earlier.user_attrs)
    if settings is not None and settings.backend not in (None, job.backend.name):
        raise SpecError(
            f"study {chosen!r} tuned a {settings.backend} job; this one is {job.backend.name}", key="--warm-start"
        )
    if settings is not None and settings.task != job.spec.task:
        raise SpecError(
            f"study {chosen!r} measured task: {settings.task}; this job {job.spec.task}", key="--warm-start"
        )
    return earlier, f"{chosen} ({shown_url(url)})"


def warm_configs(
    earlier: list[TrialRecord],
    source: str,
    job: Job,
    unsupported: Callable[[Params], str | None],
    budget: int,
    tried: set[tuple[tuple[str, Value], ...]],
) -> WarmStart:
    """The configs of the earlier study's trials `earlier` this study tries first (see the module
    docstring); `tried`: the `config_key`s of the params this study has run or enqueued already."""
    found = WarmStart(source)
    leaders = ranked(earlier)
    base = baseline(earlier)
    if not leaders:
        return found

    def score(t: TrialRecord) -> float:
        return speedup(t, base) or t.throughput

    bar, most = WITHIN * score(leaders[0]), max(1, budget // SHARE)
    knobs = [k for k in job.space if k not in DERIVED]
    for t in leaders:
        if len(found.configs) >= most or score(t) < bar:
            break
        params: Params = {k: t.config.get(k, job.baseline[k]) for k in knobs}
        if any(params[k] not in job.space[k] for k in knobs):
            reason = "a knob value outside this space"
        elif config_key(params) in tried:
            reason = "tried here already"
        elif unsupported(params):
            reason = "this device cannot run it"
        else:
            tried.add(config_key(params))
            found.configs.append((t.number, params))
            continue
        found.dropped[reason] = found.dropped.get(reason, 0) + 1
    return found


def enqueue_warm_start(study: optuna.Study, warm: WarmStart, claims: Claims) -> bool:
    """Enqueue `warm`'s configs (after the baseline), once per study: by the worker that wins the
    study's warm-start claim (two workers started together may both have read no `WARM_START`).
    False where another worker did it."""
    if claims.claim(WARM_START_CLAIM, {"source": warm.source}) is not None:
        return False
    study.set_user_attr(WARM_START, warm.source)
    for number, params in warm.configs:
        study.enqueue_trial(params, user_attrs={ROLE: "search", ORIGIN: f"{warm.source} #{number}"})
    return True
