"""The integration tier's part of ``tests/unit/test_normalize_passes.py``: what these check, and why, is
said at the top of that file (shared traces, TensorFlow profiles, the CLI here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import beyond_unit
from tests.integration.test_parser_contract import TRACES
from tests.unit.test_normalize_passes import _every_pass_keeps_its_contract


@pytest.mark.parametrize("path", beyond_unit(TRACES), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_pass_keeps_its_contract(path: Path) -> None:
    _every_pass_keeps_its_contract(path)
