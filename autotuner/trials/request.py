"""What the engine asks of a trial process, as plain data (each is pickled to the process): one
config's trial (`TrialRequest`), the probe of a device and a workload (`ProbeRequest`), and a
config's steps under the framework's profiler (`ProfileRequest`). `autotuner.spec.job.Job` builds
them from a spec; a backend's `autotuner.trials.training.TrainingBackend` runs them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autotuner.config.knobs import Config
from autotuner.measurement.timing import Measuring


@dataclass(frozen=True)
class TrialRequest:
    """Everything a trial process needs to run one config. Plain data: it is pickled."""

    workload: str
    """Import path `package.module:function` of the workload factory."""
    workload_args: dict[str, Any]
    """The keyword arguments the factory is called with: the spec's `workload_args`, the user's own."""
    device: str
    config: Config
    global_batch: int
    seed: int
    warmup_steps: int
    steps: int
    windows: int
    drift_steps: int
    heldout_batch: int
    """Chunk size of the held-out evaluation: the baseline's micro-batch, which is known to fit."""
    measure: bool = True
    """False for the reference: only the drift phase runs."""
    drift: bool = True
    """False for a re-measurement, whose config's trial measured its drift: the process ends after
    its windows, without the restart, drift steps and held-out loss (seconds a process)."""
    min_window_s: float = 0.0
    """Shortest measured window (`autotuner.measurement.measured_phase.measure_throughput`)."""
    match_steps: int = 0
    """When set, as many windows (of the calibrated length) are measured as it takes to match this
    many optimizer steps (another trial's), not `windows`."""
    match_most_s: float = 0.0
    """With `match_steps`: no more of those windows than last this long at the calibration's pace
    (0: no bound)."""
    prune_best: float | None = None
    """The best feasible throughput of the study so far: with `prune_after`, the trial stops early
    when its first windows cannot reach it (`autotuner.measurement.pruning`)."""
    prune_after: int = 0
    """Windows measured before the trial may be pruned; 0 never prunes it."""
    progress: str | None = None
    """The file the trial writes its phase to for the search's console (`autotuner.trials.progress`)."""
    compile_cache: str | None = None
    """The folder of the study's compile caches (torch.compile's `TORCHINDUCTOR_CACHE_DIR`), so a
    trial's compile is warm or cold by this study's trials alone; None: the framework's default."""
    processes: int = 1
    """Ranks of the trial on each node (the spec's `processes`): each its own process on its own
    device, all in one process group, `global_batch` split between them."""
    nodes: int = 1
    """Machines the trial spans (the spec's `nodes`), each running `processes` ranks: global rank
    `node_rank` x `processes` + local rank, `global_batch` split between all of them."""
    node_rank: int = 0
    """Which of the `nodes` this process is: 0 on the search that holds the study (its rank 0
    measures), R on the node following it (`autotuner search --node-rank R`)."""
    rendezvous: str | None = None
    """With `nodes` above 1: node 0's `host:port` (the spec's `rendezvous`), where the study's store
    is: the trial's `c10d` rendezvous and its process group meet there."""
    run_id: str | None = None
    """With `nodes` above 1: the trial's rendezvous id, the same on every node, set by node 0 when it
    hands the request to the others; its keys in the store are under it."""
    parallel: str | None = None
    """How the ranks train together (the spec's `parallel`: `ddp`, `fsdp`); None for one process."""
    log: str | None = None
    """Where the process's stdout and stderr go, its own and its children's: a file of its own,
    `<log>.<pid>.log` (`autotuner.trials.launcher.log_file`), so the libraries' warnings and prints
    stay off the search's console. None: the console."""
    time_calls: bool = False
    """An inference trial's windows timed by their served calls alone (`objective.optimize:
    latency`): each window's time is the sum of its calls', not its wall time, which holds the
    loading of each next batch too."""

    def measuring(self) -> Measuring:
        """How its measured phase times it (`autotuner.measurement.measured_phase.measure_throughput`): a
        step of `global_batch` samples, warm-up, windows and their calibration as it asks."""
        return Measuring(
            warmup_steps=self.warmup_steps,
            steps=self.steps,
            windows=self.windows,
            samples_per_step=self.global_batch,
            min_window_s=self.min_window_s,
            match_steps=self.match_steps,
            match_most_s=self.match_most_s,
        )


@dataclass(frozen=True)
class ProbeRequest:
    """What a probe process checks: the device, and that the workload factory imports; with
    `workload_args`, that the factory builds a workload from them; with `global_batch` too, that its
    data makes a global batch the model computes a loss on."""

    device: str
    """The spec's device: `auto`, `cpu` or `cuda:N`."""
    workload: str
    """Import path `package.module:function` of the workload factory."""
    workload_args: Mapping[str, Any] | None = None
    """None: only import the factory."""
    global_batch: int | None = None
    parallel: str | None = None
    """How the job's ranks train together (the spec's `parallel`), so the probe can say which of
    its knobs this torch build and device can honour; None for one process."""
    log: str | None = None
    """As `TrialRequest.log`."""
    nodes: int = 1
    """Machines a trial spans (the spec's `nodes`): FSDP2's hybrid sharding needs two or more."""


@dataclass(frozen=True)
class ProfileRequest:
    """`steps` optimizer steps of `trial`'s config under the framework's profiler, after its warm-up
    steps, the trace written into `folder`."""

    trial: TrialRequest
    steps: int
    folder: str


def log_of(request: object) -> str | None:
    """The log file of a request of any kind (a profile's is its trial's), or None."""
    if isinstance(request, ProfileRequest):
        return request.trial.log
    return getattr(request, "log", None)
