"""The export file (`runs/<name>/best.yaml`, or `.json`): one model, `ExportFile`, that
`autotuner.export.writer` fills from a study's storage and `autotuner.export.reader` reads back.

Each section names the fields the writer always fills and the reader relies on; the evidence
around them (a trial's metrics, its predicted run time and cost, the environment's details) is
kept as it is (`extra="allow"`), so a newer autotuner may add evidence without a new version. A
change of what a field means bumps `EXPORT_VERSION`; the reader accepts `READS_VERSIONS`.
Infinite values (the drift of a run whose loss diverged) are written as the string `inf`.

A section reads as a mapping too (`tuned.study["name"]`, `tuned.metrics.get("drift")`): its
fields and the evidence kept beside them, by name, as the export file writes them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from pydantic import BaseModel, ConfigDict, Field

from autotuner.config.knobs import Config

EXPORT_VERSION = 1
"""The version the writer writes."""
READS_VERSIONS = (1,)
"""The versions the reader understands."""


class _Section(BaseModel, Mapping[str, object]):
    """A section's named fields, typed, and the evidence beyond them kept as it is (a reader checks
    what it uses); read by name too, as a mapping of both."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)

    def __getitem__(self, key: str) -> object:
        if key in type(self).model_fields:
            return getattr(self, key)
        return (self.__pydantic_extra__ or {})[key]

    # A mapping's keys, where pydantic's model iterates (name, value) pairs: `dict(section)` is the same.
    def __iter__(self) -> Iterator[str]:  # type: ignore[override]
        yield from type(self).model_fields
        yield from self.__pydantic_extra__ or {}

    def __len__(self) -> int:
        return len(type(self).model_fields) + len(self.__pydantic_extra__ or {})


class Measured(_Section):
    """How a config was measured: its throughput (samples/s: its trial's median window, or once
    re-measured the median over every window of its re-measurement processes), each process's
    median (the trial's first) and how far apart they are."""

    throughput: float | None = None
    trial_throughput: float | None = None
    throughput_runs: list[float] | None = None
    throughput_run_spread: float | None = None
    remeasured: bool | None = None


class Metrics(Measured):
    """The best config's evidence: `Measured`, its trial's metrics (drift, spread, peak memory,
    warm-up, ...) and, with a `run:`, its predicted run time and cost."""

    throughput: float = Field(gt=0)  # type: ignore[assignment]


class Baseline(Measured):
    """The baseline's config and evidence (params None where the study has no baseline)."""

    params: Config | None = None
    outcome: str | None = None


class Drift(_Section):
    tolerance: float | None = None
    reference_noise_floor: float | None = None
    reference_config: Config | None = None


class EnvironmentSection(_Section):
    """The hardware and software the config was tuned on (`autotuner.trials.probe.Environment`'s
    stored form) and its fingerprint."""

    backend: str
    fingerprint: str


class SpecRef(_Section):
    """The job it was tuned for."""

    path: str | None = None
    identity: str
    """`autotuner.spec.job.Job.identity`."""
    workload: str | None = None
    global_batch: int | None = Field(None, gt=0)
    processes: int = Field(1, gt=0)
    """Ranks the job runs as on each node (`global_batch` = micro-batch x accumulation x nodes x
    processes)."""
    nodes: int = Field(1, gt=0)
    """Machines its ranks span, each running `processes` of them."""
    rendezvous: str | None = None
    """Where the study's nodes met (`host:port` of node 0): the launch lines' `--rdzv-endpoint`."""
    parallel: str | None = None
    """How its ranks train together: `ddp`, `fsdp`; None for one process."""
    task: str = "train"
    """`train`, or `inference` (a config to serve a model with: `TunedInference`)."""


class StudyRef(_Section):
    name: str
    storage: str | None = None
    """The storage URL, without its password."""
    trial: int | None = None
    """The best config's trial number."""
    trials_ran: int | None = None


class SpeedupInterval(_Section):
    """The speedup's interval (`autotuner.measurement.interval`): its ends at `level` from `rounds`
    paired rounds of re-measurement, stated jointly with the intervals of the configs the winner
    was chosen among (`among`, its own included; 1 in exports made before it was recorded);
    `estimate` is the speedup itself."""

    estimate: float = Field(gt=0)
    low: float = Field(gt=0)
    high: float = Field(gt=0)
    rounds: int = Field(ge=2)
    level: float = Field(gt=0, lt=1)
    among: int = Field(1, ge=1)


class Ranked(_Section):
    """One of the `top` best feasible configs (rank 1 is the best)."""

    rank: int
    trial: int
    params: Config
    throughput: float
    speedup: float | None = None
    speedup_interval: SpeedupInterval | None = None


class ExportFile(BaseModel):
    """The whole file."""

    # A newer export may add top-level evidence; what changes its meaning bumps `version`.
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)
    version: int
    params: Config
    metrics: Metrics
    baseline: Baseline
    speedup: float | None
    speedup_interval: SpeedupInterval | None = None
    """The speedup's interval, where re-measurement ran two rounds or more."""
    drift: Drift = Field(default_factory=Drift)
    environment: EnvironmentSection
    spec: SpecRef
    study: StudyRef
    run: dict[str, object] | None = None
    """The real run the configs were ranked for (`autotuner.results.run_time.RunPlan`'s form, its
    description and optimizer steps), where the spec has a `run:`."""
    top: list[Ranked] | None = None

    def as_data(self) -> dict[str, object]:
        """The file's content: plain YAML- and JSON-safe data, the sections that are set."""
        unset = {name for name in ("run", "top", "speedup_interval") if getattr(self, name) is None}
        return {key: plain(value) for key, value in self.model_dump(exclude=unset).items()}


def plain(value: object) -> object:
    """YAML- and JSON-safe: infinities become the string 'inf'."""
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value
