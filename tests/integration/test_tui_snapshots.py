"""What the screens look like: SVG snapshots at a fixed terminal size (pytest-textual-snapshot).

Most screens are drawn from synthetic view models (tests/tui_models.py: a report written by
hand), so they test layout and escaping, and a change of the analysis does not show up here. Three
are end to end on the bundled samples (ingested into run directories named after them, so nothing
depends on a clock or a temporary path): the overview, and the timeline, which needs events.
After a deliberate change of appearance, look at the report and refresh with
``pytest tests/integration/test_tui_snapshots.py --snapshot-update``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual.pilot import Pilot

from tests.tui_helpers import loaded, settle
from tests.tui_models import (
    comparison,
    gpu_view,
    mesh_view,
    pipeline_lanes,
    pipeline_view,
    straggler_view,
)
from traceview.runs import Run
from traceview.tui.app import TraceviewApp
from traceview.tui.timeline import Timeline

SnapCompare = Callable[..., bool]


def app_of(*runs: Run) -> TraceviewApp:
    app = TraceviewApp(list(runs))
    app.animation_level = "none"
    return app


def synthetic(with_comparison: bool = False) -> TraceviewApp:
    app = TraceviewApp(
        views=[straggler_view()], comparison=comparison() if with_comparison else None
    )
    app.animation_level = "none"
    return app


def keys(*presses: str) -> Callable[[Pilot[Any]], Any]:
    """Wait for the run to load, press ``presses`` and let the workers finish (lanes)."""

    async def run_before(pilot: Pilot[Any]) -> None:
        await loaded(pilot)
        for key in presses:
            await pilot.press(key)
            await settle(pilot)

    return run_before


# --- end to end, on real samples ----------------------------------------------------------------


def test_overview_80x24(snap_compare: SnapCompare, ddp: Run) -> None:
    assert snap_compare(app_of(ddp), terminal_size=(80, 24), run_before=keys())


def test_timeline_80x24(snap_compare: SnapCompare, ddp: Run) -> None:
    assert snap_compare(app_of(ddp), terminal_size=(80, 24), run_before=keys("2"))


def test_timeline_zoomed_on_the_all_reduce_100x30(snap_compare: SnapCompare, explicit: Run) -> None:
    # The explicit all-reduce runs after backward: zoom on the end of the step.
    presses = ("2", "e", "plus", "plus", "l", "l", "l", "l", "l", "l")
    assert snap_compare(app_of(explicit), terminal_size=(100, 30), run_before=keys(*presses))


def test_timeline_critical_path_100x30(snap_compare: SnapCompare, explicit: Run) -> None:
    # x: the step's critical path underlined, . its first segment chosen
    presses = ("2", "x", "full_stop")
    assert snap_compare(app_of(explicit), terminal_size=(100, 30), run_before=keys(*presses))


# --- synthetic view models: layout and escaping ------------------------------------------------


def test_overview_with_a_straggler_120x36(snap_compare: SnapCompare) -> None:
    assert snap_compare(synthetic(), terminal_size=(120, 36), run_before=keys())


def test_kernel_launches_80x24(snap_compare: SnapCompare) -> None:
    app = TraceviewApp(views=[gpu_view()])
    app.animation_level = "none"
    assert snap_compare(app, terminal_size=(80, 24), run_before=keys("3", "k"))


def test_operators_filtered_80x24(snap_compare: SnapCompare) -> None:
    presses = ("3", "slash", "c", "o", "n", "v", "enter")
    assert snap_compare(synthetic(), terminal_size=(80, 24), run_before=keys(*presses))


def test_ranks_80x24(snap_compare: SnapCompare) -> None:
    assert snap_compare(synthetic(), terminal_size=(80, 24), run_before=keys("4"))


def test_heatmap_80x24(snap_compare: SnapCompare, ddp: Run) -> None:
    """The ranks × steps heatmap: each cell's colour step also written as a digit (0-9), so it
    reads without colour (NO_COLOR: tests/integration/test_many_ranks.py)."""
    assert snap_compare(app_of(ddp), terminal_size=(80, 24), run_before=keys("4", "m"))


def test_steps_80x24(snap_compare: SnapCompare) -> None:
    assert snap_compare(synthetic(), terminal_size=(80, 24), run_before=keys("5"))


def test_compare_100x30(snap_compare: SnapCompare) -> None:
    assert snap_compare(synthetic(True), terminal_size=(100, 30), run_before=keys("6"))


def test_help_80x24(snap_compare: SnapCompare) -> None:
    assert snap_compare(synthetic(), terminal_size=(80, 24), run_before=keys("question_mark"))


def test_untrusted_names_shown_escaped_100x24(snap_compare: SnapCompare) -> None:
    assert snap_compare(synthetic(), terminal_size=(100, 24), run_before=keys("3"))


def test_ranks_grouped_by_mesh_dimension_100x24(snap_compare: SnapCompare) -> None:
    """A dp 2 × tp 2 mesh's ranks under their dp groups, each group's means on its row."""
    app = TraceviewApp(views=[mesh_view()])
    app.animation_level = "none"
    assert snap_compare(app, terminal_size=(100, 24), run_before=keys("4"))


def test_pipeline_timeline_100x24(snap_compare: SnapCompare) -> None:
    """The timeline's pipeline view (p) of a 2-stage GPipe step, lanes written by hand."""
    app = TraceviewApp(views=[pipeline_view()])
    app.animation_level = "none"

    async def run_before(pilot: Pilot[Any]) -> None:
        await keys("2")(pilot)
        timeline = app.query_one(Timeline)
        timeline.cache.update(pipeline_lanes())  # (a view has no events to cut lanes from)
        timeline._update_rows()
        await pilot.press("p")
        await settle(pilot)

    assert snap_compare(app, terminal_size=(100, 24), run_before=run_before)
