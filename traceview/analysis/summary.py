"""The run report: per-rank, per-step and run-wide means, every verdict computed once.

Bottleneck, hidden communication, straggler (and whether it is significant), each rank's
imbalance and blocked time, warm-up and slow steps: all decided here, into
``results.RunReport``, which the text report, ``report --json`` and the TUI render as they are
(docs/design.md).
"""

from __future__ import annotations

import statistics
from typing import cast

import polars as pl
import pyarrow as pa

from traceview import schema as S
from traceview.manifest import Collected, Manifest
from traceview.results import (
    BottleneckPhase,
    Breakdown,
    Hidden,
    JobInfo,
    RankSummary,
    RunInfo,
    RunReport,
    StepMark,
    StepStats,
    StepSummary,
    Summary,
    TopOp,
)

HIDDEN_YES = 0.9  # at least this fraction of communication overlaps compute: "hidden: yes"
HIDDEN_NO = 0.1  # at most this: "hidden: no"
STRAGGLER_MIN_EXCESS = 0.05  # a straggler is busier than the median rank by at least 5%
WARMUP_FACTOR = 1.10  # a leading step this much slower than the median step is warm-up
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


def _rank_rows(steps: pl.DataFrame) -> pl.DataFrame:
    phase_cols = [S.phase_ns(p) for p in S.BREAKDOWN_PHASES]
    return (
        steps.group_by(S.RANK)
        .agg(
            pl.len().alias("steps"),
            pl.col(S.WALL_NS).mean(),
            *(pl.col(c).mean() for c in phase_cols),
            pl.col(S.COMM_TOTAL_NS).mean(),
            pl.col(S.COMM_EXPOSED_NS).mean(),
            pl.col(S.COMM_TOTAL_NS).sum().alias("comm_total_sum"),
            pl.col(S.COMM_EXPOSED_NS).sum().alias("comm_exposed_sum"),
            pl.col(S.TIMELINE).first(),
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


def _ranks(ranks_df: pl.DataFrame) -> list[RankSummary]:
    rows = list(ranks_df.iter_rows(named=True)) if ranks_df.height else []
    median = _median([_ms(row["busy_ns"]) for row in rows])
    ranks = []
    for row in rows:
        breakdown = Breakdown(**{p: _ms(row[S.phase_ns(p)]) for p in S.BREAKDOWN_PHASES})
        busy = _ms(row["busy_ns"])
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
            )
        )
    return ranks


