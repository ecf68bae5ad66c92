"""The run report: per-rank, per-step and run-wide means, every verdict computed once.

Bottleneck, hidden communication, straggler (and whether it is significant), each rank's
imbalance and blocked time, warm-up and slow steps: all decided here, into
``results.RunReport``, which the text report, ``report --json`` and the TUI render as they are
(docs/design.md).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from typing import Any, cast, get_args

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from traceview.analysis.critical_path import (
    NO_STEP,
    PATH_VERSION,
    Explained,
    PathCache,
    explain,
)
from traceview.analysis.crossrank import (
    ClockFit,
    CrossRank,
    Matched,
    alltoall_ranks,
    bus_bandwidth_gbps,
    collective_rows,
    comm_by_group,
    cross_rank,
    global_peer,
    launch_views,
    match_collectives,
)
from traceview.analysis.fsdp import fsdp_gathers
from traceview.analysis.gpu import gpu_verdict, phase_launches, rank_gpu
from traceview.analysis.groups import Groups, declared_groups
from traceview.analysis.memory import memory_results
from traceview.analysis.pipeline import POINT_TO_POINT, annotated_stages, detect_pipeline
from traceview.analysis.selection import (
    WARMUP_FACTOR,
    Selection,
    StepChoice,
    kept_rows,
    select_steps,
)
from traceview.model import schema as S
from traceview.model.columns import TableOnDemand
from traceview.model.manifest import Collected, Manifest
from traceview.model.results import (
    BottleneckPhase,
    Breakdown,
    Clocks,
    CollectiveSummary,
    FsdpGather,
    Hidden,
    HostBound,
    IncompleteStep,
    JobInfo,
    Pipeline,
    RankSpread,
    RankSummary,
    RunInfo,
    RunReport,
    Spread,
    StepMark,
    StepsFrom,
    StepStats,
    StepSummary,
    StragglerPhase,
    Summary,
    TopOp,
)

HIDDEN_YES = 0.9  # at least this fraction of communication overlaps compute: "hidden: yes"
HIDDEN_NO = 0.1  # at most this: "hidden: no"
STRAGGLER_MIN_WAIT = 0.05  # a straggler: the others wait for it at least 5% of the step
SLOW_FACTOR = 1.25  # a later step this much slower than the median is marked slow


def _ms(ns: float | int | None) -> float:
    return round(float(ns or 0) / 1e6, 3)


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


def _rank_rows(steps: pl.DataFrame, cross: CrossRank | None) -> pl.DataFrame:
    phase_cols = [S.phase_ns(p) for p in S.BREAKDOWN_PHASES]
    if cross is not None and cross.available:
        steps = steps.join(cross.waits, on=[S.RANK, S.STEP], how="left", nulls_equal=True)
        steps = steps.with_columns(pl.col("wait_ns", "wait_total_ns").fill_null(0))
        unknown = cross.matched.unknown_steps.with_columns(pl.lit(False).alias("known"))
        steps = steps.join(unknown, on=[S.RANK, S.STEP], how="left", nulls_equal=True)
        steps = steps.with_columns(pl.col("known").fill_null(True))
    else:
        steps = steps.with_columns(
            pl.lit(None, pl.Int64).alias("wait_ns"),
            pl.lit(None, pl.Int64).alias("wait_total_ns"),
            pl.lit(False).alias("known"),
        )

    def share(wait: str, comm: str) -> pl.Expr:
        """The rank's mean ``comm`` per step times the share of it that was waiting in the
        steps where every call was matched (a step with a call left unmatched has an unknown
        wait: counting it as transfer would overstate the transfer)."""
        known = pl.col("known")
        part = pl.col(wait).filter(known).sum()
        whole = pl.col(comm).filter(known).sum()
        return (
            pl.when(known.any())
            .then(pl.when(whole > 0).then(part / whole * pl.col(comm).mean()).otherwise(0.0))
            .otherwise(None)
            .alias(wait)
        )

    return (
        steps.group_by(S.RANK)
        .agg(
            share("wait_ns", S.COMM_EXPOSED_NS),
            share("wait_total_ns", S.COMM_TOTAL_NS),
            pl.len().alias("steps"),
            pl.col(S.WALL_NS).mean(),
            *(pl.col(c).mean() for c in phase_cols),
            pl.col(S.COMM_TOTAL_NS).mean(),
            pl.col(S.COMM_EXPOSED_NS).mean(),
            pl.col(S.COMM_TOTAL_NS).sum().alias("comm_total_sum"),
            pl.col(S.COMM_EXPOSED_NS).sum().alias("comm_exposed_sum"),
            pl.col(S.TIMELINE).first(),
            *(pl.col(S.host_bound_ns(p)).mean() for p in S.GPU_HOST_BOUND_PHASES),
        )
        .with_columns(
            (pl.col(S.WALL_NS) - pl.col(S.COMM_EXPOSED_NS) - pl.col(S.phase_ns(S.IDLE))).alias(
                "busy_ns"
            )
        )
        .sort(S.RANK)
    )


def _hidden(total: float, exposed: float) -> float:
    return round(1.0 - exposed / total, 4) if total > 0 else 0.0


def _exact_ms(ns: float) -> float:
    """ns as ms to the ns (6 decimals): figures views round again are not rounded twice."""
    return round(float(ns) / 1e6, 6)


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def _split(part_ns: float | None, whole_ms: float) -> tuple[float | None, float | None]:
    """(part, whole - part) in ms; (None, None) where the part is not known."""
    if part_ns is None:
        return None, None
    part = min(_ms(part_ns), whole_ms)
    return part, round(whole_ms - part, 3)


def _ranks(ranks_df: pl.DataFrame, cross: CrossRank | None) -> list[RankSummary]:
    rows = list(ranks_df.iter_rows(named=True)) if ranks_df.height else []
    median = _median([_ms(row["busy_ns"]) for row in rows])
    ranks = []
    caused = cross.arrivals.caused_exposed_ns if cross is not None and cross.available else None
    fit = cross.clocks if cross is not None else None
    last = cross.arrivals.last if cross is not None and cross.available else {}
    for row in rows:
        breakdown = Breakdown(**{p: _ms(row[S.phase_ns(p)]) for p in S.BREAKDOWN_PHASES})
        host_bound = _host_bound(row, _ms)
        busy = _ms(row["busy_ns"])
        wait, transfer = _split(row["wait_ns"], _ms(row[S.COMM_EXPOSED_NS]))
        wait_total, transfer_total = _split(row["wait_total_ns"], _ms(row[S.COMM_TOTAL_NS]))
        ranks.append(
            RankSummary(
                rank=row[S.RANK],
                steps=row["steps"],
                step_ms=_ms(row[S.WALL_NS]),
                breakdown_ms=breakdown,
                comm_total_ms=_ms(row[S.COMM_TOTAL_NS]),
                comm_exposed_ms=_ms(row[S.COMM_EXPOSED_NS]),
                comm_hidden_fraction=_hidden(row["comm_total_sum"], row["comm_exposed_sum"]),
                busy_ms=busy,
                bottleneck=bottleneck_of(breakdown),
                timeline=row[S.TIMELINE],
                blocked_ms=round(_ms(row[S.COMM_EXPOSED_NS]) + breakdown.idle, 3),
                imbalance=round((busy - median) / median, 4) if median > 0 else 0.0,
                straggler=False,
                comm_wait_ms=wait,
                comm_transfer_ms=transfer,
                comm_wait_total_ms=wait_total,
                comm_transfer_total_ms=transfer_total,
                clock_offset_us=round(fit.offset_ns[row[S.RANK]] / 1e3, 1)
                if fit is not None and row[S.RANK] in fit.offset_ns
                else None,
                caused_wait_ms=_ms(caused.get(row[S.RANK], 0) / max(row["steps"], 1))
                if caused is not None
                else None,
                last_arrivals=last.get(row[S.RANK], 0) if caused is not None else None,
                host_bound_ms=host_bound,
            )
        )
    return ranks


def _host_bound(row: dict[str, Any], to_ms: Callable[[float], float]) -> HostBound | None:
    """A row's host-bound parts (means, ns) in ms; null where the row has none (CPU)."""
    values = [row[S.host_bound_ns(p)] for p in S.GPU_HOST_BOUND_PHASES]
    if any(v is None for v in values):
        return None
    return HostBound(**{p: to_ms(v) for p, v in zip(S.GPU_HOST_BOUND_PHASES, values, strict=True)})


