"""One contract over normalize's passes, on every sample and shared trace: each pass runs in the
documented order, returns per-event arrays of the rank's length with codes in range, and keeps
the invariants the passes after it rely on (trees nest, step windows are disjoint and hold their
events, device activities link to host calls)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import beyond_unit, parser_of
from tests.integration.test_parser_contract import TRACES
from tests.unit.test_normalize_passes import Recorder, _check
from traceview.normalize.pipeline import PASSES, RankMeta, normalize
from traceview.normalize.rules import rules_for
from traceview.normalize.steps import with_markers


@pytest.mark.parametrize("path", beyond_unit(TRACES), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_pass_keeps_its_contract(path: Path) -> None:
    parser = parser_of(path)
    assert parser is not None
    parsed = parser.parse(path)
    recorder = Recorder()
    normalized = normalize(
        parsed.events,
        rules_for(parser.framework),
        RankMeta("run", parsed.rank or 0, parser.framework, parsed.host),
        layout=parsed.layout,
        infer_steps=parsed.infer_steps,
        process_names=parsed.process_names,
        inspect=recorder,
    )
    assert tuple(recorder.seen) == PASSES
    _check(recorder.results)
    raw = with_markers(recorder.results["stray_times"], recorder.results["infer_steps"])
    assert normalized.events.num_rows == raw.num_rows
    assert normalized.steps == len(recorder.results["steps"].markers)
