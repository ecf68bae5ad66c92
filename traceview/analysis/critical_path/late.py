"""What a late rank did while the others had begun the step (``before``): for a late-start cause,
per counted step the stretch from the first rank's start to the late rank's own, laid over that
rank's segments of its previous step (its update, data loading, idling outside every operator:
a sleep, a synchronize) and, where none covers it, the time between its steps (outside every
step marker: work no marker records, garbage collection, a checkpoint written outside the loop).
The advice of a late start names the largest."""

from __future__ import annotations

import polars as pl

from traceview.model import schema as S
from traceview.model.columns import TableOnDemand
from traceview.model.results import Spent

#: The kind of time a late rank spent outside every step of its own (between its steps).
BETWEEN_STEPS = "between_steps"

#: How many of the largest (phase, kind) pieces a cause lists.
LISTED = 4


def before(
    segments: TableOnDemand, windows: pl.DataFrame, rank: int, steps: list[int]
) -> list[Spent]:
    """Where ``rank`` was while it started each of ``steps`` late, ms per step (a mean over
    ``steps``: the blamed late start's steps): ``windows`` (rank, step, s, e: each rank's span
    of each step) give each step's first start and the rank's own; the rank's segments of the
    step before (read a piece at a time) are clipped to that stretch, per (phase, kind), each
    named for the operator holding most of it; what no segment covers is ``BETWEEN_STEPS``.
    Largest first, up to ``LISTED``."""
    if not steps:
        return []
    first = windows.group_by(S.STEP).agg(pl.col("s").min().alias("a"))
    own = windows.filter(pl.col(S.RANK) == rank).select(S.STEP, pl.col("s").alias("b"))
    late = (
        own.join(first, on=S.STEP)
        .filter(pl.col(S.STEP).is_in(steps) & (pl.col("b") > pl.col("a")))
        .with_columns((pl.col(S.STEP) - 1).alias("previous"))
    )
    if late.height == 0:
        return []
    lo, hi = int(late["previous"].min()), int(late["previous"].max())  # type: ignore[arg-type]
    # (each piece filtered as it comes: the segments are never whole in memory)
    frames: list[pl.DataFrame] = []
    for table in segments.in_pieces((S.STEP, lo, hi)):
        piece = pl.from_arrow(
            table.select([S.RANK, S.STEP, S.START_NS, S.END_NS, S.PHASE, S.KIND, S.OP])
        )
        assert isinstance(piece, pl.DataFrame)
        frames.append(piece.filter((pl.col(S.RANK) == rank) & pl.col(S.STEP).is_between(lo, hi)))
        del table, piece
    mine = pl.concat(frames) if frames else pl.DataFrame()
    span_ns = int((late["b"] - late["a"]).sum())
    pieces = pl.DataFrame()
    if mine.height:
        clipped = (
            mine.join(late, left_on=S.STEP, right_on="previous")
            .with_columns(
                (pl.min_horizontal(S.END_NS, "b") - pl.max_horizontal(S.START_NS, "a")).alias("ns")
            )
            .filter(pl.col("ns") > 0)
        )
        pieces = clipped.select(S.PHASE, S.KIND, S.OP, "ns")
    covered = int(pieces["ns"].sum()) if pieces.height else 0
    n = len(steps)
    out: list[Spent] = []
    if pieces.height:
        by_kind = pieces.group_by(S.PHASE, S.KIND).agg(pl.col("ns").sum())
        for phase, kind, ns in by_kind.sort(
            "ns", S.PHASE, S.KIND, descending=[True, False, False]
        ).iter_rows():
            theirs = pieces.filter((pl.col(S.PHASE) == phase) & (pl.col(S.KIND) == kind))
            ops = (
                theirs.filter(pl.col(S.OP).is_not_null())
                .group_by(S.OP)
                .agg(pl.col("ns").sum())
                .sort("ns", S.OP, descending=[True, False])
            )
            op = ops[S.OP][0] if ops.height and 2 * ops["ns"][0] >= ns else None
            out.append(Spent(phase=phase, kind=kind, op=op, ms=round(ns / n / 1e6, 3)))
    if span_ns > covered:
        out.append(
            Spent(
                phase=None, kind=BETWEEN_STEPS, op=None, ms=round((span_ns - covered) / n / 1e6, 3)
            )
        )
    out.sort(key=lambda s: -s.ms)
    return [s for s in out[:LISTED] if s.ms > 0]
