"""What every graph of a run's steps is cut from, read once with bounded memory (``_Source``,
``_source``), the graphs cut from it (``build_graph``, ``_graph``) and the steps taken in
batches of at most ``GRAPH_ROWS`` items (``_batches``)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from traceview.analysis.critical_path.graph import NO_STEP, Graph
from traceview.analysis.critical_path.waits import (
    _calls,
    _composite,
    _issue_points,
    _received_when_waited,
    _released_early,
    _unexplained,
    _waiting_pieces,
)
from traceview.analysis.critical_path.walk import Walks, walk
from traceview.analysis.crossrank import ISSUED, Matched
from traceview.model import schema as S
from traceview.model.columns import TableOnDemand


def build_graph(
    segments: pa.Table,
    matched: Matched,
    steps: list[int | None],
    world: int | None = None,
    actions: pa.Table | None = None,
) -> Graph | None:
    """The graph of ``steps`` (the counted steps; None: a window without step markers) from
    every rank's segments and the matched calls (crossrank.match_collectives, on one clock);
    ``world``: the job's world size, where known (a world of one has nothing to wait for);
    ``actions``: a pipeline's, on the same clock."""
    source = _source(segments, matched, steps, world, actions)
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
    actions: pl.DataFrame | None  # a pipeline's (``_actions``), None without one
    # the last graph made, and its walk where it is one step's: asked for again (a run of one
    # batch, or of one long step, walks, replays and walks its median step again in the same
    # graph), they are not made again; a new one replaces them before it is made
    last: tuple[list[int], Graph | None, Walks | None] | None = None

    def graph(self, steps: list[int]) -> Graph | None:
        """The graph of ``steps`` (sorted; ``_graph``), the last one where it is the same."""
        if self.last is not None and self.last[0] == steps:
            return self.last[1]
        self.last = None  # (freed before the next is made)
        graph = _graph(self, steps)
        self.last = (steps, graph, None)
        return graph

    def walks(self, steps: list[int]) -> Walks | None:
        """``walk`` of the graph of ``steps`` (None: no graph), the last walk where it is the
        same step's."""
        graph = self.graph(steps)
        if graph is None:
            return None
        assert self.last is not None
        if self.last[2] is not None:
            return self.last[2]
        walks = walk(graph, self.rows)
        if len(steps) == 1:  # (one step's path: kept until ``forget_walks``)
            self.last = (steps, graph, walks)
        return walks

    def forget_walks(self) -> None:
        """Free the kept walk, keeping its graph (the what-ifs replay it): one rank's path of
        one long step is as many items as the graph."""
        if self.last is not None:
            self.last = (self.last[0], self.last[1], None)

    def rest_of(self, steps: list[int]) -> pl.DataFrame:
        """The rest of ``steps`` (sorted), sorted: where the rest is not held, read again,
        only the pieces (row groups) that may hold those steps. A rest held that is more than
        a graph holds (one step's) is given up: its graph is made of its columns."""
        if self.rest is not None:
            if steps == self.steps:
                rest = self.rest
                if rest.height > GRAPH_ROWS and self.segments.pieces is not None:
                    self.rest = None  # (from a file: read again if need be)
                return rest
            return self.rest.filter(pl.col(S.STEP).is_in(_series(steps)))
        wanted = _series(steps)
        parts = [
            _compact(table, wanted).filter(~_waiting())
            for table in self.segments.in_pieces((S.STEP, steps[0], steps[-1]))
        ]
        rest = pl.concat(parts, rechunk=False)
        return rest if self.in_order else rest.sort(S.RANK, S.STEP, S.START_NS)

    def windows(self) -> pl.DataFrame:
        """Per rank and step, the span of its items."""
        spans = [f.drop("len") for f in (self.rest_spans, _spans(self.pieces))]
        return pl.concat(spans).group_by(S.RANK, S.STEP).agg(pl.col("s").min(), pl.col("e").max())

    def step_rows(self, steps: list[int]) -> np.ndarray:
        """The items of each of ``steps`` (0 where it has none)."""
        counts = pl.concat([self.rest_spans, _spans(self.pieces)])
        per_step = counts.group_by(S.STEP).agg(pl.col("len").sum())
        wanted = pl.DataFrame({S.STEP: steps}, schema={S.STEP: per_step.schema[S.STEP]})
        joined = wanted.join(per_step, on=S.STEP, how="left", maintain_order="left")
        return joined["len"].fill_null(0).to_numpy().astype(np.int64, copy=False)


