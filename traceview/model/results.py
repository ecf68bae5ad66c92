"""The results of the analysis: typed, serialisable structs that every view renders.

The analysis (``traceview.analysis``) computes every figure and every verdict once into these
structs; the text report, ``--json`` and the TUI only render them. ``report --json`` is
``to_json(RunReport)``: its keys are a contract (docs/design.md, docs/schema/), so a
field is never removed or retyped once added, and data a run does not have is ``null``.

Nothing here imports numpy, polars or a UI library.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal, NamedTuple, TypeVar

import msgspec

from traceview.model import schema as S
from traceview.model.escape import encodable

#: The version of the result model (``schema_version`` of ``report --json``); bumped when a
#: field changes meaning. Adding a field does not bump it.
RESULTS_VERSION = "1"


class Result(msgspec.Struct, kw_only=True):
    """Base of every result: JSON in and out."""

    def to_json(self) -> bytes:
        try:
            return msgspec.json.encode(self)
        except UnicodeEncodeError:  # a file name that is not UTF-8: its bytes escaped
            return msgspec.json.encode(encodable(msgspec.to_builtins(self)))

    def to_builtins(self) -> Any:
        return msgspec.to_builtins(self)


R = TypeVar("R", bound=Result)

#: What the JSON's enumerated strings can be (a schema test keeps old values valid).
Phase = Literal["io", "h2d", "forward", "backward", "update", "comm", "other", "idle"]
#: "imbalance": communication is the largest share, but most of it is waiting for a straggler
BottleneckPhase = Literal[
    "io", "h2d", "forward", "backward", "update", "comm", "imbalance", "pipeline"
]
#: How the ranks' times were put on one clock: measured by ``collect``, shared by one host,
#: estimated from matched collectives, or not at all (several hosts, nothing to estimate from).
ClockSource = Literal["collect", "one host", "collectives", "unaligned"]
StragglerPhase = Literal["io", "h2d", "forward", "backward", "update", "other"]
Hidden = Literal["yes", "partly", "no", "n/a"]
Timeline = Literal["cpu", "gpu"]
StepMark = Literal["first", "warm-up", "slow", ""]
#: Why a step is left out of the headline figures (analysis/selection.py): a leading step well
#: above the median of the steps after it, or not among the steps --steps/--skip chose.
StepExclusion = Literal["warm-up", "selection"]
#: Where the steps come from: the trace's own markers, inferred from what repeats (how), or none
#: (the whole trace is one window).
StepsFrom = Literal[
    "markers",
    "step_groups",
    "session_runs",
    "annotations",
    "optimizer",
    "dataloader",
    "backward",
    "one_window",
]


def from_json(data: bytes | str, kind: type[R]) -> R:
    """A result read back from its JSON (``kind`` is the struct it was written from)."""
    return msgspec.json.decode(data, type=kind)


class Breakdown(Result):
    """Exclusive time per phase (ms): the phases of a step, each instant counted once."""

    io: float = 0.0
    h2d: float = 0.0
    forward: float = 0.0
    backward: float = 0.0
    update: float = 0.0
    comm: float = 0.0
    other: float = 0.0
    idle: float = 0.0

    def __getitem__(self, phase: str) -> float:
        if phase not in S.BREAKDOWN_PHASES:
            raise KeyError(phase)
        return float(getattr(self, phase))

    def items(self) -> Iterator[tuple[str, float]]:
        for phase in S.BREAKDOWN_PHASES:
            yield phase, self[phase]

    def total(self) -> float:
        return sum(value for _, value in self.items())

    @classmethod
    def of(cls, values: dict[str, float]) -> Breakdown:
        return cls(**{p: float(values.get(p, 0.0)) for p in S.BREAKDOWN_PHASES})


# The breakdown's fields are the phases, in report order: renaming or reordering one of them
# without the other would silently mislabel every figure.
assert Breakdown.__struct_fields__ == S.BREAKDOWN_PHASES, "Breakdown fields != BREAKDOWN_PHASES"


# --- the run report (``traceview report --json``) -----------------------------------------------


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


#: How a rank's allocated memory moves across steps (analysis/memory.py): "leak" grew at every
#: step, "creep" at most steps, "steady" otherwise.
Growth = Literal["leak", "creep", "steady"]


class StepMemory(Result):
    """Allocated memory of one device in one step window (MiB: 2**20 bytes)."""

    step: int | None
    start_mb: float | None  # when the step starts (what the last record before it left)
    end_mb: float | None  # when it ends
    peak_mb: float | None  # the most at any instant of the step
    peak_phase: Phase | None = None


class DeviceMemory(Result):
    """One device of one rank: what its allocator held (MiB: 2**20 bytes). Null: not recorded."""

    peak_mb: float | None  # the most allocated at once over the trace
    peak_phase: Phase | None  # the phase running when it peaked
    peak_op: str | None  # the operator running then (untrusted: from the trace)
    peak_step: int | None  # the step it peaked in (null: outside the steps, or unnumbered)
    reserved_peak_mb: float | None  # the allocator's reserve at its largest (null on CPU)
    start_mb: float | None  # when the first step starts
    end_mb: float | None  # when the last step ends
    growth_mb_per_step: float | None  # least-squares slope of the steps' end (null: < 3 steps)
    growth: Growth | None
    since_profiling_started: bool  # counts only allocations made while profiling (CPU)
    steps: list[StepMemory] = []


class RankMemory(Result):
    """A rank's memory: the figures of its main device (an accelerator where it has one, else
    the CPU), and every device's in ``by_device``."""

    device: str
    peak_mb: float | None
    peak_phase: Phase | None
    peak_op: str | None
    peak_step: int | None
    reserved_peak_mb: float | None
    growth_mb_per_step: float | None
    growth: Growth | None
    since_profiling_started: bool
    by_device: dict[str, DeviceMemory]


