"""Communication across ranks: process groups, communication by group, all-to-alls, FSDP's
all-gathers, the pipeline that point-to-point calls form, and collectives matched across ranks."""

from __future__ import annotations

from typing import Literal

from traceview.model.results.base import Result, StragglerPhase


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


class GatherSpan(Result):
    """One of FSDP's all-gathers on one rank in one step, as the TUI's FSDP view draws it: from
    issue to end, and when its unit first used what it gathered (ns, the rank's own clock)."""

    unit: str  # (untrusted)
    phase: str  # where it was issued: forward or backward
    prefetched: bool
    issued_ns: int
    end_ns: int
    needed_ns: int | None  # null: its use is not in the trace


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


class StepCollective(Result):
    """One matched collective call in one step, across its ranks: what a timeline marks."""

    name: str  # the view (untrusted)
    collective: str
    position: int  # its place among the step's calls of this view
    skew_ns: int  # last arrival minus first
    last_rank: int
    arrivals: dict[int, int]  # rank -> start_ns on the rank's own clock (as its events are)
    group: str | None = None  # its process group (untrusted; null: not known)
