"""What the report reads of the matched calls: per view and position in the step
(``collective_rows``), per call (``matched_table``, ``step_collectives``), per process group,
phase and collective (``comm_by_group``) and per rank's all-to-alls (``alltoall_ranks``)."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from traceview.analysis.crossrank.driver import CrossRank
from traceview.analysis.crossrank.matching import ISSUED, Matched
from traceview.analysis.crossrank.waits import PAIR, merged_exposed
from traceview.analysis.groups import Groups
from traceview.model import schema as S
from traceview.model.results import AllToAllRank, CommByGroup, StepCollective

#: NCCL's algorithm and protocol, as its kernel names spell them (ncclKernel_AllReduce_RING_LL_...,
#: ncclDevKernel_AllReduce_Sum_f32_TREE_LL128)
_ALGORITHM = (
    r"_((?:RING|TREE|COLLNET_DIRECT|COLLNET_CHAIN|COLLNET|NVLS_TREE|NVLS|PAT)_(?:LL128|LL|SIMPLE))"
    r"(?:_|\(|$)"
)


def collective_rows(matched: Matched, n_steps: int) -> pl.DataFrame:
    """One row per view and position in the step, over its matched calls: means over calls and
    ranks of wait and transfer, the arrival skew, the rank most often last, and the algorithm
    where the view's name says it (NCCL kernels)."""
    if matched.calls.height == 0:
        return pl.DataFrame()
    steps = max(n_steps, 1)
    key = ["group_key", S.NAME, S.COLLECTIVE, "position", "_direction"]
    calls = matched.calls
    if "peer_rank" not in calls.columns:
        calls = calls.with_columns(pl.lit(None, pl.Int32).alias("peer_rank"))
    # point-to-point calls: one row per direction (the peer's offset), never pooled with calls
    # to other peers as if of one group
    calls = calls.with_columns(
        (pl.col("peer_rank").cast(pl.Int64) - pl.col(S.RANK)).fill_null(0).alias("_direction")
    )
    return (
        calls.group_by(key)
        .agg(
            pl.col("step_key").n_unique().alias("matches"),
            pl.col(S.GROUP).first(),
            pl.col(S.BYTES).max(),
            pl.col("transfer_ns").mean(),
            pl.col("wait_ns").mean(),
            pl.col("queued_ns").mean(),
            pl.col("skew_ns").mean(),
            pl.col("last_rank").mode().min(),  # a tie: the lowest rank
            pl.col(S.RANK).n_unique().alias("_ranks"),
            pl.col("peer_rank").is_not_null().any().alias("_pair"),
        )
        .with_columns(
            pl.when("_pair").then(2).otherwise("_ranks").alias("ranks"),
            (pl.col("matches") / steps).alias("calls_per_step"),
            pl.col(S.NAME).str.extract(_ALGORITHM, 1).alias("algorithm"),
        )
        .sort("position", S.NAME)
    )


_MATCH_COLUMNS = {
    "matched": pl.Boolean,
    "position": pl.Int64,
    "last_rank": pl.Int32,
    "arrival_ns": pl.Int64,
    "last_arrival_ns": pl.Int64,
    "wait_ns": pl.Int64,
    "transfer_ns": pl.Int64,
    "queued_ns": pl.Int64,
    "skew_ns": pl.Int64,
}