def _waiting() -> pl.Expr:
    """The segments that may wait for a call: exposed communication, and a collective's kernel
    on a GPU (NCCL's kernel runs from when its stream reaches it until every member's has: it
    holds the wait for the last member as well as the transfer)."""
    kind = pl.col(S.KIND)
    return (kind == S.SEGMENT_COMM) | ((kind == S.SEGMENT_KERNEL) & (pl.col(S.PHASE) == S.COMM))


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
    actions: pa.Table | None = None,
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
    wanted_series = _series(wanted)
    rest: list[pl.DataFrame] | None = []
    held = 0
    comm: list[pl.DataFrame] = []
    communicating: list[pl.DataFrame] = []  # (rank, step) that spent time communicating
    spans: list[pl.DataFrame] = []  # of the rest, per piece (``_spans``)
    ranks: set[int] = set()
    steps_held: set[int] = set()  # (the steps of the rest read so far)
    in_order, last = True, None
    for table in segments.in_pieces():
        seg = _compact(table, wanted_series)
        del table
        if seg.height == 0:
            continue
        # (as the analysis writes them, they are in order: then never sorted, nor copied)
        if in_order:
            first = seg.row(0)[:3]
            in_order = (last is None or first > last) and _in_order(seg)
            last = seg.row(seg.height - 1)[:3]
        ranks.update(seg[S.RANK].unique().to_list())
        is_comm = _waiting()
        comm.append(seg.filter(is_comm))
        communicating.append(
            seg.filter(is_comm | (pl.col(S.PHASE) == S.COMM)).select(S.RANK, S.STEP).unique()
        )
        # (the rest wait for no call: their call and lead are given per batch, in ``_graph``)
        mine = seg.filter(~is_comm)
        del seg
        spans.append(_spans(mine))
        held += mine.height
        steps_held.update(mine[S.STEP].unique().to_list())
        # (more than a graph holds, of several steps: each batch reads its own; of one step,
        # the rest is that step's graph, as large held as read again)
        if rest is not None and (held <= GRAPH_ROWS or held_whole or len(steps_held) <= 1):
            rest.append(mine)
        else:
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
    calls = _received_when_waited(calls, pieces)
    rest_spans = (
        pl.concat(spans)
        .group_by(S.RANK, S.STEP)
        .agg(pl.col("s").min(), pl.col("e").max(), pl.col("len").sum())
    )
    source = _Source(
        rest_frame, pieces, calls, sorted(set(wanted)), unmatched, held + pieces.height,
        rest_spans, segments, in_order, _actions(actions, wanted),
    )  # fmt: skip
    for step in _apart(source.windows()):
        unmatched.setdefault(step, APART)
    return source


#: Why a step's path is no job's: its ranks were never inside it at the same time.
APART = (
    "the ranks never ran the step at the same time (one rank's window ends before another's "
    "begins: traces of different runs or profiling windows, or clocks far apart), so no rank "
    "waited for another"
)


def _apart(windows: pl.DataFrame) -> list[int]:
    """The steps of several ranks (``windows``: per rank and step, s and e) in which some rank's
    window ends before another's begins: the latest start after the earliest end (a window of
    no length inside another's, or two that touch, is together)."""
    steps = windows.group_by(S.STEP).agg(
        pl.col(S.RANK).n_unique().alias("ranks"), pl.col("s").max(), pl.col("e").min()
    )
    return steps.filter((pl.col("ranks") > 1) & (pl.col("s") > pl.col("e")))[S.STEP].to_list()


