"""The terminal UI, driven by keys with Textual's Pilot at 80×24: what a person would read.

Each test opens a real sample run (ingested once per module), waits until the overview is drawn
and the workers are done, presses keys and reads the widgets' content.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from rich.text import Text
from textual.pilot import Pilot
from textual.widgets import DataTable, Input, Static, TabbedContent

from tests.conftest import REPO, SAMPLES, run_cli
from tests.tui_helpers import EVIL, evil_run, play, sample_run, settle
from traceview.analysis.compare import compare
from traceview.analysis.summary import RunInputs, summarize
from traceview.commands.tui import run_groups
from traceview.model import schema as S
from traceview.model.escape import safe
from traceview.model.manifest import Manifest
from traceview.runs import Run, ingest_run, open_run, open_runs
from traceview.tui.app import TraceviewApp
from traceview.tui.help import HelpScreen
from traceview.tui.model import build_view
from traceview.tui.operators import OP_WIDTH, OperatorsPane
from traceview.tui.overview import Legend, RankBars
from traceview.tui.render import SHORT, ms, pct
from traceview.tui.timeline import Timeline
from traceview.views.style import us_figure

SIZE = (80, 24)


def drive(
    runs: list[Run], scenario: Callable[[TraceviewApp, Pilot[None]], Awaitable[None]]
) -> TraceviewApp:
    """Run the app headless at 80×24, wait until it has loaded, then play ``scenario``."""
    app = TraceviewApp(runs)
    play(app, scenario, SIZE)
    return app


def plain(value: object) -> str:
    if isinstance(value, Text):
        return value.plain
    if isinstance(value, Static):
        return plain(value.content)
    return str(value)


def rows(table: DataTable) -> list[list[str]]:
    return [[plain(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


# --- overview ---------------------------------------------------------------------------------


def test_overview_says_where_the_time_goes_with_the_reports_numbers(ddp: Run) -> None:
    report = ddp.report()
    summary = report.summary
    seen: dict[str, str] = {}

    async def look(app: TraceviewApp, pilot: Pilot[None]) -> None:
        seen["verdict"] = plain(app.query_one("#verdict", Static))
        seen["bars"] = plain(app.query_one(RankBars).render())
        seen["legend"] = plain(app.query_one(Legend).render())
        seen["notes"] = plain(app.query_one("#notes", Static))
        seen["title"] = plain(app.query_one("#title", Static))

    drive([ddp], look)
    # the cause first (DDP over gloo: none stands out), then the bottleneck
    first, verdict = seen["verdict"].split("\n", 1)
    assert summary.cause is None and first.startswith("balanced: "), seen["verdict"]
    assert verdict.startswith(
        f"backward is the bottleneck: {pct(summary.bottleneck_share)} of the "
        f"{ms(summary.step_ms)} ms step"
    ), seen["verdict"]
    assert f"{pct(summary.comm_hidden_fraction)} of it hidden behind compute" in seen["verdict"]
    assert "ddp · pytorch · 2 ranks · 5 steps · cpu timeline" in seen["title"]
    # One bar per rank and the mean, each with its step time; a significant straggler is called
    # out, a busiest rank within 5% of the median is not (the ranks are balanced).
    lines = seen["bars"].splitlines()
    assert lines[1].split()[:2] == ["mean", ms(summary.step_ms)]
    assert summary.straggler_significant is False
    for row in report.ranks:
        line = next(x for x in lines if x.startswith(f"rank {row.rank} "))
        assert ms(row.step_ms) in line
        assert "◀ straggler" not in line
        bar = line.split()[3]
        assert set(bar) <= set("IHFBUCo."), "bars carry one letter per phase"
    # The legend gives every phase's mean ms and share, letter first.
    for phase, value in summary.breakdown_ms.items():
        entry = f"{phase:<9}{ms(value):>8} ms {pct(value / summary.step_ms):>4}"
        assert entry in seen["legend"], f"{phase}: {entry!r} not in legend"
    assert f"straggler: rank {summary.straggler_rank} (waited for the most" in seen["notes"]
    assert "ranks are balanced" in seen["notes"]
    assert "host-bound" not in seen["legend"]  # a CPU run's phases have no host-bound part


def test_overview_reads_a_parameter_server_job_as_workers_and_servers(runs_root: Path) -> None:
    """An MXNet ps-lite job (dist_sync): the overview names the architecture, each worker's
    busy fraction and steps per second, and how the roles were known, as the report has them."""
    out = runs_root / "mxnet-dist_sync"
    if not out.exists():
        ingest_run([SAMPLES / "mxnet" / "dist_sync"], out)
    with open_run([out]) as run:
        report = run.report()
        seen: dict[str, str] = {}

        async def look(app: TraceviewApp, pilot: Pilot[None]) -> None:
            seen["notes"] = plain(app.query_one("#notes", Static))

        drive([run], look)
    assert report.run.architecture == "parameter_server"
    notes = " ".join(seen["notes"].split())
    assert "parameter server (synchronous): workers:" in notes, notes
    for rank in report.ranks:
        assert rank.steps_per_s is not None and rank.busy_fraction is not None
        assert (
            f"rank {rank.rank} busy {pct(rank.busy_fraction)}, {rank.steps_per_s:.1f} steps/s"
            in notes
        )
    assert str(report.run.architecture_from) in notes


def test_overview_explains_the_gpu_with_the_reports_numbers(runs_root: Path) -> None:
    """On a GPU run the overview says why the device idles (the report's verdict) and, per
    rank, its busy share, idle time by what the host did and each phase's two parts."""
    with open_run([sample_run("gpu_sync", runs_root)]) as run:
        report = run.report()
        seen: dict[str, str] = {}

        async def look(app: TraceviewApp, pilot: Pilot[None]) -> None:
            seen["verdict"] = plain(app.query_one("#verdict", Static))
            seen["notes"] = plain(app.query_one("#notes", Static))
            seen["legend"] = plain(app.query_one(Legend).render())

        drive([run], look)
    # the legend gives each phase (kernels + host-bound) and, below, its host-bound part
    bound = report.summary.host_bound_ms
    assert bound is not None
    legend = " ".join(seen["legend"].split())
    parts = " · ".join(f"{p} {ms(bound[p])}" for p in S.GPU_HOST_BOUND_PHASES)
    assert f"of which host-bound: {parts} ms" in legend
    assert bound.update > 0.5 and ms(report.summary.breakdown_ms.update) in legend
    verdict, gpu = report.gpu_verdict, report.ranks[0].gpu
    assert verdict is not None and verdict.wait == "data" and gpu is not None
    assert (
        f"GPU idle {pct(verdict.idle_fraction)} of the step, waiting for the data loader "
        f"({pct(verdict.wait_fraction)} of the step)"
    ) in " ".join(seen["verdict"].split())
    notes = " ".join(seen["notes"].split())
    assert f"GPU rank 0: busy {pct(gpu.busy_fraction)} ({ms(gpu.busy_ms)} ms)" in notes
    assert f"host-bound {ms(gpu.idle_ms.host_bound)}, data {ms(gpu.idle_ms.data)}" in notes
    for phase in gpu.phases:
        if phase.total_ms > 0:
            assert f"{phase.phase} {ms(phase.device_ms)} + {ms(phase.host_bound_ms)}" in notes


def test_every_screen_fits_80_by_24(ddp: Run, explicit: Run) -> None:
    """The main content of each screen lies inside the terminal (or scrolls inside it)."""

    async def visit(app: TraceviewApp, pilot: Pilot[None]) -> None:
        screen = app.screen.region
        for key, widget in [
            ("1", "#overview-pane"),
            ("2", "#timeline"),
            ("3", "#ops-table"),
            ("4", "#ranks-table"),
            ("5", "#steps-table"),
            ("6", "#compare-pane"),
        ]:
            await pilot.press(key)
            await settle(pilot)
            region = app.query_one(widget).region
            assert region.width > 0 and region.height >= 3, (key, region)
            assert screen.contains_region(region), (key, region, screen)

    drive([ddp, explicit], visit)


# --- navigation -------------------------------------------------------------------------------


def test_number_keys_and_tab_switch_screens_and_q_quits(ddp: Run) -> None:
    visited: list[str] = []

    async def walk(app: TraceviewApp, pilot: Pilot[None]) -> None:
        tabs = app.query_one(TabbedContent)
        for key in ["2", "3", "4", "5", "6", "1", "tab", "tab", "shift+tab"]:
            await pilot.press(key)
            visited.append(tabs.active)
        await pilot.press("q")

    app = drive([ddp], walk)
    assert visited == [
        "timeline", "operators", "ranks", "steps", "compare", "overview",
        "timeline", "operators", "timeline",
    ]  # fmt: skip
    assert app.return_code == 0, "q leaves the app"


def test_question_mark_opens_and_closes_the_help(ddp: Run) -> None:
    seen: list[str] = []

    async def help(app: TraceviewApp, pilot: Pilot[None]) -> None:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        keys = app.screen.query_one("#help-keys", Static)
        seen.append("\n".join(line.text for line in keys.render_lines(keys.region.reset_offset)))
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)

    drive([ddp], help)
    assert "[ ]" in seen[0] and "previous, next step" in seen[0]
    assert "quit" in seen[0]


