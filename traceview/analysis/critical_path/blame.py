"""Blame: the walked paths' time per step, rank, phase and kind (and operator), and each
row's share of the step and excess over the median rank."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from traceview.analysis.critical_path.graph import _COMPUTING, LATE_START, NO_STEP, TRANSFER
from traceview.analysis.critical_path.walk import PIECE_COLUMNS, Walks
from traceview.analysis.rounding import rounded
from traceview.model import schema as S
from traceview.model.results import Blame

_OWN = (*_COMPUTING, LATE_START)


def _pieces_of(walks: Walks | None) -> pl.DataFrame:
    """Every piece of ``walks`` that lasts, with its path's step (null: the one window)."""
    if walks is None or not len(walks):
        return pl.DataFrame(schema={**PIECE_COLUMNS, "step": pl.Int64})
    step = walks.step_column()
    column = pl.Series("step", pa.array(step, pa.int64(), mask=step == NO_STEP))
    return walks.frame.with_columns(column).filter(pl.col("dur_ns") > 0)


def _blame_rows(walks: Walks) -> pl.DataFrame:
    return _pieces_of(walks).select(
        pl.col("step").fill_null(NO_STEP),
        "rank",
        "phase",
        "kind",
        "op",
        pl.col("dur_ns").alias("ns"),
    )


def _blame(
    df: pl.DataFrame, n_steps: int, step_ms: float, median_phase: dict[str, float]
) -> list[Blame]:
    if df.height == 0 or n_steps == 0:
        return []
    agg = df.group_by("rank", "phase", "kind").agg((pl.col("ns").sum() / n_steps / 1e6).alias("ms"))
    order = agg.sort(
        "ms", "rank", "phase", "kind", descending=[True, False, False, False], nulls_last=True
    )
    return _blamed(order.with_columns(pl.lit(step_ms, pl.Float64).alias("step_ms")), median_phase)


def _blame_per_step(
    df: pl.DataFrame, step_ms: dict[int, float], median_phase: dict[str, float]
) -> dict[int, list[Blame]]:
    """``_blame`` of each step's rows alone (one step each), in one pass over every step's."""
    if df.height == 0:
        return {}
    agg = df.group_by("step", "rank", "phase", "kind").agg(
        (pl.col("ns").sum() / 1 / 1e6).alias("ms")
    )
    order = agg.sort(
        "step", "ms", "rank", "phase", "kind",
        descending=[False, True, False, False, False], nulls_last=True,
    )  # fmt: skip
    known = pl.DataFrame(
        {"step": list(step_ms), "step_ms": list(step_ms.values())},
        schema={"step": order.schema["step"], "step_ms": pl.Float64},
    )
    order = order.join(known, on="step", how="left", maintain_order="left")
    blames = _blamed(order, median_phase)
    steps = order["step"].to_list()
    out: dict[int, list[Blame]] = {}
    for step, blame in zip(steps, blames, strict=True):
        out.setdefault(step, []).append(blame)
    return out


def _blamed(rows: pl.DataFrame, median_phase: dict[str, float]) -> list[Blame]:
    """Each row's (rank, phase, kind, ms, step_ms) blame: its share of the step, and for own
    work, its excess over the median rank's time in the phase (a late start: all of it)."""
    kind, phase, ms = pl.col("kind"), pl.col("phase"), pl.col("ms")
    median = (
        phase.cast(pl.String).replace_strict(
            list(median_phase), list(median_phase.values()), default=0.0, return_dtype=pl.Float64
        )
        if median_phase
        else pl.lit(0.0)
    )
    figures = rows.select(
        ms,
        pl.when(pl.col("step_ms") > 0).then(ms / pl.col("step_ms")).otherwise(0.0).alias("share"),
        pl.when(kind == LATE_START)
        .then(ms)
        .when(kind.is_in([TRANSFER, S.SEGMENT_IDLE]) | phase.is_null())
        .then(None)
        .otherwise(ms - median)
        .alias("excess"),
    )
    excess = figures["excess"]
    known = excess.is_not_null().to_list()
    return [
        Blame(rank=r, phase=p, kind=k, ms=m, share=sh, excess_ms=e if ok else None)
        for r, p, k, m, sh, e, ok in zip(
            rows["rank"].to_list(),
            rows["phase"].to_list(),
            rows["kind"].to_list(),
            rounded(figures["ms"].to_numpy(), 3),
            rounded(figures["share"].to_numpy(), 4),
            rounded(excess.fill_null(0.0).to_numpy(), 3),
            known,
            strict=True,
        )
    ]
