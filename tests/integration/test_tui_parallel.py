"""The TUI on jobs beyond data parallelism (issue 32), driven with Pilot: the Ranks screen
grouped by mesh dimension, and the timeline's pipeline view of stages over time (compute
against bubble). The runs are written by hand (tests/tui_models.py: a 2-D mesh's groups, a
2-stage GPipe pipeline's lanes), so every figure checked here is worked out from them; the same
screens on real gloo jobs: tests/live/test_parallel_views.py."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from tests.tui_helpers import play, settle
from tests.tui_models import mesh_view, pipeline_lanes, pipeline_view, straggler_view
from traceview.model import schema as S
from traceview.tui.app import TraceviewApp
from traceview.tui.model import RunView
from traceview.tui.timeline import Timeline

SIZE = (120, 30)


def drive(
    view: RunView, scenario: Callable[[TraceviewApp, Pilot[None]], Awaitable[None]]
) -> TraceviewApp:
    app = TraceviewApp(views=[view])
    play(app, scenario, SIZE)
    return app


def first_cells(app: TraceviewApp) -> list[str]:
    table = app.query_one("#ranks-table", DataTable)
    return [str(table.get_row_at(i)[0]) for i in range(table.row_count)]


def test_ranks_are_grouped_by_each_mesh_dimension_in_turn() -> None:
    """A dp 2 × tp 2 mesh: grouped by dp ({0, 2}, {1, 3}) first, then g: tp ({0, 1}, {2, 3}),
    then none: the plain list, slowest first, as a data-parallel run's. Each group's row holds
    its ranks' mean (rank 2, the straggler, is busy 53.5 ms, rank 0 33.5: dp {0, 2} 43.5)."""
    seen: dict[str, list[str]] = {}

    async def scenario(app: TraceviewApp, pilot: Pilot[None]) -> None:
        await pilot.press("4")
        for grouping in ("dp", "tp", "none"):
            await settle(pilot)
            seen[grouping] = first_cells(app)
            summary = str(app.query_one("#ranks-summary", Static).render())
            if grouping == "dp":
                table = app.query_one("#ranks-table", DataTable)
                assert str(table.get_row_at(0)[2]) == "43.50"  # (53.5 + 33.5) / 2
                assert "dp groups' communication" in summary
                assert "allgather in forward 11.95 ms, 81% hidden" in summary
            await pilot.press("g")

    drive(mesh_view(), scenario)
    assert seen["dp"] == ["dp 0,2", "2*", "0", "dp 1,3", "1", "3"]
    assert seen["tp"] == ["tp 0-1", "1", "0", "tp 2-3", "2*", "3"]
    assert seen["none"] == ["2*", "1", "0", "3"]


def test_a_data_parallel_run_is_not_grouped() -> None:
    """No mesh, no pipeline: the ranks list as before, g says there is nothing to group by."""
    rows: list[str] = []

    async def scenario(app: TraceviewApp, pilot: Pilot[None]) -> None:
        await pilot.press("4", "g")
        await settle(pilot)
        rows.extend(first_cells(app))
        summary = str(app.query_one("#ranks-summary", Static).render())
        assert "g: group" not in summary

    drive(straggler_view(), scenario)
    assert rows == ["2*", "1", "0", "3"]


def test_pipeline_ranks_group_by_stage() -> None:
    rows: list[str] = []

    async def scenario(app: TraceviewApp, pilot: Pilot[None]) -> None:
        await pilot.press("4")
        await settle(pilot)
        rows.extend(first_cells(app))
        summary = str(app.query_one("#ranks-summary", Static).render())
        assert "pipeline: 2 stages × 4 micro-batches (GPipe); bubble 44%" in summary

    drive(pipeline_view(), scenario)
    assert rows == ["stage 0", "0", "stage 1", "1*"]


