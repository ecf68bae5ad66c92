"""The walk: each step's critical path walked back from its end through the graph's edges
(``critical_paths``), and the pieces it leaves (``PathPiece``, ``WalkedPath``)."""

from __future__ import annotations

from dataclasses import dataclass

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
#: fields, named as in schema.CRITICAL_PATH_SCHEMA; the labels as categories (a step's path
#: can be millions of pieces).
PIECE_COLUMNS = {
    S.RANK: pl.Int32,
    S.PHASE: pl.Categorical,
    S.OP: pl.Categorical,
    S.KIND: pl.Categorical,
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
        indices = encoded.indices  # (no copy through Arrow's cast and fill where none is null)
        codes = (indices.fill_null(0) if indices.null_count else indices).to_numpy()
        self.codes = codes.astype(np.int32)  # (a code an item: four bytes, not eight)
        if indices.null_count:
            self.codes[indices.is_null().to_numpy(zero_copy_only=False)] = -1
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
        """The labels of ``codes`` (-1: null) as a dictionary column: a path of millions of
        pieces holds a code a piece, never a string each."""
        indices = pa.array(codes.astype(np.int32, copy=False), pa.int32(), mask=codes < 0)
        return pa.DictionaryArray.from_arrays(indices, pa.array(self.values, pa.string()))


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
                phases.append(np.array([self.phase.code(block.phase)], np.int32))
                ops.append(np.array([self.op.code(block.op)], np.int32))
                kinds.append(np.array([self.kind.code(block.kind)], np.int32))
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


@dataclass
class Walks:
    """Every step's walked path of one graph: their pieces one after the other in one frame
    (PIECE_COLUMNS; step ``i``'s are rows ``offsets[i]`` to ``offsets[i + 1]``), never a frame
    or an object per step (a run of 100,000 tiny steps)."""

    steps: np.ndarray  # int64, in the graph's order
    start_ns: np.ndarray  # per step, the job's step: first rank's start ...
    end_ns: np.ndarray  # ... to the last rank's end
    reasons: list[str | None]  # per step, why its path is incomplete (None: complete)
    frame: pl.DataFrame
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.steps)

    def path(self, i: int) -> WalkedPath:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        reason = self.reasons[i]
        return WalkedPath(
            int(self.steps[i]), int(self.start_ns[i]), int(self.end_ns[i]),
            self.frame.slice(a, b - a), reason is None, reason,
        )  # fmt: skip

    def paths(self) -> list[WalkedPath]:
        return [self.path(i) for i in range(len(self.steps))]

    def of_step(self, step: int) -> WalkedPath | None:
        where = np.flatnonzero(self.steps == step)
        return self.path(int(where[0])) if len(where) else None

    def step_column(self) -> np.ndarray:
        """Each row's step."""
        return np.repeat(self.steps, np.diff(self.offsets))


def _frame(columns: list[np.ndarray], labels: tuple[_Labels, ...]) -> pl.DataFrame:
    """Code columns (``_Pieces.columns``' order) as PIECE_COLUMNS."""
    phase, kind, op = labels
    ranks, phases, ops, kinds, starts, durs = columns
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
    return whole.cast(PIECE_COLUMNS)  # type: ignore[arg-type]


def critical_paths(graph: Graph, items_in_run: int | None = None) -> list[WalkedPath]:
    """The critical path of every step of the graph (``walk``), one object each."""
    return walk(graph, items_in_run).paths()


