"""The integration tier's part of ``tests/unit/test_calltree.py``: what these check, and why, is
said at the top of that file (shared traces, TensorFlow profiles, the CLI here)."""

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