def matched_table(collectives: pa.Table, cross: CrossRank | None) -> pa.Table:
    """The collectives table with what matching found for each call (``export``): matched,
    its place in the step, the last rank to arrive, arrival times on the aligned clock, wait,
    transfer and skew; null where the call was left unmatched or is a launch view."""
    if cross is not None and cross.calls is not None:
        collectives = cross.calls  # with the groups the pass told
    df = pl.from_arrow(collectives)
    assert isinstance(df, pl.DataFrame)
    key = [S.RANK, S.NAME, S.COLLECTIVE, S.SEQ]
    calls = cross.matched.calls if cross is not None else pl.DataFrame()
    if calls.height == 0:
        found = pl.DataFrame(schema={**{k: df.schema[k] for k in key}, **_MATCH_COLUMNS})
    else:
        found = calls.select(
            *key,
            pl.lit(True).alias("matched"),
            "position",
            pl.col("last_rank").cast(pl.Int32),
            pl.col(ISSUED).alias("arrival_ns"),
            "last_arrival_ns",
            "wait_ns",
            "transfer_ns",
            "queued_ns",
            "skew_ns",
        ).cast(_MATCH_COLUMNS)  # type: ignore[arg-type]
    joined = df.join(found, on=key, how="left").with_columns(pl.col("matched").fill_null(False))
    return joined.to_arrow()


def step_collectives(table: pa.Table) -> dict[int | None, list[StepCollective]]:
    """Per step, its matched calls (``matched_table``'s rows), the most skewed first."""
    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    df = df.filter(pl.col("matched"))
    if df.height == 0:
        return {}
    # (one call is one group's: two tensor-parallel pairs' all-reduces of one name and place
    # are two calls, each marked on its own pair)
    key = [S.STEP, S.GROUP, S.NAME, S.COLLECTIVE, "position"]
    calls = (
        df.group_by(key)
        .agg(
            pl.col("skew_ns").first(),
            pl.col("last_rank").first(),
            pl.col(S.RANK),
            pl.col("arrival_ns"),
        )
        .sort(
            [S.STEP, "skew_ns", "position", S.NAME, S.GROUP],
            descending=[False, True, False, False, False],
            nulls_last=True,
        )
    )
    out: dict[int | None, list[StepCollective]] = {}
    for row in calls.iter_rows(named=True):
        out.setdefault(row[S.STEP], []).append(
            StepCollective(
                name=row[S.NAME],
                collective=row[S.COLLECTIVE],
                position=row["position"],
                skew_ns=row["skew_ns"],
                last_rank=row["last_rank"],
                arrivals=dict(zip(row[S.RANK], row["arrival_ns"], strict=True)),
                group=row[S.GROUP],
            )
        )
    return out


