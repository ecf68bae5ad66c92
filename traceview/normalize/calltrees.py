"""The ``call_trees`` pass: host events nested per thread (depth, parent, self time) by sorting
and binary searches, not a per-event stack; and which host call launched each device activity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from traceview.model import schema as S
from traceview.model.columns import (
    DEVICE,
    HOST_TREE,
    ints,
)
from traceview.model.errors import BadInput
from traceview.normalize.classify import KIND_CODES, Classes


@dataclass
class _Tree:
    order: np.ndarray  # host event indices, sorted by thread then time
    depth: np.ndarray  # per host event (aligned with order)
    parent: np.ndarray  # position in order of the parent (-1: none)
    self_ns: np.ndarray


def tree_of(pid: np.ndarray, tid: np.ndarray, ts: np.ndarray, dur: np.ndarray) -> _Tree:
    """Nesting of host events per thread, without a per-event loop.

    Sorted by (thread, start, zero-length first, longer first), the ancestors of event i are the
    earlier events of its thread that are still open when it starts, so its depth is
    ``i - (#earlier events of the thread that ended by then)``; its parent is the last earlier
    event one level up. Zero-length events never contain others.
    """
    n = len(ts)
    if n == 0:
        empty = np.zeros(0, np.int64)
        return _Tree(empty, empty, empty, empty)
    order = np.lexsort((-dur, dur != 0, ts, tid, pid))
    p, t, s, d = pid[order], tid[order], ts[order], dur[order]
    new_thread = np.ones(n, bool)
    new_thread[1:] = (p[1:] != p[:-1]) | (t[1:] != t[:-1])
    group = np.cumsum(new_thread) - 1
    t0 = int(s.min())
    span = int((s + d).max()) - t0 + 1
    if (int(group[-1]) + 1) * span >= 2**62:  # timestamps from different clocks, or garbage
        raise BadInput(
            f"the trace's events span {span / 3.156e16:,.0f} years on {int(group[-1]) + 1} "
            "threads: its timestamps are inconsistent, so events cannot be nested"
        )
    start_key = group * span + (s - t0)
    end_key = start_key + d
    del p, t, new_thread
    closed = np.searchsorted(np.sort(end_key), start_key, side="right")
    # Zero-length events that start with event i and sort after it have "ended" by its start
    # but are not before it; count them back (i itself included when it is zero-length).
    zero = d == 0
    index = np.arange(n)
    correction = np.zeros(n, np.int64)
    if zero.any():
        run_start = zero & np.concatenate(([True], (start_key[1:] != start_key[:-1]) | ~zero[:-1]))
        run_id = np.cumsum(run_start) - 1
        run_end = np.zeros(int(run_id.max()) + 1, np.int64)
        np.maximum.at(run_end, run_id[zero], index[zero] + 1)
        correction[zero] = run_end[run_id[zero]] - index[zero]
    depth = np.maximum(index - closed + correction, 0)
    del closed, correction, zero

    by_level = np.sort(depth * n + index)
    query = (depth - 1) * n + index
    pos = np.searchsorted(by_level, query, side="left") - 1
    candidate = np.where(pos >= 0, by_level[np.maximum(pos, 0)] % n, -1)
    ok = (depth > 0) & (pos >= 0)
    ok &= np.where(ok, by_level[np.maximum(pos, 0)] // n == depth - 1, False)
    ok &= np.where(ok, group[np.maximum(candidate, 0)] == group, False)
    parent = np.where(ok, candidate, -1)
    del by_level, query, pos, candidate, ok, index

    # Exact when events nest properly. A thread where some event outlives the one it started in
    # (Python frames against record_function regions, say) is walked with a stack instead.
    has_parent = parent >= 0
    outlives = has_parent & (end_key[np.maximum(parent, 0)] < end_key)
    for g in np.unique(group[outlives]):
        rows = np.flatnonzero(group == g)
        depth[rows], parent[rows] = _stack_walk(s[rows], (s + d)[rows], int(rows[0]))

    del start_key, end_key, group
    has_parent = parent >= 0
    child_ns = np.bincount(parent[has_parent], weights=d[has_parent], minlength=n)
    self_ns = np.maximum(d - child_ns.astype(np.int64), 0)
    return _Tree(order, depth.astype(np.int32), parent.astype(np.int32), self_ns)


def _stack_walk(start: np.ndarray, end: np.ndarray, offset: int) -> tuple[np.ndarray, np.ndarray]:
    """Depth and parent (positions + ``offset``) of one thread's events, sorted by start.

    The parent is the latest-started event still open; an event that ended under a longer-lived
    child stays on the stack until the child ends, as a profiler's own stack would have it.
    """
    depth = np.zeros(len(start), np.int64)
    parent = np.full(len(start), -1, np.int64)
    stack: list[int] = []
    ends = end.tolist()
    for i, t in enumerate(start.tolist()):
        while stack and ends[stack[-1]] <= t:
            stack.pop()
        depth[i] = len(stack)
        if stack:
            parent[i] = stack[-1] + offset
        stack.append(i)
    return depth, parent


def _lookup(keys: np.ndarray, values: np.ndarray, query: np.ndarray) -> np.ndarray:
    """values[j] for the j with keys[j] == query (first such j), -1 where none; keys >= 0."""
    valid = keys >= 0
    if not valid.any() or len(query) == 0:
        return np.full(len(query), -1, np.int64)
    k, v = keys[valid], values[valid]
    order = np.argsort(k, kind="stable")
    k, v = k[order], v[order]
    first = np.concatenate(([True], k[1:] != k[:-1]))
    k, v = k[first], v[first]
    pos = np.minimum(np.searchsorted(k, query), len(k) - 1)
    return np.where((query >= 0) & (k[pos] == query), v[pos], -1)


@dataclass
class RankColumns:
    """The raw columns every pass reads, as numpy (times in ns; missing ids as 0)."""

    pid: np.ndarray
    tid: np.ndarray
    ts: np.ndarray
    dur: np.ndarray  # never negative

    @classmethod
    def of(cls, raw: pa.Table) -> RankColumns:
        return cls(
            pid=ints(raw.column(S.PID), 0),
            tid=ints(raw.column(S.TID), 0),
            ts=ints(raw.column(S.TS_NS), 0),
            dur=np.maximum(ints(raw.column(S.DUR_NS), 0), 0),
        )


@dataclass
class CallTrees:
    """Pass ``call_trees``: how host events nest, per event (-1 where an event is not on a host
    thread's tree)."""

    depth: np.ndarray  # int32
    parent: np.ndarray  # int32 event index
    self_ns: np.ndarray  # duration less the children's (device activities: their duration)
    hosts: np.ndarray  # event indices of host-tree events, by thread then start
    by_depth: np.ndarray  # the same events, shallowest first (the order phases flow down in)


def call_trees(classes: Classes, columns: RankColumns) -> CallTrees:
    n = len(classes.kind)
    host_tree = HOST_TREE[classes.kind]
    host_idx = np.flatnonzero(host_tree)
    c = columns
    tree = tree_of(c.pid[host_idx], c.tid[host_idx], c.ts[host_idx], c.dur[host_idx])
    hosts = host_idx[tree.order]
    depth = np.full(n, -1, np.int32)
    depth[hosts] = tree.depth
    parent = np.full(n, -1, np.int32)
    parent[hosts] = np.where(tree.parent >= 0, hosts[np.maximum(tree.parent, 0)], -1)
    self_ns = np.where(host_tree, 0, c.dur)
    self_ns[hosts] = tree.self_ns
    by_depth = hosts[np.argsort(tree.depth, kind="stable")]
    return CallTrees(depth, parent, self_ns, hosts, by_depth)


@dataclass
class Launched:
    """Each device activity and the host call that launched it (``correlation``, else the
    operator's ``external_id``; -1: none found)."""

    rows: np.ndarray  # event indices of device activities
    launcher: np.ndarray  # per row: the launching host event (-1: none)


def launchers(raw: pa.Table, classes: Classes, trees: CallTrees) -> Launched:
    """The host call of each device activity: the runtime call with its ``correlation``, else
    the operator with its ``external_id``."""
    kind, hosts = classes.kind, trees.hosts
    device = np.flatnonzero(DEVICE[kind])
    correlation = ints(raw.column(S.CORRELATION), -1)
    external = ints(raw.column(S.EXTERNAL_ID), -1)
    runtime = hosts[kind[hosts] == KIND_CODES[S.KIND_RUNTIME]]
    launcher = _lookup(correlation[runtime], runtime, correlation[device])
    host_ops = hosts[kind[hosts] != KIND_CODES[S.KIND_RUNTIME]]
    by_external = _lookup(external[host_ops], host_ops, external[device])
    return Launched(device, np.where(launcher >= 0, launcher, by_external))
