"""The cut kept as time: each step window's exclusive segments in time order
(``timeline_segments``) with the operators that name them (``gap_operators``), and the phase of
every instant of a span (``attribution``: what a timeline view draws)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traceview.analysis.attribution.intervals import _holders, merge_intervals
from traceview.analysis.attribution.levels import _COMM_LEVEL, LEVEL, LEVEL_PHASES, LEVELS
from traceview.analysis.attribution.timeline import (
    DEVICE_WAIT_PATTERN,
    RankTimeline,
    name_mask,
    rank_timeline,
)
from traceview.model import schema as S
from traceview.model.columns import (
    HOST_TREE,
    KIND_CODE,
    OPERATOR,
    STRUCTURAL,
    EventArrays,
    distinct,
    roots,
)


def _outermost_operator(ev: EventArrays, rows: np.ndarray) -> np.ndarray:
    """For each host event row, the outermost operator (not a region) it is nested in on its
    thread, itself included (what a segment is named by: ``linear``, not the ``addmm`` inside
    it); device rows and -1 stay as they are. Each event's climb through operators at once
    (``roots``: a trace nesting operators 40,000 deep took 40,000 rounds)."""
    named = OPERATOR[ev.kind] & ~STRUCTURAL[ev.kind]
    parent = ev.parent_row
    up = np.where((parent >= 0) & named[np.maximum(parent, 0)], parent, -1)
    top = roots(up.astype(np.int64, copy=False))
    at = np.maximum(rows, 0)
    return np.where((rows >= 0) & HOST_TREE[ev.kind[at]], top[at], rows)


#: The kind (schema.SEGMENT_KINDS) of each level's time on a timeline, host and device side.
_HOST_KIND = np.array(
    [S.SEGMENT_KINDS.index(S.SEGMENT_COMM) if name == S.COMM
     else S.SEGMENT_KINDS.index(S.SEGMENT_HOST_BOUND) if name.startswith("host-bound")
     else S.SEGMENT_KINDS.index(S.SEGMENT_COMPUTE) for name, _ in LEVELS]
    + [S.SEGMENT_KINDS.index(S.SEGMENT_IDLE)]
)  # fmt: skip
_PHASE_NAMES = pa.array(S.BREAKDOWN_PHASES, pa.string())
_KIND_NAMES = pa.array(S.SEGMENT_KINDS, pa.string())
_SEGMENT_PHASE = np.array([S.BREAKDOWN_PHASES.index(p) for p in (*LEVEL_PHASES, S.IDLE)])


def operator_gaps(op: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """The segments (operator codes, -1: none; ``S.SEGMENT_KINDS`` codes) that are time between
    operators, which ``gap_operators`` may give the operator around them."""
    return (op < 0) & (kind == _HOST_KIND[LEVEL[S.FORWARD]])


def gap_operators(
    op: np.ndarray, phase: np.ndarray, kind: np.ndarray, window: np.ndarray
) -> np.ndarray:
    """Segment operator codes with the time between two stretches of one operator (Python
    between two calls of it: compute no operator holds) given to that operator, where the
    stretches before and after it are of that operator, phase and window (-1: no operator)."""
    gap = operator_gaps(op, kind)
    if not gap.any():
        return op
    index = np.arange(len(op))
    before = np.maximum.accumulate(np.where(~gap, index, -1))
    after = np.minimum.accumulate(np.where(~gap, index, len(op))[::-1])[::-1]
    b, a = np.maximum(before, 0), np.minimum(after, len(op) - 1)
    same = (
        (before >= 0) & (after < len(op)) & (op[b] == op[a]) & (phase[b] == phase)
        & (phase[a] == phase) & (kind[b] == kind) & (kind[a] == kind)
        & (window[b] == window) & (window[a] == window)
    )  # fmt: skip
    return np.where(gap & same, op[b], op)


_HOST_BOUND, _LAUNCH = (S.SEGMENT_KINDS.index(k) for k in (S.SEGMENT_HOST_BOUND, S.SEGMENT_LAUNCH))


#: The runtime calls that launch device work (a kernel, a graph, an asynchronous copy or
#: memset): CUDA's and HIP's runtime and driver APIs.
LAUNCH_PATTERN = (
    r"(?i)^(cuda|hip|cu|hipExt)\w*(Launch|MemcpyAsync|Memcpy\w*Async|MemsetAsync|Memset\w*Async)"
)


def _launching(
    events: pa.Table, ev: EventArrays, kind: np.ndarray, at: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Host-bound instants (the device idle, the host inside an operator) at which the host is
    inside a runtime call that launches work (``LAUNCH_PATTERN``) are ``launch``: the device
    waits for the launch itself. Inside another runtime call (the allocator's cudaMalloc and
    cudaFree, a cudaMemcpy that is not asynchronous; a synchronize is no host work at all) they
    stay host-bound, and that call (its row: the second array, -1 elsewhere) names them."""
    inner = np.full(len(kind), -1, np.int64)
    bound = np.flatnonzero(kind == _HOST_BOUND)
    if len(bound) == 0:
        return kind, inner
    runtime = (ev.kind == KIND_CODE[S.KIND_RUNTIME]) & ~name_mask(events, DEVICE_WAIT_PATTERN)
    rows = np.flatnonzero(runtime & (ev.end > ev.ts))
    if len(rows) == 0:
        return kind, inner
    launches = name_mask(events, LAUNCH_PATTERN)[rows]
    held = _holders(ev.ts[rows], ev.end[rows], at[bound])
    inside = held >= 0
    launching = inside & launches[np.maximum(held, 0)]
    kind = kind.copy()
    kind[bound[launching]] = _LAUNCH
    other = inside & ~launching
    inner[bound[other]] = rows[held[other]]
    return kind, inner


