"""What traceview found, drawn into the merged Chrome trace beside the events: a flow arrow from
each rank's collective call to the same call on the rank that arrived last (the one everybody
waited for), each rank's exclusive phases as a track (the attribution, instant by instant), and
the critical path of every step as a process of its own. Perfetto then shows the cross-rank
story, not only the events."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import polars as pl
import pyarrow as pa

from traceview.model import schema as S

GPU_TID_BASE = 1 << 30  # device streams get tids of their own, apart from host threads
STEPS_TID = (1 << 31) - 1
PHASES_TID = STEPS_TID - 1
#: The critical path's own process, after every rank's.
PATH_PID = (1 << 31) - 1


def lane_of(device: pl.Expr, pid: pl.Expr, tid: pl.Expr) -> pl.Expr:
    """The track an event lies on: its thread, or its device stream's own track."""
    return (
        pl.when(device.cast(pl.String) == S.DEVICE_GPU)
        .then(GPU_TID_BASE + pid * 4096 + tid)
        .otherwise(tid)
    )


def collective_flows(
    matched: pa.Table, shifts: dict[int, int], ranks: set[int], ids: Iterator[int]
) -> list[dict[str, Any]]:
    """An arrow ("s" on the call, "f" on the last rank's call) from each rank's matched call to
    its match on the rank that arrived last; ``shifts``: ns to subtract from each rank's times."""
    df = pl.from_arrow(matched)
    assert isinstance(df, pl.DataFrame)
    if df.height == 0 or "matched" not in df.columns:
        return []
    calls = df.filter(pl.col("matched") & pl.col(S.RANK).is_in(list(ranks))).with_columns(
        lane_of(pl.col(S.DEVICE), pl.col(S.PID), pl.col(S.TID)).alias("lane"),
        (pl.col(S.START_NS) - pl.col(S.RANK).replace_strict(shifts, default=0))
        .truediv(1000)
        .alias("ts_us"),
        (pl.col(S.END_NS) - pl.col(S.START_NS)).truediv(1000).alias("dur_us"),
    )
    key = [S.STEP, S.GROUP, S.NAME, S.COLLECTIVE, "position"]
    last = calls.filter(pl.col(S.RANK) == pl.col("last_rank")).select(
        *key,
        pl.col("lane").alias("to_lane"),
        pl.col("ts_us").alias("to_ts"),
        pl.col(S.RANK).alias("to_rank"),
    )
    pairs = (
        calls.filter(pl.col(S.RANK) != pl.col("last_rank"))
        .join(last, on=key, how="inner", nulls_equal=True)
        .sort("ts_us")
    )
    out: list[dict[str, Any]] = []
    for rank, lane_, ts, dur, to_rank, to_lane, to_ts, name, wait in pairs.select(
        S.RANK, "lane", "ts_us", "dur_us", "to_rank", "to_lane", "to_ts", S.COLLECTIVE, "wait_ns"
    ).iter_rows():
        flow = next(ids)
        base = {"name": f"waits for rank {to_rank}", "cat": "last arrival", "id": flow}
        start = round(ts + min(dur / 2, 0.001), 3)
        out.append({**base, "ph": "s", "pid": rank, "tid": lane_, "ts": start,
                    "args": {"collective": name, "wait_ms": round((wait or 0) / 1e6, 3)}})  # fmt: skip
        out.append({**base, "ph": "f", "bp": "e", "pid": to_rank, "tid": to_lane,
                    "ts": round(to_ts, 3)})  # fmt: skip
    return out


def phase_slices(
    pieces: Iterable[pa.Table], shifts: dict[int, int], ranks: set[int]
) -> Iterator[list[dict[str, Any]]]:
    """Each rank's exclusive phases as slices on a track of its own, a stretch of one phase
    merged into one slice (the attribution's segments, a piece at a time)."""
    for piece in pieces:
        df = pl.from_arrow(piece.select([S.RANK, S.STEP, S.START_NS, S.END_NS, S.PHASE]))
        assert isinstance(df, pl.DataFrame)
        df = df.filter(pl.col(S.RANK).is_in(list(ranks))).sort(S.RANK, S.START_NS)
        if df.height == 0:
            continue
        # a new slice where the rank, the step or the phase changes, or time skips
        new = (
            (pl.col(S.RANK) != pl.col(S.RANK).shift())
            | (pl.col(S.PHASE) != pl.col(S.PHASE).shift())
            | (pl.col(S.STEP).ne_missing(pl.col(S.STEP).shift()))
            | (pl.col(S.START_NS) != pl.col(S.END_NS).shift())
        ).fill_null(True)
        runs = (
            df.with_columns(new.cum_sum().alias("run"))
            .group_by("run", maintain_order=True)
            .agg(
                pl.col(S.RANK).first(),
                pl.col(S.STEP).first(),
                pl.col(S.PHASE).first(),
                pl.col(S.START_NS).first(),
                pl.col(S.END_NS).last(),
            )
            .with_columns(pl.col(S.RANK).replace_strict(shifts, default=0).alias("shift"))
        )
        yield [
            {"ph": "X", "name": phase, "cat": "traceview phase", "pid": rank, "tid": PHASES_TID,
             "ts": round((start - shift) / 1000, 3), "dur": round((end - start) / 1000, 3),
             "args": {"step": step}}
            for rank, step, phase, start, end, shift in runs.select(
                S.RANK, S.STEP, S.PHASE, S.START_NS, S.END_NS, "shift"
            ).iter_rows()
        ]  # fmt: skip


def path_track(path: pa.Table, origin: int) -> list[dict[str, Any]]:
    """Every step's critical path as one track of its own process: each stretch named by the
    rank holding it and what it did (the path is on the run's aligned clock)."""
    df = pl.from_arrow(path)
    assert isinstance(df, pl.DataFrame)
    out: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": PATH_PID, "tid": 0,
         "args": {"name": "traceview critical path"}},
        {"ph": "M", "name": "process_sort_index", "pid": PATH_PID, "tid": 0,
         "args": {"sort_index": -1}},
        {"ph": "M", "name": "thread_name", "pid": PATH_PID, "tid": 1,
         "args": {"name": "critical path (rank: what holds the step)"}},
    ]  # fmt: skip
    for step, rank, start, dur, phase, kind, op in df.select(
        S.STEP, S.RANK, S.START_NS, "dur_ns", S.PHASE, S.KIND, S.OP
    ).iter_rows():
        what = phase if kind == "compute" and phase else kind
        args: dict[str, Any] = {"rank": rank, "step": step, "phase": phase, "kind": kind}
        if op is not None:
            args["op"] = op
        out.append({"ph": "X", "name": f"rank {rank}: {what}", "cat": "critical path",
                    "pid": PATH_PID, "tid": 1, "ts": round((start - origin) / 1000, 3),
                    "dur": round(dur / 1000, 3), "args": args})  # fmt: skip
    return out
