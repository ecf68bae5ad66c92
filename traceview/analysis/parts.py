"""The per-rank analysis of a rank normalized in chunks (``traceview.chunked``), a chunk at a
time: the tables ``rank_tables`` gives for the whole rank, without holding its events.

A chunk is a run of whole steps, or a piece of a long step. Each table is either per step window (steps, comm, gpu, the
kernels of the launches table, the memory rows of each step) or per event (ops, collectives):

- **Per event**, each row is counted in the chunk that writes it (``counted``: a call still open
  at a chunk's end is written, and counted, by the chunk in which it closes); the rows around it
  (its parents, carried from earlier chunks) are context. The parts combine exactly
  (``combine_ops``, ``combine_collectives``: sums, and percentiles over the kept durations).
- **Per window**, a chunk's windows are analysed once every row that can overlap them has been
  normalized: a GPU window ends where the device finished the step, which can be several steps
  of host time later (its horizon), so the chunk waits for the first chunk that starts past
  it (for a step cut in pieces, past the end of the device work its pieces launched: the
  step's rows are held until then). A piece with no window of its own only passes on what the
  next windows need of it. The rows are the chunk's own and carried ones, the previous chunk's last step (a gap on
  the training thread takes the phase of its neighbours), the later chunks' rows up to the
  horizon and the first step after it, and the device activities of older chunks still
  running; the windows are this chunk's only.

What a slice cannot tell of the whole rank (its training thread, whether it ran on a device,
whether another thread runs backward) is given up front (``attribution.RankPart``) and
checked against the rows as they pass: ``finish`` returns None when a guess was wrong, and the
caller analyses the rank whole instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from traceview import schema as S
from traceview.analysis.attribution import (
    RankPart,
    backward_elsewhere,
    breakdown,
    comm_intervals,
    rank_timeline,
    step_windows,
)
from traceview.analysis.collectives import collectives_part, combine_collectives
from traceview.analysis.gpu import combine_launches, gpu_steps, kernel_launches
from traceview.analysis.memory import memory_steps, whole_trace_instants
from traceview.analysis.ops import OpsPart, combine_ops, ops_part
from traceview.arrays import KIND_CODE, EventArrays, coded, ints

_DEVICE_KINDS = [KIND_CODE[k] for k in S.DEVICE_ACTIVITY_KINDS]
_HOST_KINDS = [KIND_CODE[k] for k in S.HOST_TREE_KINDS]
_NEVER = 1 << 62
#: Columns of the events no analysis reads (left out of the chunks it keeps).
_UNUSED = (S.RUN_ID, S.HOST, S.FRAMEWORK, S.CAT, S.CORRELATION)


class ChunkedAnalysis:
    """``rank_tables`` of one rank, fed chunk by chunk (``add``), in time order."""

    def __init__(
        self,
        memory: pa.Table | None,
        training: tuple[int, int],
        gpu: bool,
        backward_elsewhere: bool,
    ):
        self.memory = memory
        self.training, self.gpu, self.elsewhere = training, gpu, backward_elsewhere
        self.seen_gpu = self.seen_elsewhere = False
        self.whole_at = whole_trace_instants(memory)
        self.rank = 0
        self.ops: list[OpsPart] = []
        self.calls: list[pa.Table] = []
        self.per_window: dict[str, list[pa.Table]] = {
            name: [] for name in ("steps", "comm", "gpu", "memory_steps")
        }
        self.kernels: list[pl.DataFrame] = []
        # chunks waiting for their windows' analysis (all rows that may overlap those windows
        # have to be in: a GPU window ends where the device finished the step, which may be
        # several steps of host time later)
        self.queue: list[_Chunk] = []
        self.before: pa.Table | None = None  # the last analysed chunk's table, context included
        self.running: pa.Table | None = None  # device activities of older chunks still running
        self.after: int | None = None  # where the last analysed chunk's last window ended

    def add(self, events: pa.Table, own: np.ndarray, counted: np.ndarray, lo: int, hi: int) -> None:
        """One chunk's normalized rows (``own``: the chunk's; the others carried in, as
        context), ``counted``: the rows it writes; its steps are the markers in [lo, hi)."""
        if events.num_rows == 0:
            return
        events = events.drop_columns([c for c in _UNUSED if c in events.column_names])
        self.rank = int(events.column(S.RANK)[0].as_py())
        ev = EventArrays.of(events)
        self._check(ev, counted)
        self.ops.append(ops_part(events, counted))
        self.calls.append(collectives_part(events, counted))
        # where its windows end (before the previous chunk's last window pushes them on) and
        # where its first one ends, without the device's lag
        part = RankPart(self.training, self.gpu, self.elsewhere, lo, hi)
        _, ends, numbers = step_windows(ev, self.training, self.gpu, part)
        part.gpu = False
        _, first, _ = step_windows(ev, self.training, False, part)
        device_steps, device_ends = _device_ends(ev) if self.gpu else (_NONE, _NONE)
        del ev
        reach = int(ends.max()) if len(ends) else hi
        first_end = int(first[0]) if len(first) else hi
        self.queue.append(
            _Chunk(events, own, lo, hi, reach, first_end, numbers, device_steps, device_ends)
        )
        self._drain(final=False)

    def _check(self, ev: EventArrays, counted: np.ndarray) -> None:
        kind = ev.kind
        self.seen_gpu |= bool(np.isin(kind[counted], _DEVICE_KINDS).any())
        host = np.isin(kind, _HOST_KINDS) & counted
        self.seen_elsewhere |= backward_elsewhere(ev, host, self.training)

    def _drain(self, final: bool) -> None:
        """Analyse the chunks whose windows every row that can overlap them has reached: wait
        for a chunk that starts past the head's horizon (the rows up to it, and the first ones
        after it: a gap at a window's end takes the phase of what follows)."""
        while self.queue:
            head = self.queue[0]
            horizon = max(head.reach, head.hi, self.after if self.after is not None else head.hi)
            if not final and self.queue[-1].lo < horizon:
                return
            # a step cut in pieces: its device work was launched in the later ones, all in now
            horizon = max(horizon, *(c.device_end(head.numbers) for c in self.queue))
            if not final and self.queue[-1].lo < horizon:
                return
            self._analyse(head, horizon)
            self.queue.pop(0)

    def _analyse(self, head: _Chunk, horizon: int) -> None:
        """The windows of the chunk at the head of the queue."""
        whole = [device for device, at in self.whole_at.items() if head.lo <= at < head.hi]
        if not len(head.numbers) and not whole:  # a piece of a long step: context for what follows
            context = [self.running] if self.running is not None else []
            self.running = _still_running(_unique_ids(context, [head.events]), head.hi)
            self.before = _ending_after(head.events, head.lo)
            return
        later = [c.own() for c in self.queue[1:]]
        if later and self.queue[-1].lo >= horizon:  # past the horizon: its first step will do
            last = later[-1]
            later[-1] = last.filter(pc.less(last.column(S.TS_NS), self.queue[-1].first_end))
        context = [t for t in (self.running, self.before) if t is not None and t.num_rows]
        pieces = [t for t in (head.events, *later) if t.num_rows]
        table = _unique_ids(context, pieces)
        del later, pieces, context
        part = RankPart(self.training, self.gpu, self.elsewhere, head.lo, head.hi, self.after)
        tl = rank_timeline(table, part)
        steps = breakdown(table, tl)
        if steps.num_rows:
            self.after = int(np.max(ints(steps.column(S.END_NS))))
        self.per_window["steps"].append(steps)
        self.per_window["comm"].append(comm_intervals(table, tl))
        self.per_window["gpu"].append(gpu_steps(table, tl))
        self.kernels.append(kernel_launches(table, tl))
        self.per_window["memory_steps"].append(memory_steps(table, self.memory, steps, whole))
        # what later chunks' windows still need: device activities running past this chunk
        # (and the calls that launched them)
        self.running = _still_running(table, head.hi)
        # what the next chunk's windows need of this one (besides the rows still open, which it
        # carries): its last step, where the training thread's last phase before them is
        last_start = int(np.max(ints(steps.column(S.START_NS)))) if steps.num_rows else head.lo
        self.before = _ending_after(head.events, last_start)

    def finish(self) -> dict[str, pa.Table] | None:
        """The rank's tables (``rank_tables``); None where a fact given up front did not hold
        (the rank is then analysed whole)."""
        self._drain(final=True)
        self.queue, self.before, self.running = [], None, None
        if self.seen_gpu != self.gpu or (self.gpu and self.seen_elsewhere != self.elsewhere):
            return None
        tables = {
            name: pa.concat_tables(parts) if parts else _EMPTY[name]
            for name, parts in self.per_window.items()
        }
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
        tables["ops"] = combine_ops(self.ops)
        tables["collectives"] = combine_collectives(self.calls)
        tables["launches"] = combine_launches(self.kernels, self.rank)
        return tables


