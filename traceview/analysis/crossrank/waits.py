"""Waiting and transfer: the matched calls' waits laid over each rank's communication
(``split_waits``), and the wait each rank caused by arriving last (``arrivals``).

Waiting and transfer. In a matched call the last rank to arrive decides when anyone can finish:
on each rank, the time inside the call before the last arrival is **wait**, the rest
**transfer** (on the last rank itself all of it is transfer). A rank's wait intervals, laid over
its communication (``comm``: the union of its comm time per step, cut into exposed and hidden
pieces), split both the exposed communication of the breakdown and all of it, so wait that was
hidden behind backward never counts as the cause of a slow step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from traceview.analysis.attribution.intervals import merge_intervals
from traceview.analysis.crossrank.matching import _KEY, _VIEW, ISSUED, Matched
from traceview.model import schema as S


def _covered(starts: np.ndarray, ends: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Length of the sorted, disjoint [starts, ends) that lies before each instant of ``at``."""
    if len(starts) == 0:
        return np.zeros(len(at), np.int64)
    before = np.concatenate([[0], np.cumsum(ends - starts)])
    pos = np.searchsorted(starts, at, side="right") - 1
    safe = np.maximum(pos, 0)
    partial = np.clip(at - starts[safe], 0, (ends - starts)[safe])
    return np.where(pos >= 0, before[safe] + partial, 0)


class _Slots:
    """One time line for all ranks: each rank's times shifted into a slot of its own, so one
    sort and one running maximum handle every rank's intervals at once."""

    def __init__(self, *frames: pl.DataFrame) -> None:
        self.origin = min(int(f[S.START_NS].min()) for f in frames)  # type: ignore[arg-type]
        self.span = max(int(f[S.END_NS].max()) for f in frames) - self.origin + 1  # type: ignore[arg-type]
        self.ranks = np.unique(np.concatenate([f[S.RANK].to_numpy() for f in frames])).astype(
            np.int64
        )  # slot i holds rank ranks[i]

    def times(self, df: pl.DataFrame, column: str) -> np.ndarray:
        base = np.searchsorted(self.ranks, df[S.RANK].to_numpy()).astype(np.int64) * self.span
        return df[column].to_numpy().astype(np.int64) - self.origin + base


_NO_WAITS = {S.RANK: pl.Int32, S.STEP: pl.Int64, "wait_ns": pl.Int64, "wait_total_ns": pl.Int64}


def split_waits(matched: Matched, comm: pa.Table) -> pl.DataFrame:
    """Lay the matched calls' waits over each rank's communication (``comm``): per (rank, step),
    ``wait_ns`` (the union of the rank's waits within its exposed communication) and
    ``wait_total_ns`` (within all of it); steps without wait are absent (0)."""
    comm_df = pl.from_arrow(comm)
    assert isinstance(comm_df, pl.DataFrame)
    calls = matched.calls
    if calls.height == 0 or comm_df.height == 0:
        return pl.DataFrame(schema=_NO_WAITS)
    waits = calls.select(
        S.RANK,
        pl.col(ISSUED).alias(S.START_NS),
        (pl.col(ISSUED) + pl.col("wait_ns")).alias(S.END_NS),
    )
    slots = _Slots(waits, comm_df)
    call_start, call_wait_end = slots.times(waits, S.START_NS), slots.times(waits, S.END_NS)
    has_wait = call_wait_end > call_start
    ws, we = merge_intervals(call_start[has_wait], call_wait_end[has_wait])
    cs, ce = slots.times(comm_df, S.START_NS), slots.times(comm_df, S.END_NS)
    pieces = comm_df.select(S.RANK, S.STEP, S.EXPOSED).with_columns(
        pl.Series("overlap", _covered(ws, we, ce) - _covered(ws, we, cs), pl.Int64)
    )
    return pieces.group_by(S.RANK, S.STEP).agg(
        pl.col("overlap").filter(pl.col(S.EXPOSED)).sum().alias("wait_ns"),
        pl.col("overlap").sum().alias("wait_total_ns"),
    )