def _mean_host_bound(values: list[HostBound | None]) -> HostBound | None:
    """The mean over ranks of their host-bound parts (a CPU rank's phases have none: 0); null
    where no rank has any."""
    if all(v is None for v in values):
        return None
    return HostBound(
        **{
            p: round(sum(v[p] for v in values if v is not None) / len(values), 3)
            for p in S.GPU_HOST_BOUND_PHASES
        }
    )


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(sum(known) / len(values), 3) if known and len(known) == len(values) else None


_STRAGGLER_PHASES: tuple[StragglerPhase, ...] = (
    "io",
    "h2d",
    "forward",
    "backward",
    "update",
    "other",
)


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


def _per_step(
    df: pl.DataFrame, selection: Selection | None
) -> tuple[list[StepSummary], StepStats | None]:
    """Each step number across ranks, the ones the selection leaves out with why; the median,
    the marks and the statistics are over the counted steps: a later step well above their
    median is slow (named and kept)."""
    if df.height == 0:
        return [], None
    phase_cols = [S.phase_ns(p) for p in S.BREAKDOWN_PHASES]
    per_step = (
        df.group_by(S.STEP)
        .agg(
            pl.len().alias("ranks"),
            pl.col(S.WALL_NS).mean().alias("mean"),
            pl.col(S.WALL_NS).min().alias("min"),
            pl.col(S.WALL_NS).max().alias("max"),
            pl.col(S.RANK).sort_by(S.WALL_NS, S.RANK).last().alias("slowest"),
            *(pl.col(c).mean() for c in phase_cols),
            # mean of ranks, a CPU rank's phases having no host-bound part; null if none has
            *(
                pl.when(pl.col(c).is_not_null().any())
                .then(pl.col(c).fill_null(0).mean())
                .otherwise(None)
                .alias(c)
                for c in (S.host_bound_ns(p) for p in S.GPU_HOST_BOUND_PHASES)
            ),
        )
        .sort(S.STEP, nulls_last=True)
    )
    excluded = selection.excluded if selection is not None else {}
    numbers = per_step[S.STEP].to_list()
    means = [float(v) / 1e6 for v in per_step["mean"]]
    counted = [m for n, m in zip(numbers, means, strict=True) if n not in excluded] or means
    median = _median(counted)
    marks: list[StepMark] = [""] * len(means)
    marks[0] = "first"
    for i, number in enumerate(numbers):
        why = excluded.get(number)
        if why is not None and why[0] == "warm-up":
            marks[i] = "warm-up"
        elif not marks[i] and number not in excluded and median > 0:
            marks[i] = "slow" if means[i] > median * SLOW_FACTOR else marks[i]
    rows = []
    for i, row in enumerate(per_step.iter_rows(named=True)):
        why = excluded.get(row[S.STEP])
        rows.append(
            StepSummary(
                step=row[S.STEP],
                ranks=row["ranks"],
                step_ms=round(means[i], 6),
                min_ms=_exact_ms(row["min"]),
                max_ms=_exact_ms(row["max"]),
                slowest_rank=row["slowest"],
                vs_median=round((means[i] - median) / median, 4) if median > 0 else 0.0,
                breakdown_ms=Breakdown(
                    **{p: _exact_ms(row[S.phase_ns(p)]) for p in S.BREAKDOWN_PHASES}
                ),
                mark=marks[i],
                host_bound_ms=_host_bound(row, _exact_ms),
                excluded=why[0] if why is not None else None,
                excluded_reason=why[1] if why is not None else None,
            )
        )
    mean = statistics.fmean(counted)
    stdev = statistics.stdev(counted) if len(counted) > 1 else 0.0
    stats = StepStats(
        count=len(counted),
        mean_ms=round(mean, 6),
        median_ms=round(median, 6),
        stdev_ms=round(stdev, 6),
        min_ms=round(min(counted), 6),
        max_ms=round(max(counted), 6),
        cv=round(stdev / mean, 4) if mean > 0 else 0.0,
        warmup_factor=WARMUP_FACTOR,
        slow_factor=SLOW_FACTOR,
    )
    return rows, stats


