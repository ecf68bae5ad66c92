"""The vectorized call-tree builder agrees with the obvious per-event stack on real traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import SAMPLES, for_unit, shared_pytorch_files
from traceview.model import schema as S
from traceview.normalize.calltrees import tree_of
from traceview.normalize.classify import kinds_from_categories
from traceview.normalize.rules import builtin_rules
from traceview.parsers.kineto import KinetoParser


def reference_tree(pid, tid, ts, dur):
    """Depth and parent by walking each thread with a stack (the textbook algorithm)."""
    order = np.lexsort((-dur, dur != 0, ts, tid, pid))
    depth = np.zeros(len(ts), np.int64)
    parent = np.full(len(ts), -1, np.int64)
    stack: list[int] = []  # positions in `order`
    thread = None
    for pos, i in enumerate(order):
        if (pid[i], tid[i]) != thread:
            thread, stack = (pid[i], tid[i]), []
        while stack and ts[order[stack[-1]]] + dur[order[stack[-1]]] <= ts[i]:
            stack.pop()
        depth[pos] = len(stack)
        parent[pos] = stack[-1] if stack else -1
        stack.append(pos)
    return order, depth, parent


def _host_arrays(path: Path):
    raw = kinds_from_categories(KinetoParser().parse(path).events, builtin_rules("pytorch"))
    kind = np.array(raw.column(S.KIND).to_pylist())
    host = np.isin(kind, [S.KIND_OP, S.KIND_ANNOTATION, S.KIND_RUNTIME, S.KIND_PYTHON])
    cols = [
        np.asarray(raw.column(c).to_numpy(zero_copy_only=False))[host]
        for c in (S.PID, S.TID, S.TS_NS, S.DUR_NS)
    ]
    return cols


TRACES = [*sorted(SAMPLES.glob("pytorch/*/rank-0.pt.trace.json.gz")), *shared_pytorch_files()]


def _vectorized_call_tree_matches_stack_walk(path: Path) -> None:
    pid, tid, ts, dur = _host_arrays(path)
    tree = tree_of(pid, tid, ts, dur)
    order, depth, parent = reference_tree(pid, tid, ts, dur)
    assert np.array_equal(tree.order, order)
    mismatch = np.flatnonzero((tree.depth != depth) | (tree.parent != parent))
    # Identical, including threads where events overlap without nesting (Python frames against
    # record_function regions), which the builder walks with a stack like the reference.
    assert len(mismatch) == 0, (
        f"{len(mismatch)} of {len(ts)} host events nest differently, e.g. positions {mismatch[:5]}"
    )


@pytest.mark.parametrize("path", for_unit(TRACES), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_vectorized_call_tree_matches_stack_walk(path: Path) -> None:
    _vectorized_call_tree_matches_stack_walk(path)


def test_self_time_is_duration_minus_children() -> None:
    # parent [0, 100) with children [10, 30) and [40, 45), one grandchild [12, 20)
    pid = np.zeros(4, np.int64)
    tid = np.zeros(4, np.int64)
    ts = np.array([0, 10, 12, 40])
    dur = np.array([100, 20, 8, 5])
    tree = tree_of(pid, tid, ts, dur)
    by_event = dict(zip(tree.order.tolist(), tree.self_ns.tolist(), strict=True))
    assert by_event == {0: 75, 1: 12, 2: 8, 3: 5}
    depth = dict(zip(tree.order.tolist(), tree.depth.tolist(), strict=True))
    assert depth == {0: 0, 1: 1, 2: 2, 3: 1}


def test_zero_length_events_nest_but_contain_nothing() -> None:
    # [0, 10) holds a zero-length marker at 5 and a sibling [5, 8) starting at the same time
    ts = np.array([0, 5, 5])
    dur = np.array([10, 0, 3])
    zeros = np.zeros(3, np.int64)
    tree = tree_of(zeros, zeros, ts, dur)
    depth = dict(zip(tree.order.tolist(), tree.depth.tolist(), strict=True))
    parent_event = {
        int(tree.order[pos]): (int(tree.order[p]) if p >= 0 else -1)
        for pos, p in enumerate(tree.parent.tolist())
    }
    assert depth == {0: 0, 1: 1, 2: 1}
    assert parent_event == {0: -1, 1: 0, 2: 0}


@pytest.mark.parametrize("shape", ["rows", "window", "unsorted", "far_apart", "nulls"])
def test_parent_rows_finds_each_parents_row(shape: str) -> None:
    """``arrays.parent_rows`` (a row per id, on a chunk or a filtered table) against a dict of
    id to row: ids as rows, a window of the ids (a chunk), ids out of order (rows carried into a
    chunk before its own), ids far apart (a few rows of a large rank) and null links."""
    import pyarrow as pa

    from traceview.model.columns import parent_rows

    rng = np.random.default_rng(7)
    n = 5_000
    ids = {
        "rows": np.arange(n),
        "window": np.arange(n) + 3_000_000,
        "unsorted": np.concatenate([[5, 9], rng.permutation(n - 2) + 1_000_000]),
        "far_apart": np.sort(rng.choice(1 << 40, n, replace=False)),
        "nulls": np.arange(n) + 10,
    }[shape]
    # parents: ids of these rows, ids not among them (outside the rows, or between two ids) and
    # none (-1)
    pick = rng.integers(0, n, n)
    parent = np.where(rng.random(n) < 0.7, ids[pick], -1)
    parent = np.where(rng.random(n) < 0.1, ids.max() + rng.integers(1, 100, n), parent)
    parent = np.where(rng.random(n) < 0.05, np.maximum(ids.min() - 1, 0), parent)
    null = rng.random(n) < 0.1 if shape == "nulls" else np.zeros(n, bool)
    table = pa.table(
        {
            S.EVENT_ID: pa.array(ids, pa.int64()),
            S.PARENT: pa.array(parent, pa.int64(), mask=null),
        }
    )
    row_of = {int(i): r for r, i in enumerate(ids)}
    expected = [
        -1 if m or p < 0 else row_of.get(int(p), -1) for p, m in zip(parent, null, strict=True)
    ]
    assert parent_rows(table).tolist() == expected


@pytest.mark.parametrize("spread", [10, 1 << 18, 1 << 40, -5])
def test_unique_inverse_is_numpys(spread: int) -> None:
    """``arrays.unique_inverse`` (a table over the keys' range where it is modest) gives what
    ``np.unique(..., return_inverse=True)`` gives: keys close together, far apart, negative."""
    from traceview.model.columns import unique_inverse

    rng = np.random.default_rng(3)
    keys = rng.integers(min(spread, 0), abs(spread), 300)[rng.integers(0, 300, 20_000)]
    unique, inverse = unique_inverse(keys)
    expected_unique, expected_inverse = np.unique(keys, return_inverse=True)
    assert unique.tolist() == expected_unique.tolist()
    assert inverse.tolist() == expected_inverse.ravel().tolist()
    assert unique_inverse(keys[:0])[0].tolist() == []
