"""The cut of a rank's timeline per step window (``level_times``, ``covered_by_level``) and the
tables read off it: the steps table (``breakdown``) and the communication table
(``comm_intervals``)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from traceview.analysis.attribution.intervals import (
    _clip,
    _inside,
    _runs,
    _union_by_window,
    merge_intervals,
)
from traceview.analysis.attribution.levels import _COMM_LEVEL, LEVEL_PHASES
from traceview.analysis.attribution.timeline import LevelTimes, RankTimeline, rank_timeline
from traceview.model import schema as S
from traceview.model.columns import (
    distinct,
)


def level_times(tl: RankTimeline) -> LevelTimes:
    """Every instant of each step window, counted once, for the highest level active then
    (computed once per timeline: the steps and gpu tables read the same cut)."""
    if tl.cut is None:
        tl.cut = _level_times(tl)
    return tl.cut


def covered_by_level(
    starts: np.ndarray,
    ends: np.ndarray,
    levels: np.ndarray,
    w_start: np.ndarray,
    w_end: np.ndarray,
    n_levels: int,
) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """Per window, the time covered by the intervals of level <= k, for k = 0..n_levels-1 (row
    k + 1; row 0 is zeros), so ``np.diff`` over the rows is each level's exclusive time; and the
    intervals clipped to their windows, sorted by window and start (window, start, end, level)."""
    n_windows = len(w_start)
    window, s, e, level = _clip(starts, ends, levels, w_start, w_end)
    order = np.lexsort((s, window))
    clipped = window[order], s[order], e[order], level[order]
    window, s, e, level = clipped
    covered = np.zeros((n_levels + 1, n_windows), np.int64)
    # level by level, the union so far (disjoint runs, few) merged with the level's intervals:
    # each interval is sorted in once, not once per level at or above its own
    by_level = np.argsort(level, kind="stable")
    bounds = np.searchsorted(level[by_level], np.arange(n_levels + 1))
    u_window = u_start = u_end = np.zeros(0, np.int64)
    for k in range(n_levels):
        mine = by_level[bounds[k] : bounds[k + 1]]
        if len(mine) == 0:
            covered[k + 1] = covered[k]
            continue
        u_window, u_start, u_end = _runs(
            np.concatenate([u_window, window[mine]]),
            np.concatenate([u_start, s[mine]]),
            np.concatenate([u_end, e[mine]]),
        )
        covered[k + 1] = np.bincount(u_window, weights=u_end - u_start, minlength=n_windows)
    return covered, clipped


def _level_times(tl: RankTimeline) -> LevelTimes:
    n_windows = len(tl.w_start)
    covered_by, (window, s, e, level) = covered_by_level(
        tl.starts, tl.ends, tl.levels, tl.w_start, tl.w_end, len(LEVEL_PHASES)
    )
    comm = level == _COMM_LEVEL
    comm_total = _union_by_window(window[comm], s[comm], e[comm], n_windows)
    return LevelTimes(
        np.diff(covered_by, axis=0), covered_by[-1], comm_total, (window, s, e, level)
    )


def breakdown(events: pa.Table, tl: RankTimeline | None = None) -> pa.Table:
    """The steps table (schema.STEPS_SCHEMA) of one rank's events (``tl``: their timeline, where
    the caller has it already)."""
    rank = int(events.column(S.RANK)[0].as_py()) if events.num_rows else 0
    tl = tl or rank_timeline(events)
    w_start, w_end, numbers = tl.w_start, tl.w_end, tl.numbers
    n_windows = len(w_start)
    if n_windows == 0:
        return pa.Table.from_pylist([], schema=S.STEPS_SCHEMA)

    times = level_times(tl)
    exclusive, comm_total = times.exclusive, times.comm_total

    wall = w_end - w_start
    columns: dict[str, object] = {
        S.RANK: np.full(n_windows, rank, np.int32),
        S.STEP: pa.array(numbers, pa.int64(), mask=numbers < 0),
        S.TIMELINE: [S.DEVICE_GPU if tl.gpu else S.DEVICE_CPU] * n_windows,
        S.START_NS: w_start,
        S.END_NS: w_end,
        S.WALL_NS: wall,
    }
    for phase in S.BREAKDOWN_PHASES:
        if phase == S.IDLE:
            columns[S.phase_ns(phase)] = wall - times.covered
        else:
            levels = [i for i, p in enumerate(LEVEL_PHASES) if p == phase]
            columns[S.phase_ns(phase)] = exclusive[levels].sum(axis=0)
    exposed = exclusive[_COMM_LEVEL]
    columns[S.COMM_TOTAL_NS] = comm_total
    columns[S.COMM_EXPOSED_NS] = exposed
    with np.errstate(divide="ignore", invalid="ignore"):
        columns[S.COMM_HIDDEN_FRACTION] = np.where(comm_total > 0, 1.0 - exposed / comm_total, 0.0)
    for phase in S.GPU_HOST_BOUND_PHASES:  # part of the phase's column; null on CPU timelines
        columns[S.host_bound_ns(phase)] = pa.array(
            times.host_bound(phase), pa.int64(), mask=np.full(n_windows, not tl.gpu)
        )
    return pa.table(columns, schema=S.STEPS_SCHEMA)


def comm_intervals(events: pa.Table, tl: RankTimeline | None = None) -> pa.Table:
    """The rank's communication within its step windows (schema.COMM_SCHEMA): the union of its
    comm intervals, cut into pieces that are exposed (nothing of a higher level runs then: the
    breakdown's comm) or hidden. Per step, the exposed pieces add up to the steps table's comm
    and all pieces to its comm_total."""
    rank = int(events.column(S.RANK)[0].as_py()) if events.num_rows else 0
    tl = tl or rank_timeline(events)
    if len(tl.w_start) == 0:
        return S.empty(S.COMM_SCHEMA)
    _, s, e, level = level_times(tl).clipped
    comm = level == _COMM_LEVEL
    if not comm.any():
        return S.empty(S.COMM_SCHEMA)
    cs, ce = merge_intervals(s[comm], e[comm])
    above = level < _COMM_LEVEL
    hs, he = merge_intervals(s[above], e[above])
    bounds = distinct(np.concatenate([cs, ce, hs, he, tl.w_start, tl.w_end]))
    lo, hi = bounds[:-1], bounds[1:]
    mids = lo + (hi - lo) // 2
    keep = _inside(cs, ce, mids)
    lo, hi, exposed = lo[keep], hi[keep], ~_inside(hs, he, mids[keep])
    window = np.searchsorted(tl.w_start, lo, side="right") - 1
    # join neighbours of one window and one kind: a piece per stretch, not per boundary
    new = np.ones(len(lo), bool)
    new[1:] = (lo[1:] != hi[:-1]) | (exposed[1:] != exposed[:-1]) | (window[1:] != window[:-1])
    heads = np.flatnonzero(new)
    ends = np.maximum.reduceat(hi, heads) if len(heads) else hi
    numbers = tl.numbers[window[heads]]
    return pa.table(
        {
            S.RANK: pa.array(np.full(len(heads), rank, np.int32)),
            S.STEP: pa.array(numbers, pa.int64(), mask=numbers < 0),
            S.START_NS: pa.array(lo[heads], pa.int64()),
            S.END_NS: pa.array(ends, pa.int64()),
            S.EXPOSED: pa.array(exposed[heads], pa.bool_()),
        },
        schema=S.COMM_SCHEMA,
    )