class RunMemory(Result):
    """Memory across ranks: the highest peak and how far above the others' it is."""

    peak_mb: float
    peak_rank: int
    device: str  # the device of that peak
    # its peak less the median of the other ranks' (on the same kind of device), in MiB and as
    # a fraction of that median; null with one rank
    excess_mb: float | None
    imbalance: float | None
    median_mb: float | None  # the median of the other ranks' peaks (null with one rank)
    imbalanced: bool | None  # far above the others (a warning): the first to run out
    leaking_ranks: list[int] = []  # ranks whose main device's memory grows step after step


class HostBound(Result):
    """The host-bound part of each phase of a breakdown (ms; GPU timelines): the device idle
    while the host is inside that phase, launching its work. Already counted in the phase's
    figure of ``breakdown_ms`` (phase = its kernels' time + this), reported apart so the two
    never merge silently."""

    h2d: float
    forward: float
    backward: float
    update: float

    def __getitem__(self, phase: str) -> float:
        if phase not in S.GPU_HOST_BOUND_PHASES:
            raise KeyError(phase)
        return float(getattr(self, phase))


assert HostBound.__struct_fields__ == S.GPU_HOST_BOUND_PHASES, "HostBound != GPU_HOST_BOUND_PHASES"


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
    # Across ranks (analysis/crossrank.py), means over ranks; null where no collective was
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
    memory: RunMemory | None = None  # null: no rank has memory records
    # the host-bound part of breakdown_ms's phases, mean of ranks (a CPU rank's phases have
    # none); null where no rank has a GPU timeline
    host_bound_ms: HostBound | None = None
    # one-time startup before the first step (mean of ranks; CUDA context creation, first
    # allocations, autotuning, lazy initialization): outside every figure above; null: none known
    startup_ms: float | None = None


class GpuIdle(Result):
    """The device's idle time in a step (ms), by what the host did meanwhile."""

    host_bound: float  # inside an op of h2d, forward, backward or update: launching its work
    data: float  # in data loading
    other: float  # anything else (Python between phases, a synchronize outside any phase)


class GpuPhase(Result):
    """One phase on the device (ms per step): its kernels' time and the device's wait for the
    host inside it, never merged; ``total_ms`` is their sum (what a synchronized timer sees)."""

    phase: Phase
    device_ms: float  # kernels and copies (exclusive, cut among device events alone)
    # device idle while the host is inside this phase; with device_ms, the breakdown's phase
    host_bound_ms: float
    total_ms: float