def timeline_segments(events: pa.Table, tl: RankTimeline | None = None) -> pa.Table:
    """Each step window of the rank as its exclusive segments in time order
    (schema.SEGMENTS_SCHEMA): the breakdown's cut kept as time, a segment per stretch of one
    phase, kind and operator (the canonical op of the event holding the time, on the device
    the kernel's). Per window the segments tile it and their phases add up to the steps row."""
    rank = int(events.column(S.RANK)[0].as_py()) if events.num_rows else 0
    tl = tl or rank_timeline(events)
    if len(tl.w_start) == 0:
        return S.empty(S.SEGMENTS_SCHEMA)
    keep = tl.ends > tl.starts
    s, e, level = tl.starts[keep], tl.ends[keep], tl.levels[keep]
    rows, on_device = tl.rows[keep], tl.on_device[keep]
    bounds = distinct(np.concatenate([s, e, tl.w_start, tl.w_end]).astype(np.int64))
    lo, hi = bounds[:-1], bounds[1:]
    mids = lo + (hi - lo) // 2
    window = np.searchsorted(tl.w_start, mids, side="right") - 1
    inside = (window >= 0) & (mids < tl.w_end[np.maximum(window, 0)])
    lo, hi, mids, window = lo[inside], hi[inside], mids[inside], window[inside]
    idle = len(LEVEL_PHASES)
    winner = np.full(len(mids), idle, np.int64)
    holder = np.full(len(mids), -1, np.int64)  # the interval holding each piece
    by_level = np.argsort(level, kind="stable")
    cuts = np.searchsorted(level[by_level], np.arange(idle + 1))
    for k in range(idle):  # the lowest level covering an instant holds it
        mine = by_level[cuts[k] : cuts[k + 1]]
        if len(mine) == 0:
            continue
        free = np.flatnonzero(winner == idle)
        got = _holders(s[mine], e[mine], mids[free])
        won = got >= 0
        winner[free[won]] = k
        holder[free[won]] = mine[got[won]]
    kind = _HOST_KIND[winner]
    held = holder >= 0
    if len(rows) == 0:  # (windows with nothing in them: idle throughout)
        holder = np.full(len(mids), 0, np.int64)
        rows, on_device = np.full(1, -1, np.int64), np.zeros(1, bool)
    if tl.gpu:
        kernel = held & on_device[np.maximum(holder, 0)]
        kind = np.where(kernel, S.SEGMENT_KINDS.index(S.SEGMENT_KERNEL), kind)
        kind, in_runtime = _launching(events, tl.ev, kind, mids)
    row = np.where(held, rows[np.maximum(holder, 0)], -1)
    comm = winner == _COMM_LEVEL  # (named by the call itself, not the operator issuing it)
    row = np.where(comm, row, _outermost_operator(tl.ev, row))
    if tl.gpu:  # (host work that is not a launch: named by its runtime call, cudaMalloc)
        row = np.where(in_runtime >= 0, in_runtime, row)
    ops = pc.dictionary_encode(events.column(S.OP)).combine_chunks()
    op_codes = np.asarray(ops.indices.fill_null(-1).to_numpy(zero_copy_only=False), np.int64)
    named = (row >= 0) & (comm | ~STRUCTURAL[tl.ev.kind[np.maximum(row, 0)]])
    op = np.where(named, op_codes[np.maximum(row, 0)], -1)
    phase = _SEGMENT_PHASE[winner]
    op = gap_operators(op, phase, kind, window)
    new = np.ones(len(lo), bool)
    new[1:] = (
        (window[1:] != window[:-1]) | (phase[1:] != phase[:-1]) | (kind[1:] != kind[:-1])
        | (op[1:] != op[:-1]) | (lo[1:] != hi[:-1])
    )  # fmt: skip
    heads = np.flatnonzero(new)
    ends = np.append(hi[heads[1:] - 1], hi[-1]) if len(heads) else hi
    numbers = tl.numbers[window[heads]]
    op_heads = op[heads]
    return pa.table(
        {
            S.RANK: pa.array(np.full(len(heads), rank, np.int32)),
            S.STEP: pa.array(numbers, pa.int64(), mask=numbers < 0),
            S.START_NS: pa.array(lo[heads], pa.int64()),
            S.END_NS: pa.array(ends, pa.int64()),
            S.PHASE: _PHASE_NAMES.take(pa.array(phase[heads])),
            S.KIND: _KIND_NAMES.take(pa.array(kind[heads])),
            S.OP: ops.dictionary.take(pa.array(np.maximum(op_heads, 0), mask=op_heads < 0))
            if len(ops.dictionary)
            else pa.nulls(len(heads), pa.string()),
        },
        schema=S.SEGMENTS_SCHEMA,
    )