def walk(graph: Graph, items_in_run: int | None = None, at_once: bool = True) -> Walks:
    """The critical path of every step of the graph, walked back from its end
    (``items_in_run``: where the graph is a batch of the run's steps, the items of them all,
    which bound a walk as the whole graph bounds it). A step whose last rank never waits in
    it (a run of one rank without communication: most steps of a run of tiny steps) is laid
    out for all such steps at once: its path is that rank's items, after its late start
    (``at_once=False``: every step walked alone, as tests compare)."""
    items = graph.items
    start = items[S.START_NS].to_numpy()
    end = items[S.END_NS].to_numpy()
    call = items["call"].to_numpy()
    waits = call >= 0
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
    # per step and rank (a group: the items are sorted by rank, step and start): its items'
    # rows (contiguous) and span
    group = items["group"].to_numpy()  # (a graph has items: _graph makes none of none)
    heads = np.flatnonzero(np.diff(group, prepend=group[:1] - 1))
    groups = pl.DataFrame(
        {
            S.STEP: items[S.STEP].gather(heads),
            S.RANK: items[S.RANK].gather(heads),
            "lo": heads,
            "hi": np.append(heads[1:] - 1, len(group) - 1),
            "s": start[heads],
            "e": np.maximum.reduceat(end, heads),
        }
    )
    # per step: the first rank's start, the last rank's end and that rank (ties: the highest)
    jobs = (
        groups.sort(S.STEP, "e", S.RANK)
        .group_by(S.STEP, maintain_order=True)
        .agg(
            pl.col("s").min().alias("start"),
            pl.col("e").last().alias("end"),
            pl.col(S.RANK).last(),
            pl.col("lo").last(),
            pl.col("hi").last(),
        )
    )
    row_of = {step: i for i, step in enumerate(jobs[S.STEP].to_list())}
    order = [row_of[s] for s in graph.steps if s in row_of]
    pick = np.array(order, np.int64)
    steps = jobs[S.STEP].to_numpy()[pick].astype(np.int64)
    job_start = jobs["start"].to_numpy()[pick].astype(np.int64)
    job_end = jobs["end"].to_numpy()[pick].astype(np.int64)
    last_rank = jobs[S.RANK].to_numpy()[pick].astype(np.int64)
    lo = jobs["lo"].to_numpy()[pick].astype(np.int64)
    hi = jobs["hi"].to_numpy()[pick].astype(np.int64)
    # laid out at once: the last rank waits for nothing in the step, and its last item ends
    # the step (the walk takes its items lo..hi whole, then its late start, if any)
    waiting = np.flatnonzero(waits)
    plain = (
        (np.searchsorted(waiting, hi, side="right") == np.searchsorted(waiting, lo))
        & (end[hi] == job_end)
        & (start[hi] < job_end)
        & (job_end > job_start)
        & at_once
    )
    reasons = [graph.unmatched_steps.get(int(s)) for s in steps.tolist()]
    if plain.all() and not (start[lo] > job_start).any():  # (every path its last rank's items)
        offsets = np.concatenate([[0], np.cumsum(hi - lo + 1)])
        return Walks(steps, job_start, job_end, reasons, _items_frame(items, lo, hi), offsets)
    labels = tuple(_Labels(items[name]) for name in (S.PHASE, S.KIND, S.OP))
    phase = labels[0]
    # per item, the last item at or before it that waits for a call (-1: none)
    last_wait = np.maximum.accumulate(np.where(waits, np.arange(len(call)), -1))
    position, parts = _plain_columns(plain, lo, hi, job_start, last_rank, start, end, labels)
    walked = np.flatnonzero(~plain).tolist()
    bounds = (  # (only the steps walked one by one ask)
        dict(
            zip(
                zip(groups[S.STEP].to_list(), groups[S.RANK].to_list(), strict=True),
                zip(groups["lo"].to_list(), groups["hi"].to_list(), strict=True),
                strict=True,
            )
        )
        if walked
        else {}
    )
    for i in walked:
        s = int(steps[i])
        pieces = _Pieces(start, end, labels)
        r, t, first_start = int(last_rank[i]), int(job_end[i]), int(job_start[i])
        guard = 0
        limit = 4 * ((items_in_run or items.height) + calls.height) + 16
        while t > first_start:
            guard += 1
            if guard > limit:
                reasons[i] = "the calls wait on each other in a cycle (clocks off?)"
                pieces.append(
                    PathPiece(r, None, None, S.SEGMENT_IDLE, first_start, t - first_start)
                )
                break
            span = bounds.get((s, r))
            if span is None or t <= start[span[0]]:
                # before the rank's step began: late start (carried in from before the window)
                pieces.append(PathPiece(r, None, None, LATE_START, first_start, t - first_start))
                break
            a, b = span
            j = a + int(np.searchsorted(start[a : b + 1], t, side="left")) - 1
            if t > end[j]:  # past the rank's last item: nothing ran on it
                pieces.append(
                    PathPiece(r, S.IDLE, None, S.SEGMENT_IDLE, int(end[j]), t - int(end[j]))
                )
                t = int(end[j])
                continue
            k = int(call[j])
            if k < 0:  # the rank's own items back to its last wait (or its step's start)
                first = max(a, int(last_wait[j - 1]) + 1) if j > a else a
                pieces.own(r, first, j, t)
                t = int(start[first])
                continue
            # a piece waiting for call k: its transfer, then what the call waited for
            t, r, _ = _through_call(k, c, c_op, r, t, int(start[j]), pieces, phase[j])
        columns = pieces.columns()
        position.append(np.full(len(columns[0]), i, np.int64))
        for part, column in zip(parts, columns, strict=True):
            part.append(column)
    where = np.concatenate(position) if position else np.zeros(0, np.int64)
    if len(where) < 2 or bool((where[1:] >= where[:-1]).all()):  # (in order: no copy)
        columns = [np.concatenate(part) if part else np.zeros(0, np.int64) for part in parts]
    else:
        arranged = np.argsort(where, kind="stable")
        columns = [np.concatenate(part)[arranged] for part in parts]
    offsets = np.concatenate([[0], np.cumsum(np.bincount(where, minlength=len(steps)))])
    return Walks(steps, job_start, job_end, reasons, _frame(columns, labels), offsets)