@dataclass
class Arrivals:
    """Per rank: the wait it caused, i.e. the other ranks' wait inside the matched calls it
    arrived last to (exposed: only what was not hidden behind compute), and how often it was
    last where anyone waited (in the view where that happened most)."""

    caused_ns: dict[int, int]
    caused_exposed_ns: dict[int, int]
    last: dict[int, int]


PAIR = 1 << 32  # (waiting rank, rank waited for) packed into one key


def merged_exposed(keyed: pl.DataFrame, key: str, comm: pa.Table) -> pl.DataFrame:
    """Intervals per (rank, ``key``), ``keyed`` packing both into its rank column (rank *
    ``PAIR`` + key): merged per (rank, key), each with the length of the rank's exposed
    communication (``comm``) it covers (``exposed``)."""
    by_slot = _Slots(keyed)
    ms, me = merge_intervals(by_slot.times(keyed, S.START_NS), by_slot.times(keyed, S.END_NS))
    ident_of_slot = by_slot.ranks
    slot = ms // by_slot.span
    ident = ident_of_slot[slot]
    shift = slot * by_slot.span - by_slot.origin
    merged = pl.DataFrame(
        {
            S.RANK: (ident // PAIR).astype(np.int32),
            key: ident % PAIR,
            S.START_NS: ms - shift,
            S.END_NS: me - shift,
        }
    )
    exposed_ns = np.zeros(merged.height, np.int64)
    comm_df = pl.from_arrow(comm)
    assert isinstance(comm_df, pl.DataFrame)
    exposed = comm_df.filter(pl.col(S.EXPOSED))
    if exposed.height:
        by_rank = _Slots(merged, exposed)
        es, ee = merge_intervals(
            by_rank.times(exposed, S.START_NS), by_rank.times(exposed, S.END_NS)
        )
        exposed_ns = _covered(es, ee, by_rank.times(merged, S.END_NS)) - _covered(
            es, ee, by_rank.times(merged, S.START_NS)
        )
    return merged.with_columns(pl.Series("exposed", exposed_ns, pl.Int64))


def arrivals(matched: Matched, comm: pa.Table) -> Arrivals:
    """Who caused the waiting. A rank's waits in calls with the same last rank are merged before
    they are measured, so a call seen in two views (the training thread's c10d call and gloo's
    thread) or concurrent calls (DDP buckets) count their common time once."""
    calls = matched.calls
    if calls.height == 0:
        return Arrivals({}, {}, {})
    waited = calls.filter(pl.col("skew_ns") > 0)
    per_view = waited.group_by("last_rank", *_VIEW).agg(pl.struct(_KEY).n_unique().alias("n"))
    last_df = per_view.group_by("last_rank").agg(pl.col("n").max())
    last = dict(zip(last_df["last_rank"].to_list(), last_df["n"].to_list(), strict=True))
    waits = waited.filter((pl.col("wait_ns") > 0) & (pl.col(S.RANK) != pl.col("last_rank")))
    if waits.height == 0:
        return Arrivals({}, {}, last)
    # one slot per (waiting rank, rank waited for): merge there, then measure each merged wait
    # against the waiting rank's exposed communication, laid out in slots of its own
    pairs = waits.select(
        (pl.col(S.RANK).cast(pl.Int64) * PAIR + pl.col("last_rank")).alias(S.RANK),
        pl.col(ISSUED).alias(S.START_NS),
        (pl.col(ISSUED) + pl.col("wait_ns")).alias(S.END_NS),
    )
    merged = merged_exposed(pairs, "last_rank", comm)
    caused = (
        merged.with_columns((pl.col(S.END_NS) - pl.col(S.START_NS)).alias("caused"))
        .group_by("last_rank")
        .agg(pl.col("caused", "exposed").sum())
    )
    ranks = caused["last_rank"].to_list()
    return Arrivals(
        dict(zip(ranks, caused["caused"].to_list(), strict=True)),
        dict(zip(ranks, caused["exposed"].to_list(), strict=True)),
        last,
    )
