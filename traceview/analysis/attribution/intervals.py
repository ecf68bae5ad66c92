"""Interval arithmetic on numpy arrays: unions, intervals cut to step windows, what covers an
instant."""

from __future__ import annotations

import numpy as np


def _clip(
    starts: np.ndarray, ends: np.ndarray, levels: np.ndarray, w_start: np.ndarray, w_end: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Intervals cut to the windows they overlap: (window, start, end, level)."""
    first = np.searchsorted(w_end, starts, side="right")
    last = np.searchsorted(w_start, ends, side="left") - 1
    count = np.maximum(last - first + 1, 0)
    if len(count) == 0 or count.max() <= 1:  # (nearly always: none spans two windows)
        inside = count == 1
        window = first[inside]
        s = np.maximum(starts[inside], w_start[window])
        e = np.minimum(ends[inside], w_end[window])
        keep = e > s
        return window[keep], s[keep], e[keep], levels[inside][keep]
    window = np.repeat(first, count) + (
        np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
    )
    s = np.maximum(np.repeat(starts, count), w_start[window])
    e = np.minimum(np.repeat(ends, count), w_end[window])
    keep = e > s
    return window[keep], s[keep], e[keep], np.repeat(levels, count)[keep]


def _union_by_window(
    window: np.ndarray, s: np.ndarray, e: np.ndarray, n_windows: int
) -> np.ndarray:
    """Length of the union of intervals per window; inputs sorted by (window, start)."""
    if len(s) == 0:
        return np.zeros(n_windows, np.int64)
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = (s[1:] > reach[:-1]) | (window[1:] != window[:-1])
    heads = np.flatnonzero(new)
    run_end = np.maximum.reduceat(e, heads)
    # reduceat over a run that follows another keeps the earlier reach out: runs are split where
    # a start passes the running maximum, so each run's own max end is its union end.
    lengths = run_end - s[heads]
    return np.bincount(window[heads], weights=lengths, minlength=n_windows).astype(np.int64)


def _runs(
    window: np.ndarray, s: np.ndarray, e: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The union of intervals per window, as disjoint runs sorted by (window, start)."""
    order = np.lexsort((s, window))
    window, s, e = window[order], s[order], e[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = (s[1:] > reach[:-1]) | (window[1:] != window[:-1])
    heads = np.flatnonzero(new)
    return window[heads], s[heads], np.maximum.reduceat(e, heads)


def _inside(starts: np.ndarray, ends: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Whether each instant of ``at`` lies in one of the sorted, disjoint [start, end)."""
    pos = np.searchsorted(starts, at, side="right") - 1
    return (pos >= 0) & (at < ends[np.maximum(pos, 0)]) if len(starts) else np.zeros(len(at), bool)


def _holders(s: np.ndarray, e: np.ndarray, at: np.ndarray) -> np.ndarray:
    """For each instant of ``at``, an interval of (``s``, ``e``) that covers it (-1: none): the
    last one to start before it, or where that one is over, the one reaching furthest."""
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    pos = np.searchsorted(s, at, side="right") - 1
    safe_pos = np.maximum(pos, 0)
    reach = np.maximum.accumulate(e) if len(e) else e
    furthest = np.maximum.accumulate(np.where(e >= reach, np.arange(len(e)), 0)) if len(e) else e
    last = np.where(e[safe_pos] > at, safe_pos, furthest[safe_pos])
    return np.where((pos >= 0) & (e[last] > at), order[last], -1)


def merge_intervals(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals as sorted, disjoint (start, end) arrays."""
    if len(s) == 0:
        return s, e
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > reach[:-1]
    heads = np.flatnonzero(new)
    return s[heads], np.maximum.reduceat(e, heads)
