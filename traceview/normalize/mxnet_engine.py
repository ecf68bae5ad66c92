"""MXNet's dependency engine laid out as a training timeline: a core pass over the raw events of
an MXNet profile, chosen by the parser (``ParsedTrace.layout == "mxnet_engine"``) because the
format's own structure needs it, not by framework name in the core.

MXNet runs operators asynchronously on its engine's worker threads while the Python thread only
queues them, so the timeline that matters is the engine's. This pass makes the busiest worker
thread of the compute devices (``cpu/N``, ``gpu/N``) the core's training thread; the other
workers' operators join it where they do not overlap its own (the rest count from their own
threads, as compute elsewhere). On it go the step markers, the data-loading regions of the
Python thread, and per step spans over the engine's forward, backward and update operators, so
that operators without a phase of their own (copies, DeleteVariable...) and the gaps between
operators take the phase of the span they are in; a span also covers the idle time before its
first operator in which the Python thread was issuing that phase (traceview collect's regions
around the Python calls). On every worker the backward span reaches back to the call that asked
for backward, so the head gradient's fill that backward queues first (``SetValueOp``) is
backward's on whichever worker ran it. Each step's KVStore round (from the Trainer.step that
asked for the first push to the end of the last KVStore operator) is a communication span of its
own.

MXNet writes no step markers. ``traceview collect`` records one ``mx.profiler.Task`` per step
(``step#N``) on the Python thread, which runs ahead of the engine; each window is moved to end
where the engine finished that step's update (or push/pull) round and the Python thread waiting
for it went on. Without markers the steps are inferred from those rounds: one optimizer-update
round per step, or one push/pull round where the servers update; the report says so.

The markers and spans are written as events of their own (category ``traceview``; names in
``SPAN_NAMES``), each stating what it is (``schema.LAID_OUT_SCHEMA``: kind ``step`` and its step
number; kind ``python``, its phase and, for a KVStore round, its operator): no rule decodes
their names, so a ``--rules`` file reclassifies the trace's own operators and regions, never
these.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traceview.model import schema as S
from traceview.model.columns import (
    dictionary_array,
    dictionary_codes,
    disjoint,
    unique_pairs,
    window_index,
)
from traceview.model.errors import Notes
from traceview.normalize.mxnet_roles import pushes_to_servers, server_of
from traceview.normalize.rules import MAX_STEP, RuleSet
from traceview.normalize.steps import LayoutResult
from traceview.parsers import group_ids

#: The category traceview collect's profiler domain writes, and that of the spans made here.
TRACEVIEW_CAT = "traceview"
#: The spans made here, by phase: their names (for the views) and canonical operators (None:
#: named after the span). Structure, not operators: kind ``python``, like Python frames, so the
#: ops table and ``compare`` list the operators inside them.
SPAN_NAMES = {
    S.FORWARD: "engine forward",
    S.BACKWARD: "engine backward",
    S.UPDATE: "engine update",
    S.COMM: "KVStore round",  # each step's round: from the first push/pull asked for to the end
}
SPAN_OPS = {S.COMM: "kvstore_round"}
_OPS = sorted(set(SPAN_OPS.values()))
STEP_CALL = "Trainer.step"
_ROUNDS_TID = -1 - zlib.crc32(b"traceview KVStore rounds")
_DEVICE_NAME = re.compile(r"^(cpu|gpu)/\d+$")
# Engine bookkeeping: never the start of a new step's forward pass when steps are inferred.
_BOOKKEEPING = re.compile(
    r"^(DeleteVariable|WaitForVar|WaitForAll|Copy\w*2\w+|_copyto|_copy|_zeros\w*|_ones|_full"
    r"|SetValueOp|ResourceParallelRandomSetSeed)$"
)
# A segment of operators the engine ran as one (bulk execution, MXNet's default): compute of
# the phase that queued it, which its name does not tell (see _spans).
_BULK = "ImperativeBulk"
# The fill of a head gradient with ones, which a backward call queues before its operators.
_FILL = "SetValueOp"
# The C API call that queues backward (autograd.backward, loss.backward()).
_BACKWARD_CALL = re.compile(r"^MXAutogradBackward(Ex)?$")
_WAIT = re.compile(r"^MXNDArray(WaitAll|WaitToRead|WaitToWrite|SyncCopyToCPU)$")
_PHASE_CODES = {p: i for i, p in enumerate(S.EVENT_PHASES)}
_NO_PHASE = -1
_KIND_CODE = {k: i for i, k in enumerate(S.EVENT_KINDS)}


def lay_out(
    raw: pa.Table, rules: RuleSet, process_names: dict[int, str], notes: Notes
) -> LayoutResult:
    """The engine timeline of one rank's raw MXNet events (kinds already set)."""
    layout = _lay_out(_Events.of(raw), rules, process_names, notes)
    meta: dict[str, Any] = {"engine_devices": layout.devices, "steps_from": layout.steps_from}
    if layout.server is not None:
        meta.update(role="server", role_from="trace", server=layout.server)
    elif pushes_to_servers(pc.unique(raw[S.NAME]).to_pylist()):
        meta.update(role="worker", role_from="trace")  # it pushes to and pulls from servers
    return LayoutResult(
        events=_raw_table(layout.events),
        meta={k: v for k, v in meta.items() if v not in (None, [], "")},
        threads={f"{p}/{t}": label for (p, t), label in layout.thread_labels.items()},
        skipped={"duplicate": layout.duplicates},
    )