class KernelLaunches(Result):
    """Kernels launched by the host (a runtime call per kernel), by phase and canonical op."""

    phase: Phase | None  # null with op: all of the rank's kernels
    op: str | None  # canonical operator of the launching call (untrusted)
    kernels_per_step: float
    # a kernel's launch delay (runtime call start to kernel start) is queueing (its stream
    # busy with earlier work) + launch latency (its stream idle): only the second is a launch
    # problem
    launch_latency_us_p50: float
    launch_latency_us_p95: float
    kernel_us_p50: float  # kernel duration
    kernel_us_p95: float
    launch_overhead_us_p50: float  # the launch call's own duration
    short_kernel_fraction: float  # kernels shorter than their launch call
    launch_queue_us_p50: float | None = None  # queueing (null: a stored analysis without it)
    launch_queue_us_p95: float | None = None
    queued_fraction: float | None = None  # the kernels' queueing / their launch delays, summed


class RankGpu(Result):
    """A GPU rank's device time explained (analysis/gpu.py), means per step."""

    busy_fraction: float  # device busy (any kernel, copy or memset) / step
    busy_ms: float
    idle_ms: GpuIdle  # busy_ms + host_bound + data + other = step_ms
    sync_ms: float  # host blocked in a device/stream synchronize, a blocking copy, .item()
    launches: float  # kernels launched per step
    # over all kernels (null: none linked to a launch): the stream idle part of the launch
    # delay, the queueing part (stream busy with earlier work) and its share of the delays
    launch_latency_us_p50: float | None
    launch_latency_us_p95: float | None
    short_kernel_fraction: float | None  # kernels shorter than the launch call that made them
    kernel_us_p50: float | None = None
    kernel_us_p95: float | None = None
    launch_queue_us_p50: float | None = None
    launch_queue_us_p95: float | None = None
    launch_queued_fraction: float | None = None
    queue_depth_max: int = 0  # operations launched, not yet started on the device: the most
    queue_depth_mean: float = 0.0  # time-weighted over the steps
    phases: list[GpuPhase] = []
    kernels: list[KernelLaunches] = []  # by phase and op, most launched first (up to 20)


#: host-bound: the device waits for the host launching work; data: for the data loader
GpuWait = Literal["host-bound", "data"]


class GpuVerdict(Result):
    """Said once (GPU runs): the device is idle a large share of the step while the host works."""

    rank: int  # the rank with the most idle device time
    wait: GpuWait
    idle_fraction: float  # device idle / step
    wait_fraction: float  # the idle time of this kind / step
    phase: Phase | None = None  # host-bound: the phase with the most host-bound time
    kernels_per_step: float | None = None  # host-bound: that phase's kernels launched per step
    kernel_us_p50: float | None = None  # and their median duration


class RankSummary(Result):
    rank: int
    steps: int
    step_ms: float
    breakdown_ms: Breakdown
    comm_total_ms: float
    comm_exposed_ms: float
    comm_hidden_fraction: float
    busy_ms: float  # step - exposed comm - idle: the rank's own work
    bottleneck: BottleneckPhase | None
    timeline: Timeline
    blocked_ms: float  # exposed comm + idle: waiting for the others (or the network)
    imbalance: float  # busy time against the median rank's (0.05: 5% busier)
    straggler: bool  # this rank is the straggler and it is significant
    clock_offset_us: float | None = None  # estimated from collectives (Clocks), else null
    comm_wait_ms: float | None = None  # per step, as in Summary
    comm_transfer_ms: float | None = None
    comm_wait_total_ms: float | None = None
    comm_transfer_total_ms: float | None = None
    # the others' exposed wait per step at the calls it arrived last to (summed over them)
    caused_wait_ms: float | None = None
    last_arrivals: int | None = None  # matched calls it arrived last to (where anyone waited)
    gpu: RankGpu | None = None  # device time explained (null on CPU runs)
    memory: RankMemory | None = None  # null: the rank's trace has no memory records
    host_bound_ms: HostBound | None = None  # part of breakdown_ms; null on a CPU timeline


#: What a critical path segment is (analysis/critical_path/): a rank's own work (CPU compute,
#: a device kernel, the device waiting for the host's launches: host_bound), communication the
#: path cannot lay on another rank (transfer), a rank that began the step after the first one
#: (late_start: carried in from before the window), or nothing running (idle).
PathKind = Literal["compute", "kernel", "launch", "transfer", "late_start", "host_bound", "idle"]


