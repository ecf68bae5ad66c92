"""The integration tier's part of ``tests/unit/test_parser_contract.py``: what these check, and why, is
said at the top of that file (shared traces, TensorFlow profiles, the CLI here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import SHARED, beyond_unit, parser_of
from tests.unit.test_parser_contract import TRACES, _parser_returns_raw_events_and_nothing_decided
from traceview.parsers import registered


def test_every_format_has_a_sample() -> None:
    if not SHARED.exists():
        pytest.skip(f"the TF1 Timeline traces live in {SHARED}, not beside the repository here")
    formats = {parser.name for parser in map(parser_of, TRACES) if parser is not None}
    assert formats >= {p.name for p in registered()}


@pytest.mark.parametrize("path", beyond_unit(TRACES), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_parser_returns_raw_events_and_nothing_decided(path: Path) -> None:
    _parser_returns_raw_events_and_nothing_decided(path)