def attribution(tl: RankTimeline, start: int, end: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The exclusive phase of every instant of [start, end): (segment starts, ends, phases).

    The same rule as the breakdown, kept as time segments (idle where nothing runs): what a
    timeline view draws. Adjacent segments of one phase are merged.
    """
    clip_s, clip_e = np.maximum(tl.starts, start), np.minimum(tl.ends, end)
    keep = clip_e > clip_s
    s, e, level = clip_s[keep], clip_e[keep], tl.levels[keep]
    bounds = distinct(np.concatenate([[start, end], s, e]).astype(np.int64))
    mids = (bounds[:-1] + bounds[1:]) // 2
    winner = np.full(len(mids), len(LEVEL_PHASES), np.int64)  # idle
    for lvl in range(len(LEVEL_PHASES) - 1, -1, -1):
        us, ue = merge_intervals(s[level <= lvl], e[level <= lvl])
        if len(us) == 0:
            continue
        pos = np.searchsorted(us, mids, side="right") - 1
        inside = (pos >= 0) & (mids < ue[np.maximum(pos, 0)])
        winner[inside] = lvl
    names = [*LEVEL_PHASES, S.IDLE]
    phase = np.array([S.BREAKDOWN_PHASES.index(names[w]) for w in range(len(names))])[winner]
    change = np.ones(len(phase), bool)
    change[1:] = phase[1:] != phase[:-1]
    heads = np.flatnonzero(change)
    seg_s = bounds[:-1][heads]
    seg_e = np.append(bounds[:-1][heads[1:]], bounds[-1]) if len(heads) else bounds[1:]
    return seg_s, seg_e, [S.BREAKDOWN_PHASES[p] for p in phase[heads]]