def _summary(ranks: list[RankSummary], ranks_df: pl.DataFrame) -> Summary:
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
    step_ms = round(sum(r.step_ms for r in ranks) / n, 3)
    total = float(ranks_df["comm_total_sum"].sum())
    exposed = float(ranks_df["comm_exposed_sum"].sum())
    hidden = _hidden(total, exposed)
    bottleneck = bottleneck_of(breakdown)
    straggler_rank, excess, significant = None, 0.0, None
    if n > 1:
        busy = sorted(r.busy_ms for r in ranks)
        median = busy[n // 2] if n % 2 else (busy[n // 2 - 1] + busy[n // 2]) / 2
        slowest = max(ranks, key=lambda r: r.busy_ms)
        excess = (slowest.busy_ms - median) / median if median > 0 else 0.0
        straggler_rank = slowest.rank
        significant = excess >= STRAGGLER_MIN_EXCESS
        slowest.straggler = significant
    return Summary(
        breakdown_ms=breakdown,
        step_ms=step_ms,
        comm_total_ms=round(sum(r.comm_total_ms for r in ranks) / n, 3),
        comm_exposed_ms=round(sum(r.comm_exposed_ms for r in ranks) / n, 3),
        comm_hidden_fraction=hidden,
        hidden=hidden_verdict(total, hidden),
        bottleneck=bottleneck,
        bottleneck_share=round(breakdown[bottleneck] / step_ms, 4)
        if bottleneck and step_ms
        else 0.0,
        straggler_rank=straggler_rank,
        straggler_excess=round(excess, 4),
        straggler_significant=significant,
        blocked_ms=round(sum(r.blocked_ms for r in ranks) / n, 3),
    )


def _per_step(df: pl.DataFrame) -> tuple[list[StepSummary], StepStats | None]:
    """Each step number across ranks; leading steps well above the median are warm-up, later
    ones slow."""
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
        )
        .sort(S.STEP, nulls_last=True)
    )
    means = [float(v) / 1e6 for v in per_step["mean"]]
    median = _median(means)
    marks: list[StepMark] = [""] * len(means)
    marks[0] = "first"
    for i, value in enumerate(means):
        if median <= 0 or value <= median * WARMUP_FACTOR:
            break
        marks[i] = "warm-up"
    for i, value in enumerate(means):
        if not marks[i] and median > 0 and value > median * SLOW_FACTOR:
            marks[i] = "slow"
    rows = []
    for i, row in enumerate(per_step.iter_rows(named=True)):
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
            )
        )
    mean = statistics.fmean(means)
    stdev = statistics.stdev(means) if len(means) > 1 else 0.0
    stats = StepStats(
        count=len(means),
        mean_ms=round(mean, 6),
        median_ms=round(median, 6),
        stdev_ms=round(stdev, 6),
        min_ms=round(min(means), 6),
        max_ms=round(max(means), 6),
        cv=round(stdev / mean, 4) if mean > 0 else 0.0,
        warmup_factor=WARMUP_FACTOR,
        slow_factor=SLOW_FACTOR,
    )
    return rows, stats


def _top_ops(ops: pa.Table, n_steps: int, step_ms: float, top: int) -> list[TopOp]:
    ops_df = pl.from_arrow(ops)
    assert isinstance(ops_df, pl.DataFrame)
    if not ops_df.height:
        return []
    n_steps = max(n_steps, 1)
    # Operators and device activities; regions (annotations) hold waits, not work.
    operators = ops_df.filter(pl.col(S.KIND).is_in([S.KIND_OP, *S.DEVICE_ACTIVITY_KINDS]))
    agg = (
        operators.group_by(S.DEVICE, S.PHASE, S.OP)
        .agg(
            pl.col(S.NAME).first(),
            pl.col(S.COUNT).sum(),
            pl.col(S.TOTAL_NS).sum(),
            pl.col(S.SELF_NS).sum(),
            pl.col(S.P95_NS).max(),
        )
        .sort(S.SELF_NS, descending=True)
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


def summarize(
    steps: pa.Table,
    ops: pa.Table,
    manifest: Manifest,
    top: int = 10,
    *,
    path: str | None = None,
) -> RunReport:
    """The report of a run (``report --json``, docs/design.md) from its steps and ops tables;
    ``path``: the run directory, where it is not a temporary one."""
    df = pl.from_arrow(steps)
    assert isinstance(df, pl.DataFrame)
    ranks_df = _rank_rows(df) if df.height else pl.DataFrame()
    ranks = _ranks(ranks_df)
    summary = _summary(ranks, ranks_df)
    per_step, stats = _per_step(df)
    return RunReport(
        run=RunInfo(
            framework=manifest.framework,
            ranks=len(ranks),
            steps=int(df[S.STEP].n_unique()) if df.height and df[S.STEP].null_count() == 0 else 0,
            world_size=manifest.world_size,
            missing_ranks=manifest.missing_ranks,
            timeline=ranks[0].timeline if ranks else None,
            path=path,
            run_id=manifest.run_id,
            job=_job(manifest.collect),
        ),
        summary=summary,
        ranks=ranks,
        per_step=per_step,
        step_stats=stats,
        top_ops=_top_ops(ops, int(df.height), summary.step_ms, top),
        warnings=[*manifest.notes.warnings, *_ranks_without_steps(manifest, ranks)],
        remarks=list(manifest.notes.remarks),
    )
