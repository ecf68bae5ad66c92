"""Blame: the walked paths' time per step, rank, phase and kind (and operator), and each
row's share of the step and excess over the median rank."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from traceview.analysis.critical_path.graph import _COMPUTING, LATE_START, NO_STEP, TRANSFER
from traceview.analysis.critical_path.walk import PIECE_COLUMNS, WalkedPath
from traceview.model import schema as S
from traceview.model.results import Blame

_OWN = (*_COMPUTING, LATE_START)


def _pieces_of(paths: list[WalkedPath]) -> pl.DataFrame:
    """Every piece of ``paths`` that lasts, with its path's step (null: the one window): the
    paths' frames one after the other, their steps repeated (one column for all of them, not
    one per path: a run of thousands of short steps)."""
    if not paths:
        return pl.DataFrame(schema={**PIECE_COLUMNS, "step": pl.Int64})
    steps = np.array([p.step for p in paths], np.int64)
    step = np.repeat(steps, [p.frame.height for p in paths])
    column = pl.Series("step", pa.array(step, pa.int64(), mask=step == NO_STEP))
    whole = pl.concat([p.frame for p in paths], rechunk=False)
    return whole.with_columns(column).filter(pl.col("dur_ns") > 0)


def _blame_rows(paths: list[WalkedPath]) -> pl.DataFrame:
    return _pieces_of(paths).select(
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
    return [_blamed(row, step_ms, median_phase) for row in order.iter_rows(named=True)]


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
    out: dict[int, list[Blame]] = {}
    for row in order.iter_rows(named=True):
        step = int(row["step"])
        out.setdefault(step, []).append(_blamed(row, step_ms[step], median_phase))
    return out


def _blamed(row: dict[str, Any], step_ms: float, median_phase: dict[str, float]) -> Blame:
    ms = float(row["ms"])
    kind, phase = row["kind"], row["phase"]
    if kind == LATE_START:
        excess: float | None = ms
    elif kind in (TRANSFER, S.SEGMENT_IDLE) or phase is None:
        excess = None
    else:
        excess = ms - median_phase.get(phase, 0.0)
    return Blame(
        rank=int(row["rank"]),
        phase=phase,
        kind=kind,
        ms=round(ms, 3),
        share=round(ms / step_ms, 4) if step_ms > 0 else 0.0,
        excess_ms=round(excess, 3) if excess is not None else None,
    )
