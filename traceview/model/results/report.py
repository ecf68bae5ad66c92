"""The run report (``traceview report --json``): the run, its summary and the report itself."""

from __future__ import annotations

from traceview.model.results.base import (
    RESULTS_VERSION,
    BottleneckPhase,
    Breakdown,
    ClockSource,
    Hidden,
    Result,
    StepsFrom,
    StragglerPhase,
    Timeline,
)
from traceview.model.results.comm import (
    AllToAllRank,
    CollectiveSummary,
    CommByGroup,
    FsdpGather,
    Pipeline,
    ProcessGroup,
)
from traceview.model.results.critical_path import Cause, CriticalPath, WhatIf
from traceview.model.results.failure import Failure, RankAtEnd
from traceview.model.results.gpu import GpuVerdict, HostBound
from traceview.model.results.live import WholeRun
from traceview.model.results.memory import RunMemory
from traceview.model.results.ranks import RankSpread, RankSummary
from traceview.model.results.roles import Architecture, ServerSummary
from traceview.model.results.steps import IncompleteStep, OutsideOp, StepStats, StepSummary, TopOp


class JobInfo(Result):
    """The job ``traceview collect`` ran (null for traces read on their own)."""

    command: list[str] | None
    exit_code: int | None
    hosts: list[str]
    clock_method: str  # tcp (every rank's clock probed), mixed, or wallclock
    clock_uncertainty_us: float | None
    max_clock_offset_us: float | None


class Clocks(Result):
    """How the ranks' clocks were aligned, so that arrival times compare across ranks."""

    source: ClockSource
    calls: int | None = None  # collectives: matched synchronizing calls and point-to-point
    #                           pairs the estimate used
    max_offset_us: float | None = None  # the largest offset applied (estimated or measured)
    max_drift_ppm: float | None = None  # collectives: the largest drift estimated
    residual_us: float | None = None  # collectives: p90 distance of matched ends from the fit
    unaligned_ranks: list[int] = []  # ranks with too few matched calls to estimate


class RunInfo(Result):
    """The run: ``steps_from`` says where its steps come from ("markers": the trace's own;
    "annotations", "dataloader", "optimizer", "backward": inferred where the training loop
    repeats; "step_groups", "session_runs": TensorFlow's; "one_window": none, the whole trace
    is one window); ``step_choice``: the --steps/--skip the figures count (null: the
    default, leading warm-up steps left out)."""

    framework: str | None
    ranks: int  # ranks with steps
    steps: int  # distinct step numbers (0 when the steps are unnumbered)
    world_size: int | None
    missing_ranks: list[int]
    timeline: Timeline | None  # the clock the breakdown was measured on
    path: str | None  # the run directory (null for a temporary one)
    run_id: str | None
    job: JobInfo | None
    clocks: Clocks | None = None  # null with one rank
    # where the steps come from (null: a report from before this was recorded)
    steps_from: StepsFrom | None = None
    # the --steps/--skip the headline figures were chosen with (null: the default selection)
    step_choice: str | None = None
    # all-reduce and other collectives, or parameter servers (workers push and pull); whether
    # the workers keep in lockstep (null: not known); how traceview knew both
    architecture: Architecture = "collective"
    synchronous: bool | None = True
    architecture_from: str | None = None


