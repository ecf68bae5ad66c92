"""The verdicts: hidden communication, the bottleneck, the straggler and its phase, the pipeline's
and the critical path's, each decided once from the figures."""

from __future__ import annotations

from typing import cast, get_args

import polars as pl

from traceview.analysis.critical_path import LATE_START, TRANSFER, Explained
from traceview.analysis.critical_path.cause import cause_words
from traceview.analysis.crossrank import CrossRank
from traceview.analysis.summary.units import _hidden, _mean, _mean_host_bound, _median
from traceview.model import schema as S
from traceview.model.results import (
    Blame,
    BottleneckPhase,
    Breakdown,
    Cause,
    CommByGroup,
    Hidden,
    Pipeline,
    RankSummary,
    StragglerPhase,
    Summary,
)

HIDDEN_YES = 0.9  # at least this fraction of communication overlaps compute: "hidden: yes"


HIDDEN_NO = 0.1  # at most this: "hidden: no"


STRAGGLER_MIN_WAIT = 0.05  # a straggler: the others wait for it at least 5% of the step


def hidden_verdict(comm_total_ns: float, hidden_fraction: float) -> Hidden:
    if comm_total_ns <= 0:
        return "n/a"
    if hidden_fraction >= HIDDEN_YES:
        return "yes"
    if hidden_fraction <= HIDDEN_NO:
        return "no"
    return "partly"


def bottleneck_of(breakdown_ms: Breakdown) -> BottleneckPhase | None:
    shares = {p: breakdown_ms[p] for p in S.BOTTLENECK_PHASES}
    best = max(shares, key=lambda p: shares[p])
    return cast(BottleneckPhase, best) if shares[best] > 0 else None


_STRAGGLER_PHASES: tuple[StragglerPhase, ...] = (
    "io",
    "h2d",
    "forward",
    "backward",
    "update",
    "other",
)


#: a straggler whose cause is its idling is named with its own work's phase where that work
#: exceeds the median rank's by this share of the step on the critical path
IDLE_PHASE_FLOOR = 0.05


def _straggler_phase(
    straggler: RankSummary, ranks: list[RankSummary]
) -> tuple[StragglerPhase, float, float] | None:
    """The phase in which the straggler spends the most time over the median of the other ranks
    (its own work, not communication or idle): (phase, its ms, the others' median ms)."""
    best: tuple[StragglerPhase, float, float] | None = None
    others = [r for r in ranks if r is not straggler]
    for phase in _STRAGGLER_PHASES:
        median = _median([r.breakdown_ms[phase] for r in others])
        own = straggler.breakdown_ms[phase]
        if own - median > 0 and (best is None or own - median > best[1] - best[2]):
            best = (phase, own, round(median, 3))
    return best


def _summary(ranks: list[RankSummary], ranks_df: pl.DataFrame, cross: CrossRank | None) -> Summary:
    if not ranks:
        return Summary(
            breakdown_ms=Breakdown(), step_ms=0.0, comm_total_ms=0.0, comm_exposed_ms=0.0,
            comm_hidden_fraction=0.0, hidden="n/a", bottleneck=None, bottleneck_share=0.0,
            straggler_rank=None, straggler_excess=0.0, straggler_significant=None, blocked_ms=0.0,
        )  # fmt: skip
    n = len(ranks)
    breakdown = Breakdown(
        **{p: round(sum(r.breakdown_ms[p] for r in ranks) / n, 3) for p in S.BREAKDOWN_PHASES}
    )
    total = float(ranks_df["comm_total_sum"].sum())
    exposed = float(ranks_df["comm_exposed_sum"].sum())
    hidden = _hidden(total, exposed)
    bottleneck: BottleneckPhase | None = bottleneck_of(breakdown)
    step_ms = round(sum(r.step_ms for r in ranks) / n, 3)
    straggler_rank, excess, significant = None, 0.0, None
    waited_for: float | None = None
    phase: tuple[StragglerPhase, float, float] | None = None
    if n > 1:
        median = _median([r.busy_ms for r in ranks])
        matched = [r for r in ranks if r.caused_wait_ms is not None]
        if matched and any(r.caused_wait_ms for r in matched):
            # the rank the others wait for: the most wait caused; on a tie, the least own wait
            slowest = max(matched, key=lambda r: (r.caused_wait_ms, -(r.comm_wait_total_ms or 0)))
            waited_for = round((slowest.caused_wait_ms or 0.0) / (n - 1), 3)
            significant = step_ms > 0 and waited_for >= STRAGGLER_MIN_WAIT * step_ms
        else:  # nobody waits (balanced), or nothing matched (not known): the busiest rank
            slowest = max(ranks, key=lambda r: r.busy_ms)
            significant = False if matched else None
        excess = (slowest.busy_ms - median) / median if median > 0 else 0.0
        straggler_rank = slowest.rank
        slowest.straggler = bool(significant)
        if significant:
            phase = _straggler_phase(slowest, ranks)
    comm_wait = _mean([r.comm_wait_ms for r in ranks])
    comm_exposed = round(sum(r.comm_exposed_ms for r in ranks) / n, 3)
    if bottleneck == S.COMM and comm_wait is not None and comm_wait > comm_exposed - comm_wait:
        bottleneck = "imbalance"  # most of the exposed communication is waiting for a rank
    share = comm_wait if bottleneck == "imbalance" else (breakdown[bottleneck] if bottleneck else 0)
    return Summary(
        breakdown_ms=breakdown,
        step_ms=step_ms,
        comm_total_ms=round(sum(r.comm_total_ms for r in ranks) / n, 3),
        comm_exposed_ms=comm_exposed,
        comm_hidden_fraction=hidden,
        hidden=hidden_verdict(total, hidden),
        bottleneck=bottleneck,
        bottleneck_share=round((share or 0) / step_ms, 4) if bottleneck and step_ms else 0.0,
        straggler_rank=straggler_rank,
        straggler_excess=round(excess, 4),
        straggler_significant=significant,
        blocked_ms=round(sum(r.blocked_ms for r in ranks) / n, 3),
        comm_wait_ms=comm_wait,
        comm_transfer_ms=_mean([r.comm_transfer_ms for r in ranks]),
        comm_wait_total_ms=_mean([r.comm_wait_total_ms for r in ranks]),
        comm_transfer_total_ms=_mean([r.comm_transfer_total_ms for r in ranks]),
        straggler_wait_ms=waited_for,
        straggler_phase=phase[0] if phase else None,
        straggler_phase_ms=phase[1] if phase else None,
        straggler_phase_median_ms=phase[2] if phase else None,
        host_bound_ms=_mean_host_bound([r.host_bound_ms for r in ranks]),
    )