def test_pipeline_view_draws_each_stage_compute_against_its_bubble() -> None:
    """p on the timeline: a row per stage in stage order; the cells drawn as bubble are the
    stage's time outside its own work. Stage 0 of the hand-written GPipe step (46 ms) computes
    4 x 2 ms forward, 4 x 2 ms backward and 2 ms update: bubble 28 of 46 ms; stage 1 computes
    24 + 16 + 2 ms: bubble 4 of 46 ms (the first forward's wait and the last backward's)."""
    lines: list[str] = []
    header: list[str] = []

    async def scenario(app: TraceviewApp, pilot: Pilot[None]) -> None:
        await pilot.press("2")
        await settle(pilot)
        timeline = app.query_one(Timeline)
        timeline.cache.update(pipeline_lanes())  # (a view has no events to cut lanes from)
        timeline._update_rows()
        await pilot.press("p")
        await settle(pilot)
        width = timeline.bar_width()
        for y in range(len(timeline.rows)):
            lines.append(timeline.render_line(y).text[timeline.label_width() + 1 :][:width])
        header.append(timeline.header_text().plain)
        lines.append(timeline.render_line(0).text[: timeline.label_width()])
        await pilot.press("p")
        await settle(pilot)
        assert timeline.render_line(0).text.startswith("▾ rank 0")

    drive(pipeline_view(), scenario)
    stage0, stage1, label = lines
    width = len(stage0)
    assert stage0.count("░") / width == pytest.approx(28 / 46, abs=2 / width)
    assert stage1.count("░") / width == pytest.approx(4 / 46, abs=2 / width)
    assert stage0.startswith("F") and stage1.startswith("░")  # stage 1 waits for the first
    assert label.startswith("stage 0 r0 ░68%")  # the report's bubble share of the stage's step
    assert "pipeline GPipe, 2 stages × 4 micro-batches: bubble 44% (ideal 20%" in header[0]


def test_pipeline_key_on_a_run_without_a_pipeline_keeps_the_ranks() -> None:
    async def scenario(app: TraceviewApp, pilot: Pilot[None]) -> None:
        await pilot.press("2", "p")
        await settle(pilot)
        assert not app.query_one(Timeline).pipeline

    drive(straggler_view(), scenario)


def test_a_stages_collective_is_drawn_as_communication_not_bubble() -> None:
    """A pipeline row draws the stage's time outside its own work as bubble, except where one
    of its collective calls runs (a data-parallel all-reduce: the analysis leaves collectives
    out of the bubble): there its communication is drawn as such. Idle time and a receive's
    wait stay bubble."""
    from traceview.tui.render import BUBBLE, pipeline_cells

    cells = [
        (S.FORWARD, True),
        (S.COMM, True),  # the all-reduce
        (S.COMM, True),
        (S.COMM, True),  # a receive
        (S.IDLE, True),
    ]
    drawn = pipeline_cells(cells, [False, True, True, False, True]).plain
    letter = pipeline_cells([(S.COMM, True)], [True]).plain
    assert letter != BUBBLE
    assert drawn == "F" + letter * 2 + BUBBLE * 2
    assert pipeline_cells(cells).plain == "F" + BUBBLE * 4  # without calls: as before


def test_an_fsdp_units_gathers_are_drawn_in_flight_ready_and_waited_for() -> None:
    """The FSDP view's cells, 1 ms each over 20 ms: a prefetched gather issued at 0 and done at
    4, used at 8 (in flight g, then ready ·); a gather on demand issued at 10, used at 11 and
    done at 12 (in flight G, then its unit waiting !); a 0.1 ms gather at 15.5 still takes a
    cell; one outside the window draws nothing."""
    from traceview.model.results import GatherSpan
    from traceview.tui.render import gather_cells

    ms = 1_000_000

    def span(issued: float, end: float, needed: float | None, prefetched: bool) -> GatherSpan:
        return GatherSpan(
            unit="u", phase=S.FORWARD, prefetched=prefetched, issued_ns=round(issued * ms),
            end_ns=round(end * ms), needed_ns=None if needed is None else round(needed * ms),
        )  # fmt: skip

    spans = [
        span(0, 4, 8, True),
        span(10, 12, 11, False),
        span(15.5, 15.6, None, True),
        span(30, 32, 33, True),
    ]
    drawn = gather_cells(spans, 0, 20 * ms, 20).plain
    assert drawn == "gggg····  G!   g    ", drawn
