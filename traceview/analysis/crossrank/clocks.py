"""Clocks: each rank's clock against the reference rank's, estimated from the matched calls
(``estimate_clocks``) and applied to a rank's times (``ClockFit``).

Clocks. Arrival times are only comparable on one clock. Ranks on one host share it, and
``collect`` measures each rank's offset from the launcher's clock (applied at ingest); traces
read on their own from several hosts keep their hosts' clocks, which can be milliseconds apart.
For those the offsets are estimated from the matched synchronizing collectives (``SYNCHRONIZING``:
no rank can leave one before the last rank arrived, and all leave within a transfer of each
other): per rank, a line (offset and drift) fitted to how much later its calls end than the
reference rank's, outliers dropped, then applied to its calls and communication before the
waits are measured. The residual is what the fit leaves: how far apart matched ends still are.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import polars as pl
import pyarrow as pa

from traceview.analysis.crossrank.matching import _KEY, ISSUED, POINT_TO_POINT, Matched
from traceview.analysis.crossrank.waits import PAIR
from traceview.model import schema as S
from traceview.model.columns import TableOnDemand

#: Collectives that no rank can leave before every rank of the group arrived (not broadcast,
#: reduce, send/recv or push/pull: a root or a sender may leave first).
SYNCHRONIZING = ("allreduce", "allgather", "reduce_scatter", "alltoall", "barrier")
MIN_CLOCK_CALLS = 3  # fewer matched synchronizing calls with the reference: no estimate


@dataclass
class ClockFit:
    """Per rank, how its clock reads against the reference rank's: at reference time T it reads
    ``T + offset_ns + drift * (T - t0_ns)``. Ranks absent were not estimated."""

    reference: int
    t0_ns: int
    offset_ns: dict[int, float]
    drift: dict[int, float]  # ns per ns (1e-6: 1 ppm)
    calls: int  # matched synchronizing calls the fit used
    residual_ns: float  # p90 of how far a rank's ends lie from the reference's, once aligned
    unaligned: list[int] = field(default_factory=list)  # ranks with too few calls to fit

    def shifted_segments(self, segments: TableOnDemand) -> TableOnDemand:
        """A run's segments (read a piece at a time) on the reference clock."""

        def shift(table: pa.Table) -> pa.Table:
            frame = pl.from_arrow(table)
            assert isinstance(frame, pl.DataFrame)
            return self.shift(frame, S.START_NS, S.END_NS).to_arrow()

        return segments.mapped(shift)

    def shift(self, df: pl.DataFrame, *columns: str) -> pl.DataFrame:
        """``df``'s time ``columns`` moved onto the reference clock."""
        lines = pl.DataFrame(
            {
                S.RANK: list(self.offset_ns),
                "_offset": list(self.offset_ns.values()),
                "_drift": [self.drift[r] for r in self.offset_ns],
            },
            schema={S.RANK: df.schema[S.RANK], "_offset": pl.Float64, "_drift": pl.Float64},
        )
        df = df.join(lines, on=S.RANK, how="left").with_columns(
            pl.col("_offset", "_drift").fill_null(0.0)
        )
        # T = t0 + (t - t0 - offset) / (1 + drift), with t - t0 exact in integers first
        return df.with_columns(
            (
                pl.lit(self.t0_ns, pl.Int64)
                + (
                    ((pl.col(c) - self.t0_ns).cast(pl.Float64) - pl.col("_offset"))
                    / (1.0 + pl.col("_drift"))
                ).round()
            )
            .cast(pl.Int64)
            .alias(c)
            for c in columns
        ).drop("_offset", "_drift")


MIN_DRIFT_SPAN_NS = 10_000_000_000  # a drift is fitted only over calls this far apart (10 s)
MAX_DRIFT = 1e-3  # 1000 ppm: no working clock drifts faster; a steeper fit is noise