def _slow_remarks(per_step: list[StepSummary]) -> list[str]:
    """Later outliers: named, and kept in the figures."""
    slow = [s for s in per_step if s.mark == "slow"]
    if not slow:
        return []
    named = ", ".join(f"step {s.step} ({s.step_ms:,.1f} ms, +{s.vs_median:.0%})" for s in slow[:5])
    more = f" and {len(slow) - 5} more" if len(slow) > 5 else ""
    return [
        f"slow step(s) kept in the figures: {named}{more} against the median of the counted steps"
    ]


def _kept_table(table: pa.Table, selection: Selection) -> pa.Table:
    """A per-rank table's rows in the selected steps (rows outside any step are dropped)."""
    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    return kept_rows(df, selection).to_arrow()


def _fsdp(
    collectives: pa.Table | None, comm: pa.Table | None, selection: Selection | None, n_steps: int
) -> list[FsdpGather]:
    """FSDP's all-gathers over the counted steps (``fsdp.fsdp_gathers``)."""
    if collectives is None or comm is None or collectives.num_rows == 0:
        return []
    if selection is not None:
        collectives, comm = _kept_table(collectives, selection), _kept_table(comm, selection)
    else:
        collectives = collectives.filter(pc.is_valid(collectives.column(S.STEP)))
    return fsdp_gathers(collectives, comm, n_steps)


def _startup_ms(manifest: Manifest, ranks: list[int]) -> float | None:
    """Mean over the ranks with steps of their training thread's time before the first step
    (ingest's ``startup_ns``); null where no rank has it (one window, an older run)."""
    found = [r.meta.get("startup_ns") for r in manifest.ranks if r.rank in ranks or not ranks]
    known = [int(v) for v in found if isinstance(v, int) and v >= 0]
    return round(sum(known) / len(known) / 1e6, 3) if known else None


def _inferred_disagree(manifest: Manifest) -> list[str]:
    """A warning where the ranks' steps were inferred (or found) differently: other sources,
    or inferred steps in different numbers (the steps some ranks lack are left out of every
    figure, as incomplete steps)."""
    read = [r for r in manifest.ranks if r.events > 0]
    sources = {str(r.meta.get("steps_from")) for r in read if r.meta.get("steps_from")}
    if len(sources) > 1:
        return [
            "the ranks' steps come from different sources ("
            + ", ".join(sorted(sources))
            + "): step numbers may not mean the same iteration on every rank"
        ]
    inferred = [r for r in read if r.meta.get("steps_from") not in (None, "markers", "one_window")]
    counts = sorted({r.steps for r in inferred})
    if len(counts) > 1:
        few = min(inferred, key=lambda r: (r.steps, r.rank))
        many = max(inferred, key=lambda r: (r.steps, -r.rank))
        return [
            f"inferred steps disagree across ranks (rank {few.rank}: {few.steps}, rank "
            f"{many.rank}: {many.steps}): only the step numbers every rank has are counted"
        ]
    return []


def named_warmup(manifest: Manifest) -> frozenset[int]:
    """The steps a rank's trace itself calls warm-up (ingest's ``warmup_steps``)."""
    return frozenset(
        int(n)
        for r in manifest.ranks
        for n in (r.meta.get("warmup_steps") or [])
        if isinstance(n, int)
    )


def manifest_steps_from(manifest: Manifest) -> StepsFrom | None:
    """Where the run's steps come from, as ingest recorded it per rank (the most common where
    ranks differ; null for a run ingested before it was recorded)."""
    found = [r.meta.get("steps_from") for r in manifest.ranks]
    known = [str(v) for v in found if v in get_args(StepsFrom)]
    if not known:
        return None
    return cast(StepsFrom, max(sorted(set(known)), key=known.count))