# --- operators --------------------------------------------------------------------------------


def test_operators_table_matches_the_reports_top_operators(ddp: Run) -> None:
    report = ddp.report(5)
    table: list[list[str]] = []

    async def look(app: TraceviewApp, pilot: Pilot[None]) -> None:
        await pilot.press("3")
        table.extend(rows(app.query_one("#ops-table", DataTable)))

    drive([ddp], look)
    for row, op in zip(table, report.top_ops, strict=False):
        op_name, _phase, device, calls, self_ms, total_ms, *_rest, name = row
        assert (op_name, device, name) == (op.op, op.device, op.name)
        assert (self_ms, total_ms) == (ms(op.self_ms_per_step), ms(op.total_ms_per_step))
        assert calls == f"{op.calls_per_step:g}"
    share = float(table[0][8].rstrip("%")) / 100
    top = report.top_ops[0].self_ms_per_step / report.summary.step_ms
    assert share == pytest.approx(top, abs=0.006)


def test_operators_filter_box_and_phase_filter(ddp: Run) -> None:
    seen: dict[str, list[list[str]]] = {}

    async def filter(app: TraceviewApp, pilot: Pilot[None]) -> None:
        await pilot.press("3", "slash")
        assert isinstance(app.focused, Input), "/ puts the cursor in the filter box"
        await pilot.press(*"back")
        seen["text"] = rows(app.query_one("#ops-table", DataTable))
        await pilot.press("enter")
        assert isinstance(app.focused, DataTable), "enter goes back to the table"
        await pilot.press("slash", "ctrl+u", "escape")
        assert isinstance(app.focused, DataTable), "escape goes back to the table"
        seen["all"] = rows(app.query_one("#ops-table", DataTable))
        for phase in ["io", "h2d", "forward"]:  # p: all -> io -> h2d -> forward ...
            await pilot.press("p")
            assert app.query_one(OperatorsPane).phase == phase
            seen[phase] = rows(app.query_one("#ops-table", DataTable))

    drive([ddp], filter)
    assert seen["text"], "some operators match 'back'"
    assert all("back" in (r[0] + r[-1]).lower() for r in seen["text"])
    assert len(seen["all"]) > len(seen["text"]), "clearing the box shows every operator again"
    assert seen["io"] and all(r[1] == "io" for r in seen["io"])
    assert seen["forward"] and all(r[1] == "fwd" for r in seen["forward"])
    assert seen["h2d"] == [], "a CPU run has no host-to-device copies"


