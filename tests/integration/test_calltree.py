"""The vectorized call-tree builder agrees with the obvious per-event stack on real traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import beyond_unit
from tests.unit.test_calltree import TRACES, _host_arrays, reference_tree
from traceview.normalize.calltrees import tree_of


@pytest.mark.parametrize("path", beyond_unit(TRACES), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_vectorized_call_tree_matches_stack_walk(path: Path) -> None:
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