@dataclass
class _Chunk:
    events: pa.Table  # its rows, context included
    own_rows: np.ndarray  # bool: its own
    lo: int
    hi: int
    reach: int  # where its last window ends (without the previous chunk's push)
    first_end: int  # where its first window ends, without the device's lag
    numbers: np.ndarray  # the steps of the windows that start in it (a long step's piece: none)
    device_steps: np.ndarray  # the steps its device activities ran for (GPU runs) ...
    device_ends: np.ndarray  # ... and where each step's last one ended

    def own(self) -> pa.Table:
        return self.events.filter(pa.array(self.own_rows))

    def device_end(self, steps: np.ndarray) -> int:
        """Where its device activities of ``steps`` end (the earliest time where none)."""
        ends = self.device_ends[np.isin(self.device_steps, steps)]
        return int(ends.max()) if len(ends) else -_NEVER


_NONE = np.zeros(0, np.int64)


def _device_ends(ev: EventArrays) -> tuple[np.ndarray, np.ndarray]:
    """The steps ``ev``'s device activities ran for, and where each step's last one ended."""
    device = np.isin(ev.kind, _DEVICE_KINDS) & (ev.step >= 0)
    steps, at = np.unique(ev.step[device], return_inverse=True)
    ends = np.full(len(steps), -_NEVER, np.int64)
    np.maximum.at(ends, at, ev.end[device])
    return steps, ends


_EMPTY = {
    "steps": S.STEPS_SCHEMA.empty_table(),
    "comm": S.COMM_SCHEMA.empty_table(),
    "gpu": S.GPU_SCHEMA.empty_table(),
    "memory_steps": S.MEMORY_STEPS_SCHEMA.empty_table(),
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
    keep = np.isin(kind, _DEVICE_KINDS) & (end > hi)
    if not keep.any():
        return None
    parents = ints(table.column(S.PARENT), -1)[keep]
    ids = ints(table.column(S.EVENT_ID), 0)
    keep |= np.isin(ids, parents[parents >= 0])
    return table.filter(pa.array(keep))