def test_kernel_launches_per_operator_and_phase(runs_root: Path, ddp: Run) -> None:
    """`k` on the Operators screen of a GPU run shows the report's kernel launches (the
    verdict's rank, else the first GPU rank), per operator and phase, filtered like the
    operators; `k` again brings the operators back; a CPU run has none to show."""
    seen: dict[str, object] = {}

    async def look(app: TraceviewApp, pilot: Pilot[None]) -> None:
        await pilot.press("3", "k")
        pane = app.query_one(OperatorsPane)
        seen["kernels"] = rows(app.query_one("#ops-table", DataTable))
        seen["state"] = plain(app.query_one("#ops-state", Static))
        for _ in range(S.EVENT_PHASES.index(S.BACKWARD) + 1):  # p: all -> io ... -> backward
            await pilot.press("p")
        assert pane.phase == S.BACKWARD
        seen["backward"] = rows(app.query_one("#ops-table", DataTable))
        await pilot.press("k")
        seen["operators"] = rows(app.query_one("#ops-table", DataTable))

    with open_run([sample_run("gpu_sync", runs_root)]) as run:
        report = run.report()
        drive([run], look)
    gpu = report.ranks[0].gpu
    assert gpu is not None and gpu.kernels
    table = seen["kernels"]
    assert isinstance(table, list) and len(table) == len(gpu.kernels)
    for row, k in zip(table, gpu.kernels, strict=True):
        phase = k.phase or S.OTHER
        assert row[:3] == [safe(k.op, OP_WIDTH), SHORT[phase], f"{k.kernels_per_step:g}"], row
        assert row[5] == us_figure(k.launch_latency_us_p50) and row[8] == pct(
            k.short_kernel_fraction
        )
        assert k.queued_fraction is not None and row[7] == pct(k.queued_fraction)
    assert f"kernel launches, rank 0 · {len(gpu.kernels)} of {len(gpu.kernels)}" in str(
        seen["state"]
    )
    backward = [k for k in gpu.kernels if k.phase == S.BACKWARD]
    assert [r[0] for r in seen["backward"]] == [safe(k.op, OP_WIDTH) for k in backward]  # type: ignore[union-attr]
    assert len(seen["operators"][0]) == 10, "k again: the operators' columns"  # type: ignore[index]

    empty: dict[str, object] = {}

    async def cpu(app: TraceviewApp, pilot: Pilot[None]) -> None:
        await pilot.press("3", "k")
        empty["rows"] = rows(app.query_one("#ops-table", DataTable))
        empty["state"] = plain(app.query_one("#ops-state", Static))

    drive([ddp], cpu)
    assert empty["rows"] == [] and "no GPU rank" in str(empty["state"])