def comm_by_group(
    matched: Matched, comm: pa.Table, groups: Groups, n_steps: int
) -> list[CommByGroup]:
    """Per (group, issuing phase, collective): the matched calls' time from issue to end (each
    rank's overlapping calls merged), the part of it exposed on the rank (``comm``'s exposed
    pieces), their wait and transfer, as means per step over the ranks that make the calls."""
    calls = matched.calls
    if calls.height == 0:
        return []
    steps = max(n_steps, 1)
    key = [S.GROUP, S.ISSUED_IN, S.COLLECTIVE]
    calls = calls.with_columns(
        pl.col(S.ISSUED_IN).fill_null(S.OTHER), pl.col(S.GROUP).fill_null("")
    ).with_columns(pl.struct(key).rank("dense").cast(pl.Int64).alias("_key"))
    # one slot per (rank, key): merge there, then measure each merged interval's exposed part
    slotted = calls.select(
        (pl.col(S.RANK).cast(pl.Int64) * PAIR + pl.col("_key")).alias(S.RANK),
        pl.col(ISSUED).alias(S.START_NS),
        S.END_NS,
    )
    merged = merged_exposed(slotted, "_key", comm)
    spans = (
        merged.with_columns(
            (pl.col(S.END_NS) - pl.col(S.START_NS)).alias("_total"),
            pl.col("exposed").alias("_exposed"),
        )
        .group_by("_key")
        .agg(pl.col("_total").sum(), pl.col("_exposed").sum())
    )
    rows = (
        calls.group_by("_key", *key)
        .agg(
            pl.len().alias("_calls"),
            pl.col(S.RANK).n_unique().alias("_ranks"),
            pl.col(S.BYTES).sum().alias("_bytes"),
            pl.col(S.BYTES).is_null().any().alias("_unsized"),
            pl.col("wait_ns").sum().alias("_wait"),
            pl.col("queued_ns").sum().alias("_queued"),
            pl.col("transfer_ns").sum().alias("_transfer"),
        )
        .join(spans, on="_key", how="left")
        .sort(S.GROUP, S.ISSUED_IN, S.COLLECTIVE)
    )
    ranks_of = groups.ranks_of
    dims = {g.name: g.dim for g in groups.groups}
    out = []
    for row in rows.iter_rows(named=True):
        per = steps * row["_ranks"]
        total = (row["_total"] or 0) / per / 1e6
        exposed_ms = min((row["_exposed"] or 0) / per / 1e6, total)
        # wait, queue and transfer are summed over calls that can overlap (a sum at least the
        # merged total): scaled to it
        parts = [row[c] / per / 1e6 for c in ("_wait", "_queued", "_transfer")]
        scale = total / sum(parts) if sum(parts) > 0 else 0.0
        wait, queued, transfer = (part * scale for part in parts)
        name = row[S.GROUP] or None
        out.append(
            CommByGroup(
                group=name,
                dim=dims.get(name) if name else None,
                ranks=ranks_of.get(name) if name else None,
                phase=row[S.ISSUED_IN],
                op=row[S.COLLECTIVE],
                calls_per_step=round(row["_calls"] / per, 3),
                bytes_per_step=None if row["_unsized"] else round(row["_bytes"] / per),
                total_ms=round(total, 3),
                exposed_ms=round(exposed_ms, 3),
                hidden_ms=round(total - exposed_ms, 3),
                wait_ms=round(wait, 3),
                transfer_ms=round(transfer, 3),
                queued_ms=round(queued, 3),
            )
        )
    return out


def alltoall_ranks(matched: Matched, n_steps: int) -> list[AllToAllRank]:
    """Per rank and group, its matched all-to-alls: calls and bytes sent per step, transfer,
    and the split imbalance (``schema.SPLIT_IMBALANCE``) turned into time: a call whose largest
    split is ``i`` times the mean moves for ``transfer`` where an even split would move for
    ``transfer / i``, so it costs ``transfer * (1 - 1 / i)``."""
    calls = matched.calls
    if calls.height == 0 or S.SPLIT_IMBALANCE not in calls.columns:
        return []
    calls = calls.filter(pl.col(S.COLLECTIVE) == "alltoall")
    if calls.height == 0:
        return []
    steps = max(n_steps, 1)
    split = pl.col(S.SPLIT_IMBALANCE)
    rows = (
        calls.group_by(S.RANK, S.GROUP)
        .agg(
            pl.len().alias("_calls"),
            pl.col(S.BYTES).sum().alias("_bytes"),
            pl.col(S.BYTES).is_null().any().alias("_unsized"),
            pl.col("transfer_ns").sum().alias("_transfer"),
            split.mean().alias("_imbalance"),
            (pl.col("transfer_ns") * (1 - 1 / split.clip(lower_bound=1.0)))
            .filter(split.is_not_null())
            .sum()
            .alias("_cost"),
            split.is_not_null().any().alias("_recorded"),
        )
        .sort(S.RANK, S.GROUP, nulls_last=True)
    )
    per = 1e-6 / steps
    return [
        AllToAllRank(
            rank=row[S.RANK],
            group=row[S.GROUP],
            calls_per_step=round(row["_calls"] / steps, 3),
            bytes_per_step=None if row["_unsized"] else round(row["_bytes"] / steps),
            transfer_ms=round(row["_transfer"] * per, 3),
            split_imbalance=round(row["_imbalance"], 3) if row["_recorded"] else None,
            imbalance_ms=round(row["_cost"] * per, 3) if row["_recorded"] else None,
        )
        for row in rows.iter_rows(named=True)
    ]
