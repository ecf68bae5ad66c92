"""Per-rank figures: each rank's mean step and phases, the spread across ranks, and the job each
rank belongs to."""

from __future__ import annotations

import numpy as np
import polars as pl

from traceview.analysis.crossrank import CrossRank
from traceview.analysis.summary.units import _hidden, _median, _ms, _split, ms_column
from traceview.analysis.summary.verdicts import bottleneck_of
from traceview.model import schema as S
from traceview.model.manifest import SERVICE_ROLES, Collected, Manifest
from traceview.model.results import (
    Breakdown,
    HostBound,
    JobInfo,
    RankSpread,
    RankSummary,
    Spread,
)


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


def _ranks(ranks_df: pl.DataFrame, cross: CrossRank | None) -> list[RankSummary]:
    rows = list(ranks_df.iter_rows(named=True)) if ranks_df.height else []
    # (each figure's ``_ms`` over its whole column at once: 20,000 ranks' took a second a row
    # at a time)
    phases = {p: S.phase_ns(p) for p in S.BREAKDOWN_PHASES}
    bound = {p: S.host_bound_ns(p) for p in S.GPU_HOST_BOUND_PHASES}
    figures = [*phases.values(), *bound.values(), S.WALL_NS, S.COMM_TOTAL_NS, S.COMM_EXPOSED_NS]
    ms = {name: ms_column(ranks_df[name]) for name in [*figures, "busy_ns"]} if rows else {}
    median = _median(ms.get("busy_ns", []))
    ranks = []
    caused = cross.arrivals.caused_exposed_ns if cross is not None and cross.available else None
    fit = cross.clocks if cross is not None else None
    last = cross.arrivals.last if cross is not None and cross.available else {}
    for i, row in enumerate(rows):
        breakdown = Breakdown(**{p: ms[column][i] for p, column in phases.items()})
        host_bound = (
            None
            if any(row[column] is None for column in bound.values())
            else HostBound(**{p: ms[column][i] for p, column in bound.items()})
        )
        busy = ms["busy_ns"][i]
        exposed, total = ms[S.COMM_EXPOSED_NS][i], ms[S.COMM_TOTAL_NS][i]
        wait, transfer = _split(row["wait_ns"], exposed)
        wait_total, transfer_total = _split(row["wait_total_ns"], total)
        ranks.append(
            RankSummary(
                rank=row[S.RANK],
                steps=row["steps"],
                step_ms=ms[S.WALL_NS][i],
                breakdown_ms=breakdown,
                comm_total_ms=total,
                comm_exposed_ms=exposed,
                comm_hidden_fraction=_hidden(row["comm_total_sum"], row["comm_exposed_sum"]),
                busy_ms=busy,
                bottleneck=bottleneck_of(breakdown),
                timeline=row[S.TIMELINE],
                blocked_ms=round(exposed + breakdown.idle, 3),
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
    """A rank that was read but has no step window is not in the figures: say so (a server,
    scheduler or coordinator has no steps of its own: it is reported as what it is)."""
    read = {r.rank for r in manifest.ranks if r.events > 0 and r.role not in SERVICE_ROLES}
    left_out = sorted(read - {r.rank for r in ranks})
    if not left_out:
        return []
    which = ", ".join(map(str, left_out[:10])) + (" ..." if len(left_out) > 10 else "")
    return [
        f"rank(s) {which}: events but no step window (no step markers on a training thread), "
        "left out of the breakdown, the straggler and the means"
    ]