def test_operators_sort_key_cycles_through_the_columns(ddp: Run) -> None:
    orders: dict[str, list[list[str]]] = {}

    async def sort(app: TraceviewApp, pilot: Pilot[None]) -> None:
        await pilot.press("3")
        orders["self"] = rows(app.query_one("#ops-table", DataTable))
        for expected in ["total", "calls", "mean", "p95", "op"]:
            await pilot.press("s")
            assert app.query_one(OperatorsPane).sort == expected
            orders[expected] = rows(app.query_one("#ops-table", DataTable))

    drive([ddp], sort)

    def numbers(table: list[list[str]], column: int) -> list[float]:
        return [float(r[column].replace(",", "")) for r in table]

    assert numbers(orders["self"], 4) == sorted(numbers(orders["self"], 4), reverse=True)
    assert numbers(orders["total"], 5) == sorted(numbers(orders["total"], 5), reverse=True)
    assert numbers(orders["calls"], 3) == sorted(numbers(orders["calls"], 3), reverse=True)
    names = [r[0] for r in orders["op"]]
    assert names == sorted(names)


# --- ranks and steps --------------------------------------------------------------------------


def test_ranks_screen_shows_memory_where_the_run_has_it(ddp: Run) -> None:
    seen: dict[str, list[list[str]]] = {}
    columns: dict[str, list[str]] = {}

    async def look(app: TraceviewApp, pilot: Pilot[None]) -> None:
        await pilot.press("4")
        table = app.query_one("#ranks-table", DataTable)
        seen["rows"] = rows(table)
        columns["keys"] = [str(c.value) for c in table.columns]

    with open_run([REPO / "sample_traces" / "pytorch" / "memory"]) as run:
        report = run.report()
        drive([run], look)
    assert columns["keys"][-2:] == ["mem", "mem_phase"]
    for row in seen["rows"]:
        memory = next(r.memory for r in report.ranks if r.rank == int(row[0].rstrip("*")))
        assert memory is not None and memory.peak_mb is not None
        assert row[-2:] == [f"{memory.peak_mb:,.1f}", memory.peak_phase]
    drive([ddp], look)  # no memory records: no memory columns
    assert "mem" not in columns["keys"]


def test_ranks_screen_lists_the_slowest_rank_first(ddp: Run) -> None:
    report = ddp.report()
    table: list[list[str]] = []

    async def look(app: TraceviewApp, pilot: Pilot[None]) -> None:
        await pilot.press("4")
        table.extend(rows(app.query_one("#ranks-table", DataTable)))

    drive([ddp], look)
    by_busy = sorted(report.ranks, key=lambda r: -r.busy_ms)
    assert [int(r[0].rstrip("*")) for r in table] == [r.rank for r in by_busy]
    for row, rank in zip(table, by_busy, strict=True):
        assert row[1:3] == [ms(rank.step_ms), ms(rank.busy_ms)]
        blocked = rank.comm_exposed_ms + rank.breakdown_ms.idle
        assert row[4] == ms(blocked)
        # of the exposed comm: waiting for the last rank, and transfer
        assert rank.comm_wait_ms is not None and rank.comm_transfer_ms is not None
        assert row[5:7] == [ms(rank.comm_wait_ms), ms(rank.comm_transfer_ms)]
        assert row[9:17] == [ms(rank.breakdown_ms[p]) for p in S.BREAKDOWN_PHASES]
    # ddp's busiest rank is within 5% of the median: no rank is marked as the straggler
    assert not any(r[0].endswith("*") for r in table)