def _items_frame(items: pl.DataFrame, lo: np.ndarray, hi: np.ndarray) -> pl.DataFrame:
    """The paths of steps that are each their last rank's items ``lo``..``hi`` whole, from
    the graph's own columns (PIECE_COLUMNS): a slice where the steps' items follow one
    another (one long step: no copy of its millions of items), else one gather."""
    counts = hi - lo + 1
    if len(lo) == 0 or bool((lo[1:] == hi[:-1] + 1).all()):
        rows = items.slice(int(lo[0]) if len(lo) else 0, int(counts.sum()))
    else:
        firsts = np.cumsum(counts) - counts
        at = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(firsts - lo, counts)
        rows = items.select(pl.col(S.RANK, S.PHASE, S.OP, S.KIND, S.START_NS, S.END_NS).gather(at))
    return rows.select(
        pl.col(S.RANK), pl.col(S.PHASE), pl.col(S.OP), _path_kinds(rows[S.KIND]),
        pl.col(S.START_NS), (pl.col(S.END_NS) - pl.col(S.START_NS)).alias(S.DUR_NS),
    ).cast(PIECE_COLUMNS)  # type: ignore[arg-type]  # fmt: skip


def _path_kinds(kind: pl.Series) -> pl.Series:
    """Items' kinds as a path reads them: a wait's as a transfer, a kind-less segment's as
    "None" (as str() writes it); relabelled in the dictionary, a code an item, no string."""
    if not (kind.is_null().any() or (kind == S.SEGMENT_COMM).any()):
        return kind
    encoded = kind.to_arrow()
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    values = [TRANSFER if v == S.SEGMENT_COMM else v for v in encoded.dictionary.to_pylist()]
    indices = encoded.indices
    if indices.null_count:
        indices = indices.fill_null(len(values))
        values.append("None")
    relabelled = pa.DictionaryArray.from_arrays(indices, pa.array(values, pa.string()))
    return pl.Series(S.KIND, relabelled)


def _plain_columns(
    plain: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    job_start: np.ndarray,
    rank: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    labels: tuple[_Labels, ...],
) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """The paths of the ``plain`` steps (see ``walk``) as code columns (``_Pieces.columns``'
    order), late starts first: each row's step (position), and the columns."""
    phase, kind, op = labels
    which = np.flatnonzero(plain)
    late = which[start[lo[which]] > job_start[which]]
    a, b = lo[which], hi[which]
    counts = b - a + 1
    row_step = np.repeat(which, counts)
    firsts = np.cumsum(counts) - counts
    rows = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(firsts - a, counts)
    comm, transfer = kind.code(S.SEGMENT_COMM), kind.code(TRANSFER)
    no_kind, late_kind = kind.code("None"), kind.code(LATE_START)
    item_kind = kind.codes[rows]
    item_kind = np.where(item_kind == comm, transfer, np.where(item_kind < 0, no_kind, item_kind))
    no_label = np.full(len(late), -1, np.int32)
    late_start = job_start[late]
    parts = [
        [rank[late], rank[row_step]],
        [no_label, phase.codes[rows]],
        [no_label, op.codes[rows]],
        [np.full(len(late), late_kind, np.int32), item_kind],
        [late_start, start[rows].astype(np.int64)],
        [start[lo[late]] - late_start, (end[rows] - start[rows]).astype(np.int64)],
    ]
    return [late, row_step], parts


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