#: A pipeline's bubble is the bottleneck from this share of the stages' time (what the stages lose
#: to each other, whatever phase is the largest); its slowest stage is the straggler from this much
#: more compute than the median stage.
PIPELINE_BUBBLE_MIN = 0.2


PIPELINE_SLOW_STAGE = 0.2


PIPELINE_SLOW_PHASE = 1.5  # ... or one phase this many times the other stages' median


def _pipeline_verdict(summary: Summary, ranks: list[RankSummary], pipeline: Pipeline) -> None:
    """A pipeline's ranks wait on their neighbours by design: the bubble, not the ranks'
    imbalance, is what the step loses, and the straggler is the slowest stage."""
    bubble = pipeline.bubble_fraction
    if bubble >= PIPELINE_BUBBLE_MIN:
        summary.bottleneck = "pipeline"
        summary.bottleneck_share = bubble
    slowest = next(s for s in pipeline.stages if s.stage == pipeline.slowest_stage)
    median = _median([s.compute_ms for s in pipeline.stages if s is not slowest])
    ratio = pipeline.slowest_phase_ratio or 0.0
    significant = median > 0 and (
        (slowest.compute_ms - median) / median >= PIPELINE_SLOW_STAGE
        or ratio >= PIPELINE_SLOW_PHASE
    )
    for r in ranks:
        r.straggler = significant and r.rank in slowest.ranks
    summary.straggler_rank = slowest.ranks[0]
    summary.straggler_significant = significant
    summary.straggler_excess = round((slowest.compute_ms - median) / median, 4) if median else 0.0
    if significant and pipeline.slowest_phase is not None:
        phase = pipeline.slowest_phase
        mine = [r.breakdown_ms[phase] for r in ranks if r.rank in slowest.ranks]
        rest = [r.breakdown_ms[phase] for r in ranks if r.rank not in slowest.ranks]
        summary.straggler_phase = phase
        summary.straggler_phase_ms = round(sum(mine) / len(mine), 3)
        summary.straggler_phase_median_ms = round(_median(rest), 3) if rest else None
    else:
        summary.straggler_phase = summary.straggler_phase_ms = None
        summary.straggler_phase_median_ms = None