def test_steps_screen_shows_each_step_and_marks_the_first(ddp: Run) -> None:
    report = ddp.report()
    expected, stats = report.per_step, report.step_stats
    assert stats is not None
    table: list[list[str]] = []
    summary: list[str] = []

    async def look(app: TraceviewApp, pilot: Pilot[None]) -> None:
        await pilot.press("5")
        table.extend(rows(app.query_one("#steps-table", DataTable)))
        summary.append(plain(app.query_one("#steps-summary", Static)))

    drive([ddp], look)
    assert [r[0] for r in table] == ["2", "3", "4", "5", "6"]
    assert table[0][1] == "first"
    assert [r[2] for r in table] == [ms(r.step_ms) for r in expected]
    assert f"5 steps · mean {ms(stats.mean_ms)} ms" in summary[0]


def test_warm_up_steps_are_marked_from_their_time() -> None:
    """A leading step well above the median is warm-up; a later one, slow."""
    import pyarrow as pa

    def table(walls_ms: list[float]) -> pa.Table:
        n = len(walls_ms)
        walls = [int(w * 1e6) for w in walls_ms]
        columns = {
            S.RANK: [0] * n,
            S.STEP: list(range(n)),
            S.TIMELINE: ["cpu"] * n,
            S.START_NS: [0] * n,
            S.END_NS: walls,
            S.WALL_NS: walls,
            **{S.phase_ns(p): [0] * n for p in S.BREAKDOWN_PHASES},
            S.COMM_TOTAL_NS: [0] * n,
            S.COMM_EXPOSED_NS: [0] * n,
            S.COMM_HIDDEN_FRACTION: [0.0] * n,
            **{S.host_bound_ns(p): [None] * n for p in S.GPU_HOST_BOUND_PHASES},
        }
        return pa.table(columns, schema=S.STEPS_SCHEMA)

    marks = [
        r.mark
        for r in summarize(
            RunInputs(
                Manifest(), {"steps": table([80, 50, 10, 10, 10, 30, 10]), "ops": pa.table({})}
            )
        ).per_step
    ]
    assert marks == ["warm-up", "warm-up", "", "", "", "slow", ""]


# --- timeline ---------------------------------------------------------------------------------


def test_timeline_zoom_and_pan_change_the_visible_range(ddp: Run) -> None:
    ranges: dict[str, tuple[float, float, float]] = {}
    headers: dict[str, str] = {}

    async def zoom(app: TraceviewApp, pilot: Pilot[None]) -> None:
        await pilot.press("2")
        await settle(pilot)
        timeline = app.query_one(Timeline)
        for name, keys in [
            ("start", []),
            ("zoomed", ["plus"]),
            ("right", ["right"]),
            ("left", ["h", "h"]),
            ("far right", ["l"] * 4),
            ("reset", ["0"]),
            ("out", ["minus"]),
        ]:
            await pilot.press(*keys)
            ranges[name] = timeline.visible_ms()
            headers[name] = plain(app.query_one("#timeline-header", Static))

    drive([ddp], zoom)
    first, last, whole = ranges["start"]
    assert (first, last) == (0.0, pytest.approx(whole)) and whole > 30
    assert ranges["zoomed"][:2] == pytest.approx((whole / 4, 3 * whole / 4))
    assert ranges["right"][0] == pytest.approx(ranges["zoomed"][0] + whole / 8)
    assert ranges["left"][0] == pytest.approx(ranges["right"][0] - whole / 4)
    assert ranges["far right"][1] == pytest.approx(whole), "panning stops at the end"
    assert ranges["reset"][:2] == (0.0, pytest.approx(whole))
    assert ranges["out"] == ranges["reset"], "never zooms out past the whole step"
    assert (
        f"{ms(whole / 4)}–{ms(3 * whole / 4)} ms of {ms(whole)} ms · zoom 2×" in headers["zoomed"]
    )


def test_timeline_shows_ddp_communication_under_backward(ddp: Run) -> None:
    """The DDP sample's all-reduce runs on gloo threads while the training thread is in
    backward: in some cell of the step, one lane shows B and another C."""
    lanes: dict[str, str] = {}

    async def look(app: TraceviewApp, pilot: Pilot[None]) -> None:
        await pilot.press("2")
        await settle(pilot)
        timeline = app.query_one(Timeline)
        width = timeline.bar_width()
        for y in range(len(timeline.rows)):
            line = timeline.render_line(y - round(timeline.scroll_offset.y)).text
            label, bar = line[: timeline.label_width()], line[timeline.label_width() + 1 :]
            lanes[label.strip()] = bar[:width]

    drive([ddp], look)
    assert any(label.startswith("▾ rank 0") for label in lanes), lanes.keys()
    training = lanes["training thread"]
    comm_threads = [bar for label, bar in lanes.items() if "gloo" in label or "6298" in label]
    assert comm_threads, lanes.keys()
    overlap = [
        i for i, c in enumerate(training) if c == "B" and any(b[i] == "C" for b in comm_threads)
    ]
    assert overlap, "communication drawn under backward"