def _collective_edges(calls: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, int]:
    """Offsets between ranks from the matched synchronizing ``calls``: each rank against the
    lowest rank of every call it took part in (its group's), one line per such pair (``edges``:
    a, b, offset at ``t0``, drift, error, calls), the points' residuals, and ``t0`` (the first
    call's end)."""
    edge_schema = {"a": pl.Int64, "b": pl.Int64, "offset": pl.Float64, "drift": pl.Float64,
                   "error": pl.Float64, "calls": pl.Int64}  # fmt: skip
    calls = calls.filter(pl.col(S.COLLECTIVE).is_in(SYNCHRONIZING))
    if calls.height == 0:
        return pl.DataFrame(schema=edge_schema), pl.DataFrame(), 0
    calls = calls.with_columns(pl.col(S.RANK).cast(pl.Int64).min().over(_KEY).alias("a"))
    ref = calls.filter(pl.col(S.RANK) == pl.col("a")).select(
        *_KEY, pl.col(S.START_NS).alias("ref_start"), pl.col(S.END_NS).alias("ref_end")
    )
    t0 = int(ref["ref_end"].min()) if ref.height else 0  # type: ignore[arg-type]
    points = (
        calls.filter(pl.col(S.RANK) != pl.col("a"))
        .join(ref, on=list(_KEY))
        .select(
            (pl.col("a") * PAIR + pl.col(S.RANK)).alias("_edge"),
            (pl.col("ref_end") - t0).cast(pl.Float64).alias("x"),
            (pl.col(S.END_NS) - pl.col("ref_end")).cast(pl.Float64).alias("y"),
            # the offsets the call allows: [lo, hi]
            (pl.col(S.START_NS) - pl.col("ref_end")).cast(pl.Float64).alias("lo"),
            (pl.col(S.END_NS) - pl.col("ref_start")).cast(pl.Float64).alias("hi"),
        )
    )
    if points.height == 0:
        return pl.DataFrame(schema=edge_schema), points, t0
    # drift: slope between the halves' medians, where the span and the effect are large enough
    half = pl.col("x") >= pl.col("x").median().over("_edge")
    halves = points.group_by("_edge").agg(
        (pl.col("x").max() - pl.col("x").min()).alias("span"),
        pl.col("x").filter(~half).median().alias("x1"),
        pl.col("x").filter(half).median().alias("x2"),
        pl.col("y").filter(~half).median().alias("y1"),
        pl.col("y").filter(half).median().alias("y2"),
        (pl.col("y") - pl.col("y").median()).abs().median().alias("spread"),
    )
    slope = (pl.col("y2") - pl.col("y1")) / (pl.col("x2") - pl.col("x1"))
    drift_ok = (
        (pl.col("span") >= MIN_DRIFT_SPAN_NS)
        & (pl.col("x2") > pl.col("x1"))
        & (slope.abs() <= MAX_DRIFT)
        & (slope.abs() * pl.col("span") > 3 * pl.col("spread"))
    )
    lines = halves.select("_edge", pl.when(drift_ok).then(slope).otherwise(0.0).alias("b"))
    points = points.join(lines, on="_edge").with_columns(
        (pl.col(c) - pl.col("b") * pl.col("x")).alias(c) for c in ("y", "lo", "hi")
    )
    fit = (
        points.group_by("_edge")
        .agg(
            pl.col("b").first(),
            pl.col("y").median().alias("a"),
            pl.col("lo").max().alias("low"),
            pl.col("hi").min().alias("high"),
            pl.len().alias("n"),
            (pl.col("y") - pl.col("y").median()).abs().median().alias("mad"),
            pl.col("y").std().fill_null(0.0).alias("sd"),
        )
        .with_columns(
            pl.when(pl.col("low") <= pl.col("high"))
            .then(pl.col("a").clip(pl.col("low"), pl.col("high")))
            .otherwise(pl.col("a"))
            .alias("a"),
            # the median's standard error from the spread of the ends, the larger of two
            # readings of it (1.4826 MAD ~ sigma; the standard deviation): in doubt, no shift
            (
                1.25 * pl.max_horizontal(1.4826 * pl.col("mad"), pl.col("sd")) / pl.col("n").sqrt()
            ).alias("error"),
        )
        .with_columns(
            # an offset within two standard errors of 0 is noise: the clocks agree
            pl.when((pl.col("a").abs() <= 2 * pl.col("error")) & (pl.col("b") == 0))
            .then(0.0)
            .otherwise(pl.col("a"))
            .alias("a")
        )
        .filter(pl.col("n") >= MIN_CLOCK_CALLS)
    )
    fitted = points.join(fit.select("_edge", pl.col("a").alias("_a")), on="_edge").select(
        (pl.col("y") - pl.col("_a")).abs().alias("residual")
    )
    edges = fit.select(
        (pl.col("_edge") // PAIR).alias("a"),
        (pl.col("_edge") % PAIR).alias("b"),
        pl.col("a").alias("offset"),
        pl.col("b").alias("drift"),
        "error",
        pl.col("n").cast(pl.Int64).alias("calls"),
    )
    return edges.cast(edge_schema), fitted, t0  # type: ignore[arg-type]


def _pair_edges(calls: pl.DataFrame) -> pl.DataFrame:
    """Offsets between ranks from matched point-to-point pairs (``calls`` with ``peer_rank``).
    A receive cannot end before its send was issued: a message from a to b bounds b's clock
    against a's from above (b's receive end less a's issue), one from b to a from below. Where
    the pair of ranks sent both ways, the offset is the middle of the tightest bounds (0 where
    they allow 0: not shown to differ), its error half their distance: within a transfer where a
    receive in each direction was already waiting when the message was sent (a pipeline's
    stages wait for each other's activations and gradients)."""
    schema = {"a": pl.Int64, "b": pl.Int64, "offset": pl.Float64, "drift": pl.Float64,
              "error": pl.Float64, "calls": pl.Int64}  # fmt: skip
    if "peer_rank" not in calls.columns:
        return pl.DataFrame(schema=schema)
    p2p = calls.filter(pl.col("peer_rank").is_not_null())
    if p2p.height == 0:
        return pl.DataFrame(schema=schema)
    key = ["_src", "_dst", "step_key", "position"]
    sends = p2p.filter(pl.col(S.COLLECTIVE) == "send").select(
        pl.col(S.RANK).cast(pl.Int64).alias("_src"),
        pl.col("peer_rank").cast(pl.Int64).alias("_dst"),
        "step_key",
        "position",
        pl.col(ISSUED).alias("_sent"),
    )
    recvs = p2p.filter(pl.col(S.COLLECTIVE) == "recv").select(
        pl.col("peer_rank").cast(pl.Int64).alias("_src"),
        pl.col(S.RANK).cast(pl.Int64).alias("_dst"),
        "step_key",
        "position",
        pl.col(S.END_NS).alias("_received"),
    )
    bound = (pl.col("_received") - pl.col("_sent")).cast(pl.Float64)
    forward = pl.col("_src") < pl.col("_dst")
    edges = (
        sends.join(recvs, on=key)
        .filter(pl.col("_src") != pl.col("_dst"))
        .group_by(
            pl.min_horizontal("_src", "_dst").alias("a"),
            pl.max_horizontal("_src", "_dst").alias("b"),
        )
        .agg(
            bound.filter(forward).min().alias("high"),
            (-bound).filter(~forward).max().alias("low"),
            pl.len().alias("calls"),
        )
        .filter(pl.col("high").is_not_null() & pl.col("low").is_not_null())
        .with_columns(((pl.col("high") + pl.col("low")) / 2).alias("offset"))
        .select(
            "a",
            "b",
            pl.when((pl.col("low") <= 0) & (pl.col("high") >= 0))
            .then(0.0)
            .otherwise("offset")
            .alias("offset"),
            pl.lit(0.0).alias("drift"),
            ((pl.col("high") - pl.col("low")).abs() / 2).alias("error"),
            pl.col("calls").cast(pl.Int64),
        )
    )
    return edges.cast(schema)  # type: ignore[arg-type]


def _chain(edges: pl.DataFrame, reference: int) -> dict[int, tuple[float, float]]:
    """Each rank's (offset, drift) against ``reference`` along the surest path of ``edges``
    (each: b's clock less a's), the sum of the edges' errors smallest; ranks no path reaches
    are absent. One entry per pair of ranks, not per call: a Python walk is cheap."""
    graph: dict[int, list[tuple[int, float, float, float]]] = {}
    for a, b, offset, drift, error in edges.select(
        "a", "b", "offset", "drift", "error"
    ).iter_rows():
        cost = float(error) + 1.0  # (1 ns a hop: fewer hops where errors tie)
        graph.setdefault(a, []).append((b, offset, drift, cost))
        graph.setdefault(b, []).append((a, -offset, -drift, cost))
    found: dict[int, tuple[float, float]] = {}
    queue = [(0.0, reference, 0.0, 0.0)]
    while queue:
        cost, rank, offset, drift = heapq.heappop(queue)
        if rank in found:
            continue
        found[rank] = (offset, drift)
        for other, edge_offset, edge_drift, edge_cost in graph.get(rank, []):
            if other not in found:
                heapq.heappush(
                    queue, (cost + edge_cost, other, offset + edge_offset, drift + edge_drift)
                )
    return found


def estimate_clocks(matched: Matched) -> ClockFit | None:
    """Each rank's clock against the lowest rank's, from the matched synchronizing calls and
    point-to-point pairs (module docstring); None where there are none.

    Synchronizing calls: each rank against the lowest rank of each call it took part in (its
    group's). The offset is the median of how much later the rank's calls end than that rank's
    (all ranks leave a synchronizing call within a transfer of each other; a median ignores the
    calls one of them left late, descheduled). A drift is fitted only where the calls span
    ``MIN_DRIFT_SPAN_NS`` and it moves the line by more than the residual over that span (on a
    short profile it is indistinguishable from noise), as the slope between the medians of the
    two halves of the calls. The offset is then held inside what the calls allow: no rank can
    leave a call before the other arrived, nor the other before the rank arrived. An offset
    within two standard errors of zero (ends spread widely, few calls) is taken as zero: the
    clocks are not shown to differ, and shifting them by noise would only add error.

    Point-to-point pairs (``_pair_edges``) link ranks that share no synchronizing call: the
    stages of a pipeline across hosts. Each rank's clock is then the sum of the offsets along
    the surest chain of such links from the reference (``_chain``): ranks of a mesh that share
    no group with the lowest rank are reached through the groups they share with others.
    """
    calls = matched.calls
    if calls.height == 0:
        return None
    collective_edges, fitted, t0 = _collective_edges(calls)
    edges = pl.concat([collective_edges, _pair_edges(calls)])
    involved = calls.filter(
        pl.col(S.COLLECTIVE).is_in([*SYNCHRONIZING, *POINT_TO_POINT])
    ).get_column(S.RANK)
    if involved.len() == 0:
        return None
    reference = int(involved.min())  # type: ignore[arg-type]
    if edges.height == 0:
        return None
    chained = _chain(edges, reference)
    if len(chained) < 2:
        return None
    if fitted.height:
        residual = float(fitted["residual"].quantile(0.9) or 0.0)
    else:  # pairs only: half the distance of their bounds
        residual = float(edges["error"].max() or 0.0)  # type: ignore[arg-type]
    ranks = sorted(chained)
    return ClockFit(
        reference=reference,
        t0_ns=t0,
        offset_ns={r: chained[r][0] for r in ranks},
        drift={r: chained[r][1] for r in ranks},
        calls=int(edges["calls"].sum()),
        residual_ns=residual,
        unaligned=sorted(set(involved.unique().to_list()) - set(chained)),
    )
