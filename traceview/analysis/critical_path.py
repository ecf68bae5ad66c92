"""Why a step takes as long as it does: its critical path across ranks, blame, and what-if replay.

The graph. Each rank's step window is the sequence of its exclusive segments (the segments
table: the attribution rule kept in time order). A segment of exposed communication is cut at
the ends of the rank's matched calls inside it: each piece before a call's end **waits for that
call**. The edges:

- in order on a rank: a segment starts when the one before it ends; the first at the rank's
  step start (a rank that starts later than the first rank of the step is a **late start**,
  carried in from before the window);
- a call completes ``transfer`` after the later of its group's **last arrival** (when the last
  member's program issued it; for point-to-point, the later of the send and the receive) and
  the completion of the call before it on the same queue (gloo's worker thread, the NCCL
  stream): calls on a queue run one after the other;
- a waiting piece ends when its call completes (or at once, where it completed already);
- an arrival is where the issuing rank's timeline stood: its own segment's start plus how far
  into it the call was issued.

The critical path walks these edges back from the step's end (the last rank to finish):
through a rank's own segments, and at a waiting piece to what the call waited for: its
transfer, the call queued before it, or the last member at the moment it arrived. Every instant
of the job's step (first rank's start to last rank's end) is on the path once, so the path's
segments add up to the step. Blame is the path's time per rank, phase and kind (and operator).

Replay re-times the same graph from the edges alone (never from the recorded starts): every
start comes from its predecessors, so replaying with no change reproduces the measured steps
(a test says so), and with a change (a rank balanced, a phase or an operator faster, a
collective faster, communication hidden, late starts removed) predicts the step.

Vectorized: a replay pass is a few grouped cumulative maxima over every segment of every step
at once (polars), repeated until the calls' completions stop moving (as many passes as the
longest chain of calls that wait on each other); the walk loops over the path's waits only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Protocol

import numpy as np
import polars as pl
import pyarrow as pa

from traceview.analysis.crossrank import BUS_FACTOR, ISSUED, POINT_TO_POINT, Matched
from traceview.model import schema as S
from traceview.model.columns import TableOnDemand
from traceview.model.results import (
    Blame,
    CriticalPath,
    OpBlame,
    PathSegment,
    PathStretch,
    StepPath,
    WhatIf,
)

NEVER = -(1 << 62)
NO_STEP = -1  # the step number of a window without step markers
#: Bump when the path, blame or replay change: a run directory's kept paths (PathCache) are
#: then computed again.
PATH_VERSION = 1
TRANSFER = "transfer"
LATE_START = "late_start"
#: The kinds of a path segment: the segments table's, with waits explained.
PATH_KINDS = (
    S.SEGMENT_COMPUTE,
    S.SEGMENT_KERNEL,
    S.SEGMENT_LAUNCH,
    TRANSFER,
    LATE_START,
    S.SEGMENT_HOST_BOUND,
    S.SEGMENT_IDLE,
)
#: The kinds of a rank's own work (what balance and blame count as the rank's).
_COMPUTING = [S.SEGMENT_COMPUTE, S.SEGMENT_KERNEL, S.SEGMENT_LAUNCH, S.SEGMENT_HOST_BOUND]


@dataclass
class Graph:
    """The counted steps of a run as one graph: items (segments and waiting pieces) and calls."""

    items: pl.DataFrame  # sorted by (rank, step, start): rank, step, start, end, phase, kind,
    #                      op, call (row of calls it waits for, -1), group (per rank and step)
    calls: pl.DataFrame  # row order = call ids: rank, collective, op name, issued, end, instance,
    #                      queue, prev (call before it on its queue, -1), transfer, uses_all,
    #                      issue_item (-1: issued outside the counted windows), issue_offset
    steps: list[int]
    unmatched_steps: dict[int, str]  # steps whose communication is not all explained: why
    _timed: _Timed | None = field(default=None, repr=False, compare=False)

    def timed(self) -> _Timed:
        """What every replay of the graph starts from (made once: a replay a change)."""
        if self._timed is None:
            self._timed = _Timed.of(self)
        return self._timed


@dataclass
class _Timed:
    """A graph's items as a replay takes them, whatever the change: times from the graph's
    first instant (float64 holds them to the nanosecond), their groups (a rank's step) and
    each group's head, and only the calls that can move them (``_calls_that_move``)."""

    t0: int
    span: np.ndarray  # each item's end - start, float64
    group: np.ndarray
    call: np.ndarray  # the call each item waits for (-1: none), in ``calls``' numbering
    calls: pl.DataFrame
    kept: np.ndarray | None  # which of the graph's calls ``calls`` are (None: all)
    first: np.ndarray  # the first item of each group
    heads: np.ndarray
    g_start: np.ndarray  # each group's measured start
    g_step: np.ndarray
    step_first: np.ndarray  # per group, its step's earliest start over the ranks

    @classmethod
    def of(cls, graph: Graph) -> _Timed:
        items = graph.items
        n = items.height
        t0 = int(items[S.START_NS].min()) if n else 0  # type: ignore[arg-type]
        start = items[S.START_NS].to_numpy() - t0
        end = items[S.END_NS].to_numpy() - t0
        group = items["group"].to_numpy()
        # only the calls of the graph's steps and those its items wait for move its items (a
        # batch holds every step its waits reach: ``_tied``); the others are left out
        calls, call, kept = _calls_that_move(graph, items["call"].to_numpy())
        first = np.ones(n, bool)
        first[1:] = group[1:] != group[:-1]
        heads = np.flatnonzero(first)
        g_start = start[first].astype(np.float64)
        g_step = items[S.STEP].to_numpy()[first]
        step_first = g_start
        if len(heads):
            job_start = (
                pl.DataFrame({"s": g_step, "t": g_start}).group_by("s").agg(pl.col("t").min())
            )
            job_of = dict(zip(job_start["s"].to_list(), job_start["t"].to_list(), strict=True))
            step_first = np.array([job_of[s] for s in g_step])
        span = (end - start).astype(np.float64)
        return cls(
            t0, span, group, call, calls, kept, first, heads, g_start, g_step, step_first
        )  # fmt: skip


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


def _composite(rank: np.ndarray, t: np.ndarray, t0: int, span: int) -> np.ndarray:
    return rank.astype(np.int64) * span + (t - t0)


def build_graph(
    segments: pa.Table, matched: Matched, steps: list[int | None], world: int | None = None
) -> Graph | None:
    """The graph of ``steps`` (the counted steps; None: a window without step markers) from
    every rank's segments and the matched calls (crossrank.match_collectives, on one clock);
    ``world``: the job's world size, where known (a world of one has nothing to wait for)."""
    source = _source(segments, matched, steps, world)
    return None if source is None else _graph(source, source.steps)


#: The most items (segments and waiting pieces) one graph holds: a run with more is walked and
#: replayed in batches of whole steps (``_batches``), so that memory follows the batch, not the
#: run. Each step's path, blame and replays are its own, so batches give what one graph gives.
#: A fresh report of the 1.02 GB run: 2^18 2.18 s / 313 MB, 2^17 2.21 s / 250 MB, 2^16 2.57 s /
#: 223 MB.
GRAPH_ROWS = 1 << 17


@dataclass
class _Source:
    """What every graph of a run's steps is cut from, made once: the rank's own segments, the
    exposed communication cut into waiting pieces, and the calls."""

    # the segments not of exposed communication, sorted (rank, step, start), where they fit
    # one graph; else None: each batch reads its own (``rest_of``)
    rest: pl.DataFrame | None
    pieces: pl.DataFrame  # exposed communication cut at call ends (``_waiting_pieces``)
    calls: pl.DataFrame  # ``_calls``
    steps: list[int]  # the wanted steps (NO_STEP: the one window), sorted
    unmatched: dict[int, str]  # ``_unexplained``, over every step
    rows: int  # items over every step: a graph of them all would hold this many
    rest_spans: pl.DataFrame  # per rank and step, the span of the rest and its count (_spans)
    segments: TableOnDemand  # what they were read from (read again by ``rest_of``)
    in_order: bool  # whether the segments were in (rank, step, start) order
    # the last graph made, and its walk where it is one step's: asked for again (a run of one
    # batch, or of one long step, walks, replays and walks its median step again in the same
    # graph), they are not made again; a new one replaces them before it is made
    last: tuple[list[int], Graph | None, list[WalkedPath] | None] | None = None

    def graph(self, steps: list[int]) -> Graph | None:
        """The graph of ``steps`` (sorted; ``_graph``), the last one where it is the same."""
        if self.last is not None and self.last[0] == steps:
            return self.last[1]
        self.last = None  # (freed before the next is made)
        graph = _graph(self, steps)
        self.last = (steps, graph, None)
        return graph

    def walks(self, steps: list[int]) -> list[WalkedPath]:
        """``critical_paths`` of the graph of ``steps``, the last walk where it is the same
        step's."""
        graph = self.graph(steps)
        if graph is None:
            return []
        assert self.last is not None
        if self.last[2] is not None:
            return self.last[2]
        walks = critical_paths(graph, self.rows)
        if len(steps) == 1:  # (one step's path: kept, a path is small beside its graph)
            self.last = (steps, graph, walks)
        return walks

    def rest_of(self, steps: list[int]) -> pl.DataFrame:
        """The rest of ``steps`` (sorted), sorted: where the rest is not held, read again,
        only the pieces (row groups) that may hold those steps."""
        if self.rest is not None:
            if steps == self.steps:
                return self.rest
            return self.rest.filter(pl.col(S.STEP).is_in(steps))
        parts = [
            _compact(table, steps).filter(pl.col(S.KIND) != S.SEGMENT_COMM)
            for table in self.segments.in_pieces((S.STEP, steps[0], steps[-1]))
        ]
        rest = pl.concat(parts, rechunk=False)
        return rest if self.in_order else rest.sort(S.RANK, S.STEP, S.START_NS)

    def windows(self) -> pl.DataFrame:
        """Per rank and step, the span of its items."""
        spans = [f.drop("len") for f in (self.rest_spans, _spans(self.pieces))]
        return pl.concat(spans).group_by(S.RANK, S.STEP).agg(pl.col("s").min(), pl.col("e").max())

    def step_rows(self) -> dict[int, int]:
        counts = pl.concat([self.rest_spans, _spans(self.pieces)])
        return dict(counts.group_by(S.STEP).agg(pl.col("len").sum()).iter_rows())


def _spans(items: pl.DataFrame) -> pl.DataFrame:
    """Per rank and step of ``items``, their span (s, e) and their count (len)."""
    return items.group_by(S.RANK, S.STEP).agg(
        pl.col(S.START_NS).min().alias("s"),
        pl.col(S.END_NS).max().alias("e"),
        pl.len().cast(pl.Int64).alias("len"),
    )


def _source(
    segments: pa.Table | TableOnDemand,
    matched: Matched,
    steps: list[int | None],
    world: int | None,
) -> _Source | None:
    """The source of every graph of ``steps``, from the segments (a table, or what reads it a
    piece at a time): each piece made compact as it comes, and the rest (the segments not of
    exposed communication, most of them) held only while they fit one graph (``GRAPH_ROWS``),
    else read again by each batch: the segments are never whole in memory (a table given
    whole is held whole: it is in memory already)."""
    if isinstance(segments, pa.Table):
        segments = TableOnDemand.of(segments)
    held_whole = segments.pieces is None  # (in memory already: what is compact is kept)
    wanted = [NO_STEP if s is None else s for s in steps]
    rest: list[pl.DataFrame] | None = []
    held = 0
    comm: list[pl.DataFrame] = []
    communicating: list[pl.DataFrame] = []  # (rank, step) that spent time communicating
    spans: list[pl.DataFrame] = []  # of the rest, per piece (``_spans``)
    ranks: set[int] = set()
    in_order, last = True, None
    for table in segments.in_pieces():
        seg = _compact(table, wanted)
        del table
        if seg.height == 0:
            continue
        # (as the analysis writes them, they are in order: then never sorted, nor copied)
        if in_order:
            first = seg.row(0)[:3]
            in_order = (last is None or first > last) and _in_order(seg)
            last = seg.row(seg.height - 1)[:3]
        ranks.update(seg[S.RANK].unique().to_list())
        is_comm = pl.col(S.KIND) == S.SEGMENT_COMM
        comm.append(seg.filter(is_comm))
        communicating.append(
            seg.filter(is_comm | (pl.col(S.PHASE) == S.COMM)).select(S.RANK, S.STEP).unique()
        )
        # (the rest wait for no call: their call and lead are given per batch, in ``_graph``)
        mine = seg.filter(~is_comm)
        del seg
        spans.append(_spans(mine))
        held += mine.height
        if rest is not None and (held <= GRAPH_ROWS or held_whole):
            rest.append(mine)
        else:  # more than a graph holds: each batch reads its own
            rest = None
    if not ranks:
        return None
    calls = _calls(matched.calls)
    rest_frame = None if rest is None else pl.concat(rest, rechunk=False)
    comm_frame = pl.concat(comm)
    del rest, comm
    if not in_order:
        if rest_frame is not None:
            rest_frame = rest_frame.sort(S.RANK, S.STEP, S.START_NS)
        comm_frame = comm_frame.sort(S.RANK, S.STEP, S.START_NS)
    alone = max(world or 0, len(ranks)) <= 1
    unmatched = _unexplained(pl.concat(communicating).unique(), calls, matched, alone)
    pieces = _released_early(_waiting_pieces(comm_frame, calls), calls)
    rest_spans = (
        pl.concat(spans)
        .group_by(S.RANK, S.STEP)
        .agg(pl.col("s").min(), pl.col("e").max(), pl.col("len").sum())
    )
    return _Source(
        rest_frame, pieces, calls, sorted(set(wanted)), unmatched, held + pieces.height,
        rest_spans, segments, in_order,
    )  # fmt: skip


#: The columns of the segments a graph is made of.
_SEGMENT_COLUMNS = (S.RANK, S.STEP, S.START_NS, S.END_NS, S.PHASE, S.KIND, S.OP)


def _compact(segments: pa.Table, wanted: list[int]) -> pl.DataFrame:
    """The rows of ``wanted`` steps (NO_STEP for a null one), the labels as categories: a few
    bytes a row, not a string each, in every copy."""
    columns = {name: segments.column(name) for name in _SEGMENT_COLUMNS}
    for name in (S.PHASE, S.KIND, S.OP):
        if not pa.types.is_dictionary(columns[name].type):
            columns[name] = columns[name].dictionary_encode()
    seg = pl.from_arrow(pa.table(columns))
    assert isinstance(seg, pl.DataFrame)
    seg = seg.with_columns(pl.col(S.STEP).fill_null(NO_STEP))
    keep = seg[S.STEP].is_in(wanted)
    return seg if keep.all() else seg.filter(keep)


def _in_order(seg: pl.DataFrame) -> bool:
    """Whether the segments are in (rank, step, start) order with no two alike: sorting them
    would change nothing."""
    rank, step, start = (seg[c].to_numpy() for c in (S.RANK, S.STEP, S.START_NS))
    same_rank = rank[1:] == rank[:-1]
    same_step = step[1:] == step[:-1]
    later = (rank[1:] > rank[:-1]) | (
        same_rank & ((step[1:] > step[:-1]) | (same_step & (start[1:] > start[:-1])))
    )
    return bool(later.all())


def _graph(source: _Source, steps: list[int]) -> Graph | None:
    """The graph of some of the source's ``steps`` (sorted)."""
    rest, pieces = source.rest_of(steps), source.pieces
    if steps != source.steps:
        pieces = pieces.filter(pl.col(S.STEP).is_in(steps))
    if rest.height + pieces.height == 0:
        return None
    items = (
        pl.concat([rest, pieces], how="diagonal_relaxed")
        .with_columns(pl.col("call").fill_null(-1), pl.col("early").fill_null(0))
        .with_row_index("_o")
        .sort(S.RANK, S.STEP, S.START_NS, S.END_NS, "_o")
        .drop("_o")
        # (sorted by rank and step: a run of one (rank, step) is its group, numbered from 0)
        .with_columns(pl.struct(S.RANK, S.STEP).rle_id().cast(pl.Int64).alias("group"))
    )
    calls = _issue_points(source.calls, items)
    return Graph(items, calls, list(steps), source.unmatched)


def _batches(source: _Source, steps: list[int]) -> list[list[int]]:
    """``steps`` (sorted) in runs of whole steps of at most ``GRAPH_ROWS`` items each (a step
    with more is a batch of its own), never cut between two steps that one waits on the other
    through a call (``_tied``): each batch's graph then replays as the whole one does."""
    if not steps:
        return []
    per_step = source.step_rows()
    sizes = [per_step.get(s, 0) for s in steps]
    if sum(sizes) <= GRAPH_ROWS:
        return [list(steps)]
    tied = _tied(source, steps)
    batches: list[list[int]] = [[steps[0]]]
    held = sizes[0]
    for i in range(1, len(steps)):
        if held + sizes[i] > GRAPH_ROWS and not tied[i - 1]:
            batches.append([])
            held = 0
        batches[-1].append(steps[i])
        held += sizes[i]
    return batches


def _tied(source: _Source, steps: list[int]) -> np.ndarray:
    """Per boundary between two of ``steps`` (sorted), whether a batch may not end there: a
    piece of one step waits for a call whose queue (in its step), or any member of whose
    instance, was issued or counted in another, and every step between them."""
    n = len(steps)
    tied = np.zeros(max(n - 1, 0), bool)
    calls, pieces = source.calls, source.pieces.filter(pl.col("call") >= 0)
    if n < 2 or calls.height == 0 or pieces.height == 0:
        return tied
    order = np.asarray(steps, np.int64)

    def position(step: np.ndarray) -> np.ndarray:
        return np.clip(np.searchsorted(order, step), 0, n - 1)

    c_step = position(calls[S.STEP].fill_null(NO_STEP).to_numpy())
    # the step whose window on the issuing rank holds each call's issue (else its own)
    windows = source.windows().sort(S.RANK, "s")
    w_rank, w_start, w_end = (windows[c].to_numpy() for c in (S.RANK, "s", "e"))
    w_step = position(windows[S.STEP].to_numpy())
    c_rank, issued = calls[S.RANK].to_numpy(), calls[ISSUED].to_numpy()
    t0 = int(min(w_start.min(), issued.min()))
    span = int(max(w_end.max(), issued.max()) - t0 + 1)
    keys = _composite(w_rank, w_start, t0, span)
    at = np.searchsorted(keys, _composite(c_rank, issued, t0, span), side="right") - 1
    safe = np.maximum(at, 0)
    inside = (at >= 0) & (w_rank[safe] == c_rank) & (issued <= w_end[safe])
    issue_step = np.where(inside, w_step[safe], c_step)
    frame = pl.DataFrame(
        {
            "lo": np.minimum(c_step, issue_step),
            "hi": np.maximum(c_step, issue_step),
            "instance": calls["instance"].to_numpy(),
            "queue": calls["queue"].to_numpy(),
            "step": c_step,
        }
    )
    # an instance's members, then a queue's calls in one step, reach what any of them reaches
    frame = frame.with_columns(
        pl.col("lo").min().over("instance"), pl.col("hi").max().over("instance")
    ).with_columns(
        pl.col("lo").min().over("queue", "step"), pl.col("hi").max().over("queue", "step")
    )
    call = pieces["call"].to_numpy()
    p_step = position(pieces[S.STEP].to_numpy())
    lo = np.minimum(p_step, frame["lo"].to_numpy()[call])
    hi = np.maximum(p_step, frame["hi"].to_numpy()[call])
    # boundaries lo .. hi-1 of each such interval are tied
    marks = np.zeros(n, np.int64)
    np.add.at(marks, lo, 1)
    np.add.at(marks, hi, -1)
    return np.cumsum(marks)[:-1] > 0


#: Why a step's path is incomplete where its communication is not all explained.
UNMATCHED_CALL = "a call was left unmatched"
NO_CALL = (
    "communication without a matched call (ranks missing from the run, or calls the trace does "
    "not show): its wait and transfer are unknown, read as the rank's own time"
)


def _unexplained(
    communicating: pl.DataFrame, calls: pl.DataFrame, matched: Matched, alone: bool
) -> dict[int, str]:
    """Steps in which a call was left unmatched, or (in a world of more than one rank) a rank
    spent time communicating (exposed communication, communication kernels) without one
    matched call to explain it."""
    out = {s: UNMATCHED_CALL for s in matched.unknown_steps[S.STEP].drop_nulls().to_list()}
    if alone:
        return out
    with_calls = calls.select(pl.col(S.RANK).cast(pl.Int32), pl.col(S.STEP).fill_null(NO_STEP))
    without = communicating.with_columns(pl.col(S.RANK).cast(pl.Int32)).join(
        with_calls.unique(), on=[S.RANK, S.STEP], how="anti"
    )
    for step in without[S.STEP].unique().to_list():
        out.setdefault(step, NO_CALL)
    return out


def _calls(matched: pl.DataFrame) -> pl.DataFrame:
    """The matched calls as the graph needs them: instance, queue, the call before on the queue,
    transfer and whether the call waits for every member."""
    schema = {
        S.RANK: pl.Int32, S.STEP: pl.Int64, S.COLLECTIVE: pl.String, ISSUED: pl.Int64,
        S.END_NS: pl.Int64, "last_arrival_ns": pl.Int64, "last_rank": pl.Int32,
        "instance": pl.Int64, "queue": pl.Int64, "prev": pl.Int64, "prev_end": pl.Int64,
        "transfer": pl.Int64, "uses_all": pl.Boolean, S.BYTES: pl.Int64, "participants": pl.Int64,
    }  # fmt: skip
    if matched.height == 0:
        return pl.DataFrame(schema=schema)
    df = matched
    if "peer_rank" not in df.columns:
        df = df.with_columns(pl.lit(None, pl.Int32).alias("peer_rank"))
    p2p = pl.col(S.COLLECTIVE).is_in(POINT_TO_POINT)
    send = pl.col(S.COLLECTIVE) == "send"
    df = df.with_columns(
        pl.when(send).then(pl.col(S.RANK)).otherwise(pl.col("peer_rank")).alias("_src"),
        pl.when(send).then(pl.col("peer_rank")).otherwise(pl.col(S.RANK)).alias("_dst"),
    ).with_columns(
        pl.when(p2p)
        .then(pl.concat_str([pl.lit("p"), "_src", "_dst", "step_key", "position"], separator=":"))
        .otherwise(
            pl.concat_str(
                [pl.lit("c"), "group_key", S.NAME, S.COLLECTIVE, "step_key", "position"],
                separator=":",
            )
        )
        .rank("dense")
        .cast(pl.Int64)
        .alias("instance"),
        pl.struct(S.RANK, S.PID, S.TID).rank("dense").cast(pl.Int64).alias("queue"),
    )
    df = df.sort("queue", S.START_NS, S.END_NS).with_row_index("_id")
    df = df.with_columns(
        pl.col("_id").shift(1).over("queue").cast(pl.Int64).fill_null(-1).alias("prev"),
        pl.col(S.END_NS).shift(1).over("queue").fill_null(NEVER).alias("prev_end"),
        (pl.col(S.END_NS) >= pl.col("last_arrival_ns")).alias("uses_all"),
    )
    driver = pl.max_horizontal(
        pl.when(pl.col("uses_all")).then(pl.col("last_arrival_ns")).otherwise(pl.col(ISSUED)),
        pl.col("prev_end"),
    )
    df = df.with_columns((pl.col(S.END_NS) - driver).clip(lower_bound=0).alias("transfer"))
    if S.BYTES not in df.columns:
        df = df.with_columns(pl.lit(None, pl.Int64).alias(S.BYTES))
    return df.select(
        pl.col(S.RANK).cast(pl.Int32), pl.col(S.STEP).cast(pl.Int64), S.COLLECTIVE,
        pl.col(ISSUED).cast(pl.Int64), pl.col(S.END_NS).cast(pl.Int64),
        pl.col("last_arrival_ns").cast(pl.Int64), pl.col("last_rank").cast(pl.Int32),
        "instance", "queue", "prev", pl.col("prev_end").cast(pl.Int64), "transfer", "uses_all",
        pl.col(S.BYTES).cast(pl.Int64), pl.col("participants").cast(pl.Int64),
    )  # fmt: skip


def _released_early(pieces: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    """Waits released before their call's span closed: gloo's worker thread, descheduled on a
    loaded machine, can close a call's span milliseconds after the training thread's wait
    returned (and the thread may wake and wait again). Such a wait, cut at no call's end, would
    count as the rank's own time, and no what-if could shorten it. A piece of exposed
    communication waiting for no call, over which a call its rank issued before it is in
    flight, and during which that call's last member arrived, waits for that call: released
    ``early`` ns before the call's end (the replay keeps that lead)."""
    pieces = pieces.with_columns(pl.lit(0, pl.Int64).alias("early"))
    tails = pieces.with_row_index("_p").filter(pl.col("call") < 0)
    if tails.height == 0 or calls.height == 0:
        return pieces
    c_rank, c_end = calls[S.RANK].to_numpy(), calls[S.END_NS].to_numpy()
    issued, last = calls[ISSUED].to_numpy(), calls["last_arrival_ns"].to_numpy()
    rank, ps, pe = (tails[c].to_numpy() for c in (S.RANK, S.START_NS, S.END_NS))
    t0 = int(min(c_end.min(), pe.min()))
    span = int(max(c_end.max(), pe.max()) - t0 + 1)
    keys = _composite(c_rank, c_end, t0, span)
    order = np.argsort(keys, kind="stable")
    pos = np.searchsorted(keys[order], _composite(rank, pe, t0, span), side="right")
    c = order[np.minimum(pos, len(order) - 1)]  # the rank's first call ending after the piece
    ok = (pos < len(order)) & (c_rank[c] == rank) & (issued[c] <= ps)
    ok &= (ps < last[c]) & (last[c] <= pe)
    if not ok.any():
        return pieces
    at = tails["_p"].to_numpy()[ok]
    call = pieces["call"].to_numpy().copy()
    early = np.zeros(pieces.height, np.int64)
    call[at] = c[ok]
    early[at] = c_end[c[ok]] - pe[ok]
    return pieces.with_columns(
        pl.Series("call", call, pl.Int64), pl.Series("early", early, pl.Int64)
    )


def _waiting_pieces(comm: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    """Exposed communication cut at the ends of the rank's calls inside it: the piece before a
    call's end waits for that call (``call``); what is left after the last end waits for none."""
    if comm.height == 0 or calls.height == 0:
        return comm.with_columns(pl.lit(-1, pl.Int64).alias("call"))
    c_rank, c_end = calls[S.RANK].to_numpy(), calls[S.END_NS].to_numpy()
    rank, lo_t, hi_t = (comm[c].to_numpy() for c in (S.RANK, S.START_NS, S.END_NS))
    t0 = int(min(c_end.min(), lo_t.min()))
    span = int(max(c_end.max(), hi_t.max()) - t0 + 1)
    keys = _composite(c_rank, c_end, t0, span)
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    lo = np.searchsorted(keys, _composite(rank, lo_t, t0, span), side="right")
    hi = np.searchsorted(keys, _composite(rank, hi_t, t0, span), side="right")
    counts = hi - lo
    seg = np.repeat(np.arange(comm.height), counts)
    within = np.arange(len(seg)) - np.repeat(np.cumsum(counts) - counts, counts)
    cut_call = order[np.repeat(lo, counts) + within]
    cut_at = c_end[cut_call]
    # every segment also ends at its own end (a piece waiting for none, where the last call's
    # end falls short of it)
    seg = np.concatenate([seg, np.arange(comm.height)])
    cut_at = np.concatenate([cut_at, hi_t])
    cut_call = np.concatenate([cut_call, np.full(comm.height, -1)])
    by = np.lexsort((cut_call < 0, cut_at, seg))
    seg, cut_at, cut_call = seg[by], cut_at[by], cut_call[by]
    first = np.ones(len(seg), bool)
    first[1:] = seg[1:] != seg[:-1]
    prev_cut = np.where(first, lo_t[seg], np.roll(cut_at, 1))
    keep = (cut_call >= 0) | (cut_at > prev_cut) | first
    seg, cut_at, cut_call, prev_cut = seg[keep], cut_at[keep], cut_call[keep], prev_cut[keep]
    return comm[seg].with_columns(
        pl.Series(S.START_NS, prev_cut, pl.Int64),
        pl.Series(S.END_NS, cut_at, pl.Int64),
        pl.Series("call", cut_call, pl.Int64),
    )


def _issue_points(calls: pl.DataFrame, items: pl.DataFrame) -> pl.DataFrame:
    """Where each call was issued on its rank's timeline: the item that held that instant and
    how far into it (-1: outside the counted windows, where its arrival stays as measured)."""
    if calls.height == 0:
        return calls.with_columns(
            pl.lit(-1, pl.Int64).alias("issue_item"), pl.lit(0, pl.Int64).alias("issue_offset")
        )
    rank, start, end = (items[c].to_numpy() for c in (S.RANK, S.START_NS, S.END_NS))
    c_rank, issued = calls[S.RANK].to_numpy(), calls[ISSUED].to_numpy()
    t0 = int(min(start.min(), issued.min()))
    span = int(max(end.max(), issued.max()) - t0 + 1)
    keys = _composite(rank, start, t0, span)
    at = _composite(c_rank, issued, t0, span)
    pos = np.searchsorted(keys, at, side="right") - 1
    safe = np.maximum(pos, 0)
    inside = (pos >= 0) & (rank[safe] == c_rank) & (issued < end[safe])
    # an instant at an item's end, with nothing after it on the rank, is still that item's
    inside |= (pos >= 0) & (rank[safe] == c_rank) & (issued == end[safe])
    item = np.where(inside, safe, -1)
    offset = np.where(inside, issued - start[safe], 0)
    return calls.with_columns(
        pl.Series("issue_item", item, pl.Int64), pl.Series("issue_offset", offset, pl.Int64)
    )


# --- replay ---------------------------------------------------------------------------------


@dataclass
class Change:
    """A what-if: per-item duration factors, per-call transfer, and how steps start."""

    name: str
    item_factor: np.ndarray | None = None  # multiplies each item's duration
    transfer: np.ndarray | None = None  # each call's transfer (ns)
    hide_comm: bool = False  # every wait is over at once (the collective edges dropped)
    no_late_start: bool = False  # every rank starts the step with the first
    no_queue: bool = False  # calls on one queue do not wait for each other (tests drop it)


@dataclass
class Replay:
    step_ns: dict[int, int]  # the job's step per step
    passes: int
    converged: bool


def replay(graph: Graph, change: Change | None = None) -> Replay:
    """Re-time the graph from its edges alone (module docstring).

    A rank's item ends at E_i = P_i + max(origin, max over its waits j <= i of (C_j - P_j)),
    P the sum of its durations so far (a wait lasts nothing of its own; C_j the completion of
    the call it waits for): only the waits and the calls move from pass to pass, so a pass
    costs their number, not the items'."""
    change = change or Change("none")
    items = graph.items
    n = items.height
    every_call = graph.calls.height
    timed = graph.timed()
    t0, group, call, calls = timed.t0, timed.group, timed.call, timed.calls
    first, heads, g_step = timed.first, timed.heads, timed.g_step
    transfer_of = change.transfer
    if transfer_of is not None and timed.kept is not None:
        transfer_of = transfer_of[timed.kept]
    wait = call >= 0
    dur = timed.span
    if change.item_factor is not None:
        dur = dur * change.item_factor
    dur = np.where(wait, 0.0, dur)
    origin = timed.step_first if change.no_late_start else timed.g_start
    # prefix sums of durations per group (each group from 0)
    csum = np.cumsum(dur)
    before = np.concatenate([[0.0], csum])[heads]
    prefix = csum - np.repeat(before, np.diff(np.append(heads, n)))  # P_i, i included
    waits = np.flatnonzero(wait)
    w_group = group[waits]
    w_prefix = prefix[waits]

    def last_wait(at: np.ndarray) -> np.ndarray:
        """Per item index, the position in ``waits`` of its group's last wait at or before it
        (-1: none)."""
        if len(waits) == 0:
            return np.full(len(at), -1)
        pos = np.searchsorted(waits, at, side="right") - 1
        ok = (pos >= 0) & (w_group[np.maximum(pos, 0)] == group[np.maximum(at, 0)])
        return np.where(ok & (at >= 0), pos, -1)

    def ends_at(at: np.ndarray, held: np.ndarray, reach: np.ndarray) -> np.ndarray:
        """E' of items ``at`` given each one's last wait (``held``) and the waits' running
        maxima (``reach``)."""
        if len(reach) == 0:
            return prefix[at] + origin[group[at]]
        term = np.where(held >= 0, reach[np.maximum(held, 0)], float(NEVER))
        return prefix[at] + np.maximum(origin[group[at]], term)

    m = calls.height
    ready = np.full(m, float(NEVER))  # each call's completion, replayed
    reach = np.full(len(waits), float(NEVER))
    passes, converged = 0, True
    if m:
        c_issued = (calls[ISSUED].to_numpy() - t0).astype(np.float64)
        c_item = calls["issue_item"].to_numpy()
        c_off = calls["issue_offset"].to_numpy().astype(np.float64)
        inst = calls["instance"].to_numpy() - 1
        # the queue's calls of one step replay in order; the first waits for the call before
        # it as measured (a step's replay never moves the next one's calls)
        queue = calls["queue"].to_numpy() * (1 << 24) + calls[S.STEP].fill_null(-1).to_numpy()
        uses_all = calls["uses_all"].to_numpy()
        prev_end = calls["prev_end"].to_numpy()
        prev_end = np.where(prev_end > NEVER, prev_end - t0, NEVER).astype(np.float64)
        transfer = (
            transfer_of if transfer_of is not None else calls["transfer"].to_numpy()
        ).astype(np.float64)
        q_first = np.ones(m, bool)
        q_first[1:] = queue[1:] != queue[:-1]
        q_csum = np.cumsum(transfer)
        q_heads = np.flatnonzero(q_first)
        q_before = np.concatenate([[0.0], q_csum])[q_heads]
        q_prefix = q_csum - np.repeat(q_before, np.diff(np.append(q_heads, m)))
        shifted = np.where(q_first, 0.0, np.concatenate([[0.0], q_prefix[:-1]]))
        issued_on = c_item >= 0
        item = np.maximum(c_item, 0)
        span = timed.span[item]
        is_wait = wait[item]
        held_end = last_wait(item)
        held_start = np.where(first[item], -2, last_wait(item - 1))
        w_call = call[waits]
        # a wait released before its call's span closed keeps that lead, scaled with the
        # call's transfer (_released_early)
        t_measured = calls["transfer"].to_numpy().astype(np.float64)[w_call]
        w_early = items["early"].to_numpy()[waits].astype(np.float64)
        w_early *= np.where(t_measured > 0, transfer[w_call] / np.maximum(t_measured, 1), 1.0)
    while True:
        passes += 1
        r = np.full(len(waits), float(NEVER))
        if m and not change.hide_comm:
            r = ready[w_call] - w_early
        reach = _group_cummax(r - w_prefix, w_group)
        if m == 0:
            break
        # where each call is issued now: its item's replayed start plus how far into it
        e_item = ends_at(item, held_end, reach)
        s_item = np.where(
            held_start == -2,
            origin[group[item]],
            ends_at(np.maximum(item - 1, 0), np.maximum(held_start, -1), reach),
        )
        now_span = e_item - s_item
        scaled = np.where(span > 0, c_off * now_span / np.where(span > 0, span, 1), 0.0)
        into = np.where(is_wait, np.minimum(c_off, now_span), scaled)
        issue = np.where(issued_on, s_item + into, c_issued)
        last = np.full(int(inst.max()) + 1, float(NEVER))
        np.maximum.at(last, inst, issue)
        arrival = np.where(uses_all, last[inst], issue)
        arrival = np.where(q_first, np.maximum(arrival, prev_end), arrival)
        if change.no_queue:
            new_ready = arrival + transfer
        else:  # on a queue: C_c = max(A_c, C_prev) + T_c, a cumulative maximum
            new_ready = q_prefix + _group_cummax(arrival - shifted, queue)
        if np.array_equal(new_ready, ready):
            break
        ready = new_ready
        if passes > every_call + 1:  # (a graph without cycles settles in a pass a call)
            converged = False
            break
    tails = np.append(heads[1:] - 1, n - 1) if n else heads
    g_end = ends_at(tails, last_wait(tails), reach) if n else np.zeros(0)
    out = (
        pl.DataFrame({"s": g_step, "b": origin, "e": g_end})
        .group_by("s")
        .agg((pl.col("e").max() - pl.col("b").min()).alias("d"))
    )
    return Replay(
        dict(zip(out["s"].to_list(), [round(v) for v in out["d"].to_list()], strict=True)),
        passes,
        converged,
    )


def _calls_that_move(
    graph: Graph, call: np.ndarray
) -> tuple[pl.DataFrame, np.ndarray, np.ndarray | None]:
    """The calls of ``graph``'s steps and of the steps of the calls its items wait for
    (``call``: each item's, -1 for none: an instance's members and a queue's calls in one step
    share their step), renumbered, with the items' call ids to match and which calls they are
    (None: all)."""
    calls = graph.calls
    if calls.height == 0:
        return calls, call, None
    label = calls[S.STEP].fill_null(NO_STEP).to_numpy()
    keep = np.isin(label, np.union1d(graph.steps, label[call[call >= 0]]))
    if keep.all():
        return calls, call, None
    kept = np.flatnonzero(keep)
    renumber = np.full(calls.height, -1, np.int64)
    renumber[kept] = np.arange(len(kept))
    call = np.where(call >= 0, renumber[np.maximum(call, 0)], -1)
    return calls[kept], call, kept


def _group_cummax(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Cumulative maximum restarting at each group (``group`` sorted; values in ns, NEVER for
    none): one ``np.maximum.accumulate`` over integers lifted by group."""
    if len(values) == 0:
        return values
    none = values <= NEVER / 2
    if none.all():
        return values
    lowest = float(values[~none].min()) - 1.0
    lifted = np.round(np.where(none, lowest, values) - lowest).astype(np.int64)
    span = int(lifted.max()) + 1
    rank = np.concatenate([[0], np.cumsum(group[1:] != group[:-1])])  # dense, from 0
    if int(rank[-1]) * span >= 1 << 62:  # (groups times span beyond int64: polars)
        frame = pl.DataFrame({"v": values, "g": group})
        return frame.select(pl.col("v").cum_max().over("g")).to_series().to_numpy()
    base = rank.astype(np.int64) * span
    out = (np.maximum.accumulate(lifted + base) - base).astype(np.float64) + lowest
    return np.where(out <= lowest, float(NEVER), out)


# --- the path -------------------------------------------------------------------------------


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


# --- results --------------------------------------------------------------------------------


def what_ifs(graph: Graph, ranks_phase_ms: pl.DataFrame | None = None) -> list[Change]:
    """The changes worth replaying on this graph: none (the check), each rank balanced where
    ranks differ, every rank balanced, hidden communication, no late starts, the largest phase
    and the largest operator 2x faster."""
    changes = [Change("none")]
    items = graph.items
    if items.height == 0:
        return changes
    dur = (items[S.END_NS] - items[S.START_NS]).cast(pl.Float64)
    computing = items[S.KIND].is_in(_COMPUTING)
    frame = items.select(S.RANK, S.STEP, S.PHASE, S.OP).with_columns(
        dur.alias("d"), computing.alias("c")
    )
    per = frame.filter(pl.col("c")).group_by(S.STEP, S.RANK, S.PHASE).agg(pl.col("d").sum())
    med = per.group_by(S.STEP, S.PHASE).agg(pl.col("d").median().alias("m"))
    factor = (
        per.join(med, on=[S.STEP, S.PHASE])
        .with_columns((pl.col("m") / pl.col("d")).clip(upper_bound=1.0).alias("f"))
        .select(S.STEP, S.RANK, S.PHASE, "f")
    )
    joined = frame.with_row_index("_i").join(factor, on=[S.STEP, S.RANK, S.PHASE], how="left")
    joined = joined.sort("_i")
    f = np.where(joined["c"].to_numpy(), joined["f"].fill_null(1.0).to_numpy(), 1.0)
    if (f < 1.0).any():
        changes.append(Change("balance", item_factor=f))
    if graph.calls.height:
        changes.append(Change("hide_comm", hide_comm=True))
    changes.append(Change("no_late_start", no_late_start=True))
    return changes


def faster(graph: Graph, name: str, k: float) -> Change | None:
    """A phase, an operator or a collective ``k`` times faster (None: the graph has no such)."""
    items, calls = graph.items, graph.calls
    label = f"faster:{name}:{k:g}"
    if name in S.BREAKDOWN_PHASES and name != S.COMM:
        hit = (items[S.PHASE] == name).to_numpy() & (items["call"] < 0).to_numpy()
    else:
        hit = ((items[S.OP] == name).fill_null(False) & (items["call"] < 0)).to_numpy()
    hit_calls = (
        (calls[S.COLLECTIVE] == name).to_numpy() | (name == S.COMM)
        if calls.height
        else np.zeros(0, bool)
    )
    if not hit.any() and not hit_calls.any():
        return None
    factor = np.where(hit, 1.0 / k, 1.0)
    transfer = calls["transfer"].to_numpy().astype(np.float64) if calls.height else None
    if transfer is not None:
        transfer = np.where(hit_calls, transfer / k, transfer)
    return Change(label, item_factor=factor, transfer=transfer)


def balance_rank(graph: Graph, rank: int) -> Change | None:
    """One rank's compute phases at the median of the other ranks' (per step and phase)."""
    items = graph.items
    dur = (items[S.END_NS] - items[S.START_NS]).cast(pl.Float64)
    computing = items[S.KIND].is_in(_COMPUTING)
    frame = items.select(S.RANK, S.STEP, S.PHASE).with_columns(dur.alias("d"), computing.alias("c"))
    per = frame.filter(pl.col("c")).group_by(S.STEP, S.RANK, S.PHASE).agg(pl.col("d").sum())
    others = (
        per.filter(pl.col(S.RANK) != rank)
        .group_by(S.STEP, S.PHASE)
        .agg(pl.col("d").median().alias("m"))
    )
    mine = per.filter(pl.col(S.RANK) == rank).join(others, on=[S.STEP, S.PHASE])
    if mine.height == 0:
        return None
    factor = mine.with_columns((pl.col("m") / pl.col("d")).clip(upper_bound=1.0).alias("f")).select(
        S.STEP, pl.col(S.RANK), S.PHASE, "f"
    )
    joined = frame.with_row_index("_i").join(factor, on=[S.STEP, S.RANK, S.PHASE], how="left")
    f = np.where(
        joined.sort("_i")["c"].to_numpy(), joined.sort("_i")["f"].fill_null(1.0).to_numpy(), 1.0
    )
    return Change(f"balance:rank={rank}", item_factor=f)


def at_bandwidth(graph: Graph, op: str, gbps: float) -> Change | None:
    """Calls of collective ``op`` at a bus bandwidth of ``gbps`` Gb/s (bits, as the report's
    busbw_gbps): transfer = bus bytes / bandwidth."""
    calls = graph.calls
    if calls.height == 0:
        return None
    hit = (calls[S.COLLECTIVE] == op).to_numpy() & calls[S.BYTES].is_not_null().to_numpy()
    if not hit.any():
        return None
    n = calls["participants"].fill_null(2).to_numpy().astype(np.float64)
    factor = np.array([BUS_FACTOR[op](v) for v in n]) if op in BUS_FACTOR else np.ones(len(n))
    bus = calls[S.BYTES].fill_null(0).to_numpy().astype(np.float64) * factor
    transfer = calls["transfer"].to_numpy().astype(np.float64)
    transfer = np.where(hit, bus * 8 / gbps, transfer)  # bits over Gb/s: ns
    return Change(f"bandwidth:{op}:{gbps:g}", transfer=transfer)


@dataclass
class Explained:
    """What the report takes from the critical path."""

    path: CriticalPath | None
    per_step: dict[int, StepPath]
    whatif: list[WhatIf]
    rank_blame: dict[int, float]  # per rank, its own time on the path (not transfer), ms/step


class PathCache(Protocol):
    """Where a report keeps what it took from the critical path, per choice of steps and
    changes (``key``), for the next report of the same run (store/analysed.py: in the run
    directory, beside the tables it was computed from)."""

    def get(self, key: str) -> Explained | None: ...

    def put(self, key: str, explained: Explained) -> None: ...


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


#: A stretch of the path shorter than this share of the step joins the stretch before it on
#: the same rank in the report's list (a GPU path alternates kernels and launch gaps every few
#: microseconds); blame and the exported path keep every piece.
_STRETCH_MIN = 0.005


def _stretches(pieces: pl.DataFrame | list[PathPiece], step_ns: int) -> list[PathPiece]:
    """The path's pieces (PIECE_COLUMNS, in time order) joined into stretches of one rank and
    phase (what the report lists), each named by the kind and operator of its longest piece
    (the first of the longest); a stretch under _STRETCH_MIN of the step joins the one before
    it on its rank. A late start joins nothing: it has no phase. They still tile the step.

    Over columns: a piece begins a stretch where its rank changes, where it or the piece
    before is a late start, or where it is not short and its phase is not that of the last
    piece before it that is not short or began a run of its rank (the stretch's phase: a piece
    that is not short either has it or begins the next stretch with its own)."""
    if isinstance(pieces, list):
        pieces = pl.DataFrame(
            [(x.rank, x.phase, x.op, x.kind, x.start_ns, x.dur_ns) for x in pieces],
            schema=PIECE_COLUMNS, orient="row",
        )  # fmt: skip
    pieces = pieces.filter(pl.col(S.DUR_NS) > 0)
    n = pieces.height
    if n == 0:
        return []
    rank = pieces[S.RANK].to_numpy()
    start = pieces[S.START_NS].to_numpy()
    dur = pieces[S.DUR_NS].to_numpy()
    phase, kind, op = (_Labels(pieces[name]) for name in (S.PHASE, S.KIND, S.OP))
    late = kind.codes == kind.code(LATE_START)
    edge = np.ones(n, bool)
    edge[1:] = (rank[1:] != rank[:-1]) | late[1:] | late[:-1]
    long = dur >= _STRETCH_MIN * step_ns
    index = np.arange(n)
    marks = np.maximum.accumulate(np.where(long | edge, index, -1))
    before = np.concatenate([[0], marks[:-1]])  # (a piece that is no edge has one in its run)
    begins = edge | (long & (phase.codes != phase.codes[before]))
    first = np.flatnonzero(begins)
    last = np.append(first[1:] - 1, n - 1)
    top = np.maximum.reduceat(dur, first)
    which = np.cumsum(begins) - 1
    named = np.minimum.reduceat(np.where(dur == top[which], index, n), first)
    return [
        PathPiece(int(r), phase[f], op[k], kind[k], int(s0), int(s1 + d1 - s0))  # type: ignore[arg-type]
        for r, f, k, s0, s1, d1 in zip(
            rank[first], first, named, start[first], start[last], dur[last], strict=True
        )
    ]


@dataclass
class _StepWalk:
    """What a step's walked path leaves once its pieces are counted (``explain``)."""

    step: int
    start_ns: int
    end_ns: int
    complete: bool
    reason: str | None


def explain(
    segments: pa.Table | TableOnDemand,
    matched: Matched,
    steps: list[int | None],
    counted: list[int | None],
    median_phase_ms: dict[str, float],
    extra: list[str] | None = None,
    world: int | None = None,
) -> Explained:
    """The critical path of each of ``steps`` (every complete step, warm-up included); blame
    and the what-ifs worth reporting over the ``counted`` ones (``extra``: more changes asked
    for, as ``whatif`` takes them). The steps are walked and replayed in batches
    (``_batches``); what is kept of a walked path is its blame rows, summed per step, rank,
    phase, kind and operator (integers: the sums are the whole graph's). ``segments``: the
    table, or what reads it a piece at a time (``_source``)."""
    source = _source(segments, matched, steps, world)
    del segments
    if source is None:
        return Explained(None, {}, [], {})
    walked: list[_StepWalk] = []
    rows: list[pl.DataFrame] = []
    batches = _batches(source, source.steps)
    kept: list[WalkedPath] = []  # one batch: its paths (the median's is one of them)
    for batch in batches:
        walks = source.walks(batch)
        if not walks:
            continue
        walked += [_StepWalk(p.step, p.start_ns, p.end_ns, p.complete, p.reason) for p in walks]
        rows.append(
            _blame_rows(walks)
            .group_by("step", "rank", "phase", "kind", "op")
            .agg(pl.col("ns").sum())
        )
        if len(batches) == 1:
            kept = walks
        del walks
    wanted = {NO_STEP if s is None else s for s in counted}
    paths = [p for p in walked if p.step in wanted]
    if not paths:
        return Explained(None, {}, [], {})
    step_ns = {p.step: p.end_ns - p.start_ns for p in walked}
    ordered = sorted(paths, key=lambda p: (step_ns[p.step], p.step))
    median = ordered[(len(ordered) - 1) // 2]
    every = pl.concat(rows)
    df = every.filter(pl.col("step").is_in(list(wanted)))
    n = len(paths)
    mean_step_ms = float(np.mean([step_ns[p.step] for p in paths])) / 1e6
    blame = _blame(df, n, mean_step_ms, median_phase_ms)
    per_step = {}
    step_ms = {p.step: step_ns[p.step] / 1e6 for p in walked}
    blames = _blame_per_step(every, step_ms, median_phase_ms)
    for p in walked:
        per_step[p.step] = StepPath(
            step_ms=round(step_ms[p.step], 3),
            complete=p.complete,
            reason=p.reason,
            blame=blames.get(p.step, []),
        )
    by_op = (
        df.filter(pl.col("op").is_not_null())
        .group_by("op", "phase", "kind")
        .agg((pl.col("ns").sum() / n / 1e6).alias("ms"))
        .sort("ms", "op", "phase", "kind", descending=[True, False, False, False], nulls_last=True)
        .head(10)
    )
    # the median step's path, for the stretches the report lists: walked again, alone, unless
    # the run was one batch (a step's path is its own, in a batch or alone)
    again = next((p for p in kept if p.step == median.step), None)
    if again is None:
        (again,) = source.walks([median.step])
    del kept
    segs = [
        PathSegment(
            rank=x.rank,
            phase=x.phase,  # type: ignore[arg-type]
            op=x.op,
            kind=x.kind,  # type: ignore[arg-type]
            start_ms=round((x.start_ns - median.start_ns) / 1e6, 4),
            ms=round(x.dur_ns / 1e6, 4),
        )
        for x in _stretches(again.frame, median.end_ns - median.start_ns)
    ]
    own = df.filter(pl.col("kind").is_in(_OWN)).group_by("rank").agg(pl.col("ns").sum())
    rank_blame = {int(r): float(v) / n / 1e6 for r, v in own.iter_rows()}
    path = CriticalPath(
        step_ms=round(step_ns[median.step] / 1e6, 3),
        step=median.step,
        steps=n,
        complete_steps=sum(p.complete for p in paths),
        segments=segs,
        blame=blame,
        by_op=[
            OpBlame(op=r["op"], phase=r["phase"], kind=r["kind"], ms=round(r["ms"], 3))
            for r in by_op.iter_rows(named=True)
        ],
    )
    counted_steps = sorted(wanted & set(source.steps))
    whatif = _what_ifs(source, counted_steps, blame, by_op, extra or [])
    return Explained(path, per_step, whatif, rank_blame)


def parse_change(graph: Graph, text: str) -> Change | None:
    """A change as the report and ``whatif`` name it (WhatIf.change); None where the graph has
    nothing it applies to. Raises ValueError for a change that is not well formed."""
    name, _, rest = text.partition(":")
    if name == "none":
        return Change("none")
    if name == "balance" and not rest:
        return next((c for c in what_ifs(graph) if c.name == "balance"), None)
    if name == "balance" and rest.startswith("rank="):
        return balance_rank(graph, int(rest.removeprefix("rank=")))
    if name == "faster":
        what, _, k = rest.rpartition(":")
        if not what or float(k) <= 0:
            raise ValueError(text)
        return faster(graph, what, float(k))
    if name == "bandwidth":
        op, _, gbps = rest.rpartition(":")
        if not op or float(gbps) <= 0:
            raise ValueError(text)
        return at_bandwidth(graph, op, float(gbps))
    if name == "hide_comm" and not rest:
        return Change("hide_comm", hide_comm=True)
    if name == "no_late_start" and not rest:
        return Change("no_late_start", no_late_start=True)
    raise ValueError(text)


def _changes(
    graph: Graph, ranks: int, blame: list[Blame], by_op: pl.DataFrame, extra: list[str]
) -> list[Change | None]:
    """The changes the report replays, in its order (None: nothing in ``graph`` it applies
    to): none, balance, hide_comm, no_late_start, the rank with the most of its own time
    balanced, the top phase, the top operator and the top collective 2x faster, then
    ``extra``. Each slot names the same change in every batch of a run's steps."""
    by_name = {c.name: c for c in what_ifs(graph)}
    changes: list[Change | None] = [
        by_name["none"],
        by_name.get("balance"),
        by_name.get("hide_comm"),
        by_name.get("no_late_start"),
    ]
    top_rank = next((b.rank for b in blame if b.kind in _OWN and b.kind != LATE_START), None)
    changes.append(balance_rank(graph, top_rank) if ranks > 1 and top_rank is not None else None)
    top_phase = next(
        (b.phase for b in blame if b.kind in _OWN and b.phase not in (None, S.IDLE)), None
    )
    changes.append(faster(graph, top_phase, 2.0) if top_phase is not None else None)
    top_op = next((r["op"] for r in by_op.iter_rows(named=True) if r["kind"] in _OWN), None)
    wanted_op = top_op is not None and top_op != top_phase
    changes.append(faster(graph, top_op, 2.0) if wanted_op else None)  # type: ignore[arg-type]
    comm_op = next((r["op"] for r in by_op.iter_rows(named=True) if r["kind"] == TRANSFER), None)
    changes.append(faster(graph, comm_op, 2.0) if comm_op is not None else None)
    changes += [parse_change(graph, text) for text in extra]
    return changes


def _what_ifs(
    source: _Source, steps: list[int], blame: list[Blame], by_op: pl.DataFrame, extra: list[str]
) -> list[WhatIf]:
    """Each change replayed over ``steps`` (the counted ones), a batch at a time: a change
    with nothing to apply to in a batch leaves its steps as replayed with none. A change is
    reported where it applies to some batch, in its first slot's place (``_changes``)."""
    windows = source.windows().filter(pl.col(S.STEP).is_in(steps))
    ranks = windows[S.RANK].n_unique()
    slot_of: dict[str, int] = {}
    per_batch: list[tuple[dict[int, int], dict[str, dict[int, int]]]] = []
    for batch in _batches(source, steps):
        graph = source.graph(batch)
        if graph is None:
            continue
        results: dict[str, dict[int, int]] = {}
        for slot, change in enumerate(_changes(graph, ranks, blame, by_op, extra)):
            if change is None or change.name in results:
                continue
            slot_of[change.name] = min(slot_of.get(change.name, slot), slot)
            results[change.name] = replay(graph, change).step_ns
        per_batch.append((results["none"], results))
        del graph
    out: list[WhatIf] = []
    base: float | None = None
    for name in sorted(slot_of, key=slot_of.__getitem__):
        step_ns: dict[int, int] = {}
        for none, results in per_batch:
            step_ns.update(results.get(name, none))
        ms = float(np.mean(sorted(step_ns.values()))) / 1e6 if step_ns else 0.0
        if base is None:
            base = ms
        out.append(
            WhatIf(
                change=name, step_ms=round(ms, 3), speedup=round(base / ms, 3) if ms > 0 else 0.0
            )
        )
    return out


def path_table(
    segments: pa.Table | TableOnDemand, matched: Matched, steps: list[int | None]
) -> pa.Table:
    """Every piece of the critical path of each of ``steps`` (schema.CRITICAL_PATH_SCHEMA),
    walked in batches of steps (``_batches``)."""
    source = _source(segments, matched, steps, None)
    parts: list[pa.Table] = []
    for batch in _batches(source, source.steps) if source is not None else []:
        assert source is not None
        graph = _graph(source, batch)
        paths = critical_paths(graph, source.rows) if graph is not None else []
        parts.append(_pieces_of(paths).select(S.CRITICAL_PATH_SCHEMA.names).to_arrow())
    return pa.table(
        {
            name: pa.chunked_array(
                [t.column(name).cast(S.CRITICAL_PATH_SCHEMA.field(name).type) for t in parts],
                S.CRITICAL_PATH_SCHEMA.field(name).type,
            )
            for name in S.CRITICAL_PATH_SCHEMA.names
        },
        schema=S.CRITICAL_PATH_SCHEMA,
    )


def path_stretches(table: pa.Table) -> dict[int | None, list[PathStretch]]:
    """A path table (``path_table``) per step, as the stretches the report lists."""
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    out: dict[int | None, list[PathStretch]] = {}
    for (step,), part in frame.group_by(S.STEP, maintain_order=True):
        span = int(part[S.DUR_NS].sum())
        out[step] = [
            PathStretch(x.rank, x.phase, x.op, x.kind, x.start_ns, x.dur_ns)
            for x in _stretches(part.select(list(PIECE_COLUMNS)), span)
        ]
    return out