def test_timeline_has_a_memory_lane_under_each_rank_with_its_peak() -> None:
    """sample_traces/pytorch/memory: rank 0 holds 256 MiB more through forward and backward,
    so its memory lane's label says so and its sparkline is full while rank 1's is not."""
    lanes: dict[str, str] = {}

    async def look(app: TraceviewApp, pilot: Pilot[None]) -> None:
        await pilot.press("2")
        await settle(pilot)
        timeline = app.query_one(Timeline)
        width = timeline.bar_width()
        rank = None
        for y in range(len(timeline.rows)):
            line = timeline.render_line(y - round(timeline.scroll_offset.y)).text
            label, bar = line[: timeline.label_width()], line[timeline.label_width() + 1 :]
            if "rank" in label:
                rank = label.split("rank")[1].split()[0].rstrip("*")
            elif "memory" in label:
                lanes[f"{rank}: {label.strip()}"] = bar[:width]

    with open_run([REPO / "sample_traces" / "pytorch" / "memory"]) as run:
        report = run.report()
        drive([run], look)
    assert len(lanes) == 2, lanes
    for rank in report.ranks:
        label, bar = next((k, v) for k, v in lanes.items() if k.startswith(f"{rank.rank}:"))
        assert rank.memory is not None and rank.memory.peak_mb is not None
        assert label == f"{rank.rank}: memory {rank.memory.peak_mb:,.0f} MiB"
        assert set(bar.strip()) <= set("▁▂▃▄▅▆▇█"), bar
    # rank 0 holds its extra 256 MiB over forward and backward: most of its lane is full
    assert lanes["0: memory 257 MiB"].count("█") > len(lanes["0: memory 257 MiB"]) // 4


def test_timeline_step_keys_change_the_step_and_cut_its_lanes(ddp: Run) -> None:
    steps: list[int | None] = []
    headers: list[str] = []

    async def step(app: TraceviewApp, pilot: Pilot[None]) -> None:
        await pilot.press("2")
        await settle(pilot)
        timeline = app.query_one(Timeline)
        for key in ["right_square_bracket"] * 2 + ["left_square_bracket"] * 4:
            await pilot.press(key)
            await settle(pilot)
            steps.append(timeline.step)
            headers.append(plain(app.query_one("#timeline-header", Static)))
            assert timeline.pending == 0
            assert all(row.lane is not None for row in timeline.rows), "every rank has lanes"

    drive([ddp], step)
    # Starts on step 3 (step 2, the first, may be warm-up), then ] ] and [ past the first.
    assert steps == [4, 5, 4, 3, 2, 2]
    assert headers[0].startswith("step 4 (3 of 5)")
    assert headers[-1].startswith("step 2 (1 of 5, first)")


def test_timeline_rank_selection_opens_that_ranks_threads(ddp: Run) -> None:
    labels: dict[str, list[str]] = {}

    async def select(app: TraceviewApp, pilot: Pilot[None]) -> None:
        await pilot.press("2")
        await settle(pilot)
        timeline = app.query_one(Timeline)
        labels["start"] = [f"{r.rank}:{r.lane}" for r in timeline.rows]
        await pilot.press("down")
        await settle(pilot)
        labels["down"] = [f"{r.rank}:{r.lane}" for r in timeline.rows]
        await pilot.press("e")
        labels["all"] = [f"{r.rank}:{r.lane}" for r in timeline.rows]

    drive([ddp], select)
    assert labels["start"][:2] == ["0:0", "0:1"] and labels["start"][-1] == "1:0"
    assert labels["down"][0] == "0:0" and labels["down"][1] == "1:0"
    assert len(labels["all"]) > len(labels["down"]), "e opens every rank's threads"


# --- compare ----------------------------------------------------------------------------------