@dataclass
class _Events:
    """Paired intervals, one row per event, before they become the raw table."""

    kind: np.ndarray  # index into S.EVENT_KINDS
    cat: np.ndarray  # codes into cats
    name: np.ndarray  # codes into names
    pid: np.ndarray
    tid: np.ndarray
    ts: np.ndarray  # ns
    dur: np.ndarray  # ns
    cats: list[Any]
    names: list[Any]
    # What the events made here state they are (the trace's own: made False, the rest -1)
    made: np.ndarray  # bool
    phase: np.ndarray  # index into S.EVENT_PHASES
    op: np.ndarray  # index into _OPS
    step: np.ndarray  # step number

    def take(self, rows: np.ndarray) -> _Events:
        return _Events(
            self.kind[rows], self.cat[rows], self.name[rows], self.pid[rows], self.tid[rows],
            self.ts[rows], self.dur[rows], self.cats, self.names,
            self.made[rows], self.phase[rows], self.op[rows], self.step[rows],
        )  # fmt: skip

    @property
    def end(self) -> np.ndarray:
        return self.ts + self.dur

    @classmethod
    def of(cls, raw: pa.Table) -> _Events:
        kind, kinds = dictionary_codes(raw.column(S.KIND))
        lut = np.array([_KIND_CODE[str(k)] for k in kinds] + [_KIND_CODE[S.KIND_OP]], np.int64)
        cat, cats = dictionary_codes(raw.column(S.CAT))
        name, names = dictionary_codes(raw.column(S.NAME))
        return cls(
            kind=lut[kind],
            cat=cat,
            name=name,
            pid=raw.column(S.PID).to_numpy(zero_copy_only=False).astype(np.int64),
            tid=raw.column(S.TID).to_numpy(zero_copy_only=False).astype(np.int64),
            ts=raw.column(S.TS_NS).to_numpy().astype(np.int64),
            dur=raw.column(S.DUR_NS).to_numpy().astype(np.int64),
            cats=cats,
            names=names,
            made=np.zeros(raw.num_rows, bool),
            phase=np.full(raw.num_rows, -1, np.int64),
            op=np.full(raw.num_rows, -1, np.int64),
            step=np.full(raw.num_rows, -1, np.int64),
        )


@dataclass
class _Layout:
    events: _Events
    devices: list[str]
    steps_from: str
    thread_labels: dict[tuple[int, int], str]
    duplicates: int = 0
    server: dict[str, int] | None = None  # a ps-lite server's: its sums and updates (_server)


