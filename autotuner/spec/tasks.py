"""What a job does with its workload, the spec's `task`: train it, or serve it (`inference`). The
engine looks a task up here (`TASKS`) and asks it what it measures and allows; it names no task.

A task's trial entry point is its backend's half for it (`autotuner.backends.get_backend`: the
runner a trial process imports), and its objective and constraints follow from what it measures.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotuner.config.knobs import BATCH_SIZE
from autotuner.errors import SpecError
from autotuner.spec.keys import JobSpec


@dataclass(frozen=True)
class Task:
    name: str
    doing: str
    """What a job of this task does, as a bad spec's line says it (`this job trains`)."""
    latency: bool
    """Its trials time each call: a batch's latency is a metric, `objective.max_latency_ms` a
    constraint and `optimize: latency` an objective."""
    processes: bool
    """A trial may run as several processes (`processes`, `parallel`)."""
    run_time: bool
    """It predicts a real run's time (`run`)."""

    def check(self, spec: JobSpec, source: str) -> None:
        """The spec's keys that this task has no use for, refused in one line each."""
        measuring = " and ".join(f"task: {t.name}" for t in TASKS.values() if t.latency)
        if not self.latency:
            if spec.objective.max_latency_ms is not None:
                raise SpecError(
                    f"limits a batch's latency, which {measuring} measures (this job {self.doing})",
                    source=source,
                    key="objective.max_latency_ms",
                )
            if spec.objective.optimize == "latency":
                raise SpecError(
                    f"latency is what {measuring} measures (this job {self.doing}): optimize throughput",
                    source=source,
                    key="objective.optimize",
                )
        elif spec.objective.optimize == "latency":
            _one_call_a_request(spec, source)
        if not self.processes and spec.processes != 1:
            raise SpecError(
                f"task: {self.name} {self.doing} from one process: processes must be 1", source=source, key="processes"
            )
        if not self.processes and spec.nodes != 1:
            raise SpecError(
                f"task: {self.name} {self.doing} from one process: nodes must be 1", source=source, key="nodes"
            )
        if not self.run_time and spec.run is not None:
            raise SpecError(f"predicts a training run's time; task: {self.name} has none", source=source, key="run")

    def times_calls(self, spec: JobSpec) -> bool:
        """Whether a trial times each call on its own (`optimize: latency`)."""
        return self.latency and spec.objective.optimize == "latency"


def _inline(space: object, knob: str) -> list[object] | None:
    """The values a spec's inline `space` gives `knob` (a list, or one value), or None."""
    if not isinstance(space, dict) or knob not in space:
        return None
    values = space[knob]
    return list(values) if isinstance(values, list) else [values]


def _one_call_a_request(spec: JobSpec, source: str) -> None:
    """`optimize: latency` serves each request of `global_batch` in one call: a batch size, where
    the spec gives one, is the global batch."""
    served = {
        "space.batch_size": _inline(spec.space, BATCH_SIZE.name),
        "baseline.batch_size": [spec.baseline.get(BATCH_SIZE.name)],
    }
    for key, values in served.items():
        if any(value not in (None, spec.global_batch) for value in values or []):
            raise SpecError(
                f"optimize: latency serves each request of global_batch ({spec.global_batch}) in one call: "
                f"batch_size is {spec.global_batch} (leave it out)",
                source=source,
                key=key,
            )


TRAIN = Task("train", "trains", latency=False, processes=True, run_time=True)
INFERENCE = Task("inference", "serves", latency=True, processes=False, run_time=False)
TASKS = {task.name: task for task in (TRAIN, INFERENCE)}
"""Name -> task: the spec's `task` values."""