def test_compare_screen_shows_both_runs_with_ratios(ddp: Run, explicit: Run) -> None:
    expected = compare(
        [ddp.report(), explicit.report()], [ddp.ops, explicit.ops], ["ddp", "explicit"]
    )
    seen: dict[str, list[list[str]]] = {}
    summary: list[str] = []

    async def look(app: TraceviewApp, pilot: Pilot[None]) -> None:
        await pilot.press("6")
        for name in ("runs", "phases", "ops"):
            seen[name] = rows(app.query_one(f"#compare-{name}", DataTable))
        summary.append(plain(app.query_one("#compare-summary", Static)))

    drive([ddp, explicit], look)
    assert "A ddp (baseline)" in summary[0] and "B explicit" in summary[0]
    comm = next(r for r in seen["phases"] if r[0] == "comm")
    row = next(p for p in expected.phases if p.phase == "comm")
    assert comm == ["comm", ms(row.ms[0]), ms(row.ms[1]), f"×{row.ratio[1]:.2f}"]
    assert seen["runs"][1][4] == f"×{expected.runs[1].step_ratio:.2f}"
    assert [r[0] for r in seen["ops"]] == [o.op for o in expected.ops]


def test_compare_screen_without_a_second_run_says_how_to_get_one(ddp: Run) -> None:
    seen: list[str] = []

    async def look(app: TraceviewApp, pilot: Pilot[None]) -> None:
        await pilot.press("6")
        seen.append(plain(app.query_one("#compare-summary", Static)))

    drive([ddp], look)
    assert "Compare needs two runs" in seen[0]


# --- untrusted names --------------------------------------------------------------------------


def test_names_from_traces_are_shown_literally(runs_root: Path) -> None:
    seen: dict[str, object] = {}

    async def look(app: TraceviewApp, pilot: Pilot[None]) -> None:
        await pilot.press("3")
        table = app.query_one("#ops-table", DataTable)
        seen["row"] = table.get_row_at(0)
        seen["detail"] = app.query_one("#ops-detail", Static).content
        await pilot.press("2")
        await settle(pilot)
        timeline = app.query_one(Timeline)
        seen["labels"] = [timeline.render_line(y).text for y in range(len(timeline.rows))]
        seen["lanes"] = [lane.label for lanes in timeline.cache.values() for lane in lanes.lanes]
        await pilot.press("3")
        seen["svg"] = app.export_screenshot()

    with open_run([evil_run(runs_root)]) as run:
        drive([run], look)
    row = seen["row"]
    assert isinstance(row, list)
    op, name = row[0], row[-1]
    assert isinstance(op, Text) and isinstance(name, Text)
    assert name.plain == safe("aten::mm" + EVIL)
    assert "\\x1b]2;PWNED\\x07\\x1b[2J[bold]x[/bold]\\u202e" in name.plain
    assert not name.spans, "markup in a name is not interpreted"
    for text in [op.plain, name.plain, str(seen["detail"]), *map(str, seen["labels"])]:  # type: ignore[call-overload]
        assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
    lanes = seen["lanes"]
    assert isinstance(lanes, list)
    assert any("(gloo\\x1b]2;PWNED\\x07" in label for label in lanes), lanes
    assert not any("\x1b" in label for label in lanes)
    svg = str(seen["svg"])
    assert "[bold]x[/bold]" in svg and "\x1b" not in svg


# --- command and layering ---------------------------------------------------------------------