class Summary(Result):
    """The run as a whole: means over ranks of each rank's mean step, over the counted steps
    (``per_step[].excluded`` null). ``startup_ms``: the mean over ranks of the time from the
    first host call to the first step (one-time startup, outside every figure; null without
    numbered steps)."""

    breakdown_ms: Breakdown
    step_ms: float
    comm_total_ms: float
    comm_exposed_ms: float
    comm_hidden_fraction: float  # over all ranks' steps: 1 - exposed / total
    hidden: Hidden  # how much of the communication is hidden behind compute
    bottleneck: BottleneckPhase | None  # the phase with the largest exclusive share
    bottleneck_share: float  # its share of the step
    # The straggler: where collectives were matched across ranks, the rank whose late arrival
    # caused the most waiting; else the busiest rank (null with one rank).
    straggler_rank: int | None
    straggler_excess: float  # its busy time over the median rank's (0.05: 5% more)
    # the others wait for it at least STRAGGLER_MIN_WAIT of the step (null: one rank, or no
    # collective matched: nobody is known to wait for it)
    straggler_significant: bool | None
    blocked_ms: float  # mean over ranks of exposed comm + idle: time not on the rank's own work
    # Across ranks (analysis/crossrank/), means over ranks; null where no collective was
    # matched across ranks (one rank, no communication). wait + transfer = comm_exposed_ms;
    # the totals split comm_total_ms (hidden communication included).
    comm_wait_ms: float | None = None
    comm_transfer_ms: float | None = None
    comm_wait_total_ms: float | None = None
    comm_transfer_total_ms: float | None = None
    # the others' exposed wait per step at the calls the straggler arrived last to, per other rank
    straggler_wait_ms: float | None = None
    straggler_phase: StragglerPhase | None = None  # where the straggler spends its extra time
    straggler_phase_ms: float | None = None  # that phase on the straggler, ms per step
    straggler_phase_median_ms: float | None = None  # and the median of the other ranks
    # the verdicts of the comparison against the median rank, where the critical path decides
    # the ones above (the same values where it does not)
    straggler_rank_by_median: int | None = None
    straggler_phase_by_median: StragglerPhase | None = None
    bottleneck_by_median: BottleneckPhase | None = None
    memory: RunMemory | None = None  # null: no rank has memory records
    # the host-bound part of breakdown_ms's phases, mean of ranks (a CPU rank's phases have
    # none); null where no rank has a GPU timeline
    host_bound_ms: HostBound | None = None
    # one-time startup before the first step (mean of ranks; CUDA context creation, first
    # allocations, autotuning, lazy initialization): outside every figure above; null: none known
    startup_ms: float | None = None
    # what the step loses most to, from the critical path and its replays (null: nothing saves
    # more than the step-to-step noise, or no critical path); bottleneck and straggler_* follow
    # it where it is found, and keep their median-based values under *_by_median
    cause: Cause | None = None


class RunReport(Result):
    """``traceview report --json``."""

    run: RunInfo
    summary: Summary
    ranks: list[RankSummary]
    per_step: list[StepSummary]
    step_stats: StepStats | None  # null without steps
    top_ops: list[TopOp]
    warnings: list[str]
    remarks: list[str]
    schema_version: str = RESULTS_VERSION
    collectives: list[CollectiveSummary] = []  # matched across ranks (empty: none)
    # steps that did not complete on every rank, left out of every figure above
    incomplete_steps: list[IncompleteStep] = []
    rank_spread: RankSpread | None = None  # the ranks as a distribution (null without ranks)
    # GPU runs: the device idle a large share of the step while the host works (null: not so)
    gpu_verdict: GpuVerdict | None = None
    groups: list[ProcessGroup] = []  # the process groups the ranks declare (empty: none)
    pipeline: Pipeline | None = None  # the pipeline its point-to-point calls form (null: none)
    comm_by_group: list[CommByGroup] = []  # communication by group, phase and collective
    critical_path: CriticalPath | None = None  # null: no segments (an older run directory)
    whatif: list[WhatIf] = []  # replays of the counted steps (the first: no change)
    alltoall: list[AllToAllRank] = []  # per rank and group, its all-to-alls (empty: none)
    fsdp_gathers: list[FsdpGather] = []  # FSDP's all-gathers by phase and unit (empty: none)
    # operators outside every step (set-up, teardown), apart from top_ops' counted steps
    outside_ops: list[OutsideOp] = []
    # a job that hung, desynchronized or died: what went wrong first (null: it did not, or
    # no step record was kept); where each rank was when it ended (empty: no step record)
    failure: Failure | None = None
    ranks_at_end: list[RankAtEnd] = []
    # every step of the run, profiled or not, from the step record (null: none was kept)
    whole_run: WholeRun | None = None
    # the processes without steps of their own: parameter servers, schedulers, coordinators
    servers: list[ServerSummary] = []

    @property
    def straggler(self) -> RankSummary | None:
        """The significant straggler, if there is one."""
        return next((r for r in self.ranks if r.straggler), None)