def _cause_verdict(
    summary: Summary, ranks: list[RankSummary], explained: Explained, pipeline: Pipeline | None
) -> None:
    """The verdicts from the critical path's causes (``critical_path.cause``): the cause is what
    the step loses most to; the straggler is the cause a rank holds alone (its own work beyond
    the others', a late start, idling) that saves the most, the cause itself or a lesser one
    beside a cause of the whole run (communication, data loading); the bottleneck follows the
    cause, and with no cause (nothing saves more than the noise: a balanced run) it is the
    largest phase and no rank is named. The comparison against the median rank stays under its
    own names (``*_by_median``)."""
    summary.straggler_rank_by_median = summary.straggler_rank
    summary.straggler_phase_by_median = summary.straggler_phase
    summary.bottleneck_by_median = summary.bottleneck
    if explained.path is None or not ranks:
        return
    cause, straggler = explained.cause, explained.straggler
    for found in {id(c): c for c in (cause, straggler) if c is not None}.values():
        stage = _stage_of(found.rank, pipeline) if found.stage is None else None
        if stage is not None:  # (a stage of its own: the critical path's, from the actions)
            found.stage = stage
            found.text = cause_words(found, found.step_ms * found.speedup, len(ranks))
    summary.cause = cause
    path = explained.path
    # (where the paths are not explained, the ranks' waits are not known: the wait-based rule
    # stands; where they name no straggler, a pipeline's slowest stage, its own rule, stands)
    stage_named = pipeline is not None and bool(summary.straggler_significant)
    if len(ranks) > 1 and path.explained and (straggler is not None or not stage_named):
        _straggler(summary, ranks, straggler, path.blame)
    if cause is None:
        largest = bottleneck_of(summary.breakdown_ms)
        if summary.bottleneck != "pipeline" or largest is None:
            summary.bottleneck = largest
            summary.bottleneck_share = _breakdown_share(summary, largest)
        return
    if cause.kind == TRANSFER:
        bottleneck: BottleneckPhase | None = "comm"
    elif cause.kind in (LATE_START, S.SEGMENT_IDLE) and len(ranks) > 1:
        bottleneck = "imbalance"  # (ranks waiting for one that is not working)
    elif cause.kind not in (LATE_START, S.SEGMENT_IDLE) and cause.phase in S.BOTTLENECK_PHASES:
        bottleneck = cause.phase
    else:
        # (the cause is no phase, one rank idling among them: the largest phase is the
        # bottleneck, its share the breakdown's, not the cause's saving; a pipeline's bubble
        # keeps the share its own rule gave it)
        if summary.bottleneck in S.BREAKDOWN_PHASES:
            summary.bottleneck_share = _breakdown_share(summary, summary.bottleneck)
        return
    summary.bottleneck = bottleneck
    # (of the job's step the replay starts from: what the cause's saving is a part of)
    job_step = cause.step_ms + cause.ms
    summary.bottleneck_share = round(cause.ms / job_step, 4) if job_step > 0 else 0.0


def _breakdown_share(summary: Summary, phase: BottleneckPhase | None) -> float:
    """``phase``'s share of the step in the breakdown (0 where it is none of its phases)."""
    if phase is None or phase not in S.BREAKDOWN_PHASES or not summary.step_ms:
        return 0.0
    return round(summary.breakdown_ms[phase] / summary.step_ms, 4)


def _transfer_group(explained: Explained, by_group: list[CommByGroup], ranks: int) -> None:
    """A cause of exposed transfer is in the process group whose calls of its collective are
    exposed the most (where the run's groups are known), and says so."""
    for found in (explained.cause, explained.straggler):
        if found is None or found.kind != TRANSFER or found.op is None or found.group:
            continue
        mine = [g for g in by_group if g.op == found.op and g.group is not None]
        if mine:
            found.group = max(mine, key=lambda g: (g.exposed_ms, g.total_ms)).group
            found.text = cause_words(found, found.step_ms * found.speedup, ranks)


def _stage_of(rank: int | None, pipeline: Pipeline | None) -> int | None:
    if rank is None or pipeline is None:
        return None
    # (a rank holding several virtual stages: the one with the most compute)
    held = [s for s in pipeline.stages if rank in s.ranks]
    return max(held, key=lambda s: s.compute_ms).stage if held else None


def _straggler(
    summary: Summary, ranks: list[RankSummary], straggler: Cause | None, blame: list[Blame]
) -> None:
    """The straggler named (or none: ``straggler_significant`` false) from the critical path;
    its phase is the cause's, or where the cause is its idling, the phase of its own work the
    path holds most over the median rank's (where it holds any more; a late start names none)."""
    for r in ranks:
        r.straggler = straggler is not None and r.rank == straggler.rank
    summary.straggler_significant = straggler is not None
    summary.straggler_phase = summary.straggler_phase_ms = None
    summary.straggler_phase_median_ms = None
    if straggler is None or straggler.rank is None:
        return
    summary.straggler_rank = straggler.rank
    mine = next((r for r in ranks if r.rank == straggler.rank), None)
    if mine is None:
        return
    median = _median([r.busy_ms for r in ranks])
    summary.straggler_excess = round((mine.busy_ms - median) / median, 4) if median else 0.0
    if mine.caused_wait_ms is not None:  # the others' wait at the calls it arrived last to
        summary.straggler_wait_ms = round(mine.caused_wait_ms / (len(ranks) - 1), 3)
    phase = straggler.phase
    if phase is None and straggler.kind == S.SEGMENT_IDLE:
        own = [
            b
            for b in blame
            if b.rank == straggler.rank
            and b.phase in get_args(StragglerPhase)
            # (its own work over the median rank's by a share of the step: not the noise of
            # ranks sharing cores, where the idling is all the cause there is)
            and (b.excess_ms or 0) >= IDLE_PHASE_FLOOR * summary.step_ms
        ]
        phase = max(own, key=lambda b: (b.excess_ms or 0, b.ms)).phase if own else None
    if phase in get_args(StragglerPhase):
        others = [r.breakdown_ms[phase] for r in ranks if r is not mine]  # type: ignore[index]
        summary.straggler_phase = phase  # type: ignore[assignment]
        summary.straggler_phase_ms = round(mine.breakdown_ms[phase], 3)  # type: ignore[index]
        summary.straggler_phase_median_ms = round(_median(others), 3) if others else None