def _actions(actions: pa.Table | None, wanted: list[int]) -> pl.DataFrame | None:
    """A pipeline's actions in the ``wanted`` steps (rank, step, stage, start, end), sorted by
    rank and start; None where there are none."""
    if actions is None or actions.num_rows == 0:
        return None
    frame = pl.from_arrow(actions)
    assert isinstance(frame, pl.DataFrame)
    frame = frame.select(
        pl.col(S.RANK).cast(pl.Int32), pl.col(S.STEP).fill_null(NO_STEP).cast(pl.Int64),
        pl.col(S.STAGE).cast(pl.Int32), pl.col(S.START_NS).cast(pl.Int64),
        pl.col(S.END_NS).cast(pl.Int64),
    ).filter(pl.col(S.STEP).is_in(wanted))  # fmt: skip
    return frame.sort(S.RANK, S.START_NS) if frame.height else None


#: The columns of the segments a graph is made of.
_SEGMENT_COLUMNS = (S.RANK, S.STEP, S.START_NS, S.END_NS, S.PHASE, S.KIND, S.OP)


def _series(steps: list[int]) -> pl.Series:
    """Step numbers to look up (``is_in``), as one list value: a list of 100,000 steps is
    converted once, not by each lookup."""
    return pl.Series(S.STEP, steps, pl.Int64).implode()


def _compact(segments: pa.Table, wanted: pl.Series) -> pl.DataFrame:
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
        pieces = pieces.filter(pl.col(S.STEP).is_in(_series(steps)))
    if rest.height + pieces.height == 0:
        return None
    items = _items(rest, pieces)
    del rest
    if pieces.height or not source.in_order:  # (in order, no two alike: as the sort leaves it)
        # by rank, step, start and end (ties in their order), a column at a time: each old
        # column freed as its sorted copy is made, never a second copy of every item
        keys = (S.RANK, S.STEP, S.START_NS, S.END_NS)
        order = items.select(pl.arg_sort_by(keys, maintain_order=True)).to_series()
        for name in items.columns:
            items = items.with_columns(items[name].gather(order))
        del order
    # (sorted by rank and step: a run of one (rank, step) is its group, numbered from 0)
    items = items.with_columns(pl.struct(S.RANK, S.STEP).rle_id().cast(pl.Int32).alias("group"))
    calls = _issue_points(source.calls, items)
    actions = source.actions
    if actions is not None:
        actions = actions.filter(pl.col(S.STEP).is_in(steps))
    return Graph(items, calls, list(steps), source.unmatched, actions)


def _items(rest: pl.DataFrame, pieces: pl.DataFrame) -> pl.DataFrame:
    """The rest, then the waiting pieces (their call and how early it was released; the rest's
    -1 and 0): the rest's columns not copied where both have the same types."""
    fills = {"call": -1, "early": 0}
    missing = [c for c in pieces.columns if c not in rest.schema]
    if set(missing) <= set(fills) and all(
        pieces.schema.get(c) == t for c, t in rest.schema.items()
    ):
        rest = rest.with_columns(pl.lit(fills[c], pieces.schema[c]).alias(c) for c in missing)
        items = pl.concat([rest, pieces.select(rest.columns)], how="vertical", rechunk=False)
    else:
        items = pl.concat([rest, pieces], how="diagonal_relaxed")
    return items.with_columns(pl.col("call").fill_null(-1), pl.col("early").fill_null(0))


def _batches(source: _Source, steps: list[int]) -> list[list[int]]:
    """``steps`` (sorted) in runs of whole steps of at most ``GRAPH_ROWS`` items each (a step
    with more is a batch of its own), never cut between two steps that one waits on the other
    through a call (``_tied``): each batch's graph then replays as the whole one does."""
    if not steps:
        return []
    sizes = source.step_rows(steps)
    if int(sizes.sum()) <= GRAPH_ROWS:
        return [list(steps)]
    # a batch from step i runs to the first step k > i that would take it past GRAPH_ROWS and
    # may start one (not tied to the step before it); a batch at a time, not a step
    held = np.r_[0, np.cumsum(sizes)]  # held[k] - held[i]: steps i .. k-1
    free = np.flatnonzero(~_tied(source, steps)) + 1  # the steps a batch may start at
    cuts = [0]
    while True:
        i = cuts[-1]
        past = int(np.searchsorted(held, held[i] + GRAPH_ROWS, side="right")) - 1
        at = int(np.searchsorted(free, max(past, i + 1)))
        if at == len(free):
            break
        cuts.append(int(free[at]))
    cuts.append(len(steps))
    return [steps[a:b] for a, b in itertools.pairwise(cuts)]


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
