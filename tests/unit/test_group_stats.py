"""Sums and percentiles over groups in numpy (``model.columns``: ``sorted_in_groups``,
``group_quantile``, ``group_sums``) and the launches table made with them
(``analysis.gpu.combine_launches``), held to polars' group-by on the same numbers: another
library's quantiles, bit for bit."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from traceview.analysis.gpu import KernelRows, combine_launches
from traceview.model import schema as S
from traceview.model.columns import group_quantile, group_sums, sorted_in_groups


@pytest.mark.parametrize("seed", range(40))
def test_sorted_in_groups_is_a_lexsort_and_the_figures_are_polars(seed: int) -> None:
    rng = np.random.default_rng(seed)
    groups = int(rng.integers(1, 60))
    rows = int(rng.integers(0, 500))
    # small values, times, and a span too wide for one integer key (the lexsort it falls back on)
    scale = [10, 10**9, 10**15, 1 << 52, 1 << 62][seed % 5]
    values = rng.integers(-scale, scale, rows, dtype=np.int64)
    group = rng.integers(0, groups, rows)
    sizes = np.bincount(group, minlength=groups)
    ordered = sorted_in_groups(values.astype(np.int32) if scale == 10 else values, group, sizes)
    expected = values[np.lexsort((values, group))]
    assert ordered.dtype == np.int64 and np.array_equal(ordered, expected)
    if scale > 1 << 52:  # (beyond exact doubles: polars and numpy round differently there)
        return
    reference = (
        pl.DataFrame({"g": group, "v": values})
        .group_by("g")
        .agg(
            pl.col("v").quantile(0.5, "linear").alias("p50"),
            pl.col("v").quantile(0.95, "linear").alias("p95"),
            pl.col("v").sum().alias("sum"),
        )
        .sort("g")
    )
    present = sizes > 0
    assert np.array_equal(group_quantile(ordered, sizes, 0.5)[present], reference["p50"].to_numpy())
    assert np.array_equal(
        group_quantile(ordered, sizes, 0.95)[present], reference["p95"].to_numpy()
    )
    assert np.array_equal(group_sums(ordered, sizes)[present], reference["sum"].to_numpy())
    assert not group_quantile(ordered, sizes, 0.5)[~present].any()
    assert not group_sums(ordered, sizes)[~present].any()


@pytest.mark.parametrize("seed", range(20))
def test_values_in_pieces_sort_as_one_array(seed: int) -> None:
    """The ops table's percentiles pass each part's durations and 32-bit groups as they are:
    the key is still 64 bits (a group times a span of 10**15 overflows 32)."""
    rng = np.random.default_rng(seed)
    groups = int(rng.integers(1, 40))
    values = [rng.integers(0, 10**15, int(rng.integers(0, 80))) for _ in range(4)]
    group = [rng.integers(0, groups, len(v)).astype(np.int32) for v in values]
    every, of = np.concatenate(values), np.concatenate(group).astype(np.int64)
    sizes = np.bincount(of, minlength=groups)
    assert np.array_equal(sorted_in_groups(values, group, sizes), every[np.lexsort((every, of))])


def _parts(rng: np.random.Generator) -> list[KernelRows]:
    """Random slices' kernels: steps repeated across slices and none, op names shared, unknown
    and empty, numbers that fit 32 bits and some that do not."""
    names = ["aten::mm", "aten::add", "", "nccl:all_reduce", "zeta", "Ω-op"]
    parts = []
    for _ in range(int(rng.integers(1, 6))):
        n = int(rng.integers(0, 300))
        ops = list(rng.choice(names, int(rng.integers(1, 4)), replace=False))
        wide = rng.random() < 0.3

        def numbers(low: int, high: int, n: int = n, wide: bool = wide) -> np.ndarray:
            values = rng.integers(low, high, n, dtype=np.int64)
            if wide and n:
                values[0] = 5 << 31
            return values if wide else values.astype(np.int32)

        parts.append(
            KernelRows(
                step=rng.choice([-1, 3, 4, 7, 12], n).astype(np.int32),
                phase=rng.integers(0, len(S.EVENT_PHASES), n).astype(np.int8),
                op=rng.integers(-1, len(ops), n).astype(np.int32),
                ops=ops,
                latency=numbers(-50, 5000),
                queue=numbers(0, 80000),
                duration=numbers(0, 3000),
                overhead=numbers(0, 3000),
            )
        )
    return parts


def _reference(parts: list[KernelRows], rank: int) -> pl.DataFrame:
    """The launches table by polars' group-bys over every kernel in one frame (op "" for an
    unknown one), the levels in order: per step, per (step, phase), per (step, phase, op)."""
    kernels = pl.DataFrame(
        {
            S.STEP: np.concatenate([p.step.astype(np.int64) for p in parts]),
            S.PHASE: np.concatenate([np.array(S.EVENT_PHASES)[p.phase] for p in parts]),
            S.OP: np.concatenate([np.array([*p.ops, ""], object)[p.op] for p in parts]),
            **{
                name: np.concatenate([getattr(p, name).astype(np.int64) for p in parts])
                for name in ("latency", "queue", "duration", "overhead")
            },
        }
    ).with_columns(pl.when(pl.col(S.STEP) >= 0).then(pl.col(S.STEP)).alias(S.STEP))
    figures = [
        pl.len().cast(pl.Int64).alias(S.KERNELS),
        pl.col("latency").quantile(0.5, "linear").alias(S.LATENCY_P50_NS),
        pl.col("latency").quantile(0.95, "linear").alias(S.LATENCY_P95_NS),
        pl.col("queue").quantile(0.5, "linear").alias(S.QUEUE_P50_NS),
        pl.col("queue").quantile(0.95, "linear").alias(S.QUEUE_P95_NS),
        (pl.col("latency") + pl.col("queue")).sum().alias(S.DELAY_TOTAL_NS),
        pl.col("queue").sum().alias(S.QUEUE_TOTAL_NS),
        pl.col("duration").quantile(0.5, "linear").alias(S.DURATION_P50_NS),
        pl.col("duration").quantile(0.95, "linear").alias(S.DURATION_P95_NS),
        pl.col("overhead").quantile(0.5, "linear").alias(S.OVERHEAD_P50_NS),
        pl.col("duration").sum().alias(S.TOTAL_NS),
        (pl.col("duration") < pl.col("overhead")).sum().cast(pl.Int64).alias(S.SHORT_KERNELS),
    ]
    levels = []
    for keys in ([S.STEP], [S.STEP, S.PHASE], [S.STEP, S.PHASE, S.OP]):
        rows = kernels.group_by(keys).agg(figures).sort(keys, nulls_last=True)
        for missing in {S.PHASE, S.OP} - set(keys):
            rows = rows.with_columns(pl.lit(None, pl.String).alias(missing))
        levels.append(rows)
    out = pl.concat([level.select(levels[2].columns) for level in levels])
    return out.with_columns(pl.lit(rank, pl.Int32).alias(S.RANK))


@pytest.mark.parametrize("seed", range(25))
def test_the_launches_table_is_polars_group_bys_of_the_kernels(seed: int) -> None:
    parts = _parts(np.random.default_rng(seed))
    table = combine_launches(parts, 5)
    if not sum(len(p) for p in parts):
        assert table.num_rows == 0 and table.schema.equals(S.LAUNCHES_SCHEMA)
        return
    expected = _reference(parts, 5).select(table.column_names)
    got = pl.from_arrow(table)
    assert isinstance(got, pl.DataFrame)
    assert got.height == expected.height
    for name in table.column_names:  # (column by column: the first that differs is named)
        assert got[name].to_list() == expected[name].to_list(), name
