"""``traceview compare --json``: runs side by side, the first the baseline."""

from __future__ import annotations

from traceview.model.results.base import (
    RESULTS_VERSION,
    BottleneckPhase,
    Breakdown,
    Hidden,
    Phase,
    Result,
    StragglerPhase,
    Timeline,
)
from traceview.model.results.comm import Pipeline
from traceview.model.results.critical_path import Cause
from traceview.model.results.gpu import HostBound


class ComparedWorker(Result):
    """One worker of a run, for setting architectures side by side (``ComparedRun.workers``)."""

    rank: int
    step_ms: float
    steps_per_s: float | None = None
    comm_wait_ms: float | None = None
    staleness: float | None = None  # an asynchronous job's: others' updates unseen a step


class ComparedRun(Result):
    label: str
    framework: str | None
    ranks: int
    steps: int
    timeline: Timeline | None
    step_ms: float
    step_ratio: float | None  # against the baseline (the first run)
    breakdown_ms: Breakdown
    comm_total_ms: float
    comm_hidden_fraction: float
    hidden: Hidden
    bottleneck: BottleneckPhase | None
    # the exposed comm split across ranks (Summary), null where not matched across ranks
    comm_wait_ms: float | None = None
    comm_transfer_ms: float | None = None
    straggler_rank: int | None = None  # where significant
    straggler_phase: StragglerPhase | None = None
    # memory (RunMemory): the highest peak over ranks, its rank, device and phase; null where
    # the run has no memory records
    memory_peak_mb: float | None = None
    memory_peak_rank: int | None = None
    memory_device: str | None = None
    memory_peak_phase: Phase | None = None
    memory_since_profiling_started: bool | None = None
    # the host-bound part of breakdown_ms's phases (Summary); null without a GPU timeline
    host_bound_ms: HostBound | None = None
    # the pipeline its point-to-point calls form (RunReport.pipeline); null: none
    pipeline: Pipeline | None = None
    cause: Cause | None = None  # what its step loses most to (Summary.cause)
    # how the run is distributed (RunInfo), its throughput in worker steps per second (summed
    # over the workers: every rank in lockstep; each worker at its own pace without), and per
    # worker the figures that tell the architectures apart (empty past 64 ranks)
    architecture: str = "collective"
    synchronous: bool | None = True
    worker_steps_per_s: float | None = None
    workers: list[ComparedWorker] = []


class ComparedValues(Result):
    """One phase or operator across the runs: ms per step, and the ratio to the baseline."""

    ms: list[float]
    ratio: list[float | None]


class ComparedPhase(ComparedValues):
    phase: Phase


class ComparedOp(ComparedValues):
    op: str


class ComparedCommGroup(Result):
    """One mesh dimension's (or, outside a mesh, one group's) communication by one collective
    issued in one phase, across the runs (RunReport.comm_by_group, ms per step; a dimension's
    figures are the mean of its groups'); null where a run has none."""

    dim: str | None  # the mesh dimension (dp, tp...), null outside a mesh
    group: str | None  # the process group, where it has no dimension (untrusted)
    phase: str  # where the calls were issued: forward, backward, update, io, h2d, other
    op: str  # the collective (untrusted)
    total_ms: list[float | None]
    exposed_ms: list[float | None]
    wait_ms: list[float | None]
    ratio: list[float | None]  # total against the baseline's

    def label(self) -> str:
        """How the row is named: its dimension (or group), collective and phase."""
        where = self.dim if self.dim else f"group {self.group}"
        return f"{where} {self.op} in {self.phase}"


class Comparison(Result):
    """``traceview compare --json``: runs side by side, the first the baseline."""

    runs: list[ComparedRun]
    phases: list[ComparedPhase]
    ops: list[ComparedOp]
    highlights: list[str]
    schema_version: str = RESULTS_VERSION
    # communication by dimension (or group) and phase, where some run's is of several kinds (a
    # mesh, FSDP's gathers and reduce-scatters, a pipeline's pairs); empty for data parallelism,
    # whose communication is the phases' comm
    comm_by_group: list[ComparedCommGroup] = []


def kind_of(run: ComparedRun) -> str:
    """The run's architecture in words: all-reduce, or which parameter server."""
    if run.architecture == "collective":
        return "all-reduce"
    mode = {True: "synchronous", False: "asynchronous"}.get(run.synchronous)  # type: ignore[arg-type]
    return f"{mode} parameter server" if mode else "parameter server"
