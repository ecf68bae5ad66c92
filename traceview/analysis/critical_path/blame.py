"""Blame: the walked paths' time per step, rank, phase and kind (and operator), and each
row's share of the step and excess over the median rank."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from traceview.analysis.critical_path.graph import _COMPUTING, LATE_START, NO_STEP, TRANSFER
from traceview.analysis.critical_path.walk import PIECE_COLUMNS, Walks
from traceview.analysis.rounding import rounded
from traceview.model import schema as S
from traceview.model.results import Blame, from_columns

_OWN = (*_COMPUTING, LATE_START)


def _pieces_of(walks: Walks | None) -> pl.DataFrame:
    """Every piece of ``walks`` that lasts, with its path's step (null: the one window)."""
    if walks is None or not len(walks):
        return pl.DataFrame(schema={**PIECE_COLUMNS, "step": pl.Int64})
    step = walks.step_column()
    column = pl.Series("step", pa.array(step, pa.int64(), mask=step == NO_STEP))
    return walks.frame.with_columns(column).filter(pl.col("dur_ns") > 0)


def _blame_rows(walks: Walks) -> pl.DataFrame:
    """The time of ``walks``' pieces per step, rank, phase, kind and operator (``ns``; the
    labels as strings). The five keys are one integer a piece where their ranges allow: a
    step's path of millions of pieces is summed without copying it or encoding its rows (the
    integer built in place a key at a time, a key of one value skipped: one key's column held
    beside it, not five; every piece lasting, none is gathered)."""
    frame = walks.frame
    lasting = frame["dur_ns"].to_numpy() > 0
    every = bool(lasting.all())
    lasts = np.flatnonzero(lasting) if not every else np.zeros(0, np.int64)
    count = frame.height if every else len(lasts)
    del lasting
    labels = ("phase", "kind", "op")

    def codes(name: str) -> tuple[pl.Series, int | None]:
        # (a category's code; a null after every code)
        physical = frame[name].to_physical()
        top = physical.max()
        return physical, None if top is None else int(top) + 1  # type: ignore[arg-type]

    def column(name: str) -> np.ndarray:
        if name == "step":
            return walks.step_column()
        if name == "rank":
            return frame["rank"].to_numpy()
        physical, null = codes(name)
        return physical.fill_null(0 if null is None else null).to_numpy()

    def bounds(name: str) -> tuple[int, int]:
        """The key's lowest and highest value over the lasting pieces (or every piece)."""
        if name == "step":
            held = walks.steps[np.diff(walks.offsets) > 0] if every else walks.steps
            return (int(held.min()), int(held.max())) if len(held) else (0, 0)
        if name == "rank":
            low, high = frame["rank"].min(), frame["rank"].max()
        else:
            physical, null = codes(name)
            low, high = physical.min(), physical.max()
            if physical.null_count():
                low, high = (null, null) if low is None else (low, null)
        return (0, 0) if low is None else (int(low), int(high))  # type: ignore[arg-type]

    key = np.zeros(count, np.int64)
    size = 1.0
    for name in ("step", "rank", *labels):
        if every:
            low, high = bounds(name)
            if low == high:
                continue  # (one value: nothing to tell apart)
            values = column(name)
        else:
            values = column(name)[lasts]
            if not len(values):
                continue
            low, high = int(values.min()), int(values.max())
        width = high - low + 1
        size *= width
        if size >= 2.0**62:  # (steps far apart: by the columns)
            return _blame_rows_by_columns(walks)
        key *= width
        np.add(key, values, out=key, casting="unsafe")
        key -= low
        del values
    ns = frame["dur_ns"] if every else frame["dur_ns"].gather(lasts)
    by_key = pl.DataFrame([pl.Series("key", key), ns.alias("ns")])
    del key, ns
    groups = (
        by_key.with_row_index("at").group_by("key").agg(pl.col("ns").sum(), pl.col("at").first())
    )
    del by_key
    at = groups["at"].to_numpy()
    row = at if every else lasts[at]
    return pl.DataFrame(
        {
            "step": walks.steps[np.searchsorted(walks.offsets, row, side="right") - 1],
            "rank": frame["rank"].to_numpy()[row],
            **{name: frame[name].gather(row).cast(pl.String) for name in labels},
            "ns": groups["ns"],
        },
        schema_overrides={"step": pl.Int64},
    )


def _blame_rows_by_columns(walks: Walks) -> pl.DataFrame:
    """``_blame_rows`` grouped by the five columns themselves."""
    rows = walks.frame.with_columns(pl.Series("step", walks.step_column(), pl.Int64))
    return (
        rows.filter(pl.col("dur_ns") > 0)
        .group_by("step", "rank", "phase", "kind", "op")
        .agg(pl.col("dur_ns").sum().alias("ns"))
        .with_columns(pl.col("phase", "kind", "op").cast(pl.String))
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
    df: pl.DataFrame, steps: np.ndarray, step_ms: np.ndarray, median_phase: dict[str, float]
) -> list[list[Blame]]:
    """``_blame`` of each step's rows alone (one step each), in one pass over every step's:
    a list for each of ``steps`` (each walked step, ``step_ms`` its length; a step twice, or
    with no rows, is given the step's rows, or none)."""
    if df.height == 0:
        return [[] for _ in range(len(steps))]
    agg = df.group_by("step", "rank", "phase", "kind").agg(
        (pl.col("ns").sum() / 1 / 1e6).alias("ms")
    )
    # by step, then as ``_blame`` orders a step's rows (ms down; rank, phase, kind up, a null
    # label last): one numpy sort of numbers, the labels by their places in sorted order
    order = agg[
        np.lexsort(
            (
                _lexical_codes(agg["kind"]),
                _lexical_codes(agg["phase"]),
                agg["rank"].to_numpy(),
                -agg["ms"].to_numpy(),
                agg["step"].to_numpy(),
            )
        )
    ]
    known = pl.DataFrame(
        {"step": steps, "step_ms": step_ms},
        schema={"step": order.schema["step"], "step_ms": pl.Float64},
    ).unique("step", keep="last", maintain_order=True)
    order = order.join(known, on="step", how="left", maintain_order="left")
    blames = _blamed(order, median_phase)
    # (sorted by step: each step's rows one run, found by a search)
    step = order["step"].to_numpy()
    wanted = np.asarray(steps).astype(step.dtype, copy=False)
    starts = np.searchsorted(step, wanted, "left").tolist()
    ends = np.searchsorted(step, wanted, "right").tolist()
    return [blames[a:b] for a, b in zip(starts, ends, strict=True)]


def _lexical_codes(labels: pl.Series) -> np.ndarray:
    """Each label's place among the distinct labels sorted (a null: after them all)."""
    values = sorted(labels.drop_nulls().unique().to_list())
    coded = labels.replace_strict(
        values, list(range(len(values))), default=len(values), return_dtype=pl.Int32
    )
    return coded.to_numpy()


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
    excess_ms = np.array(rounded(excess.fill_null(0.0).to_numpy(), 3), object)
    excess_ms[excess.is_null().to_numpy()] = None
    return from_columns(
        Blame,
        {
            "rank": rows["rank"].to_list(),
            "phase": rows["phase"].to_list(),
            "kind": rows["kind"].to_list(),
            "ms": rounded(figures["ms"].to_numpy(), 3),
            "share": rounded(figures["share"].to_numpy(), 4),
            "excess_ms": excess_ms.tolist(),
        },
    )
