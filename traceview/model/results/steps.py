"""Per step: each step across ranks, how the step time varies, the top operators per step, and
the steps that did not complete on every rank."""

from __future__ import annotations

from collections import Counter

from traceview.model.results.base import (
    Breakdown,
    Phase,
    Result,
    StepExclusion,
    StepMark,
    Timeline,
)
from traceview.model.results.critical_path import StepPath
from traceview.model.results.gpu import HostBound


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
    p95_ms: float  # per call, the largest of the ranks' (and counted steps') p95
    mean_ms: float  # per call
    share: float  # self time as a fraction of the step


class OutsideOp(Result):
    """An operator's time outside the counted steps (set-up before the first step, warm-up and
    other steps left out, teardown after the last): reported apart from the per-step figures,
    in all, mean of the ranks."""

    op: str  # canonical name (untrusted)
    name: str  # the most frequent name in the trace (untrusted)
    device: Timeline
    phase: Phase
    calls: float
    self_ms: float
    total_ms: float


class IncompleteStep(Result):
    """A step that did not complete on every rank: left out of every figure of the report."""

    step: int | None
    unfinished_ranks: list[int]  # ranks it did not finish on (the rank died or was cut off in
    #                              it) or has no window on
    waited_ms: float  # the most time a rank spent in it blocked (exposed comm + idle)
    waited_rank: int | None  # that rank
    untraced_ranks: list[int] = []  # of unfinished_ranks, those whose traces hold no window
    #                                 of it (their traces stop before it, or skip it)


def incomplete_reason(per_step: list[StepSummary]) -> str:
    """Why the counted steps' critical paths are incomplete: the reason most of them give."""
    reasons = Counter(
        s.critical_path.reason
        for s in per_step
        if s.excluded is None and s.critical_path is not None and s.critical_path.reason
    )
    return reasons.most_common(1)[0][0] if reasons else "their communication is not all matched"