def _top_ops(ops: pa.Table, n_steps: int, step_ms: float, top: int) -> list[TopOp]:
    ops_df = pl.from_arrow(ops)
    assert isinstance(ops_df, pl.DataFrame)
    if not ops_df.height:
        return []
    n_steps = max(n_steps, 1)
    # Operators and device activities; regions (annotations) hold waits, not work.
    operators = ops_df.filter(pl.col(S.KIND).is_in([S.KIND_OP, *S.DEVICE_ACTIVITY_KINDS]))
    agg = (
        operators.group_by(S.DEVICE, S.PHASE, S.OP, maintain_order=True)
        .agg(
            pl.col(S.NAME).first(),
            pl.col(S.COUNT).sum(),
            pl.col(S.TOTAL_NS).sum(),
            pl.col(S.SELF_NS).sum(),
            pl.col(S.P95_NS).max(),
        )
        # (ties in self time: in the ops table's order, the same in every report)
        .sort(S.SELF_NS, descending=True, maintain_order=True)
        .head(top)
    )
    top_ops = []
    for row in agg.iter_rows(named=True):
        calls = round(row[S.COUNT] / n_steps, 2)
        total = _ms(row[S.TOTAL_NS] / n_steps)
        self_ms = _ms(row[S.SELF_NS] / n_steps)
        top_ops.append(
            TopOp(
                op=row[S.OP],
                name=row[S.NAME],
                device=row[S.DEVICE],
                phase=row[S.PHASE],
                calls_per_step=calls,
                self_ms_per_step=self_ms,
                total_ms_per_step=total,
                p95_ms=_ms(row[S.P95_NS]),
                mean_ms=_ms(row[S.TOTAL_NS] / row[S.COUNT]) if row[S.COUNT] else 0.0,
                share=round(self_ms / step_ms, 4) if step_ms > 0 else 0.0,
            )
        )
    return top_ops


def _job(collected: Collected | None) -> JobInfo | None:
    if collected is None:
        return None
    clocks = [r.clock for r in collected.ranks]
    probed = [c for c in clocks if c.method == "tcp"]
    return JobInfo(
        command=collected.command,
        exit_code=collected.exit_code,
        hosts=collected.hosts,
        clock_method="tcp"
        if probed and len(probed) == len(clocks)
        else ("mixed" if probed else "wallclock"),
        clock_uncertainty_us=round(max((c.uncertainty_ns or 0) for c in probed) / 1e3, 1)
        if probed
        else None,
        max_clock_offset_us=round(max(abs(c.offset_ns) for c in probed) / 1e3, 1)
        if probed
        else None,
    )


def _spread(values: list[float], ranks: list[int]) -> Spread:
    """Percentiles by the nearest-rank rule (each one a value some rank has)."""
    array = np.asarray(values, dtype=np.float64)
    order = np.argsort(array, kind="stable")
    high, low = int(order[-1]), int(order[0])

    def nearest(q: float) -> float:
        return round(float(array[order[max(int(np.ceil(q * len(array))) - 1, 0)]]), 3)

    return Spread(
        p50=nearest(0.5),
        p90=nearest(0.9),
        max=round(float(array[high]), 3),
        max_rank=ranks[high],
        min=round(float(array[low]), 3),
        min_rank=ranks[low],
    )


def rank_spread(ranks: list[RankSummary], extremes: int = 5) -> RankSpread | None:
    """The ranks as a distribution: step time, each phase, blocked time and waiting."""
    if not ranks:
        return None
    numbers = [r.rank for r in ranks]
    by_work = sorted(ranks, key=lambda r: (r.busy_ms, r.rank))
    waits = [r.comm_wait_ms for r in ranks]
    return RankSpread(
        ranks=len(ranks),
        step_ms=_spread([r.step_ms for r in ranks], numbers),
        breakdown_ms={
            phase: _spread([getattr(r.breakdown_ms, phase) for r in ranks], numbers)
            for phase in S.BREAKDOWN_PHASES
        },
        busy_ms=_spread([r.busy_ms for r in ranks], numbers),
        blocked_ms=_spread([r.blocked_ms for r in ranks], numbers),
        comm_wait_ms=_spread([w for w in waits if w is not None], numbers)
        if all(w is not None for w in waits)
        else None,
        slowest_ranks=[r.rank for r in reversed(by_work[-extremes:])],
        fastest_ranks=[r.rank for r in by_work[:extremes]],
    )


def _ranks_without_steps(manifest: Manifest, ranks: list[RankSummary]) -> list[str]:
    """A rank that was read but has no step window is not in the figures: say so."""
    read = {r.rank for r in manifest.ranks if r.events > 0}
    left_out = sorted(read - {r.rank for r in ranks})
    if not left_out:
        return []
    which = ", ".join(map(str, left_out[:10])) + (" ..." if len(left_out) > 10 else "")
    return [
        f"rank(s) {which}: events but no step window (no step markers on a training thread), "
        "left out of the breakdown, the straggler and the means"
    ]


def _collectives(cross: CrossRank | None, n_steps: int) -> list[CollectiveSummary]:
    if cross is None or not cross.available:
        return []
    ranks_of = cross.groups.ranks_of
    return [
        CollectiveSummary(
            op=row[S.COLLECTIVE],
            name=row[S.NAME],
            group=row[S.GROUP],
            position=row["position"],
            calls_per_step=round(row["calls_per_step"], 3),
            ranks=row["ranks"],
            bytes=row[S.BYTES],
            transfer_ms=_exact_ms(row["transfer_ns"]),
            wait_ms=_exact_ms(row["wait_ns"]),
            skew_ms=_exact_ms(row["skew_ns"]),
            last_rank=row["last_rank"],
            algorithm=row["algorithm"],
            busbw_gbps=_round(
                bus_bandwidth_gbps(
                    row[S.COLLECTIVE], row["ranks"], row[S.BYTES], row["transfer_ns"]
                )
            ),
            group_ranks=ranks_of.get(row[S.GROUP]) if row[S.GROUP] is not None else None,
            queued_ms=_exact_ms(row["queued_ns"]),
        )
        for row in collective_rows(cross.matched, n_steps).iter_rows(named=True)
    ]


