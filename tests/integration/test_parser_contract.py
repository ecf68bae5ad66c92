"""Every registered parser, over every sample and shared trace it recognises, only reads: it
returns raw events in schema.RAW_SCHEMA, kinds only where the format states them, and names a
known layout or step-inference pass if it needs one (steps it does not read are the core's)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pytest

from tests.conftest import SHARED, beyond_unit, parser_of
from tests.unit.test_parser_contract import TRACES
from traceview.model import schema as S
from traceview.normalize.step_inference import STEP_THREAD
from traceview.normalize.steps import LAYOUTS, STEP_INFERENCE
from traceview.parsers import registered


def test_every_format_has_a_sample() -> None:
    if not SHARED.exists():
        pytest.skip(f"the TF1 Timeline traces live in {SHARED}, not beside the repository here")
    formats = {parser.name for parser in map(parser_of, TRACES) if parser is not None}
    assert formats >= {p.name for p in registered()}


@pytest.mark.parametrize("path", beyond_unit(TRACES), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_parser_returns_raw_events_and_nothing_decided(path: Path) -> None:
    parser = parser_of(path)
    assert parser is not None, f"{path}: no parser recognises it"
    parsed = parser.parse(path)
    events = parsed.events
    assert events.schema.equals(S.RAW_SCHEMA, check_metadata=False)
    assert events.num_rows > 0
    kinds = set(events.column(S.KIND).to_pylist())
    # kinds are the core's to decide (from categories); a parser states instants at most
    assert kinds <= {None, S.KIND_INSTANT}, f"{parser.name} decided kinds {kinds}"
    assert pc.min(events.column(S.DUR_NS)).as_py() >= 0
    assert parsed.layout is None or parsed.layout in LAYOUTS
    assert parsed.infer_steps is None or parsed.infer_steps in STEP_INFERENCE
    # a step group is what the file says of an event; only the core's pass makes steps of it
    if events.column(S.STEP_GROUP).null_count < events.num_rows:
        assert parsed.infer_steps == "step_groups"
    on_step_thread = pc.sum(pc.equal(events.column(S.TID), STEP_THREAD)).as_py()
    assert not on_step_thread, f"{parser.name} puts events on the core's step thread"
    assert parsed.framework == parser.framework
