"""``columns.pair_groups``: the distinct (pid, tid) pairs and each row's place among them, as
``np.unique(np.stack([a, b]), axis=1, return_inverse=True)`` gives them (the reference), on
random pairs with negative, huge (64-bit thread ids) and repeated values."""

from __future__ import annotations

import numpy as np

from traceview.model.columns import pair_groups, unique_pairs


def test_pair_groups_are_numpys_unique_of_the_stacked_pairs() -> None:
    rng = np.random.default_rng(1)
    for _ in range(500):
        n = int(rng.integers(1, 60))
        a = rng.integers(-3, 3, n) * (1 << 40)
        b = rng.integers(0, 4, n) + (1 << 62) * rng.integers(0, 2, n)
        pairs, inverse = pair_groups(a, b)
        want, want_inverse = np.unique(np.stack([a, b]), axis=1, return_inverse=True)
        assert np.array_equal(pairs, want)
        assert np.array_equal(inverse, want_inverse.ravel())
        assert np.array_equal(unique_pairs(a, b), want)
        assert np.array_equal(pairs[:, inverse], np.stack([a, b]))  # (each row's own pair)


def test_no_pairs() -> None:
    empty = np.zeros(0, np.int64)
    pairs, inverse = pair_groups(empty, empty)
    assert pairs.shape == (2, 0) and len(inverse) == 0