class PathSegment(Result):
    """One stretch of a step's critical path: on ``rank``, from ``start_ms`` after the job's step
    began (the first rank's start), for ``ms``."""

    rank: int
    phase: Phase | None  # null for a late start
    op: str | None  # the operator (or collective) holding the time, where one does (untrusted)
    kind: PathKind
    start_ms: float
    ms: float


class Blame(Result):
    """Time on the critical path of one rank in one phase and kind (ms per step)."""

    rank: int
    phase: Phase | None
    kind: PathKind
    ms: float
    share: float  # of the job's step
    # over what the median rank spends in that phase per step (the cause, where one rank is
    # slower); null for transfer and idle
    excess_ms: float | None = None


class OpBlame(Result):
    """Time on the critical path of one operator (or collective), all ranks (ms per step)."""

    op: str  # (untrusted)
    phase: Phase | None
    kind: PathKind
    ms: float


class PathStretch(NamedTuple):
    """A stretch of a step's critical path on the run's clock (what a timeline draws)."""

    rank: int
    phase: str | None
    op: str | None
    kind: str
    start_ns: int
    dur_ns: int


class StepPath(Result):
    """One step's critical path in brief: the job's step and who holds it."""

    step_ms: float  # first rank's start to last rank's end
    complete: bool  # every wait on the path explained (else ``reason``)
    reason: str | None
    blame: list[Blame]


class CriticalPath(Result):
    """Why the step takes as long as it does (analysis/critical_path/): the critical path of
    the median counted step across ranks, and blame over every counted step."""

    step_ms: float  # the median step's job step: first rank's start to last rank's end
    step: int | None  # which step that is
    steps: int  # counted steps with a path
    complete_steps: int  # of them, every wait explained
    segments: list[PathSegment]  # the median step's path, in time order
    blame: list[Blame]  # mean per counted step, largest first
    by_op: list[OpBlame]  # the operators on the path, largest first (up to 10)


class WhatIf(Result):
    """A replay of the counted steps with one change (analysis/critical_path/whatif.py): ``none``,
    ``balance``, ``balance:rank=N``, ``faster:NAME:K``, ``bandwidth:OP:GBPS``, ``hide_comm``,
    ``no_late_start``."""

    change: str
    step_ms: float  # mean replayed job step
    speedup: float  # the replay with no change over this one


class WhatIfs(Result):
    """``traceview whatif --json``: the replays asked for (the first: no change)."""

    steps: int  # counted steps replayed
    whatif: list[WhatIf]
    not_applicable: list[str] = []  # changes asked for that nothing in the run matches


class StepSummary(Result):
    """One step number across ranks. Every complete step is listed; ``excluded`` says why one
    is left out of the headline figures (summary, ranks, GPU, collectives): "warm-up" (a
    leading step over 1.3x the median of the steps after it) or "selection" (not among the
    steps --steps/--skip chose), ``excluded_reason`` in words; null: counted."""

    step: int | None
    ranks: int
    step_ms: float  # mean of ranks
    min_ms: float
    max_ms: float
    slowest_rank: int
    vs_median: float  # against the median step (0.1: 10% slower)
    breakdown_ms: Breakdown  # mean of ranks
    mark: StepMark  # leading steps well above the median: warm-up; later ones: slow
    host_bound_ms: HostBound | None = None  # part of breakdown_ms, as in Summary
    # left out of every headline figure (summary, ranks, GPU, collectives), and why; null: counted
    excluded: StepExclusion | None = None
    excluded_reason: str | None = None
    critical_path: StepPath | None = None  # counted steps of runs with segments


class StepStats(Result):
    """How much the step time varies from step to step (over the counted steps' step_ms)."""

    count: int
    mean_ms: float
    median_ms: float
    stdev_ms: float
    min_ms: float
    max_ms: float
    cv: float  # stdev / mean
    warmup_factor: float  # leading steps over this × the median of the later steps: warm-up
    slow_factor: float  # later steps over this × the median are marked slow


class TopOp(Result):
    op: str  # canonical name (untrusted: from the trace or the rules)
    name: str  # the most frequent name in the trace (untrusted)
    device: Timeline
    phase: Phase
    calls_per_step: float
    self_ms_per_step: float
    total_ms_per_step: float
    p95_ms: float  # per call, the largest of the ranks' p95
    mean_ms: float  # per call
    share: float  # self time as a fraction of the step