def _round(value: float | None, digits: int = 3) -> float | None:
    return round(value, digits) if value is not None else None


def _needs_clock_estimate(manifest: Manifest) -> bool:
    """Whether the ranks' clocks may differ: not all measured by ``collect``, not one host."""
    collected = manifest.collect
    if collected and collected.ranks and all(r.clock.method == "tcp" for r in collected.ranks):
        return False
    hosts = {r.host for r in manifest.ranks if r.events > 0}
    return not (len(hosts) == 1 and None not in hosts)


def _clocks(
    manifest: Manifest, n_ranks: int, cross: CrossRank | None, estimate: bool
) -> Clocks | None:
    if n_ranks < 2:
        return None
    if not estimate:
        job = _job(manifest.collect)
        if job is not None and job.clock_method == "tcp":
            return Clocks(source="collect", max_offset_us=job.max_clock_offset_us)
        return Clocks(source="one host")
    if cross is None:  # not matched across ranks (a rank is missing): nothing was estimated
        return None
    fit: ClockFit | None = cross.clocks
    if fit is None:
        return Clocks(source="unaligned")
    return Clocks(
        source="collectives",
        calls=fit.calls,
        max_offset_us=round(max(abs(o) for o in fit.offset_ns.values()) / 1e3, 1),
        max_drift_ppm=round(max(abs(d) for d in fit.drift.values()) * 1e6, 2),
        residual_us=round(fit.residual_ns / 1e3, 1),
        unaligned_ranks=fit.unaligned,
    )


def _clock_warning(clocks: Clocks | None) -> list[str]:
    if clocks is None:
        return []
    if clocks.source == "unaligned":
        return [
            "the ranks ran on several hosts (or their hosts are unknown), were not aligned by "
            "collect, and no synchronizing collective (all-reduce, all-gather...) was matched to "
            "estimate their clocks: arrival times across ranks assume the clocks agree"
        ]
    if clocks.unaligned_ranks:
        which = ", ".join(map(str, clocks.unaligned_ranks[:10]))
        return [
            f"rank(s) {which}: too few synchronizing collectives matched with rank 0 to estimate "
            "their clocks; their arrival times assume their clock agrees with rank 0's"
        ]
    return []


def _not_matched(manifest: Manifest, collectives: pa.Table | None) -> list[str]:
    """Why a run with collective calls has no wait/transfer split: ranks are missing."""
    if not manifest.missing_ranks or collectives is None or collectives.num_rows == 0:
        return []
    return [
        "collectives are not matched across ranks while ranks of the job are missing (any of "
        "them may be the last to arrive): communication is not split into wait and transfer"
    ]


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


def _ungrouped(cross: CrossRank | None) -> list[str]:
    if cross is None or not cross.ungrouped:
        return []
    return [
        f"{cross.ungrouped} collective call(s) of ranks that are members of several process "
        "groups do not say which group they belong to, and their calls' ends do not tell it "
        "clearly: they are left unmatched"
    ]


def _pipeline(
    cross: CrossRank | None,
    collectives: pa.Table | None,
    ranks: list[RankSummary],
    groups: Groups,
    ops: pa.Table | None = None,
) -> tuple[Pipeline | None, list[str]]:
    """The pipeline the point-to-point calls form, and its warnings. Where ranks are missing (no
    cross-rank pass), the pairs between the ranks read are matched on their own: a pair's wait
    depends on its two sides only. ``ops``: where the pipelining library names its actions,
    the stages each rank holds."""
    table = cross.calls if cross is not None and cross.calls is not None else collectives
    if table is None or table.num_rows == 0:
        return None, []
    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    p2p = df.filter(pl.col(S.COLLECTIVE).is_in(POINT_TO_POINT))
    if p2p.height == 0:
        return None, []
    # each call once: where it runs, not where it was launched (c10d::send and gloo:send)
    p2p = p2p.join(launch_views(p2p), on=[S.NAME, S.COLLECTIVE], how="anti")
    named = global_peer(p2p.filter(pl.col(S.PEER).is_not_null()), groups).select(
        S.RANK, pl.col("_peer").alias("peer_rank")
    )
    if cross is not None:
        calls = cross.matched.calls
    else:
        calls = match_collectives(p2p.to_arrow(), groups).calls
    annotated = None
    if ops is not None and ops.num_rows:
        frame = pl.from_arrow(ops)
        assert isinstance(frame, pl.DataFrame)
        annotated = annotated_stages(frame)
    return detect_pipeline(calls, ranks, named, annotated)


def _no_peer(cross: CrossRank | None) -> list[str]:
    if cross is None or not cross.matched.no_peer:
        return []
    counts = cross.matched.no_peer
    which = ", ".join(f"rank {r}: {n}" for r, n in sorted(counts.items())[:10])
    more = " ..." if len(counts) > 10 else ""
    return [
        f"{sum(counts.values())} point-to-point call(s) do not say their peer ({which}{more}): "
        "they are left unmatched, out of wait and transfer; the paired ones are analysed"
    ]


