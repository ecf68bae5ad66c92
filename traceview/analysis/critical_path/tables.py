"""The path as the export and the TUI read it: every piece as a table (``path_table``), and
the pieces joined into the stretches the report lists (``_stretches``, ``path_stretches``)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from traceview.analysis.critical_path.blame import _pieces_of
from traceview.analysis.critical_path.graph import LATE_START
from traceview.analysis.critical_path.source import _batches, _graph, _source
from traceview.analysis.critical_path.walk import (
    PIECE_COLUMNS,
    PathPiece,
    walk,
)
from traceview.analysis.crossrank import Matched
from traceview.model import schema as S
from traceview.model.columns import TableOnDemand
from traceview.model.results import PathStretch

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
    if (pieces[S.DUR_NS] <= 0).any():  # (else kept as it is: a path of millions, not copied)
        pieces = pieces.filter(pl.col(S.DUR_NS) > 0)
    n = pieces.height
    if n == 0:
        return []
    rank = pieces[S.RANK].to_numpy()
    start = pieces[S.START_NS].to_numpy()
    dur = pieces[S.DUR_NS].to_numpy()
    phase, kind, op = (pieces[name] for name in (S.PHASE, S.KIND, S.OP))
    late = (kind == LATE_START).fill_null(False).to_numpy()
    edge = np.ones(n, bool)
    edge[1:] = (rank[1:] != rank[:-1]) | late[1:] | late[:-1]
    long = dur >= _STRETCH_MIN * step_ns
    # a long piece's phase against that of the last long or edge piece before it (the first
    # piece is an edge: every other has one)
    marked = np.flatnonzero(long | edge)
    longs = np.flatnonzero(long)
    before = marked[np.maximum(np.searchsorted(marked, longs) - 1, 0)]
    begins = edge
    begins[longs] |= phase.gather(longs).ne_missing(phase.gather(before)).to_numpy()
    first = np.flatnonzero(begins)
    last = np.append(first[1:] - 1, n - 1)
    top = np.maximum.reduceat(dur, first)
    # each stretch named by its first longest piece
    tops = np.flatnonzero(dur == np.repeat(top, last - first + 1))
    named = tops[np.searchsorted(tops, first)]
    # (the labels of the stretches alone: a path of a million pieces has a few thousand)
    labels = (phase.gather(first).to_list(), op.gather(named).to_list())
    kinds = kind.gather(named).to_list()
    return [
        PathPiece(int(r), p, o, k, int(s0), int(s1 + d1 - s0))
        for r, p, o, k, s0, s1, d1 in zip(
            rank[first], *labels, kinds, start[first], start[last], dur[last], strict=True
        )
    ]


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
        walks = walk(graph, source.rows) if graph is not None else None
        parts.append(_pieces_of(walks).select(S.CRITICAL_PATH_SCHEMA.names).to_arrow())
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
