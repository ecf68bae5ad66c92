"""Which collective events are calls (analysis/collectives.py ``_outermost``): against the
plain walk up every ancestor, on random forests of nested events, and on a chain of one call
nested in itself 50,000 times (a hostile trace: the walk took 40 s there)."""

from __future__ import annotations

import numpy as np

from traceview.analysis.collectives import _outermost


def _walk(parent: np.ndarray, is_collective: np.ndarray, device: np.ndarray):  # type: ignore[no-untyped-def]
    """The reference: each collective row walks up every ancestor."""
    rows = np.flatnonzero(is_collective)
    outer, inner, owners, launchers = [], [], [], []
    for r in rows:
        owner, launcher, p = -1, -1, parent[r]
        while p >= 0:
            if is_collective[p]:
                if device[p] == device[r]:
                    owner = p
                elif launcher < 0:
                    launcher = p
            p = parent[p]
        if owner >= 0:
            inner.append(r)
            owners.append(owner)
        else:
            outer.append(r)
            launchers.append(launcher)
    return (
        np.array(outer, np.int64),
        np.array([inner, owners], np.int64),
        np.array(launchers, np.int64),
    )


def _forest(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows in order, each row's parent an earlier row (or none); the host's rows above the
    device's (a kernel under the call that launched it, never a host call under a kernel)."""
    parent = np.full(n, -1, np.int64)
    depth = np.zeros(n, np.int64)
    for i in range(1, n):
        if rng.random() < 0.85:
            parent[i] = rng.integers(0, i)
            depth[i] = depth[parent[i]] + 1
    device = (depth >= 4).astype(np.int64)
    is_collective = rng.random(n) < 0.4
    return parent, is_collective, device


def test_the_outermost_calls_are_those_of_the_walk_up_every_ancestor() -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        parent, is_collective, device = _forest(rng, int(rng.integers(1, 60)))
        got, want = _outermost(parent, is_collective, device), _walk(parent, is_collective, device)
        assert np.array_equal(got[0], want[0])
        assert np.array_equal(got[1].reshape(2, -1), want[1].reshape(2, -1))
        assert np.array_equal(got[2], want[2])


def test_a_call_nested_in_itself_50000_times_is_one_call() -> None:
    n = 50_000
    parent = np.arange(-1, n - 1, dtype=np.int64)  # each row inside the one before it
    outer, (inner, owner), launcher = _outermost(parent, np.ones(n, bool), np.zeros(n, np.int64))
    assert outer.tolist() == [0] and launcher.tolist() == [-1]
    assert len(inner) == n - 1 and (owner == 0).all()