def _unmatched(cross: CrossRank | None) -> list[str]:
    if cross is None or not cross.matched.unmatched:
        return []
    counts = cross.matched.unmatched
    total = sum(counts.values())
    which = ", ".join(f"rank {r}: {n}" for r, n in sorted(counts.items())[:10])
    more = " ..." if len(counts) > 10 else ""
    return [
        f"{total} collective call(s) have no counterpart on every rank of their group "
        f"({which}{more}): a rank died, its trace was cut short, its profile covers other "
        "steps, or the framework issued them differently; they are left out of wait and "
        "transfer, the matched ones are analysed"
    ]


#: A rank's own end, where it did not end cleanly (collect's state, or a trace cut short).
_ENDED_BADLY = ("exception", "signal", "crashed", "profiling", "stopping", "running", "unknown")


def incomplete_steps(steps: pl.DataFrame, manifest: Manifest) -> pl.DataFrame:
    """(step, rank) of the steps that did not complete on every rank, the rank the step did not
    finish on (``unfinished``) or every rank that has it: the last step of a rank whose trace was
    cut short, or that died or was killed before its profile was complete (it recorded fewer steps
    than ``collect`` asked for; a rank that died after its profile was written lost no step), or
    whose profile was stopped inside a step (the memory cap), and a numbered step some ranks with
    steps lack."""
    empty = pl.DataFrame(schema={S.STEP: pl.Int64, S.RANK: pl.Int32, "unfinished": pl.Boolean})
    if steps.height == 0 or steps[S.STEP].null_count() > 0:
        return empty
    bad = {r.rank for r in manifest.ranks if r.status != "ok"}
    collected = manifest.collect
    if collected is not None:
        wanted = collected.schedule.steps if collected.schedule is not None else None
        bad |= {
            r.rank
            for r in collected.ranks
            if r.rank is not None
            and (
                (
                    r.state in _ENDED_BADLY
                    and (r.profiled_steps is None or wanted is None or r.profiled_steps < wanted)
                )
                or r.stop_mid_step  # its profile was stopped inside a step (the memory cap)
            )
        }
    last = (
        steps.filter(pl.col(S.RANK).is_in(sorted(bad)))
        .group_by(S.RANK)
        .agg(pl.col(S.STEP).max())
        .select(pl.col(S.STEP).cast(pl.Int64), pl.col(S.RANK).cast(pl.Int32))
    )
    ranks = steps[S.RANK].n_unique()
    partial = steps.group_by(S.STEP).agg(pl.col(S.RANK).n_unique().alias("n"))
    partial = partial.filter(pl.col("n") < ranks).select(pl.col(S.STEP).cast(pl.Int64))
    numbers = pl.concat([last.select(S.STEP), partial]).unique()
    if numbers.height == 0:
        return empty
    unfinished = set(zip(last[S.STEP].to_list(), last[S.RANK].to_list(), strict=True))
    present = steps.filter(pl.col(S.STEP).is_in(numbers[S.STEP].to_list())).select(
        pl.col(S.STEP).cast(pl.Int64), pl.col(S.RANK).cast(pl.Int32)
    )
    return present.with_columns(
        pl.Series(
            "unfinished",
            [(s, r) in unfinished for s, r in present.iter_rows()],
            pl.Boolean,
        )
    )


def complete_flag(
    steps: pa.Table, manifest: Manifest, choice: StepChoice | None = None
) -> pa.Table:
    """The steps table with ``complete``: false for a step that did not complete on every rank
    (``incomplete_steps``), which the report leaves out of its figures; and ``excluded``: why a
    complete step is left out of the report's figures (warm-up, or not chosen by
    --steps/--skip; null: counted), the report's own selection."""
    df = pl.from_arrow(steps)
    assert isinstance(df, pl.DataFrame)
    incomplete = incomplete_steps(df, manifest)[S.STEP].unique().to_list()
    flag = ~df[S.STEP].is_in(incomplete).fill_null(False)
    kept = df.filter(flag)
    selection = select_steps(kept if kept.height else df, choice, named_warmup(manifest))
    why = selection.excluded if selection is not None else {}
    excluded = pl.Series(
        "excluded", [why[s][0] if s in why else None for s in df[S.STEP].to_list()], pl.String
    )
    return steps.append_column("complete", flag.to_arrow()).append_column(
        "excluded", excluded.to_arrow()
    )


def _incomplete(
    steps: pl.DataFrame, incomplete: pl.DataFrame, all_ranks: list[int]
) -> list[IncompleteStep]:
    out = []
    for step in sorted(set(incomplete[S.STEP].to_list())):
        rows = incomplete.filter(pl.col(S.STEP) == step)
        has = set(rows[S.RANK].to_list())
        unfinished = set(rows.filter(pl.col("unfinished"))[S.RANK].to_list())
        unfinished |= {r for r in all_ranks if r not in has}  # no window: not finished there
        # who was blocked longest in it: usually a rank waiting in a collective for the one
        # that died (it may have died of that wait itself)
        others = steps.filter(pl.col(S.STEP) == step).with_columns(
            (pl.col(S.COMM_EXPOSED_NS) + pl.col(S.phase_ns(S.IDLE))).alias("blocked")
        )
        waited = others.sort("blocked", S.RANK, descending=[True, False]).head(1)
        out.append(
            IncompleteStep(
                step=step,
                unfinished_ranks=sorted(unfinished),
                waited_ms=_ms(waited["blocked"][0]) if waited.height else 0.0,
                waited_rank=int(waited[S.RANK][0]) if waited.height else None,
            )
        )
    return out