def _own_phases(ev: _Events, rules: RuleSet) -> tuple[np.ndarray, np.ndarray]:
    """Per event: the phase code its name gives (-1: none) and whether it is a step marker."""
    key = ev.kind * (len(ev.cats) + 1) + (ev.cat + 1)
    key = key * (len(ev.names) + 1) + (ev.name + 1)
    unique, inverse = np.unique(key, return_inverse=True)
    phase = np.full(len(unique), _NO_PHASE, np.int64)
    step = np.zeros(len(unique), bool)
    for i, value in enumerate(unique.tolist()):
        name_i = value % (len(ev.names) + 1) - 1
        rest = value // (len(ev.names) + 1)
        cat_i = rest % (len(ev.cats) + 1) - 1
        kind = S.EVENT_KINDS[rest // (len(ev.cats) + 1)]
        cat = ev.cats[cat_i] if cat_i >= 0 else None
        name = str(ev.names[name_i]) if name_i >= 0 else ""
        result = rules.classify(kind, cat, name)
        step[i] = result.kind == S.KIND_STEP
        phase[i] = _PHASE_CODES[result.phase] if result.phase else _NO_PHASE
    inverse = np.asarray(inverse).ravel()
    return phase[inverse], step[inverse]


def _lay_out(ev: _Events, rules: RuleSet, process_names: dict[int, str], notes: Notes) -> _Layout:
    """The engine timeline, its step markers and phase spans (see the module docstring)."""
    own, is_step = _own_phases(ev, rules)
    is_op = ev.kind == _KIND_CODE[S.KIND_OP]
    # Compute devices: cpu/N and gpu/N (their pids are small device numbers).
    device_pids = sorted(p for p, label in process_names.items() if _DEVICE_NAME.match(label))
    if not device_pids:  # metadata stripped: every process with operators
        device_pids = sorted({int(p) for p in ev.pid[is_op]})
    # The Python threads (those calling the C API) run a few operators synchronously; the
    # engine's worker threads run the rest.
    python_tids = np.unique(ev.tid[ev.kind == _KIND_CODE[S.KIND_RUNTIME]])
    engine = is_op & np.isin(ev.pid, device_pids) & ~np.isin(ev.tid, python_tids)
    thread_labels: dict[tuple[int, int], str] = {}
    for pid, label in process_names.items():
        if _DEVICE_NAME.match(label) or label.endswith("/"):
            for t in np.unique(ev.tid[is_op & (ev.pid == pid)]).tolist():
                thread_labels[(pid, int(t))] = f"{label.rstrip('/')} engine worker"
    for t in python_tids.tolist():
        for pid in np.unique(ev.pid[ev.tid == t]).tolist():
            domain = process_names.get(int(pid), "")
            what = "MXNet C API" if domain in ("", "MXNET_C_API") else f"{domain} domain"
            thread_labels.setdefault((int(pid), int(t)), f"python ({what})")
    server = server_of(ev.names, ev.name, own, is_step, is_op, _bookkeeping(ev))
    if server is not None:  # no steps: it serves the workers' pushes and pulls
        used = sorted({int(p) for p in ev.pid[engine]})
        devices = [process_names.get(p, f"device {p}") for p in used]
        return _Layout(ev, devices, "none", thread_labels, server=server)
    computing = (
        engine & ~_bookkeeping(ev) & ~np.isin(own, [_PHASE_CODES[p] for p in (S.COMM, S.H2D, S.IO)])
    )
    if not computing.any():
        computing = engine
    if not computing.any():
        ev, _ = _without_markers(ev, is_step)
        return _Layout(ev, [], "none", thread_labels)

    # The timeline thread: the busiest worker. Operators of other workers that do not overlap
    # its own join it; the rest stay on their threads, where their compute still counts.
    rows = np.flatnonzero(computing)
    threads, inverse = np.unique(
        np.stack([ev.pid[rows], ev.tid[rows]]), axis=1, return_inverse=True
    )
    busy = np.bincount(np.asarray(inverse).ravel(), weights=ev.dur[rows].astype(np.float64))
    best = int(np.argmax(busy))
    home = (int(threads[0, best]), int(threads[1, best]))
    at_home = engine & (ev.pid == home[0]) & (ev.tid == home[1])
    joining = np.flatnonzero(engine & ~at_home)
    moved = joining[_fits_between(ev.ts[at_home], ev.end[at_home], ev.ts[joining], ev.end[joining])]
    ev.pid[moved], ev.tid[moved] = home
    at_home[moved] = True
    used = sorted({int(p) for p in ev.pid[engine]})
    devices = [process_names.get(p, f"device {p}") for p in used]
    thread_labels[home] = f"{', '.join(devices)} engine (timeline)"
    workers = [
        (int(p), int(t)) for p, t in unique_pairs(ev.pid[computing], ev.tid[computing]).T.tolist()
    ]
    if len(workers) > 1:
        notes.remark(
            f"MXNet ran operators on {len(workers)} engine worker threads ({', '.join(devices)}); "
            "those that overlap the busiest one's stay on their own threads and count there"
        )

    windows, numbers, steps_from = _step_windows(ev, own, is_step, engine, at_home, notes)
    keep = ~is_step
    if steps_from == "collector" and len(windows):
        # traceview collect stops the profiler a step late (off the last step's timing): what
        # it recorded after the last window is not part of the profiled steps
        keep &= ev.ts < windows[-1, 1]
    rows = np.flatnonzero(keep)
    ev = ev.take(rows)
    own, engine, at_home = own[rows], engine[rows], at_home[rows]
    # The Python calls that issued each phase (traceview collect's regions), off the engine.
    issued = (
        ~engine
        & (ev.kind == _KIND_CODE[S.KIND_ANNOTATION])
        & np.isin(own, [_PHASE_CODES[p] for p in (S.FORWARD, S.BACKWARD, S.UPDATE)])
    )
    calls = (ev.ts[issued], own[issued])
    backward_calls = _backward_calls(ev, own, engine)
    # Backward queues the head gradient's fill first (SetValueOp, with a DeleteVariable), on
    # whichever worker is free: on every thread the backward span reaches back to the call that
    # asked for it (never over an operator that ran before: see _spans), and covers the fill.
    asked = (backward_calls, np.full(len(backward_calls), _PHASE_CODES[S.BACKWARD]))
    calls = (np.concatenate([calls[0], asked[0]]), np.concatenate([calls[1], asked[1]]))
    fills = _head_gradient_fills(ev, own, engine, windows, backward_calls)
    io_rows, io_start, io_end = _io_regions(
        ev,
        own,
        at_home,
        windows,
        _spans(ev, own, at_home, windows, None, None, backward_calls, fills),
        np.sort(calls[0][calls[1] == _PHASE_CODES[S.FORWARD]]),
    )
    spans = _spans(ev, own, at_home, windows, (io_start, io_end), calls, backward_calls, fills)
    ev.ts[io_rows], ev.dur[io_rows] = io_start, io_end - io_start
    ev.pid[io_rows], ev.tid[io_rows] = home
    placed = [(home, spans)]
    none = np.zeros(0, np.int64)
    for pid, tid in workers:  # the other workers' operators take their phases from spans too
        if (pid, tid) == home:
            continue
        mine = engine & (ev.pid == pid) & (ev.tid == tid)
        placed.append(
            ((pid, tid), _spans(ev, own, mine, windows, (none, none), asked, backward_calls, fills))
        )

    rounds = _comm_rounds(ev, own, engine, at_home, windows)
    if rounds:
        where = (rounds[0][2], _ROUNDS_TID)
        placed.append((where, [(S.COMM, start, stop) for start, stop, _ in rounds]))
        thread_labels[where] = "KVStore rounds (traceview)"
    extra = _synthetic(ev, home, windows, numbers, placed)
    return _Layout(_with_spans(ev, extra), devices, steps_from, thread_labels)


def _comm_rounds(
    ev: _Events, own: np.ndarray, engine: np.ndarray, timeline: np.ndarray, windows: np.ndarray
) -> list[tuple[int, int, int]]:
    """Per step, its KVStore round: from the first push/pull the Python thread asked for (or
    the start of the Trainer.step call that asked) to the end of the last KVStore operator;
    (start, end, pid of the operators).

    The engine runs a push only when a worker thread is free for it; the step waits for the
    round all the same, so the wait in between is communication too.
    """
    comm = own == _PHASE_CODES[S.COMM]
    asked = (
        comm
        & ~engine
        & np.isin(ev.kind, [_KIND_CODE[S.KIND_RUNTIME], _KIND_CODE[S.KIND_ANNOTATION]])
    )
    done = comm & (ev.kind == _KIND_CODE[S.KIND_OP])
    # traceview collect's region around Trainer.step: the round starts when the step does
    names = np.array([str(n) == STEP_CALL for n in ev.names] + [False])[ev.name]
    calls = np.flatnonzero(names & ~engine & (ev.kind == _KIND_CODE[S.KIND_ANNOTATION]))
    solid = timeline & (ev.kind == _KIND_CODE[S.KIND_OP]) & ~_bookkeeping(ev)
    end = ev.end
    asked_at, done_at, solid_at = (_ByStart(ev.ts, np.flatnonzero(m)) for m in (asked, done, solid))
    rounds: list[tuple[int, int, int]] = []
    for w_start, w_end in windows.tolist():
        a = asked_at.between(w_start, w_end)
        d = done_at.between(w_start, w_end)
        if len(a) == 0 or len(d) == 0:
            continue
        start = int(ev.ts[a].min())
        around = calls[(ev.ts[calls] <= start) & (end[calls] > start) & (ev.ts[calls] >= w_start)]
        if len(around):
            start = int(ev.ts[around].min())
        # ... but only over time in which the engine waited: pushes asked for while backward
        # still computes wait for their gradients, not for the network.
        first_op = int(ev.ts[d].min())
        busy = solid_at.between(w_start, first_op + 1)  # (an end by first_op: a start too)
        busy_before = end[busy][end[busy] <= first_op]
        start = max(start, int(busy_before.max()) if len(busy_before) else start)
        start = min(start, first_op)
        stop = min(max(int(end[d].max()), int(end[a].max())), w_end)
        if stop > start:
            rounds.append((start, stop, int(ev.pid[d[0]])))
    return rounds


class _ByStart:
    """Some rows of the rank (``rows``, ascending), found by their start: a step window's rows
    are then looked up, not masked out of the whole rank's (a mask per window made the layout
    grow with the square of the trace)."""

    def __init__(self, ts: np.ndarray, rows: np.ndarray):
        order = np.argsort(ts[rows], kind="stable")
        self.rows, self.ts = rows[order], ts[rows][order]

    def between(self, start: int, end: int) -> np.ndarray:
        """The rows that start in [start, end), ascending."""
        lo, hi = np.searchsorted(self.ts, [start, end], side="left")
        return np.sort(self.rows[lo:hi])


def _fits_between(
    b_start: np.ndarray, b_end: np.ndarray, start: np.ndarray, end: np.ndarray
) -> np.ndarray:
    """Which intervals (start, end) can join the busy intervals b without overlapping them or
    each other: in start order, the first that fits wins."""
    order_b = np.argsort(b_start, kind="stable")
    bs = b_start[order_b]
    be = np.maximum.accumulate(b_end[order_b]) if len(b_end) else b_end
    # No busy interval runs at the start, none starts then, and the next begins after the end.
    running = window_index(bs, be, start, with_start=False)
    following = np.searchsorted(bs, start, side="right")
    free = (running < 0) & ~np.isin(start, bs)
    if len(bs):
        free &= np.where(following < len(bs), end <= bs[np.minimum(following, len(bs) - 1)], True)
    keep = np.zeros(len(start), bool)
    reach = np.iinfo(np.int64).min
    order = np.argsort(start, kind="stable")
    for i in order[free[order]].tolist():  # those that fit beside b, against each other
        if start[i] >= reach:
            keep[i] = True
            reach = int(end[i])
    return keep


def _without_markers(ev: _Events, is_step: np.ndarray) -> tuple[_Events, _Events]:
    return ev.take(np.flatnonzero(~is_step)), ev.take(np.flatnonzero(is_step))


def _rounds(ev: _Events, own: np.ndarray, engine: np.ndarray) -> tuple[np.ndarray, np.ndarray, str]:
    """(first start, last end) of each update (else push/pull) round on the engine.

    A round is a run of optimizer-update operators (or, where the servers update, of KVStore
    communication) with no forward computation of the next step between them.
    """
    is_op = ev.kind == _KIND_CODE[S.KIND_OP]
    closing, what = engine & (own == _PHASE_CODES[S.UPDATE]), "optimizer-update"
    if not closing.any():
        closing, what = is_op & (own == _PHASE_CODES[S.COMM]), "push/pull"
    if not closing.any():
        closing = (ev.kind == _KIND_CODE[S.KIND_RUNTIME]) & (own == _PHASE_CODES[S.COMM])
    rows = np.flatnonzero(closing)
    if len(rows) == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty, ""
    rows = rows[np.argsort(ev.ts[rows], kind="stable")]
    # Forward operators separate rounds; a bulk segment does not (with Trainer.step right after
    # backward, backward's segments run between the pushes of one round).
    separator = engine & (own < 0) & ~_bookkeeping(ev) & ~_bulk(ev)
    sep_ts = np.sort(ev.ts[separator])
    seen = np.searchsorted(sep_ts, ev.ts[rows], side="left")
    new = np.concatenate(([True], seen[1:] > seen[:-1]))
    heads = np.flatnonzero(new)
    first = ev.ts[rows][heads]
    last = np.maximum.reduceat(ev.end[rows], heads)
    return first, last, what


def _after_waits(ev: _Events, ends: np.ndarray) -> np.ndarray:
    """Round ends moved to where a Python thread that waited for the round (``waitall``,
    ``asnumpy``...) got going again: the next step cannot start before that."""
    waits = np.array([bool(_WAIT.match(str(n))) for n in ev.names] + [False])[ev.name]
    rows = np.flatnonzero(waits & (ev.kind == _KIND_CODE[S.KIND_RUNTIME]))
    if len(rows) == 0 or len(ends) == 0:
        return ends
    rows = rows[np.argsort(ev.ts[rows], kind="stable")]
    cover = window_index(ev.ts[rows], np.maximum.accumulate(ev.end[rows]), ends, with_start=False)
    moved = np.where(cover >= 0, np.maximum.accumulate(ev.end[rows])[np.maximum(cover, 0)], ends)
    # never past the next round's end
    limit = np.concatenate([ends[1:], [np.iinfo(np.int64).max]])
    return np.minimum(moved, limit)


def _marker_number(name: str, position: int, notes: Notes) -> int:
    """The step number in a collector's ``step#N`` marker, else its position; a number too
    large to be a step (a corrupt marker) is the position too, with a warning."""
    digits = re.sub(r"\D", "", name)
    if not digits:
        return position
    if len(digits) < 16 and int(digits) < MAX_STEP:
        return int(digits)
    shown = repr(name) if len(name) <= 40 else repr(name[:37] + "...")
    notes.warn(f"step marker {shown}: step number too large to be a step, numbered by its position")
    return position


def _step_windows(
    ev: _Events,
    own: np.ndarray,
    is_step: np.ndarray,
    engine: np.ndarray,
    timeline: np.ndarray,
    notes: Notes,
) -> tuple[np.ndarray, np.ndarray, str]:
    """Step windows ((n, 2) start/end ns), their numbers, and where they came from."""
    markers = np.flatnonzero(is_step)
    markers = markers[np.argsort(ev.ts[markers], kind="stable")]
    markers = markers[disjoint(ev.ts[markers], ev.end[markers])]
    first, last, what = _rounds(ev, own, engine)
    last = _after_waits(ev, last)
    busy = ev.ts[engine]
    if len(markers):
        numbers = np.array(
            [_marker_number(str(ev.names[ev.name[m]]), i, notes) for i, m in enumerate(markers)],
            np.int64,
        )
        m_start, m_end = ev.ts[markers], ev.end[markers]
        inside = first >= m_start[0]
        if inside.sum() > len(markers):  # rounds of steps after the window (the profiler ran on)
            inside &= first < m_end[-1]
        first, last = first[inside][: len(markers)], last[inside][: len(markers)]
        # The collector marks steps on the Python thread, which runs ahead of the engine: end
        # each window where the engine finished that step's round.
        if len(last) == len(markers) and np.all(np.diff(last) > 0) and last[0] > m_start[0]:
            starts = np.concatenate(([m_start[0]], last[:-1]))
            return np.stack([starts, last], axis=1), numbers, "collector"
        notes.remark(
            f"step windows are traceview collect's markers as the Python thread saw them (the "
            f"engine's {what or 'update'} rounds did not line up: {len(last)} for {len(markers)} steps)"
        )
        return np.stack([m_start, m_end], axis=1), numbers, "collector"
    if len(last):
        start0 = int(busy.min()) if len(busy) else int(first[0])
        starts = np.concatenate(([min(start0, int(first[0]))], last[:-1]))
        notes.remark(
            f"MXNet writes no step markers: {len(last)} step(s) inferred, one per {what} round "
            "(each ends where its round ends; the first starts at the trace's first operator)"
        )
        return np.stack([starts, last], axis=1), np.arange(len(last), dtype=np.int64), "inferred"
    if len(busy):
        notes.remark(
            "MXNet writes no step markers and the trace shows no optimizer-update or push/pull "
            "round: the whole trace is analysed as one step"
        )
        whole = np.array([[int(busy.min()), int(ev.end[engine].max())]], np.int64)
        return whole, np.zeros(1, np.int64), "whole trace"
    return np.zeros((0, 2), np.int64), np.zeros(0, np.int64), "none"


def _backward_calls(ev: _Events, own: np.ndarray, engine: np.ndarray) -> np.ndarray:
    """Sorted starts of the Python calls that queued backward: the C API's
    ``MXAutogradBackwardEx`` and traceview collect's regions of the backward phase."""
    by_name = np.array([bool(_BACKWARD_CALL.match(str(n))) for n in ev.names] + [False])[ev.name]
    region = (ev.kind == _KIND_CODE[S.KIND_ANNOTATION]) & (own == _PHASE_CODES[S.BACKWARD])
    runtime = (ev.kind == _KIND_CODE[S.KIND_RUNTIME]) & by_name
    return np.sort(ev.ts[~engine & (runtime | region)])


def _bulk(ev: _Events) -> np.ndarray:
    """Per event: whether it is a bulk segment (``ImperativeBulk``)."""
    return np.array([str(n) == _BULK for n in ev.names] + [False])[ev.name]


def _backward_bulks(
    ev: _Events,
    inside: np.ndarray,  # the window's timeline operators (rows, ascending)
    bulk: np.ndarray,
    forward_op: np.ndarray,
    backward: np.ndarray,
    backward_calls: np.ndarray | None,
    w_start: int,
    w_end: int,
) -> np.ndarray:
    """Rows of the bulk segments of one step window that hold backward work.

    The engine runs what Python queued in order, so a segment that started only after Python
    asked for backward (``MXAutogradBackwardEx``, or traceview collect's backward region) is
    backward's; without such a call in the window, those after the last forward operator (the
    loss) or after the first backward operator are. Where the engine lags behind Python, a
    forward segment can still start after the call: _backward_start leaves it to forward only
    when the forward operators after it outlast it.
    """  # fmt: skip
    rows = inside[bulk[inside]]
    if len(rows) == 0:
        return rows
    asked = (
        backward_calls[(backward_calls >= w_start) & (backward_calls < w_end)]
        if backward_calls is not None
        else np.zeros(0, np.int64)
    )
    if len(asked):
        return rows[ev.ts[rows] >= int(asked.min())]
    forward = inside[forward_op[inside] & ~bulk[inside]]
    last = ev.ts[forward] + ev.dur[forward]  # (not ev.end: the whole rank's)
    after = ev.ts[rows] >= (int(last.max()) if len(forward) else w_end)
    if len(backward):
        after |= ev.ts[rows] >= int(ev.ts[backward].min())
    return rows[after]


def _head_gradient_fills(
    ev: _Events,
    own: np.ndarray,
    engine: np.ndarray,
    windows: np.ndarray,
    backward_calls: np.ndarray,
) -> np.ndarray:
    """Per event: whether it is the fill of a head gradient (``SetValueOp`` on an engine worker)
    that a backward call queued before its operators: one the engine started after the step's
    first backward call and before the step's first update or KVStore operator after that call
    (every gradient, so every push and update, needs the fill first; a fill after them, such
    as ``zero_grad``'s after the update, is not backward's)."""
    named = np.array([str(n) == _FILL for n in ev.names] + [False])[ev.name]
    is_op = ev.kind == _KIND_CODE[S.KIND_OP]
    candidates = np.flatnonzero(engine & is_op & named)
    fills = np.zeros(len(ev.ts), bool)
    if len(candidates) == 0 or len(windows) == 0 or len(backward_calls) == 0:
        return fills
    # the step's first backward call
    first = np.searchsorted(backward_calls, windows[:, 0], side="left")
    has_call = first < len(backward_calls)
    asked = np.where(has_call, backward_calls[np.minimum(first, len(backward_calls) - 1)], 0)
    has_call &= asked < windows[:, 1]
    # ... and its first update or KVStore operator after it (any thread's)
    after = is_op & np.isin(own, [_PHASE_CODES[S.UPDATE], _PHASE_CODES[S.COMM]])
    later = np.append(np.sort(ev.ts[after]), np.iinfo(np.int64).max)
    limit = np.minimum(later[np.searchsorted(later, asked, side="left")], windows[:, 1])
    window = window_index(windows[:, 0], windows[:, 1], ev.ts[candidates], with_start=False)
    w = np.maximum(window, 0)
    ts = ev.ts[candidates]
    fills[candidates] = (window >= 0) & has_call[w] & (ts >= asked[w]) & (ts < limit[w])
    return fills


def _bookkeeping(ev: _Events) -> np.ndarray:
    """Per event: whether its name is engine bookkeeping (copies, deletions, fills)."""
    return np.array([bool(_BOOKKEEPING.match(str(n))) for n in ev.names] + [True])[ev.name]


def _in_window(ops: _ByStart, end: np.ndarray, start: int, stop: int) -> np.ndarray:
    """The timeline operators (``ops``) that run entirely inside [start, stop) (rows,
    ascending)."""
    rows = ops.between(start, stop)
    return rows[end[rows] <= stop]


def _backward_start(ev: _Events, backward: np.ndarray, forward: np.ndarray) -> int:
    """Where a step's backward pass starts on the engine.

    The engine runs an operator as soon as its inputs are ready, so the loss's first gradient
    operators (``_backward_mean``...) can run before the forward pass has finished. Backward
    starts at the backward operator after which there is the most backward and the least
    forward time.
    """
    rows = np.concatenate([backward, forward])  # (forward: rows, ascending)
    rows = rows[np.argsort(ev.ts[rows], kind="stable")]
    is_backward = np.isin(rows, backward)
    weight = np.where(is_backward, ev.dur[rows], -ev.dur[rows])
    after = np.cumsum(weight[::-1])[::-1]  # backward minus forward time from each row on
    score = np.where(is_backward, after, np.iinfo(np.int64).min)
    return int(ev.ts[rows[int(np.argmax(score))]])


def _spans(
    ev: _Events,
    own: np.ndarray,
    mine: np.ndarray,
    windows: np.ndarray,
    io: tuple[np.ndarray, np.ndarray] | None = None,
    calls: tuple[np.ndarray, np.ndarray] | None = None,
    backward_calls: np.ndarray | None = None,
    fills: np.ndarray | None = None,
) -> list[tuple[str, int, int]]:
    """Per step, the spans of one thread's backward operators, of the forward ones before them
    and of the update ones after them, each made of whole operators.

    With ``io`` (data-loading intervals), forward operators inside them are data loading's and
    the forward span is made too; with ``calls`` (start, phase code of the Python calls that
    issued each phase), a span also covers the idle time before its first operator in which
    Python was issuing it, back to the previous operator or data loading. Bulk segments are
    backward's where _backward_bulks says so, else forward's (``backward_calls``: when Python
    asked for backward); so are the head gradients' fills (``fills``, _head_gradient_fills), also
    on a worker that ran nothing else of backward.
    """
    spans: list[tuple[str, int, int]] = []
    forward_op = (own < 0) & ~_bookkeeping(ev)
    bulk = _bulk(ev) & (own < 0)
    io_start = io[0] if io is not None else np.zeros(0, np.int64)
    io_end = io[1] if io is not None else np.zeros(0, np.int64)
    if len(io_start):
        order = np.argsort(io_start)
        io_start, io_end = io_start[order], np.maximum.accumulate(io_end[order])
        forward_op &= window_index(io_start, io_end, ev.ts, with_start=False) < 0
        forward_op &= ~np.isin(ev.ts, io_start)
    solid = ~_bookkeeping(ev)
    end = ev.end
    ops = _ByStart(ev.ts, np.flatnonzero(mine & (ev.kind == _KIND_CODE[S.KIND_OP])))
    for w_start, w_end in windows.tolist():
        inside = _in_window(ops, end, w_start, w_end)
        backward = inside[own[inside] == _PHASE_CODES[S.BACKWARD]]
        bulks = _backward_bulks(
            ev, inside, bulk, forward_op, backward, backward_calls, w_start, w_end
        )
        if len(bulks):
            backward = np.union1d(backward, bulks)
        in_forward = inside[forward_op[inside]]
        if len(bulks):
            in_forward = in_forward[~np.isin(in_forward, bulks)]
        if fills is not None:  # not one the engine ran before forward work of this thread
            last = ev.ts[in_forward].max() if len(in_forward) else w_start
            backward = np.union1d(backward, inside[fills[inside] & (ev.ts[inside] > last)])
        found: dict[str, list[int]] = {}
        b_end = w_start
        if len(backward):
            b_end = int(end[backward].max())
            found[S.BACKWARD] = [_backward_start(ev, backward, in_forward), b_end]
        update = inside[(own[inside] == _PHASE_CODES[S.UPDATE]) & (ev.ts[inside] >= b_end)]
        if len(update):
            found[S.UPDATE] = [int(ev.ts[update].min()), int(end[update].max())]
        if io is not None and S.BACKWARD in found:
            b_start = found[S.BACKWARD][0]
            forward = in_forward[ev.ts[in_forward] < b_start]
            if len(forward):
                found[S.FORWARD] = [int(ev.ts[forward].min()), b_start]
        if calls is not None:
            ends = np.concatenate(
                [end[inside[solid[inside]]], io_end[(io_end > w_start) & (io_end <= w_end)]]
            )
            for phase in (S.FORWARD, S.BACKWARD, S.UPDATE):
                if phase not in found:
                    continue
                start = found[phase][0]
                issued = calls[0][
                    (calls[1] == _PHASE_CODES[phase]) & (calls[0] >= w_start) & (calls[0] < start)
                ]
                if len(issued) == 0:
                    continue
                before = ends[ends <= start]
                earliest = max(int(issued.min()), int(before.max()) if len(before) else w_start)
                if len(io_start):  # never from inside data loading
                    inside_io = window_index(
                        io_start, io_end, np.array([earliest]), with_start=False
                    )[0]
                    earliest = int(io_end[inside_io]) if inside_io >= 0 else earliest
                if earliest < start:
                    found[phase][0] = earliest
                    if phase == S.BACKWARD and S.FORWARD in found:
                        found[S.FORWARD][1] = earliest
        for phase in (S.FORWARD, S.BACKWARD, S.UPDATE):
            if phase in found and found[phase][1] > found[phase][0]:
                spans.append((phase, found[phase][0], found[phase][1]))
    return spans


def _io_regions(
    ev: _Events,
    own: np.ndarray,
    timeline: np.ndarray,
    windows: np.ndarray,
    spans: list[tuple[str, int, int]],
    calls: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Data-loading regions of other threads, fitted onto the engine timeline.

    A region keeps the operators that started inside it (the batch's own copies and stacking),
    and those the engine started after it but before Python called forward (``calls``: sorted
    starts of the forward calls): Python queued them while loading data. It gives up the edges where an operator that started before it, or a phase span, runs.
    Returns (rows, new starts, new ends) of the regions kept.
    """
    io = (
        ~timeline
        & (own == _PHASE_CODES[S.IO])
        & np.isin(ev.kind, [_KIND_CODE[S.KIND_ANNOTATION], _KIND_CODE[S.KIND_RUNTIME]])
    )
    rows = np.flatnonzero(io)
    if len(rows) == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    # Only the outermost region of each thread moves.
    rows = rows[np.lexsort((-ev.dur[rows], ev.ts[rows], ev.tid[rows], ev.pid[rows]))]
    group = group_ids(ev.pid[rows], ev.tid[rows])
    low = int(ev.ts[rows].min())
    span = int(ev.end[rows].max()) - low + 1
    reach = np.maximum.accumulate(group * span + (ev.end[rows] - low))
    earlier = np.concatenate(([-1], reach[:-1]))
    rows = rows[~(earlier >= group * span + (ev.end[rows] - low))]
    start, end = ev.ts[rows].copy(), ev.end[rows].copy()
    ops = np.flatnonzero(timeline)
    ops = ops[np.argsort(ev.ts[ops], kind="stable")]
    o_start, o_end = ev.ts[ops], np.maximum.accumulate(ev.end[ops])
    # An operator running when the region starts: the region starts when it ends.
    cover = window_index(o_start, o_end, start, with_start=False)
    start = np.where(cover >= 0, o_end[np.maximum(cover, 0)], start)
    # An operator that started inside the region and outlasts it: the region waits for it.
    cover = window_index(o_start, o_end, end, with_start=False)
    late = (cover >= 0) & (o_start[np.maximum(cover, 0)] >= start)
    end = np.where(late, o_end[np.maximum(cover, 0)], end)
    if len(calls):
        # ... and the operators queued while loading data that the engine ran only after it
        upto = calls[np.minimum(np.searchsorted(calls, end, side="left"), len(calls) - 1)]
        upto = np.where(upto >= end, upto, end)
        queued = ops[(own[ops] < 0) & ~_bulk(ev)[ops]]
        q_start, q_end = ev.ts[queued], np.maximum.accumulate(ev.end[queued])
        last = np.searchsorted(q_start, upto, side="left") - 1
        reach = np.where(last >= 0, q_end[np.maximum(last, 0)], end)
        end = np.maximum(end, np.where(reach > end, reach, end))
    # Phase spans and step windows are not cut: a region crossing one gives up the rest.
    if spans:
        s_start = np.array([s for _, s, _ in spans], np.int64)
        s_end = np.array([e for _, _, e in spans], np.int64)
        order = np.argsort(s_start)
        s_start, s_end = s_start[order], s_end[order]
        cover = window_index(s_start, s_end, start, with_start=False)
        start = np.where(cover >= 0, s_end[np.maximum(cover, 0)], start)
        cover = window_index(s_start, s_end, end, with_start=False)
        end = np.where(cover >= 0, s_start[np.maximum(cover, 0)], end)
    if len(windows):
        w = window_index(windows[:, 0], windows[:, 1], start, with_start=False)
        end = np.where(w >= 0, np.minimum(end, windows[np.maximum(w, 0), 1]), end)
    keep = end > start
    return rows[keep], start[keep], end[keep]


def _synthetic(
    ev: _Events,
    home: tuple[int, int],
    windows: np.ndarray,
    numbers: np.ndarray,
    placed: list[tuple[tuple[int, int], list[tuple[str, int, int]]]],
) -> _Events:
    """Step markers (on the timeline thread) and phase spans (on their threads), each stating
    its kind, phase, operator and step number."""
    labels = [f"step#{n}" for n in numbers.tolist()]
    ts = [int(v) for v in windows[:, 0].tolist()]
    end = [int(v) for v in windows[:, 1].tolist()]
    pids, tids = [home[0]] * len(labels), [home[1]] * len(labels)
    kinds = [_KIND_CODE[S.KIND_STEP]] * len(labels)
    phases, ops, steps = [-1] * len(labels), [-1] * len(labels), numbers.tolist()
    for (pid, tid), spans in placed:
        for phase, start, stop in spans:
            labels.append(SPAN_NAMES[phase])
            ts.append(start)
            end.append(stop)
            pids.append(pid)
            tids.append(tid)
            kinds.append(_KIND_CODE[S.KIND_PYTHON])
            phases.append(_PHASE_CODES[phase])
            ops.append(_OPS.index(SPAN_OPS[phase]) if phase in SPAN_OPS else -1)
            steps.append(-1)
    n = len(labels)
    cats = list(ev.cats)
    if TRACEVIEW_CAT not in cats:
        cats.append(TRACEVIEW_CAT)
    names_all = list(ev.names)
    index = {str(v): i for i, v in enumerate(names_all)}
    codes = []
    for label in labels:
        if label not in index:
            index[label] = len(names_all)
            names_all.append(label)
        codes.append(index[label])
    ev.cats, ev.names = cats, names_all
    start_ns = np.array(ts, np.int64)
    return _Events(
        kind=np.array(kinds, np.int64),
        cat=np.full(n, cats.index(TRACEVIEW_CAT), np.int64),
        name=np.array(codes, np.int64),
        pid=np.array(pids, np.int64),
        tid=np.array(tids, np.int64),
        ts=start_ns,
        dur=np.array(end, np.int64) - start_ns,
        cats=cats,
        names=names_all,
        made=np.ones(n, bool),
        phase=np.array(phases, np.int64),
        op=np.array(ops, np.int64),
        step=np.array(steps, np.int64),
    )


def _with_spans(ev: _Events, extra: _Events) -> _Events:
    """The events and the synthetic ones after them, except that a span exactly as long as an
    operator on its thread (a worker whose backward in a step is one bulk segment, or whose
    update is one operator) goes first: the call tree then makes the span the operator's parent
    (on a tie the earlier event contains the later), so an operator without a phase of its own
    takes the span's, and the operator, not the span (a region), is the innermost event: on a
    worker other than the timeline's only operators count."""
    loose = np.flatnonzero(ev.kind == _KIND_CODE[S.KIND_OP])
    keys = np.stack([ev.pid[loose], ev.tid[loose], ev.ts[loose], ev.dur[loose]], axis=1)
    ties = {tuple(k) for k in keys.tolist()}
    mine = np.stack([extra.pid, extra.tid, extra.ts, extra.dur], axis=1).tolist()
    first = np.array([tuple(k) in ties for k in mine], bool)
    before, after = extra.take(np.flatnonzero(first)), extra.take(np.flatnonzero(~first))
    return _concat(_concat(before, ev), after)


def _concat(a: _Events, b: _Events) -> _Events:
    """a's rows, then b's (codes into the dictionaries of whichever was made last: the longer)."""
    words = a if len(a.names) >= len(b.names) else b
    return _Events(
        np.concatenate([a.kind, b.kind]), np.concatenate([a.cat, b.cat]),
        np.concatenate([a.name, b.name]), np.concatenate([a.pid, b.pid]),
        np.concatenate([a.tid, b.tid]), np.concatenate([a.ts, b.ts]),
        np.concatenate([a.dur, b.dur]), words.cats, words.names,
        np.concatenate([a.made, b.made]), np.concatenate([a.phase, b.phase]),
        np.concatenate([a.op, b.op]), np.concatenate([a.step, b.step]),
    )  # fmt: skip


def _raw_table(ev: _Events) -> pa.Table:
    n = len(ev.ts)
    raw = pa.table(
        {
            S.KIND: pa.DictionaryArray.from_arrays(
                pa.array(ev.kind.astype(np.int32)), pa.array(list(S.EVENT_KINDS))
            ),
            S.CAT: dictionary_array(ev.cat, ev.cats),
            S.NAME: pc.fill_null(dictionary_array(ev.name, ev.names).cast(pa.string()), ""),
            S.PID: pa.array(ev.pid, pa.int64()),
            S.TID: pa.array(ev.tid, pa.int64()),
            S.TS_NS: pa.array(ev.ts, pa.int64()),
            S.DUR_NS: pa.array(ev.dur, pa.int64()),
            S.COLLECTIVE: pa.nulls(n, pa.string()),
            S.STATED_KIND: dictionary_array(np.where(ev.made, ev.kind, -1), list(S.EVENT_KINDS)),
            S.STATED_PHASE: dictionary_array(ev.phase, list(S.EVENT_PHASES)),
            S.STATED_OP: dictionary_array(ev.op, list(_OPS)),
            S.STATED_STEP: pa.array(ev.step, pa.int64(), mask=ev.step < 0),
        }
    )
    return S.conform(raw, S.LAID_OUT_SCHEMA)
