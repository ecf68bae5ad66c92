"""What names a segment (analysis/attribution/segments.py ``_outermost_operator``): against the
plain climb through every operator parent, on random forests of nested events of every kind,
and on one thread of operators nested 40,000 deep (a hostile 4 MB trace: its report took 25 s
when each round climbed one level)."""

from __future__ import annotations

import numpy as np

from traceview.analysis.attribution.segments import _outermost_operator
from traceview.analysis.attribution.timeline import _enclosing_operator
from traceview.model import schema as S
from traceview.model.columns import HOST_TREE, KIND_CODE, OPERATOR, STRUCTURAL, EventArrays


def _events(kind: np.ndarray, parent: np.ndarray) -> EventArrays:
    n = len(kind)
    zeros = np.zeros(n, np.int64)
    return EventArrays(
        kind=kind, phase=zeros, pid=zeros, tid=zeros, ts=zeros, end=zeros, self_ns=zeros,
        step=zeros - 1, parent_row=parent, depth=zeros,
    )  # fmt: skip


def _climb(ev: EventArrays, rows: np.ndarray) -> np.ndarray:
    """The reference: each row climbs while its parent is an operator that is not a region."""
    named = OPERATOR[ev.kind] & ~STRUCTURAL[ev.kind]
    out = rows.copy()
    for i, r in enumerate(rows):
        if r < 0 or not HOST_TREE[ev.kind[r]]:
            continue
        while ev.parent_row[r] >= 0 and named[ev.parent_row[r]]:
            r = ev.parent_row[r]
        out[i] = r
    return out


def test_random_forests_name_segments_as_the_plain_climb() -> None:
    rng = np.random.default_rng(3)
    kinds = np.array(sorted(KIND_CODE.values()), np.int64)
    for _ in range(200):
        n = int(rng.integers(1, 300))
        parent = np.array([int(rng.integers(-1, i)) if i else -1 for i in range(n)], np.int64)
        ev = _events(rng.choice(kinds, n), parent)
        rows = rng.integers(-1, n, int(rng.integers(0, 2 * n)))
        assert np.array_equal(_outermost_operator(ev, rows), _climb(ev, rows))


def test_a_chain_of_40000_nested_operators_names_every_segment_by_the_outermost() -> None:
    n = 40_000
    kind = np.full(n, KIND_CODE[S.KIND_OP], np.int64)
    kind[0] = KIND_CODE[S.KIND_STEP]  # (a region above them all: never the name)
    parent = np.arange(-1, n - 1, dtype=np.int64)
    rows = np.arange(-1, n, dtype=np.int64)
    got = _outermost_operator(_events(kind, parent), rows)
    assert got[0] == -1 and got[1] == 0  # (-1 stays; the region names itself)
    assert (got[2:] == 1).all()  # every operator's segment: the outermost operator


def _nearest_operator(ev: EventArrays, rows: np.ndarray) -> np.ndarray:
    """The reference: each region row climbs to its nearest operator ancestor."""
    named = OPERATOR[ev.kind] & ~STRUCTURAL[ev.kind]
    out = np.full(len(rows), -1, np.int64)
    for i, r in enumerate(rows):
        p = ev.parent_row[r]
        while p >= 0 and not named[p]:
            p = ev.parent_row[p]
        out[i] = p
    return out


def test_a_regions_enclosing_operator_as_the_plain_climb_at_any_depth() -> None:
    rng = np.random.default_rng(5)
    kinds = np.array(sorted(KIND_CODE.values()), np.int64)
    for _ in range(200):
        n = int(rng.integers(1, 300))
        parent = np.array([int(rng.integers(-1, i)) if i else -1 for i in range(n)], np.int64)
        ev = _events(rng.choice(kinds, n), parent)
        rows = rng.integers(0, n, int(rng.integers(0, 2 * n)))
        assert np.array_equal(_enclosing_operator(ev, rows), _nearest_operator(ev, rows))
    # one operator above 40,000 nested regions: each region's is that operator
    n = 40_000
    kind = np.full(n, KIND_CODE[S.KIND_ANNOTATION], np.int64)
    kind[0] = KIND_CODE[S.KIND_OP]
    ev = _events(kind, np.arange(-1, n - 1, dtype=np.int64))
    got = _enclosing_operator(ev, np.arange(n))
    assert got[0] == -1 and (got[1:] == 0).all()
