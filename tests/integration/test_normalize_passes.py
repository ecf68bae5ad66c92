"""One contract over normalize's passes, on every sample and shared trace: each pass runs in the
documented order, returns per-event arrays of the rank's length with codes in range, and keeps
the invariants the passes after it rely on (trees nest, step windows are disjoint and hold their
events, device activities link to host calls)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import beyond_unit
from tests.integration.test_parser_contract import TRACES
from tests.unit.test_normalize_passes import _every_pass_keeps_its_contract


@pytest.mark.parametrize("path", beyond_unit(TRACES), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_pass_keeps_its_contract(path: Path) -> None:
    _every_pass_keeps_its_contract(path)
