"""Smaller truths (issue 36): many warnings are counted past the first few, never printed one
line each; a rank at or beyond the world size the traces state is named."""

from __future__ import annotations

from pathlib import Path

from traceview.ingest.discover import TraceFile, assign_ranks
from traceview.model.errors import Notes
from traceview.views.style import NOTES_SHOWN, shown_notes


def test_the_first_warnings_are_shown_and_the_rest_counted() -> None:
    items = [f"rank {i} left out: damaged" for i in range(25)]
    shown = shown_notes(items)
    assert shown[:NOTES_SHOWN] == items[:NOTES_SHOWN]
    assert len(shown) == NOTES_SHOWN + 1
    assert shown[-1].startswith(f"… and {25 - NOTES_SHOWN} more warnings")
    assert shown_notes(items[:NOTES_SHOWN]) == items[:NOTES_SHOWN]  # none counted when all fit
    assert shown_notes(items[: NOTES_SHOWN + 1], "note")[-1].startswith("… and 1 more note ")


def test_a_rank_beyond_the_world_size_is_named() -> None:
    traces = [
        TraceFile(Path("a.json"), "kineto", "pytorch", claimed_rank=0, world_size=2),
        TraceFile(Path("b.json"), "kineto", "pytorch", claimed_rank=5, world_size=2),
    ]
    notes = Notes()
    assert assign_ranks(traces, notes) == 2
    beyond = [w for w in notes.warnings if "beyond the world size" in w]
    assert len(beyond) == 1 and beyond[0].startswith("rank(s) 5 at or beyond the world size 2")
    notes = Notes()
    assign_ranks(traces[:1], notes)
    assert not [w for w in notes.warnings if "beyond" in w]