def cross_rank_of(
    manifest: Manifest, collectives: pa.Table | None, comm: pa.Table | None
) -> CrossRank | None:
    """The cross-rank pass over a run's per-rank tables, its clocks estimated where they may
    differ; None where a rank is missing (the last to arrive may be the one not read)."""
    if collectives is None or comm is None or manifest.missing_ranks:
        return None
    return cross_rank(
        collectives,
        comm,
        align_clocks=_needs_clock_estimate(manifest),
        groups=groups_of(manifest),
    )


def groups_of(manifest: Manifest) -> Groups:
    """The process groups the run's ranks declare."""
    declared = {r.rank: list(r.meta.get("process_groups") or []) for r in manifest.ranks}
    return declared_groups(declared, manifest.world_size)


def _critical_path(
    segments: TableOnDemand | None,
    cross: CrossRank | None,
    per_step: list[StepSummary],
    ranks: list[RankSummary],
    whatif: list[str],
    world: int | None,
    cache: PathCache | None,
) -> Explained | None:
    """The critical path of the counted steps (analysis/critical_path/), each step's set on
    ``per_step``; ``cache``: where an earlier report of this run kept it."""
    counted = [s.step for s in per_step if s.excluded is None]
    every = [s.step for s in per_step]
    if segments is None or segments.num_rows == 0 or not counted or not ranks:
        return None
    key = json.dumps([PATH_VERSION, every, counted, whatif, world])
    explained = cache.get(key) if cache is not None else None
    if explained is None:
        explained = _explain(segments, cross, ranks, every, counted, whatif, world)
        if cache is not None:
            cache.put(key, explained)
    for s in per_step:
        s.critical_path = explained.per_step.get(NO_STEP if s.step is None else s.step)
    return explained


def _explain(
    segments: TableOnDemand,
    cross: CrossRank | None,
    ranks: list[RankSummary],
    every: list[int | None],
    counted: list[int | None],
    whatif: list[str],
    world: int | None,
) -> Explained:
    """``explain`` of the segments, read a piece at a time: nothing here holds them whole."""
    if cross is not None and cross.clocks is not None:  # on the clock the calls were matched on
        segments = cross.clocks.shifted_segments(segments)
    matched = cross.matched if cross is not None else Matched(pl.DataFrame())
    median_phase = {
        phase: _median([getattr(r.breakdown_ms, phase) for r in ranks])
        for phase in S.BREAKDOWN_PHASES
    }
    return explain(segments, matched, every, counted, median_phase, whatif, world)


#: The critical path names the straggler where one rank holds at least this share of the ranks'
#: own time on it (and 1.5 / ranks, so that two even ranks do not name one) ...
BLAME_SHARE = 0.5
#: ... and spends at least this much of the step over the median rank in one of its phases
BLAME_EXCESS = 0.05


def _blame_verdict(summary: Summary, ranks: list[RankSummary], explained: Explained) -> None:
    """The straggler from blame where it is decisive: the rank holding most of the ranks' own
    time on the critical path, in the phase where that time most exceeds the median rank's.
    Elsewhere the comparison against the median rank stands; both are kept under their own
    names (``straggler_*_by_median``)."""
    summary.straggler_rank_by_median = summary.straggler_rank
    summary.straggler_phase_by_median = summary.straggler_phase
    blame = explained.rank_blame
    path = explained.path
    if len(ranks) < 2 or not blame or path is None:
        return
    top = min(blame, key=lambda r: (-blame[r], r))
    share = blame[top] / (sum(blame.values()) or 1.0)
    excess = [
        b for b in path.blame
        if b.rank == top and b.excess_ms is not None and b.phase in get_args(StragglerPhase)
    ]  # fmt: skip
    worst = max(excess, key=lambda b: b.excess_ms or 0.0, default=None)
    if (
        share < max(BLAME_SHARE, 1.5 / len(ranks))
        or worst is None
        or (worst.excess_ms or 0.0) < BLAME_EXCESS * path.step_ms
    ):
        return
    summary.straggler_rank = top
    summary.straggler_phase = worst.phase  # type: ignore[assignment]
    if summary.bottleneck == "imbalance":  # the wait is explained: by the straggler's phase
        summary.bottleneck = worst.phase  # type: ignore[assignment]