class ProcessGroup(Result):
    """A process group the run's ranks declare (PyTorch's ``distributedInfo.pg_config``)."""

    name: str  # (untrusted)
    desc: str | None  # its description: ``default_pg``, ``mesh_tp`` (untrusted)
    dim: str | None  # the DeviceMesh dimension it belongs to (``tp``), null outside a mesh
    ranks: list[int]


class CommByGroup(Result):
    """A process group's communication in one phase, by collective (means over the group's
    ranks, per step): what each dimension of a parallel job costs where it is issued."""

    group: str | None  # (untrusted)
    dim: str | None  # the mesh dimension, where the group has one
    ranks: list[int] | None  # the group's ranks, where declared
    phase: str  # where the calls were issued: forward, backward, update, io, h2d, other
    op: str  # the collective (untrusted)
    calls_per_step: float
    bytes_per_step: int | None  # where the trace records sizes
    total_ms: float  # the calls' time from issue to end, overlapping calls counted once
    exposed_ms: float  # of it, nothing else of the rank's ran then (the breakdown's comm)
    hidden_ms: float  # of it, behind compute
    wait_ms: float  # inside the calls, waiting for the last member (or the peer)
    transfer_ms: float  # moving data: the rest of the calls, less queued
    queued_ms: float = 0.0  # the last member's own queue (wait + transfer + queued = total)


class FsdpGather(Result):
    """FSDP's all-gathers of one unit in one phase: prefetched or not, and how far ahead of its
    use each finished (means per step over the ranks; times from the rank's own view of the
    call: the kernel on a GPU, gloo's worker run on a CPU)."""

    phase: str  # where they were issued: forward or backward
    unit: str  # FSDP's unit: the module's name, as FSDP's regions give it (untrusted)
    calls_per_step: float
    prefetched: float  # the share issued ahead of the unit (a prefetch), 0 to 1
    total_ms: float  # from issue to end, per step
    exposed_ms: float  # of it, nothing else of the rank ran then
    # from issue, and from the end, to when the unit first used what they gathered (its
    # copy-out): medians over the calls whose use the trace shows (null: none). On a GPU a
    # copy-out kernel cannot start before its all-gather ends, so 0 there means it waited.
    issued_ahead_ms: float | None
    ahead_ms: float | None
    ahead_min_ms: float | None  # the least of them


class AllToAllRank(Result):
    """One rank's matched all-to-alls in one group (expert parallelism), means per step."""

    rank: int
    group: str | None  # (untrusted)
    calls_per_step: float
    bytes_per_step: int | None  # what it sent, where the trace records sizes
    transfer_ms: float  # its calls' transfer (not the wait for the last member)
    # the largest of a call's split sizes over their mean (1.0: even), the mean over its calls
    # whose splits the trace records (NCCL's In/Out split size; c10d's recorded arguments with
    # gloo); null where none is recorded
    split_imbalance: float | None
    # what the imbalance costs: a call's transfer is set by its largest split, so an even split
    # of the same bytes would take transfer / imbalance; this is the rest, per step
    imbalance_ms: float | None


class PipelineStage(Result):
    """One stage of a pipeline (means over its ranks, ms per step)."""

    stage: int
    ranks: list[int]  # the ranks that run it (one per data-parallel replica)
    compute_ms: float  # forward + backward + update
    bubble_ms: float  # blocked on the neighbours: the step less compute, data, other, collectives
    transfer_ms: float  # the part of the bubble in which its incoming messages were moving


