"""The walk: each step's critical path walked back from its end through the graph's edges
(``critical_paths``), and the pieces it leaves (``PathPiece``, ``WalkedPath``)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import polars as pl
import pyarrow as pa

from traceview.analysis.critical_path.graph import LATE_START, TRANSFER, Graph
from traceview.analysis.crossrank import ISSUED
from traceview.model import schema as S


@dataclass
class PathPiece:
    rank: int
    phase: str | None
    op: str | None
    kind: str
    start_ns: int  # on the run's clock
    dur_ns: int


#: The columns of a walked path's pieces (``WalkedPath.frame``), in time order: PathPiece's
#: fields, named as in schema.CRITICAL_PATH_SCHEMA.
PIECE_COLUMNS = {
    S.RANK: pl.Int32,
    S.PHASE: pl.String,
    S.OP: pl.String,
    S.KIND: pl.String,
    S.START_NS: pl.Int64,
    S.DUR_NS: pl.Int64,
}


@dataclass
class WalkedPath:
    step: int
    start_ns: int  # the job's step: first rank's start ...
    end_ns: int  # ... to the last rank's end
    frame: pl.DataFrame  # its pieces in time order (PIECE_COLUMNS): a rank's own stretch
    # of thousands of segments is built as columns, never one object per piece
    complete: bool
    reason: str | None

    @property
    def pieces(self) -> list[PathPiece]:
        return [PathPiece(*row) for row in self.frame.iter_rows()]


class _Labels:
    """A string column read by position without turning every row into a Python string: its
    dictionary codes (-1: null), and the dictionary, which ``code`` extends."""

    def __init__(self, column: pl.Series) -> None:
        encoded = column.to_arrow().dictionary_encode()
        if isinstance(encoded, pa.ChunkedArray):
            encoded = encoded.combine_chunks()
        self.codes = np.asarray(encoded.indices.cast(pa.int64()).fill_null(-1), np.int64)
        self.values: list[str] = encoded.dictionary.to_pylist()
        self._code_of = {value: code for code, value in enumerate(self.values)}

    def __getitem__(self, i: int) -> str | None:
        code = int(self.codes[i])
        return self.values[code] if code >= 0 else None

    def code(self, value: str | None) -> int:
        """The code of ``value`` (-1: None), added to the dictionary where it is new."""
        if value is None:
            return -1
        code = self._code_of.get(value)
        if code is None:
            code = self._code_of[value] = len(self.values)
            self.values.append(value)
        return code

    def column(self, codes: np.ndarray) -> pa.Array:
        """The strings of ``codes`` (-1: null), decoded by Arrow."""
        dictionary = pa.array(self.values, pa.string())
        return dictionary.take(pa.array(codes, mask=codes < 0))


class _Pieces:
    """A path's pieces as the walk finds them, latest first: single pieces, and runs of a
    rank's own items (kept as index ranges); ``frame`` lays them out as columns in time
    order."""

    def __init__(self, start: np.ndarray, end: np.ndarray, labels: tuple[_Labels, ...]):
        self.start, self.end = start, end
        self.phase, self.kind, self.op = labels
        self.blocks: list[PathPiece | tuple[int, int, int, int]] = []

    def append(self, piece: PathPiece) -> None:
        self.blocks.append(piece)

    def own(self, rank: int, first: int, last: int, until: int) -> None:
        """Items ``first``..``last`` of ``rank``, the last one cut at ``until``."""
        self.blocks.append((rank, first, last, until))

    def columns(self) -> list[np.ndarray]:
        """The pieces in time order as code columns: rank, phase, op, kind (``_Labels``
        codes), start, duration (``_frames`` makes them PIECE_COLUMNS)."""
        ranks, starts, durs, phases, ops, kinds = [], [], [], [], [], []
        # a wait's kind reads as a transfer; a kind-less segment as "None", as str() writes it
        comm, transfer = self.kind.code(S.SEGMENT_COMM), self.kind.code(TRANSFER)
        no_kind = self.kind.code("None")
        for block in reversed(self.blocks):
            if isinstance(block, PathPiece):
                ranks.append(np.array([block.rank], np.int64))
                starts.append(np.array([block.start_ns], np.int64))
                durs.append(np.array([block.dur_ns], np.int64))
                phases.append(np.array([self.phase.code(block.phase)], np.int64))
                ops.append(np.array([self.op.code(block.op)], np.int64))
                kinds.append(np.array([self.kind.code(block.kind)], np.int64))
                continue
            rank, first, last, until = block
            start = self.start[first : last + 1].astype(np.int64)
            end = self.end[first : last + 1].astype(np.int64)
            end[-1] = until
            kind = self.kind.codes[first : last + 1]
            kind = np.where(kind == comm, transfer, np.where(kind < 0, no_kind, kind))
            ranks.append(np.full(len(start), rank, np.int64))
            starts.append(start)
            durs.append(end - start)
            phases.append(self.phase.codes[first : last + 1])
            ops.append(self.op.codes[first : last + 1])
            kinds.append(kind)
        parts = (ranks, phases, ops, kinds, starts, durs)
        return [np.concatenate(p) if p else np.zeros(0, np.int64) for p in parts]


def _frames(columns: list[list[np.ndarray]], labels: tuple[_Labels, ...]) -> list[pl.DataFrame]:
    """Each path's pieces (``_Pieces.columns``) as PIECE_COLUMNS: one frame made for them all
    (a run of thousands of short steps), a slice of it each."""
    if not columns:
        return []
    phase, kind, op = labels
    ranks, phases, ops, kinds, starts, durs = (
        np.concatenate([path[i] for path in columns]) for i in range(6)
    )
    table = pa.table(
        {
            S.RANK: pa.array(ranks, pa.int64()),
            S.PHASE: phase.column(phases),
            S.OP: op.column(ops),
            S.KIND: kind.column(kinds),
            S.START_NS: pa.array(starts, pa.int64()),
            S.DUR_NS: pa.array(durs, pa.int64()),
        }
    )
    whole = pl.from_arrow(table)
    assert isinstance(whole, pl.DataFrame)
    whole = whole.cast(PIECE_COLUMNS)  # type: ignore[arg-type]
    offsets = np.cumsum([0, *(len(path[0]) for path in columns)]).tolist()
    return [whole.slice(a, b - a) for a, b in pairwise(offsets)]


def critical_paths(graph: Graph, items_in_run: int | None = None) -> list[WalkedPath]:
    """The critical path of every step of the graph, walked back from its end
    (``items_in_run``: where the graph is a batch of the run's steps, the items of them all,
    which bound a walk as the whole graph bounds it)."""
    items = graph.items
    start = items[S.START_NS].to_numpy()
    end = items[S.END_NS].to_numpy()
    call = items["call"].to_numpy()
    phase, kind, op = (_Labels(items[name]) for name in (S.PHASE, S.KIND, S.OP))
    # per item, the last item at or before it that waits for a call (-1: none)
    last_wait = np.maximum.accumulate(np.where(call >= 0, np.arange(len(call)), -1))
    calls = graph.calls
    c = {
        name: calls[name].to_numpy()
        for name in (
            ISSUED,
            S.END_NS,
            "last_arrival_ns",
            "last_rank",
            "prev",
            "prev_end",
            "uses_all",
            S.RANK,
        )
    }
    c_op = calls[S.COLLECTIVE].to_list()
    groups = items.group_by(S.STEP, S.RANK, maintain_order=True).agg(
        pl.col(S.START_NS).min().alias("s"),
        pl.col(S.END_NS).max().alias("e"),
    )
    where = (
        items.with_row_index("_i")
        .group_by(S.STEP, S.RANK, maintain_order=True)
        .agg(pl.col("_i").min().alias("lo"), pl.col("_i").max().alias("hi"))
    )
    bounds = {(s, r): (lo, hi) for s, r, lo, hi in where.iter_rows()}
    # per step: the first rank's start, the last rank's end and that rank (ties: the highest)
    jobs = (
        groups.sort(S.STEP, "e", S.RANK)
        .group_by(S.STEP, maintain_order=True)
        .agg(
            pl.col("s").min().alias("start"), pl.col("e").last().alias("end"), pl.col(S.RANK).last()
        )
    )
    job_of = {row[0]: row[1:] for row in jobs.iter_rows()}
    walked: list[tuple[int, int, int, str | None]] = []
    columns: list[list[np.ndarray]] = []
    for s in graph.steps:
        if s not in job_of:
            continue
        job_start, job_end, last_rank = (int(v) for v in job_of[s])
        pieces = _Pieces(start, end, (phase, kind, op))
        reason = graph.unmatched_steps.get(s)
        r, t = last_rank, job_end
        guard = 0
        limit = 4 * ((items_in_run or items.height) + calls.height) + 16
        while t > job_start:
            guard += 1
            if guard > limit:
                reason = "the calls wait on each other in a cycle (clocks off?)"
                pieces.append(PathPiece(r, None, None, S.SEGMENT_IDLE, job_start, t - job_start))
                break
            span = bounds.get((s, r))
            if span is None or t <= start[span[0]]:
                # before the rank's step began: late start (carried in from before the window)
                pieces.append(PathPiece(r, None, None, LATE_START, job_start, t - job_start))
                break
            lo, hi = span
            i = lo + int(np.searchsorted(start[lo : hi + 1], t, side="left")) - 1
            if t > end[i]:  # past the rank's last item: nothing ran on it
                pieces.append(
                    PathPiece(r, S.IDLE, None, S.SEGMENT_IDLE, int(end[i]), t - int(end[i]))
                )
                t = int(end[i])
                continue
            k = int(call[i])
            if k < 0:  # the rank's own items back to its last wait (or its step's start)
                first = max(lo, int(last_wait[i - 1]) + 1) if i > lo else lo
                pieces.own(r, first, i, t)
                t = int(start[first])
                continue
            # a piece waiting for call k: its transfer, then what the call waited for
            t, r, done = _through_call(k, c, c_op, r, t, int(start[i]), pieces, phase[i])
            if done:
                continue
        walked.append((s, job_start, job_end, reason))
        columns.append(pieces.columns())
    frames = _frames(columns, (phase, kind, op))
    return [
        WalkedPath(s, job_start, job_end, frame, reason is None, reason)
        for (s, job_start, job_end, reason), frame in zip(walked, frames, strict=True)
    ]


def _through_call(
    k: int,
    c: dict[str, np.ndarray],
    c_op: list[str],
    r: int,
    t: int,
    seg_start: int,
    pieces: _Pieces,
    phase: str | None,
) -> tuple[int, int, bool]:
    """Walk back through the call a waiting piece [seg_start, t) waits for: the call's transfer,
    the calls queued before it, and the member that arrived last. Returns where the path
    goes on (time, rank)."""
    while True:
        uses_all = bool(c["uses_all"][k])
        arrival = int(c["last_arrival_ns"][k]) if uses_all else int(c[ISSUED][k])
        prev_end = int(c["prev_end"][k])
        driver = max(arrival, prev_end)
        # the call was ready when the wait began (all of it transfer), or it cannot explain the
        # time before t (the walk reached the wait before its end, or clocks disagree): the
        # rank's own waiting, so the walk always moves back in time and never cycles
        if driver <= seg_start or driver >= t:
            pieces.append(PathPiece(r, phase, c_op[k], TRANSFER, seg_start, t - seg_start))
            return seg_start, r, True
        pieces.append(PathPiece(r, phase, c_op[k], TRANSFER, driver, t - driver))
        t = driver
        if prev_end > arrival and int(c["prev"][k]) >= 0:  # queued behind the call before
            k = int(c["prev"][k])
            continue
        who = int(c["last_rank"][k]) if uses_all else r
        if who == r:  # its own issue, inside the piece: the rank's comm before it, as transfer
            pieces.append(PathPiece(r, phase, c_op[k], TRANSFER, seg_start, t - seg_start))
            return seg_start, r, True
        return t, who, True