def summarize(
    steps: pa.Table,
    ops: pa.Table,
    manifest: Manifest,
    top: int = 10,
    *,
    path: str | None = None,
    collectives: pa.Table | None = None,
    cross: CrossRank | None = None,
    gpu: pa.Table | None = None,
    launches: pa.Table | None = None,
    memory_steps: pa.Table | None = None,
    choice: StepChoice | None = None,
    comm: pa.Table | None = None,
    segments: TableOnDemand | None = None,
    whatif: list[str] | None = None,
    path_cache: PathCache | None = None,
) -> RunReport:
    """The report of a run (``report --json``, docs/design.md) from its per-rank tables;
    ``path``: the run directory, where it is not a temporary one; ``cross``: the cross-rank pass
    (``cross_rank_of``; without it wait and transfer are null), ``collectives``: the calls it
    was made from (to say why there is none); ``gpu``, ``launches``: the GPU tables
    (analysis/gpu.py; without them ``ranks[].gpu`` is null); ``memory_steps``: the per-rank
    memory figures (None: the run has no memory table); ``choice``: the steps --steps/--skip
    chose (None: leading warm-up steps left out, ``selection``); ``comm``: the run's comm table,
    for the cross-rank pass over the selected steps where some are left out (without it,
    ``cross`` is used as it is); ``segments``: the ranks' timelines as segments, for the
    critical path (None: an older run directory; no critical path, no what-ifs); ``whatif``:
    changes to replay besides the report's own (WhatIf.change); ``path_cache``: where the
    critical path of an earlier report of the same run and steps is kept."""
    df = pl.from_arrow(steps)
    assert isinstance(df, pl.DataFrame)
    all_steps = df
    # Steps that did not complete on every rank are left out of every figure (they are listed
    # apart), unless that would leave nothing.
    incomplete = incomplete_steps(df, manifest)
    if incomplete.height:
        kept = df.filter(~pl.col(S.STEP).is_in(incomplete[S.STEP].unique().to_list()))
        df = kept if kept.height else df
    # The steps every headline figure counts, decided once over the run (every rank alike).
    selection = select_steps(df, choice, named_warmup(manifest))
    complete_df = df
    df = kept_rows(df, selection)
    every_step_cross = cross  # (the critical path of each complete step, warm-up included)
    if (
        selection is not None
        and selection.excluded
        and collectives is not None
        and comm is not None
    ):
        cross = cross_rank_of(
            manifest, _kept_table(collectives, selection), _kept_table(comm, selection)
        )
    estimate = _needs_clock_estimate(manifest)
    ranks_df = _rank_rows(df, cross) if df.height else pl.DataFrame()
    ranks = _ranks(ranks_df, cross)
    clocks = _clocks(manifest, len(ranks), cross, estimate)
    summary = _summary(ranks, ranks_df, cross)
    groups = cross.groups if cross is not None else groups_of(manifest)
    pipeline, pipeline_warnings = _pipeline(cross, collectives, ranks, groups, ops)
    if pipeline is not None:
        _pipeline_verdict(summary, ranks, pipeline)
    per_step, stats = _per_step(complete_df, selection)
    explained = _critical_path(
        segments, every_step_cross, per_step, ranks, whatif or [], manifest.world_size, path_cache
    )
    if explained is not None:
        _blame_verdict(summary, ranks, explained)
    verdict = None
    if gpu is not None and launches is not None and df.height:
        on_gpu = rank_gpu(gpu, launches, df)
        for r in ranks:
            r.gpu = on_gpu.get(r.rank)
        verdict = gpu_verdict(
            on_gpu, {r.rank: r.step_ms for r in ranks}, phase_launches(gpu, launches)
        )
    # memory: every complete step, warm-up included (its peaks and growth are memory's own
    # story: allocator growth is what warm-up is), whatever the selection counts
    complete = set(complete_df[S.STEP].to_list()) if complete_df.height else None
    since = {r.rank: list(r.meta.get("memory_since_start") or []) for r in manifest.ranks}
    memory = memory_results(
        memory_steps, [r.rank for r in ranks], complete, since, manifest.framework
    )
    for rank in ranks:
        rank.memory = memory.ranks.get(rank.rank)
    summary.memory = memory.run
    summary.startup_ms = _startup_ms(manifest, [r.rank for r in ranks])
    steps_from = manifest_steps_from(manifest)
    if steps_from == "one_window":
        verdict = None  # one window holds the one-time costs: no per-step advice built on them
    return RunReport(
        run=RunInfo(
            framework=manifest.framework,
            ranks=len(ranks),
            steps=int(complete_df[S.STEP].n_unique())
            if complete_df.height and complete_df[S.STEP].null_count() == 0
            else 0,
            world_size=manifest.world_size,
            missing_ranks=manifest.missing_ranks,
            timeline=ranks[0].timeline if ranks else None,
            path=path,
            run_id=manifest.run_id,
            job=_job(manifest.collect),
            clocks=clocks,
            steps_from=steps_from,
            step_choice=choice.describe() if choice is not None else None,
        ),
        summary=summary,
        ranks=ranks,
        rank_spread=rank_spread(ranks),
        per_step=per_step,
        step_stats=stats,
        top_ops=_top_ops(ops, int(all_steps.height), summary.step_ms, top),
        warnings=[
            *manifest.notes.warnings,
            *_ranks_without_steps(manifest, ranks),
            *groups.warnings,
            *_ungrouped(cross),
            *_inferred_disagree(manifest),
            *_unmatched(cross),
            *_no_peer(cross),
            *pipeline_warnings,
            *_clock_warning(clocks),
            *memory.warnings,
        ],
        remarks=[
            *manifest.notes.remarks,
            *(selection.remarks if selection is not None else []),
            *_slow_remarks(per_step),
            *_not_matched(manifest, collectives),
            *memory.remarks,
        ],
        collectives=_collectives(cross, sum(1 for s in per_step if s.excluded is None)),
        incomplete_steps=_incomplete(
            all_steps, incomplete, sorted(set(all_steps[S.RANK].to_list()))
        )
        if incomplete.height
        else [],
        gpu_verdict=verdict,
        groups=groups.groups,
        pipeline=pipeline,
        comm_by_group=comm_by_group(
            cross.matched, cross.comm, groups, sum(1 for s in per_step if s.excluded is None)
        )
        if cross is not None and cross.comm is not None
        else [],
        critical_path=explained.path if explained is not None else None,
        whatif=explained.whatif if explained is not None else [],
        alltoall=alltoall_ranks(cross.matched, sum(1 for s in per_step if s.excluded is None))
        if cross is not None
        else [],
        fsdp_gathers=_fsdp(
            collectives, comm, selection, sum(1 for s in per_step if s.excluded is None)
        ),
    )