def test_folders_are_runs_and_files_are_one(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for folder in (a, b, c):
        folder.mkdir()
    f1, f2 = tmp_path / "r0.json", tmp_path / "r1.json"
    assert run_groups([a, b], None) == [[a], [b]]
    assert run_groups([a, b, c], None) == [[a], [b], [c]]
    assert run_groups([f1, f2], None) == [[f1, f2]]
    assert run_groups([a], None) == [[a]]
    assert run_groups([f1, f2], [f1]) == [[f1, f2], [f1]]


def test_tui_on_a_missing_path_fails_in_one_line(tmp_path: Path) -> None:
    result = run_cli("tui", tmp_path / "nothing-here")
    assert result.code == 2, result.err
    assert len(result.err.strip().splitlines()) == 1 and "Traceback" not in result.err


def test_headless_modules_never_import_textual() -> None:
    code = (
        "import sys\n"
        "import traceview.analysis, traceview.analysis.attribution, traceview.ingest.run\n"
        "import traceview.views.text, traceview.model.results\n"
        "import traceview.runs, traceview.cli, traceview.tui.model\n"
        "from traceview.cli import build_parser; build_parser()\n"
        "print(sorted(m for m in sys.modules if m == 'textual' or m.startswith('textual.')))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert proc.stdout.strip() == "[]", f"textual imported by headless modules: {proc.stdout}"


def test_views_of_several_runs_are_built_off_the_ui_thread(ddp: Run, explicit: Run) -> None:
    """The model needs no Textual and no UI thread: build it here, as the worker does."""
    view = build_view(ddp)
    assert view.rank_numbers == [0, 1]
    assert view.step_numbers == [2, 3, 4, 5, 6]
    assert view.ops[0].op == ddp.report(1).top_ops[0].op
    with open_runs([[ddp.path], [explicit.path]]) as both:
        assert [r.label for r in both] == ["ddp", "explicit"]


def rank_bars(timeline: Timeline) -> dict[int, str]:
    """Each rank's first lane (its breakdown), as drawn, without the label."""
    bars = {}
    for y, row in enumerate(timeline.rows):
        if row.lane == 0:
            line = timeline.render_line(y - round(timeline.scroll_offset.y)).text
            bars[row.rank] = line[timeline.label_width() + 1 :]
    return bars


def test_timeline_marks_each_ranks_arrival_at_a_collective(runs_root: Path) -> None:
    """On the slow-forward sample, c marks the step's most skewed all-reduce: rank 1 (whose
    forward is three times the others') arrives last, its mark right of the others'."""
    from tests.tui_helpers import sample_run
    from traceview.runs import open_run

    marks: dict[int, int] = {}
    header: list[str] = []

    async def look(app: TraceviewApp, pilot: Pilot[None]) -> None:
        await pilot.press("2")
        await settle(pilot)
        await pilot.press("c")
        await settle(pilot)
        timeline = app.query_one(Timeline)
        header.append(plain(app.query_one("#timeline-header", Static)))
        for rank, bar in rank_bars(timeline).items():
            for symbol in "▼▽":
                if symbol in bar:
                    marks[rank] = bar.index(symbol)

    with open_run([sample_run("slowfwd", runs_root)]) as run:
        drive([run], look)
    assert "rank 1 last ▼" in header[0] and "allreduce #0" in header[0], header
    assert set(marks) == {0, 1, 2}
    assert marks[1] > marks[0] and marks[1] > marks[2], marks


def test_timeline_draws_the_critical_path(runs_root: Path) -> None:
    """On the slow-forward sample, x underlines the step's critical path: it runs mostly on
    rank 1 (whose forward is three times the others'), its underlined cells add up to about the
    step, and . chooses a segment, described in the header."""
    from tests.tui_helpers import sample_run
    from traceview.runs import open_run

    underlined: dict[int, int] = {}
    header: list[str] = []

    async def look(app: TraceviewApp, pilot: Pilot[None]) -> None:
        await pilot.press("2")
        await settle(pilot)
        await pilot.press("x")
        await settle(pilot)
        timeline = app.query_one(Timeline)
        header.append(plain(app.query_one("#timeline-header", Static)))
        width = timeline.bar_width()
        for row in timeline.rows:
            if row.lane == 0:
                bar = timeline._bar(row, width)
                marked = set()
                for span in bar.spans:
                    if "underline" in str(span.style):
                        marked.update(range(span.start, span.end))
                underlined[row.rank] = len(marked)
        await pilot.press("full_stop")
        await settle(pilot)
        header.append(plain(app.query_one("#timeline-header", Static)))

    with open_run([sample_run("slowfwd", runs_root)]) as run:
        drive([run], look)
    assert "critical path" in header[0] and "segments" in header[0], header
    assert underlined[1] > underlined[0] and underlined[1] > underlined[2], underlined
    assert "1/" in header[1] and "rank " in header[1], header


def test_timeline_puts_ranks_from_several_hosts_on_one_clock(tmp_path: Path) -> None:
    """Four hosts whose clocks are up to 250 ms apart (their offsets estimated from the
    collectives): on the run clock every rank's step starts in the same column, as it did."""
    from tests.synthetic_jobs import Job, write
    from traceview.runs import open_run

    job = Job(
        ranks=4, steps=4, forward_ms={3: 25.0},
        offset_ms={1: 3.7, 2: -12.5, 3: 250.0}, drift_ppm={}, exit_jitter_ms=0.05,
    )  # fmt: skip
    firsts: dict[int, int] = {}
    header: list[str] = []

    async def look(app: TraceviewApp, pilot: Pilot[None]) -> None:
        await pilot.press("2")
        await settle(pilot)
        timeline = app.query_one(Timeline)
        header.append(plain(app.query_one("#timeline-header", Static)))
        for rank, bar in rank_bars(timeline).items():
            firsts[rank] = len(bar) - len(bar.lstrip())

    with open_run([write(job, tmp_path / "job")]) as run:
        drive([run], look)
    assert "hosts' clocks aligned from collectives" in header[0]
    assert len(firsts) == job.ranks and max(firsts.values()) - min(firsts.values()) <= 1, firsts