class Pipeline(Result):
    """A pipeline the run's point-to-point calls form: stages in order (stage 0 sends first)."""

    stages: list[PipelineStage]
    microbatches: float  # sends from stage 0 to stage 1 per step (or the schedule's own)
    # GPipe: every forward before any backward; interleaved: several stages per rank
    # (torch.distributed.pipelining's annotations); zero-bubble: those, backward split in two
    schedule: Literal["GPipe", "1F1B", "interleaved", "zero-bubble"]
    bubble_fraction: float  # the stages' bubble over their step time
    # equal stages, no transfer: (p - 1) / (m + p - 1), interleaved (p - 1) / (v m + p - 1);
    # null for a zero-bubble schedule (its ideal depends on how the backward splits)
    ideal_bubble_fraction: float | None
    slowest_stage: int  # the most compute
    slowest_phase: StragglerPhase | None  # where it spends its extra time over the others
    slowest_phase_ratio: float | None  # that phase on the slowest stage over the others' median
    stage_count: int = 0  # the pipeline's stages, each with a trace or not (0: those listed)
    virtual_stages: int = 1  # stages each rank holds (interleaved schedules: more than one)

    @property
    def depth(self) -> int:
        """The number of stages, those without a trace included."""
        return self.stage_count or len(self.stages)

    @property
    def untraced(self) -> list[int]:
        """The stages none of whose ranks has a trace."""
        return sorted(set(range(self.depth)) - {s.stage for s in self.stages})


class CollectiveSummary(Result):
    """One collective across ranks: a view at one position of the step (the n-th call of
    ``name`` in every step), over its matched calls."""

    op: str  # the collective: allreduce, allgather, broadcast... (untrusted)
    name: str  # the view: the event that makes the call (untrusted)
    group: str | None  # process group, where the trace names it or it was told (untrusted)
    position: int  # the call's place among the step's calls of this view (0: first)
    calls_per_step: float  # steps it was matched in, per step of the run
    ranks: int  # ranks that take part
    bytes: int | None  # message size, where the trace records it
    transfer_ms: float  # mean over ranks and calls: from the last arrival to the end
    wait_ms: float  # mean over ranks and calls: inside the call before the last arrival
    skew_ms: float  # mean over calls: last arrival minus first
    last_rank: int  # the rank that most often arrived last
    algorithm: str | None = None  # NCCL's algorithm_protocol, where the kernel name says it
    # what each link moved during the transfer (nccl-tests' bus bandwidth), where bytes are known
    busbw_gbps: float | None = None
    group_ranks: list[int] | None = None  # the group's ranks, where the run declares it
    queued_ms: float = 0.0  # mean over ranks and calls: the last rank's own queue before it began


class IncompleteStep(Result):
    """A step that did not complete on every rank: left out of every figure of the report."""

    step: int | None
    unfinished_ranks: list[int]  # ranks it did not finish on (the rank died or was cut off in
    #                              it) or has no window on
    waited_ms: float  # the most time a rank spent in it blocked (exposed comm + idle)
    waited_rank: int | None  # that rank


class StepCollective(Result):
    """One matched collective call in one step, across its ranks: what a timeline marks."""

    name: str  # the view (untrusted)
    collective: str
    position: int  # its place among the step's calls of this view
    skew_ns: int  # last arrival minus first
    last_rank: int
    arrivals: dict[int, int]  # rank -> start_ns on the rank's own clock (as its events are)


class Spread(Result):
    """One figure across ranks (ms per step): its percentiles and extremes."""

    p50: float
    p90: float
    max: float
    max_rank: int
    min: float
    min_rank: int


class RankSpread(Result):
    """The ranks as a distribution, for runs too large to read rank by rank."""

    ranks: int
    step_ms: Spread
    breakdown_ms: dict[str, Spread]  # by phase, as in Breakdown
    busy_ms: Spread  # the rank's own work: step - exposed comm - idle
    blocked_ms: Spread
    comm_wait_ms: Spread | None  # null where collectives were not matched across ranks
    # by own work (busy_ms; in synchronous training every rank's step lasts as long as the
    # slowest rank's), up to 5 each: the slowest first, the fastest first
    slowest_ranks: list[int]
    fastest_ranks: list[int]


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

    @property
    def straggler(self) -> RankSummary | None:
        """The significant straggler, if there is one."""
        return next((r for r in self.ranks if r.straggler), None)


# --- compare ---------------------------------------------------------------------------------


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


# --- scaling ---------------------------------------------------------------------------------


class ScalingBase(Result):
    label: str
    ranks: int
    step_ms: float
    breakdown_ms: Breakdown


class Prediction(Result):
    step_ms: float
    speedup: float | None
    error: float | None  # |predicted - measured| / measured


class OwnPrediction(Result):
    step_ms: float
    error: float | None


class AllReduceRate(Result):
    bytes_per_step: int
    algbw_gbps: float
    busbw_gbps: float
    efficiency: float
    bus_efficiency: float


