"""The ops table: per rank, device, kind, phase and canonical operator, how often and how long.

``count``/``total``/percentiles count an operator once where it nests inside itself (aten::conv2d
around aten::convolution are both "convolution"); ``self`` adds the time of every event mapped to
the operator that no child event covers, so self times add up to the thread's busy time.
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from traceview import schema as S

_HOST_OP_KINDS = (S.KIND_OP, S.KIND_ANNOTATION)


def op_stats(events: pa.Table) -> pa.Table:
    """The ops table (schema.OPS_SCHEMA) of one or more ranks' events."""
    if events.num_rows == 0:
        return S.OPS_SCHEMA.empty_table()
    df = pl.from_arrow(
        events.select(
            [
                S.RANK,
                S.DEVICE,
                S.KIND,
                S.PHASE,
                S.OP,
                S.NAME,
                S.DUR_NS,
                S.SELF_NS,
                S.BYTES,
                S.EVENT_ID,
                S.PARENT,
            ]
        )
    )
    assert isinstance(df, pl.DataFrame)
    df = df.with_columns(
        pl.col(c).cast(pl.String) for c in (S.DEVICE, S.KIND, S.PHASE, S.OP, S.NAME)
    )
    df = df.filter(
        pl.col(S.KIND).is_in([*_HOST_OP_KINDS, *S.DEVICE_ACTIVITY_KINDS])
        & pl.col(S.OP).is_not_null()
    )
    parents = df.select(
        pl.col(S.RANK), pl.col(S.EVENT_ID).alias(S.PARENT), pl.col(S.OP).alias("parent_op")
    )
    df = df.join(parents, on=[S.RANK, S.PARENT], how="left")
    outer = pl.col("parent_op").is_null() | (pl.col("parent_op") != pl.col(S.OP))
    stats = (
        df.group_by(S.RANK, S.DEVICE, S.KIND, S.PHASE, S.OP)
        .agg(
            pl.col(S.NAME).mode().first().alias(S.NAME),
            outer.sum().cast(pl.Int64).alias(S.COUNT),
            pl.col(S.DUR_NS).filter(outer).sum().cast(pl.Int64).alias(S.TOTAL_NS),
            pl.col(S.SELF_NS).fill_null(pl.col(S.DUR_NS)).sum().cast(pl.Int64).alias(S.SELF_NS),
            pl.col(S.DUR_NS).filter(outer).median().alias(S.P50_NS),
            pl.col(S.DUR_NS).filter(outer).quantile(0.95, "linear").alias(S.P95_NS),
            pl.col(S.BYTES).filter(outer).sum().alias(S.BYTES),
            pl.col(S.BYTES).filter(outer).is_not_null().any().alias("has_bytes"),
        )
        .with_columns(
            (pl.col(S.TOTAL_NS) / pl.col(S.COUNT).clip(lower_bound=1)).alias(S.MEAN_NS),
            pl.when(pl.col("has_bytes")).then(pl.col(S.BYTES)).alias(S.BYTES),
            pl.col(S.P50_NS).fill_null(0.0),
            pl.col(S.P95_NS).fill_null(0.0),
        )
        .sort([S.RANK, S.SELF_NS], descending=[False, True])
    )
    return S.conform(stats.to_arrow(), S.OPS_SCHEMA)
