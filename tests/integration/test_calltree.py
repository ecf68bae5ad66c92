"""The vectorized call-tree builder agrees with the obvious per-event stack on real traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import beyond_unit
from tests.unit.test_calltree import (
    TRACES,
    _vectorized_call_tree_matches_stack_walk,
)


@pytest.mark.parametrize("path", beyond_unit(TRACES), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_vectorized_call_tree_matches_stack_walk(path: Path) -> None:
    _vectorized_call_tree_matches_stack_walk(path)