class ScaledRun(Result):
    label: str
    ranks: int
    step_ms: float
    speedup: float | None
    efficiency: float | None
    batch_size: int | None
    batch_size_from: Literal["user", "input shapes"] | None
    samples_per_s: float | None
    compute_ratio: float | None  # compute per step against the smallest run's
    comm_total_ms: float
    comm_exposed_ms: float
    comm_hidden_fraction: float
    breakdown_ms: Breakdown
    predicted: dict[str, Prediction]  # model -> prediction from the smallest run
    predicted_own_compute: dict[str, OwnPrediction]  # model -> on this run's own breakdown
    what_if: dict[str, float | None]  # <what>_ms and <what>_speedup
    allreduce: AllReduceRate | None  # with --link-gbps, where message sizes are known
    # t_comm(N) the models used: the transfer (all of it, hidden included) where collectives
    # were matched across ranks, else comm_total_ms
    comm_model_ms: float | None = None
    comm_wait_ms: float | None = None  # exposed wait for the last rank: imbalance, not modelled


class ModelFit(Result):
    mean_error: float | None


class CollectiveFit(Result):
    """A collective's transfer as latency + bytes / bandwidth, fitted on the runs' own matched
    calls (time = latency_ms x (ranks - 1) + bus bytes / bandwidth; bus bytes as nccl-tests
    count them: 2(n - 1)/n of the message for an all-reduce)."""

    op: str  # (untrusted)
    latency_ms: float  # per step of the algorithm (one per other rank)
    busbw_gbps: float | None  # Gb/s (bits); null: sizes unknown or no growth with size
    calls: int  # the matched calls (positions x runs) it was fitted on
    runs: list[int]  # the rank counts of the runs it was fitted on


class Extrapolation(Result):
    """A data-parallel step at a rank count never run, from the largest run and the fitted
    collectives: its step with the communication the model predicts there, at the largest run's
    share of communication exposed."""

    ranks: int
    comm_ms: float  # predicted transfer per step (each call's, summed)
    step_ms: float
    speedup: float | None  # against the smallest run (weak scaling)


class ExtrapolationCheck(Result):
    """The model fitted without the largest run, predicting it: how far off it is."""

    fitted_on: list[int]  # rank counts
    ranks: int
    predicted_comm_ms: float
    measured_comm_ms: float  # the largest run's calls' transfers per step, each call counted
    comm_error: float
    predicted_step_ms: float
    measured_step_ms: float
    step_error: float


class Scaling(Result):
    """``traceview scaling --json``."""

    base: ScalingBase
    runs: list[ScaledRun]
    models: dict[str, ModelFit]
    best_model: str | None
    batch_size: int | None
    link_gbps: float | None
    notes: list[str]
    schema_version: str = RESULTS_VERSION
    # ranks never run: a latency-bandwidth model per collective, the steps at 2x and 4x the
    # largest run's ranks, and the model checked on the largest run (fitted without it)
    collective_model: list[CollectiveFit] = []
    extrapolated: list[Extrapolation] = []
    extrapolation_check: ExtrapolationCheck | None = None


#: The results a command prints with ``--json``, by command.
JSON_RESULTS: dict[str, type[Result]] = {
    "report": RunReport,
    "compare": Comparison,
    "scaling": Scaling,
}


def json_schema(command: str) -> dict[str, Any]:
    """The JSON Schema of ``traceview COMMAND --json`` (docs/schema/COMMAND.schema.json)."""
    schema: dict[str, Any] = _clean_descriptions(msgspec.json.schema(JSON_RESULTS[command]))
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"traceview {command} --json",
        "description": f"The object `traceview {command} --json` prints (results version "
        f"{RESULTS_VERSION}). Keys are never removed or retyped once published; data a run "
        "does not have is null.",
        **schema,
    }


def _clean_descriptions(node: Any) -> Any:
    """Every ``description`` (a docstring) without the indentation its source gave it, as
    ``inspect.cleandoc`` leaves it, whichever release of msgspec wrote the schema (0.23 strips
    it, earlier ones kept it)."""
    import inspect

    if isinstance(node, dict):
        return {
            key: inspect.cleandoc(value)
            if key == "description" and isinstance(value, str)
            else _clean_descriptions(value)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_clean_descriptions(value) for value in node]
    return node
