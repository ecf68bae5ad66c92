"""The per-rank analysis of a rank normalized in chunks (``traceview.ingest.large.chunked``), a chunk at a
time: the tables ``rank_tables`` gives for the whole rank, without holding its events.

A chunk is a run of whole steps, or a piece of a long step. Each table is either per step
window (steps, comm, gpu, the kernels of the launches table, the memory rows of each step) or
per event (ops, collectives):

- **Per event**, each row is counted in the chunk that writes it (``counted``: a call still open
  at a chunk's end is written, and counted, by the chunk in which it closes); the rows around it
  (its parents, carried from earlier chunks) are context. The parts combine exactly
  (``combine_ops``, ``combine_collectives``: sums, and percentiles over the kept durations).
- **Per window**, a window is analysed a slice at a time: the part of it that lies in one
  chunk, once the next chunk is in (``ChunkedAnalysis._slice``), and its slices are added up
  once it is over (a GPU window ends where the device finished the step, which can be several
  steps of host time later). The rows of a slice are the chunk's own and carried ones, the
  device activities of older chunks still running (and the calls that launched them), the
  previous chunk's rows from its last window on and the next chunk's up to its first window's
  end (a gap on the training thread takes the phase of its neighbours). Each part of the steps
  and GPU tables is a sum over the instants of its slice, so the parts add up to the window's
  row; the queue's mean is recomputed from the parts' areas, and the communication pieces that
  run on across a cut are joined. A step cut in pieces (``chunked``: a long one) is never held
  whole.
- **Memory rows** (per window and device: the peak, and the phase and operator running then)
  are made once every window is known, from the memory records (held whole) and what each
  slice looked up in its rows: the phase and operator at each instant a row may need
  (``memory.MemoryLookups``: every piece's peak, where a window starts, the whole trace's peak).

What a slice cannot tell of the whole rank (its training thread, whether it ran on a device,
whether another thread runs backward) is given up front (``attribution.RankPart``) and
checked against the rows as they pass: ``finish`` returns None when a guess was wrong, and the
caller analyses the rank whole instead.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from traceview.analysis.attribution import (
    RankPart,
    backward_elsewhere,
    breakdown,
    comm_intervals,
    gap_operators,
    operator_gaps,
    rank_timeline,
    step_windows,
    timeline_segments,
)
from traceview.analysis.collectives import collectives_part, combine_collectives
from traceview.analysis.gpu import (
    KernelRows,
    StreamWork,
    combine_launches,
    gpu_steps,
    kernel_launches,
    stream_tail,
    table_device_work,
)
from traceview.analysis.memory import MemoryLookups, memory_steps
from traceview.analysis.ops import OpsPart, combine_ops, ops_part
from traceview.analysis.pipeline import actions_part
from traceview.model import schema as S
from traceview.model.columns import (
    DEVICE,
    HOST_TREE,
    KIND_CODE,
    STRUCTURAL,
    EventArrays,
    SpilledTable,
    TableSpill,
    coded,
    dictionary_codes,
    ints,
    parent_rows,
    unique_inverse,
)

_NEVER = 1 << 62
#: The span of a part that holds the whole rank: [-EVERYWHERE, EVERYWHERE).
EVERYWHERE = _NEVER
#: Columns of the events no analysis reads (left out of the chunks it keeps).
_UNUSED = (S.RUN_ID, S.HOST, S.FRAMEWORK, S.CAT, S.CORRELATION)


class RowParts:
    """The per-event tables of a rank (ops, collectives), fed chunk by chunk: a chunk's part
    stands on its own rows, so it can be made wherever the chunk is (``ChunkedAnalysis.split``:
    in the ingest's process, while a helper analyses the windows)."""

    def __init__(self) -> None:
        self.ops: list[OpsPart] = []
        self.calls: list[pa.Table] = []
        self.actions: list[pa.Table] = []

    def add(self, events: pa.Table, own: np.ndarray, counted: np.ndarray, lo: int, hi: int) -> None:
        if events.num_rows:
            parent = parent_rows(events)  # (once, for both)
            self.ops.append(ops_part(events, counted, parent))
            self.calls.append(collectives_part(events, counted, parent))
            self.actions.append(actions_part(events, counted))

    def finish(self) -> dict[str, pa.Table]:
        return {
            "ops": combine_ops(self.ops),
            "collectives": combine_collectives(self.calls),
            "actions": pa.concat_tables([S.empty(S.ACTIONS_SCHEMA), *self.actions]),
        }


def ranks_as_one(ranks: list[pa.Table]) -> pa.Table:
    """Several ranks' normalized events as one table for ``RowParts``: each rank's event ids
    (and the parents that name them) moved past the ids of the ranks before it, so that an id
    names one event of the batch; one dictionary per column."""
    tables, offset = [], 0
    for events in ranks:
        ids = ints(events.column(S.EVENT_ID), 0)
        if offset:
            parent = events.column(S.PARENT)
            moved = pc.if_else(
                pc.greater_equal(parent, 0), pc.add(parent, pa.scalar(offset, parent.type)), parent
            )
            field = events.schema.field(S.EVENT_ID)  # (as it was: no schema to conform again)
            events = events.set_column(
                events.schema.get_field_index(S.EVENT_ID),
                field,
                pa.array(ids + offset, field.type),
            ).set_column(
                events.schema.get_field_index(S.PARENT), events.schema.field(S.PARENT), moved
            )
        tables.append(S.conform(events, S.EVENTS_SCHEMA))
        offset += max(events.num_rows, int(ids.max()) + 1 if len(ids) else 0)
    if len(tables) < 2:
        return tables[0] if tables else S.empty(S.EVENTS_SCHEMA)
    return pa.concat_tables(tables).unify_dictionaries().combine_chunks()


class ChunkedAnalysis:
    """``rank_tables`` of one rank, fed chunk by chunk (``add``), in time order."""

    def __init__(
        self,
        side: Mapping[str, pa.Table],
        training: tuple[int, int] | None,
        gpu: bool,
        backward_elsewhere: bool,
        whole: tuple[int, int] | None = None,
        spill: Path | None = None,
    ):
        # the rank's memory records (its memory_steps rows), until the lookups take them
        self.memory = side.get("memory")
        self.whole = whole  # a rank without step markers: its one window (open to the end)
        # where the segments (the largest table, a row per stretch of a step) are written as
        # their windows end, rather than held to the end (``finish`` then names the file)
        self.segments = TableSpill(spill, S.SEGMENTS_SCHEMA) if spill is not None else None
        self.training, self.gpu, self.elsewhere = training, gpu, backward_elsewhere
        self.seen_gpu = self.seen_elsewhere = False
        self.rank = 0
        self.rows: RowParts | None = RowParts()  # (None: made elsewhere, ``split``)
        self.per_window: dict[str, list[pa.Table]] = {
            name: [] for name in ("steps", "comm", "gpu", "segments")
        }
        self.kernels: list[KernelRows] = []
        self.streams: StreamWork | None = None  # the last device work of each stream so far
        # chunks waiting for their windows' analysis (all rows that may overlap those windows
        # have to be in: a GPU window ends where the device finished the step, which may be
        # several steps of host time later)
        self.queue: list[_Chunk] = []
        self.before: pa.Table | None = None  # the last analysed chunk's table, context included
        self.running: pa.Table | None = None  # device activities of older chunks still running
        self.after: int | None = None  # where the last analysed chunk's last window ended
        # a chunk's windows are analysed as soon as the next chunk is in, a slice at a time
        # (``_slice``): a long step is never held whole
        # memory rows: made at the end, from what each slice looks up (``_lookups``: made with
        # the first slice, where the slices are analysed, not where the sink is made)
        self.lookups: MemoryLookups | None = None
        self.whole_started = False
        self.open = _Open.NONE  # the windows that run on past the last slice
        self.next_id = 0
        self.since = -_NEVER  # where the next slice starts
        self.pending = _Pending()

    def add(
        self,
        events: pa.Table,
        own: np.ndarray,
        counted: np.ndarray,
        lo: int,
        hi: int,
        ev: EventArrays | None = None,
    ) -> None:
        """One chunk's normalized rows (``own``: the chunk's; the others carried in, as
        context), ``counted``: the rows it writes; its steps are the markers in [lo, hi).
        ``ev``: their arrays, where the caller has them (the whole rank's: kept for its one
        slice; a chunk of a large trace lets its own go, its slices' rows are not its alone)."""
        if events.num_rows == 0:
            return
        events = events.drop_columns([c for c in _UNUSED if c in events.column_names])
        self.rank = int(events.column(S.RANK)[0].as_py())
        given, ev = ev, ev if ev is not None else EventArrays.of(events)
        self._check(ev, counted)
        if self.rows is not None:
            self.rows.add(events, own, counted, lo, hi)
        # its windows, by the host alone (without the device's lag)
        part = RankPart(self.training, False, self.elsewhere, lo, hi)
        host = step_windows(ev, self.training, False, part)
        if self.whole is not None:  # its one window, from the first chunk on
            first, self.whole_started = not self.whole_started, True
            whole = [np.array([bound]) for bound in self.whole] if first else [_NONE, _NONE]
            host = (whole[0], whole[1], np.full(len(whole[0]), -1, np.int64))
        device_steps, device_ends = _device_ends(ev) if self.gpu else (_NONE, _NONE)
        del ev
        near, far, ops = _neighbour_operators(events, own, self.training, lo, hi)
        self.queue.append(
            _Chunk(events, own, lo, hi, host, device_steps, device_ends, near, far, ops, given)
        )
        self._drain(final=False)

    def split(self) -> tuple[RowParts, ChunkedAnalysis]:
        """Before the first chunk: the per-event tables' analysis, and a copy of this one
        without them; two sinks for the same chunks whose results together are this one's."""
        assert self.rows is not None and not self.queue
        rest = copy.copy(self)
        rest.rows = None
        return self.rows, rest

    def _check(self, ev: EventArrays, counted: np.ndarray) -> None:
        kind = ev.kind
        self.seen_gpu |= bool(DEVICE[kind[counted]].any())
        host = HOST_TREE[kind] & counted
        self.seen_elsewhere |= backward_elsewhere(ev, host, self.training)

    def _drain(self, final: bool) -> None:
        """Analyse each chunk once the chunks after it hold the next neighbours of a gap at its
        end on the training thread (or none will come), a slice at a time."""
        while self.queue and (final or self._ready()):
            head = self.queue.pop(0)
            self._slice(head, self.queue)

    def _ready(self) -> bool:
        """The head's slice can be cut: the chunks after it hold _NEIGHBOURS operators on the
        training thread or a window's end (a gap whose next operator lies several chunks on,
        where another thread's events fill the chunks between, takes that operator's phase as
        over the whole rank), or _LOOKAHEAD chunks wait (then the gap's end is the last one's)."""
        following = self.queue[1:]
        return bool(following) and (
            len(following) >= _LOOKAHEAD or _neighbour_chunks(following) is not None
        )

    def _slice(self, head: _Chunk, following: list[_Chunk]) -> None:
        """The head's part of every window that overlaps it, once the next chunk is in (or none
        will come): the windows that started in earlier chunks and run on (``self.open``), then
        its own. A window's slices are added up once it ends.

        The slice is what lies between the head's start and the next chunk's: an instant's
        phase depends only on what runs then (the head's rows, the host calls still open and
        the device work still running from earlier chunks) and, in a gap on the training
        thread, on its neighbours (the rows before, and the next chunk's). Its windows are found
        as ``step_windows`` finds them over the whole rank: a window's end is its device work's
        (GPU runs), known once its host window is over (a step launches its work in its own
        host window); one still open runs past the slice."""
        after = following[0] if following else None
        upto = after.lo if after is not None else _NEVER
        marker, host_end, numbers = (
            np.concatenate([self.open.host[k], head.host[k]]) for k in range(3)
        )
        ids = np.concatenate([self.open.ids, self.next_id + np.arange(len(head.numbers))])
        self.next_id += len(head.numbers)
        device = np.concatenate([self.open.device, np.full(len(head.numbers), -_NEVER)])
        if self.gpu:
            device = np.maximum(device, head.device_ends_of(numbers))
        known = host_end <= upto  # all of its device work launched (or none to wait for)
        ends = np.maximum(host_end, device) if self.gpu else host_end.copy()
        ends = np.where(known, ends, _NEVER)
        starts = marker.copy()
        if self.after is not None and len(starts):
            ends = np.maximum(ends, self.after)
            starts[0] = max(int(starts[0]), self.after)
        ends = np.maximum.accumulate(ends) if len(ends) else ends
        starts[1:] = np.maximum(starts[1:], ends[:-1])
        sub_s, sub_e = np.maximum(starts, self.since), np.minimum(ends, upto)
        here = (sub_s < sub_e) | ((starts == ends) & (starts >= self.since) & (starts < upto))
        context = [t for t in (self.running, self.before) if t is not None and t.num_rows]
        pieces = [head.events]
        neighbours = following[: _neighbour_chunks(following) or len(following)]
        for k, chunk in enumerate(neighbours):  # their first rows: the next neighbours
            own = chunk.own()
            if k:  # beyond the next chunk, only the training thread's rows are neighbours
                own = _on_thread(own, self.training)
            until = min(chunk.first_end, chunk.near + 1)
            pieces.append(own.filter(pc.less(own.column(S.TS_NS), until)))
        pieces = [t for t in pieces if t.num_rows]
        table = _unique_ids(context, pieces)
        alone = not context and len(pieces) == 1 and pieces[0] is head.events  # (its rows)
        lookups = self._lookups()
        if lookups is not None:
            first = (starts >= self.since)[here]  # (where a window starts)
            lookups.add(table, self.since, upto, sub_s[here], sub_e[here], first)
        if here.any():
            part = RankPart(
                self.training,
                self.gpu,
                self.elsewhere,
                head.lo,
                head.hi,
                windows=(sub_s[here], sub_e[here], numbers[here]),
            )
            tl = rank_timeline(table, part, head.arrays if alone else None)
            self.pending.add(
                ids[here],
                sub_s[here],
                breakdown(table, tl),
                gpu_steps(table, tl),
                comm_intervals(table, tl),
                timeline_segments(table, tl),
            )
            if self.gpu:  # (a host-only rank launches no kernel)
                self.kernels.append(kernel_launches(table, tl, self.streams))
            settled = self.pending.settled()
            if settled is not None:
                self._segments_done(settled)
        if self.gpu:  # the device work begun before the next slice, for its queueing (the
            # rows the slice looked ahead at are the next slices' own)
            mine = table_device_work(table)
            before = mine[2] < upto
            mine = tuple(p[before] for p in mine)  # type: ignore[assignment]
            if self.streams is not None:
                mine = tuple(np.concatenate(p) for p in zip(self.streams, mine, strict=True))  # type: ignore[assignment]
            self.streams = stream_tail(mine)
        # the windows that end here (a prefix; one of no length at the cut is the next slice's)
        done = int(np.sum((ends < upto) | ((ends == upto) & (starts < upto))))
        if done:
            steps, gpu, comm, segments = self.pending.take(int(ids[done - 1]))
            self.per_window["steps"].append(steps)
            self.per_window["gpu"].append(gpu)
            self.per_window["comm"].append(comm)
            self._segments_done(segments)
            self.after = int(ends[done - 1])
        self.open = _Open(
            (marker[done:], host_end[done:], numbers[done:]), ids[done:], device[done:]
        )
        if not following:  # the last slice (only the final drain leaves none after the head):
            self.since = upto  # no later slice needs its rows
            return
        self.running = _still_running(table, head.hi)
        # for the next slice: the head's rows from its last window, or from its last operators
        # on the training thread where those start later (what the next slice's gap needs)
        last = sub_s[here].max() if here.any() else head.lo
        before = _ending_after(head.events, max(int(last), head.far))
        if head.training_ops < _NEIGHBOURS and self.before is not None:
            # too few of its own: the training thread's last rows of earlier chunks too (a gap
            # that began chunks before ends in the next slice), from its last _NEIGHBOURS
            # operators on
            before = _unique_ids([_on_thread(self.before, self.training), before], [])
            everything = np.ones(before.num_rows, bool)
            _, far, _ = _neighbour_operators(before, everything, self.training, 0, 0)
            before = _ending_after(before, far) if far > 0 else before
        self.before = before
        self.since = upto

    def _lookups(self) -> MemoryLookups | None:
        """What the memory rows look up as the slices pass, where the rank has memory records
        (as the whole rank's analysis does: from the thread with the step markers; without
        markers none)."""
        if self.lookups is None and self.memory is not None and self.memory.num_rows:
            self.lookups = MemoryLookups(self.memory, self.training if self.whole is None else None)
            self.memory = None  # (the lookups hold what the rows need of it)
        return self.lookups

    def _segments_done(self, segments: pa.Table) -> None:
        """Segments as the rank's table holds them, in time order: written on where they are
        spilled, else kept."""
        if self.segments is not None:
            self.segments.add(segments)
        else:
            self.per_window["segments"].append(segments)

    def finish(self) -> dict[str, pa.Table | SpilledTable] | None:
        """The rank's tables (``rank_tables``), the segments as their file where they were
        spilled; None where a fact given up front did not hold (the rank is then analysed
        whole)."""
        self._drain(final=True)
        self.queue, self.before, self.running = [], None, None
        if self.seen_gpu != self.gpu or (self.gpu and self.seen_elsewhere != self.elsewhere):
            return None
        tables = {
            name: pa.concat_tables(parts) if parts else _EMPTY[name]
            for name, parts in self.per_window.items()
        }
        tables["memory_steps"] = (
            memory_steps(lookups, None, tables["steps"])
            if (lookups := self._lookups()) is not None
            else S.empty(S.MEMORY_STEPS_SCHEMA)
        )
        memory = tables["memory_steps"]
        if memory.num_rows:  # per device: the whole trace's row, then the steps'
            frame = pl.DataFrame(
                {
                    "device": memory.column(S.DEVICE).to_pylist(),
                    "whole": memory.column(S.WHOLE).to_pylist(),
                    "start": ints(memory.column(S.START_NS)),
                }
            )
            order = frame.with_row_index("_i").sort(
                ["device", "whole", "start"], descending=[False, True, False]
            )["_i"]
            tables["memory_steps"] = memory.take(pa.array(order.to_numpy()))
        if self.rows is not None:
            tables.update(self.rows.finish())
        tables["launches"] = combine_launches(self.kernels, self.rank)
        if self.segments is None:
            return dict(tables)
        return {**tables, "segments": self.segments.close()}


@dataclass
class _Chunk:
    events: pa.Table  # its rows, context included
    own_rows: np.ndarray  # bool: its own
    lo: int
    hi: int
    # the windows of the markers that start in it (a long step's piece: none), by the host
    # alone: (starts, ends, step numbers)
    host: tuple[np.ndarray, np.ndarray, np.ndarray]
    device_steps: np.ndarray  # the steps its device activities ran for (GPU runs) ...
    device_ends: np.ndarray  # ... and where each step's last one ended
    near: int  # where its first _NEIGHBOURS operators on the training thread have started
    far: int  # where the first of its last _NEIGHBOURS ones starts
    training_ops: int  # how many of its own operators are on the training thread
    arrays: EventArrays | None = None  # its rows' arrays (the whole rank's only)

    def holds_neighbours(self) -> bool:
        """Whether a gap before it finds its neighbours here: _NEIGHBOURS operators on the
        training thread, or the end of a window."""
        return self.near < self.hi or self.first_end < self.hi

    @property
    def numbers(self) -> np.ndarray:
        return self.host[2]

    @property
    def first_end(self) -> int:
        """Where its first window ends, without the device's lag (its end where none)."""
        return int(self.host[1][0]) if len(self.host[1]) else self.hi

    def own(self) -> pa.Table:
        return self.events.filter(pa.array(self.own_rows))

    def device_ends_of(self, steps: np.ndarray) -> np.ndarray:
        """Per step of ``steps``: where its device activities here end (-_NEVER: none)."""
        out = np.full(len(steps), -_NEVER, np.int64)
        if len(self.device_steps):
            pos = np.minimum(np.searchsorted(self.device_steps, steps), len(self.device_steps) - 1)
            hit = self.device_steps[pos] == steps
            out[hit] = self.device_ends[pos[hit]]
        return out


_NONE = np.zeros(0, np.int64)


def _summed(
    table: pa.Table, window: np.ndarray, schema: pa.Schema, first: tuple[str, ...]
) -> tuple[dict[str, object], np.ndarray]:
    """Per window (``window``: of each row, ascending), the rows of ``table`` added up: the
    ``first`` columns from the window's first row, null columns left null, integer ones summed
    (the caller sets the others)."""
    heads = np.flatnonzero(np.concatenate(([True], window[1:] != window[:-1])))
    columns: dict[str, object] = {}
    for field_ in schema:
        column = table.column(field_.name)
        if field_.name in first:
            columns[field_.name] = column.take(pa.array(heads))
        elif column.null_count == len(column):
            columns[field_.name] = pa.nulls(len(heads), field_.type)
        elif pa.types.is_integer(field_.type):
            columns[field_.name] = np.add.reduceat(ints(column, 0), heads)
    return columns, heads


def _summed_steps(table: pa.Table, window: np.ndarray) -> pa.Table:
    """The steps rows of a window's slices as the window's row (``breakdown``'s)."""
    if (window[1:] != window[:-1]).all() and all(
        column.null_count in (0, len(column)) for column in table.columns
    ):  # (each window one slice, no column partly null: its rows are the windows' as they are)
        return table
    first = (S.RANK, S.STEP, S.TIMELINE, S.START_NS)
    columns, heads = _summed(table, window, S.STEPS_SCHEMA, first)
    last = np.append(heads[1:], len(window)) - 1
    columns[S.END_NS] = ints(table.column(S.END_NS), 0)[last]
    total = np.asarray(columns[S.COMM_TOTAL_NS])
    exposed = np.asarray(columns[S.COMM_EXPOSED_NS])
    with np.errstate(divide="ignore", invalid="ignore"):
        columns[S.COMM_HIDDEN_FRACTION] = np.where(total > 0, 1.0 - exposed / total, 0.0)
    return pa.table(columns, schema=S.STEPS_SCHEMA)


def _summed_gpu(table: pa.Table, window: np.ndarray) -> pa.Table:
    """The GPU rows of a window's slices as the window's row (``gpu_steps``'s): times summed,
    the longest queue, the queue's mean over the whole window."""
    if table.num_rows == 0:
        return table
    columns, heads = _summed(table, window, S.GPU_SCHEMA, (S.RANK, S.STEP))
    columns[S.QUEUE_MAX] = np.maximum.reduceat(ints(table.column(S.QUEUE_MAX), 0), heads)
    wall = ints(table.column(S.WALL_NS), 0)
    mean = table.column(S.QUEUE_MEAN).to_numpy()
    area = np.add.reduceat(np.round(mean * wall), heads)  # (each slice's: an integer)
    whole = np.asarray(columns[S.WALL_NS]).astype(np.float64)
    columns[S.QUEUE_MEAN] = np.divide(area, whole, out=np.zeros(len(heads)), where=whole > 0)
    return pa.table(columns, schema=S.GPU_SCHEMA)


def _joined_comm(table: pa.Table) -> pa.Table:
    """The communication pieces of a window's slices, a piece that runs on across a cut
    joined with its continuation (``comm_intervals`` gives a piece per stretch)."""
    if table.num_rows == 0:
        return table
    start, end = ints(table.column(S.START_NS), 0), ints(table.column(S.END_NS), 0)
    step = ints(table.column(S.STEP), -1)
    exposed = np.asarray(table.column(S.EXPOSED).to_numpy(zero_copy_only=False), bool)
    new = np.ones(len(start), bool)
    new[1:] = (start[1:] != end[:-1]) | (exposed[1:] != exposed[:-1]) | (step[1:] != step[:-1])
    heads = np.flatnonzero(new)
    joined = table.take(pa.array(heads))
    ends = pa.array(np.maximum.reduceat(end, heads), pa.int64())
    index = joined.schema.get_field_index(S.END_NS)
    return joined.set_column(index, joined.schema.field(index), ends)


def _codes_of(table: pa.Table, name: str) -> np.ndarray:
    return np.asarray(
        pc.dictionary_encode(table.column(name)).combine_chunks().indices.fill_null(-1), np.int64
    )


def _vocabulary_codes(column: pa.ChunkedArray, vocabulary: tuple[str, ...]) -> np.ndarray:
    """Each value's position in ``vocabulary`` (every value is in it)."""
    codes, values = dictionary_codes(column)
    return np.array([vocabulary.index(v) for v in values], np.int64)[codes]


def _segment_joins(table: pa.Table) -> tuple[pa.Array, np.ndarray, np.ndarray, np.ndarray]:
    """Of segments in time order: their operators' dictionary, each one's operator code once
    a gap between two stretches of one operator is given that operator (-1: none), whether it
    begins a segment of its own (not the continuation of the one before it: same phase, kind
    and operator, from its end on), and whether it is such a gap."""
    start, end = ints(table.column(S.START_NS), 0), ints(table.column(S.END_NS), 0)
    step = _codes_of(table, S.STEP)
    ops = pc.dictionary_encode(table.column(S.OP)).combine_chunks()
    named = np.asarray(ops.indices.fill_null(-1), np.int64)
    # (a gap between two stretches of one operator, cut by the slices: as the whole rank's)
    kind_codes = _vocabulary_codes(table.column(S.KIND), S.SEGMENT_KINDS)
    phase_codes = _vocabulary_codes(table.column(S.PHASE), S.BREAKDOWN_PHASES)
    gap = operator_gaps(named, kind_codes)
    named = gap_operators(named, phase_codes, kind_codes, step)
    new = np.ones(len(start), bool)
    new[1:] = (start[1:] != end[:-1]) | (named[1:] != named[:-1])
    for codes in (step, phase_codes, kind_codes):
        new[1:] |= codes[1:] != codes[:-1]
    return ops.dictionary, named, new, gap


def _settled(new: np.ndarray, gap: np.ndarray) -> int:
    """How many of the first of a window's segments so far (``_segment_joins``' ``new`` and
    ``gap``) are joined and named as they will be whatever slices follow: up to a row that
    begins a segment of its own, where neither it nor the row before it is a gap
    (``gap_operators`` looks across a gap to the rows on both sides; a segment runs on across a
    cut only into the next row). Those rows' joins are the same over them alone."""
    cuts = np.flatnonzero(new[1:] & ~gap[1:] & ~gap[:-1]) + 1
    return int(cuts[-1]) if len(cuts) else 0


def _joined_segments(table: pa.Table) -> pa.Table:
    """The segments of a window's slices, a segment that runs on across a cut joined with its
    continuation (same phase, kind and operator)."""
    if table.num_rows == 0:
        return table
    dictionary, named, new, _ = _segment_joins(table)
    return _joined(table, dictionary, named, new)


def _joined(table: pa.Table, dictionary: pa.Array, named: np.ndarray, new: np.ndarray) -> pa.Table:
    """``_joined_segments`` of ``table`` given its ``_segment_joins``."""
    end = ints(table.column(S.END_NS), 0)
    heads = np.flatnonzero(new)
    joined = table.take(pa.array(heads))
    index = joined.schema.get_field_index(S.OP)
    op = dictionary.take(pa.array(np.maximum(named[heads], 0), mask=named[heads] < 0))
    joined = joined.set_column(index, joined.schema.field(index), op.cast(pa.string()))
    ends = pa.array(np.append(end[heads[1:] - 1], end[-1]), pa.int64())
    index = joined.schema.get_field_index(S.END_NS)
    return joined.set_column(index, joined.schema.field(index), ends)


#: The training thread's operators of the next chunk a slice takes (for a gap at its end,
#: which takes the phase of its neighbours: the next operator's, or one after it where that
#: one's time is nobody's, such as a synchronize outside every phase).
_NEIGHBOURS = 64
#: How many chunks at most wait for the next neighbours of a gap (their memory is held).
_LOOKAHEAD = 8


def _neighbour_operators(
    events: pa.Table, own: np.ndarray, training: tuple[int, int] | None, lo: int, hi: int
) -> tuple[int, int, int]:
    """Where the ``_NEIGHBOURS``-th of a chunk's own operators on the training thread (host
    events that take time and are no region) starts, and the ``_NEIGHBOURS``-th last (``hi``
    and ``lo`` where it has fewer), and how many it has."""
    if training is None:
        return hi, lo, 0
    kind = coded(events.column(S.KIND), KIND_CODE)
    ts = ints(events.column(S.TS_NS), 0)
    mine = (
        own
        & (ints(events.column(S.PID), 0) == training[0])
        & (ints(events.column(S.TID), 0) == training[1])
        & HOST_TREE[kind]
        & ~STRUCTURAL[kind]
        & (ints(events.column(S.DUR_NS), 0) > 0)
    )
    starts = ts[mine]
    if len(starts) <= _NEIGHBOURS:
        return hi, lo, len(starts)
    first = np.partition(starts, _NEIGHBOURS - 1)[_NEIGHBOURS - 1]
    last = np.partition(starts, len(starts) - _NEIGHBOURS)[len(starts) - _NEIGHBOURS]
    return int(first), int(last), len(starts)


def _neighbour_chunks(following: list[_Chunk]) -> int | None:
    """How many of ``following`` (the chunks after a slice) hold the next neighbours of a gap
    at its end: up to the first where their operators on the training thread add up to
    _NEIGHBOURS, or that holds a window's end; None where none does."""
    ops = 0
    for k, chunk in enumerate(following):
        ops += chunk.training_ops
        if ops >= _NEIGHBOURS or chunk.holds_neighbours():
            return k + 1
    return None


def _on_thread(table: pa.Table, thread: tuple[int, int] | None) -> pa.Table:
    """The rows of ``table`` on host thread ``thread``."""
    if thread is None:
        return table.slice(0, 0)
    keep = (ints(table.column(S.PID), 0) == thread[0]) & (ints(table.column(S.TID), 0) == thread[1])
    return table.filter(pa.array(keep))


def _device_ends(ev: EventArrays) -> tuple[np.ndarray, np.ndarray]:
    """The steps ``ev``'s device activities ran for, and where each step's last one ended."""
    device = DEVICE[ev.kind] & (ev.step >= 0)
    steps, at = unique_inverse(ev.step[device])
    ends = np.full(len(steps), -_NEVER, np.int64)
    np.maximum.at(ends, at, ev.end[device])
    return steps, ends


@dataclass
class _Open:
    """The windows that run on past the last slice: (marker starts, host ends, step numbers),
    their ids, and where their device work seen so far ends."""

    host: tuple[np.ndarray, np.ndarray, np.ndarray]
    ids: np.ndarray
    device: np.ndarray

    NONE: ClassVar[_Open]


_Open.NONE = _Open((_NONE, _NONE, _NONE), _NONE, _NONE)


#: Pending segments beyond this many rows (a window not yet over: one long step's) are cut down
#: to the rows later slices may still join or name (``_Pending.settled``); the rest is
#: written on, not held to the window's end.
PENDING_SEGMENTS = 1 << 16


class _Pending:
    """The slices of windows not yet over: their steps, GPU, communication and segment
    rows."""

    def __init__(self) -> None:
        self.ids: list[np.ndarray] = []
        self.steps: list[pa.Table] = []
        self.gpu: list[pa.Table] = []
        self.comm: list[pa.Table] = []
        self.segments: list[pa.Table] = []
        self.look_at = PENDING_SEGMENTS  # (pending segments rows at which ``settled`` looks)

    def settled(self) -> pa.Table | None:
        """The pending segments that are as the window's end will give them (``_settled``),
        joined, and no longer held; None where there are too few to look (a window of one
        long step holds millions otherwise)."""
        rows = sum(t.num_rows for t in self.segments)
        if rows <= self.look_at:
            return None
        pending = pa.concat_tables(self.segments)
        table = pending.drop_columns(["_id"])
        dictionary, named, new, gap = _segment_joins(table)
        done = _settled(new, gap)
        self.segments = [pending.slice(done)]
        # (each row looked at a bounded number of times)
        self.look_at = rows - done + PENDING_SEGMENTS
        if not done:
            return None
        return _joined(table.slice(0, done), dictionary, named[:done], new[:done])

    def add(
        self,
        ids: np.ndarray,
        starts: np.ndarray,
        steps: pa.Table,
        gpu: pa.Table,
        comm: pa.Table,
        segments: pa.Table,
    ) -> None:
        """A slice's rows (``ids``, ``starts``: of its windows' parts, in time order)."""
        self.ids.append(ids)
        self.steps.append(steps)
        self.gpu.append(gpu)
        self.comm.append(comm.append_column("_id", pa.array(ids[_part_of(starts, comm)])))
        self.segments.append(
            segments.append_column("_id", pa.array(ids[_part_of(starts, segments)]))
        )

    def take(self, last: int) -> tuple[pa.Table, pa.Table, pa.Table, pa.Table]:
        """The rows of the windows up to id ``last``, each window's slices added up."""
        ids = np.concatenate(self.ids)
        steps, gpu = pa.concat_tables(self.steps), pa.concat_tables(self.gpu)
        comm, segments = pa.concat_tables(self.comm), pa.concat_tables(self.segments)
        self.look_at = PENDING_SEGMENTS
        n = int(np.searchsorted(ids, last, side="right"))
        m = int(np.searchsorted(ints(comm.column("_id"), 0), last, side="right"))
        k = int(np.searchsorted(ints(segments.column("_id"), 0), last, side="right"))
        self.ids = [ids[n:]]
        self.steps, self.comm = [steps.slice(n)], [comm.slice(m)]
        self.segments = [segments.slice(k)]
        self.gpu = [gpu.slice(n)] if gpu.num_rows else [gpu]
        return (
            _summed_steps(steps.slice(0, n), ids[:n]),
            _summed_gpu(gpu.slice(0, n), ids[:n]) if gpu.num_rows else gpu,
            _joined_comm(comm.slice(0, m).drop_columns(["_id"])),
            _joined_segments(segments.slice(0, k).drop_columns(["_id"])),
        )


def _part_of(starts: np.ndarray, comm: pa.Table) -> np.ndarray:
    """The window part (of ``starts``) each communication piece lies in."""
    return np.searchsorted(starts, ints(comm.column(S.START_NS), 0), side="right") - 1


_EMPTY = {
    "steps": S.STEPS_SCHEMA.empty_table(),
    "comm": S.COMM_SCHEMA.empty_table(),
    "gpu": S.GPU_SCHEMA.empty_table(),
    "segments": S.SEGMENTS_SCHEMA.empty_table(),
}


def _unique_ids(context: list[pa.Table], pieces: list[pa.Table]) -> pa.Table:
    """The rows of ``context`` then ``pieces``, each event once, as first met: a row carried
    into a chunk is also the previous chunk's own (``context``: the rows kept from analysed
    chunks, which may repeat each other and the pieces; ``pieces``: a chunk's rows and its
    successors' own ones, disjoint)."""
    table = pa.concat_tables(pieces) if pieces else None
    if not context:
        return table if table is not None else _EMPTY_EVENTS
    before = pa.concat_tables(context)
    ids = ints(before.column(S.EVENT_ID), 0)
    _, first = np.unique(ids, return_index=True)
    if len(first) < len(ids):
        before = before.take(pa.array(np.sort(first)))
        ids = ids[np.sort(first)]
    if table is None:
        return before
    again = np.isin(ints(table.column(S.EVENT_ID), 0), ids, kind="table")
    if again.any():
        table = table.filter(pa.array(~again))
    return pa.concat_tables([before, table])


_EMPTY_EVENTS = S.EVENTS_SCHEMA.empty_table()


def _ending_after(table: pa.Table, at: int) -> pa.Table:
    ts = ints(table.column(S.TS_NS), 0)
    return table.filter(pa.array(ts + ints(table.column(S.DUR_NS), 0) > at))


def _still_running(table: pa.Table, hi: int) -> pa.Table | None:
    """The device activities of ``table`` that end after ``hi``, and their launching calls."""
    if hi >= _NEVER:
        return None
    kind = coded(table.column(S.KIND), KIND_CODE)
    ts = ints(table.column(S.TS_NS), 0)
    end = ts + ints(table.column(S.DUR_NS), 0)
    keep = DEVICE[kind] & (end > hi)
    if not keep.any():
        return None
    parents = ints(table.column(S.PARENT), -1)[keep]
    ids = ints(table.column(S.EVENT_ID), 0)
    keep |= np.isin(ids, parents[parents >= 0])
    return table.filter(pa.array(keep))
