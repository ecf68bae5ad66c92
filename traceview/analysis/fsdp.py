"""FSDP's all-gathers unit by unit (issue 32): prefetched or not, exposed or hidden, and how far
ahead of its use each one finished.

From the collectives table's ``unit``, ``prefetched`` and ``needed_ns`` (what FSDP2's regions
say: ``collectives._fsdp_units``), on each rank's own view of a call: the kernel on a GPU, gloo's
worker run on a CPU, not the host call that only launched or queued it (``launch_views``).
Times run from when the program issued the call."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from traceview.analysis.crossrank import PAIR, launch_views, merged_exposed
from traceview.model import schema as S
from traceview.model.results import FsdpGather, GatherSpan

#: the phases in the order a step runs them
_ORDER = {S.FORWARD: 0, S.BACKWARD: 1}


def _gathers(collectives: pa.Table) -> pl.DataFrame:
    """FSDP's all-gathers, each on its rank's own view of the call, with ``_issued``."""
    df = pl.from_arrow(collectives)
    assert isinstance(df, pl.DataFrame)
    df = df.filter(pl.col(S.UNIT).is_not_null() & (pl.col(S.COLLECTIVE) == "allgather"))
    return df.join(launch_views(df), on=[S.NAME, S.COLLECTIVE], how="anti").with_columns(
        pl.col(S.ISSUED_IN).fill_null(S.OTHER),
        pl.coalesce(S.ISSUED_NS, S.START_NS).alias("_issued"),
    )


def gather_spans(collectives: pa.Table) -> dict[tuple[int, int | None], list[GatherSpan]]:
    """Per (rank, step), FSDP's all-gathers in the order they were issued."""
    df = _gathers(collectives).sort(S.RANK, S.STEP, "_issued")
    out: dict[tuple[int, int | None], list[GatherSpan]] = {}
    for rank, step, unit, phase, prefetched, issued, end, needed in df.select(
        S.RANK, S.STEP, S.UNIT, S.ISSUED_IN, pl.col(S.PREFETCHED).fill_null(False), "_issued",
        S.END_NS, S.NEEDED_NS,
    ).iter_rows():  # fmt: skip
        out.setdefault((rank, step), []).append(
            GatherSpan(
                unit=unit,
                phase=phase,
                prefetched=prefetched,
                issued_ns=issued,
                end_ns=end,
                needed_ns=needed,
            )
        )
    return out


def fsdp_gathers(collectives: pa.Table, comm: pa.Table, n_steps: int) -> list[FsdpGather]:
    """Per (issuing phase, unit): the all-gathers' calls, the share prefetched, their time from
    issue to end and its exposed part (means per step over the ranks that make them), and the
    medians of how long before its use each was issued and finished."""
    df = _gathers(collectives)
    if df.height == 0:
        return []
    df = df.with_columns(pl.struct(S.ISSUED_IN, S.UNIT).rank("dense").cast(pl.Int64).alias("_key"))
    # each rank's calls of a key merged (overlapping calls once), then their exposed part
    merged = merged_exposed(
        df.select(
            (pl.col(S.RANK).cast(pl.Int64) * PAIR + pl.col("_key")).alias(S.RANK),
            pl.col("_issued").alias(S.START_NS),
            S.END_NS,
        ),
        "_key",
        comm,
    )
    spans = merged.group_by("_key").agg(
        (pl.col(S.END_NS) - pl.col(S.START_NS)).sum().alias("_total"),
        pl.col("exposed").sum().alias("_exposed"),
    )
    ahead = pl.col(S.NEEDED_NS) - pl.col(S.END_NS)
    rows = (
        df.group_by("_key", S.ISSUED_IN, S.UNIT)
        .agg(
            pl.len().alias("_calls"),
            pl.col(S.RANK).n_unique().alias("_ranks"),
            pl.col(S.PREFETCHED).fill_null(False).mean().alias("_prefetched"),
            (pl.col(S.NEEDED_NS) - pl.col("_issued")).median().alias("_issued_ahead"),
            ahead.median().alias("_ahead"),
            ahead.min().alias("_ahead_min"),
            pl.col("_issued").min().alias("_first"),
        )
        .join(spans, on="_key", how="left")
        .with_columns(pl.col(S.ISSUED_IN).replace_strict(_ORDER, default=2).alias("_order"))
        .sort("_order", "_first")
    )
    steps = max(n_steps, 1)

    def ms(ns: float | None) -> float | None:
        return None if ns is None else round(ns / 1e6, 3)

    out = []
    for row in rows.iter_rows(named=True):
        per = steps * row["_ranks"]
        total = (row["_total"] or 0) / per / 1e6
        out.append(
            FsdpGather(
                phase=row[S.ISSUED_IN],
                unit=row[S.UNIT],
                calls_per_step=round(row["_calls"] / per, 3),
                prefetched=round(row["_prefetched"], 3),
                total_ms=round(total, 3),
                exposed_ms=round(min((row["_exposed"] or 0) / per / 1e6, total), 3),
                issued_ahead_ms=ms(row["_issued_ahead"]),
                ahead_ms=ms(row["_ahead"]),
                ahead_min_ms=ms(row["_ahead_min"]),
            )
        )
    return out
