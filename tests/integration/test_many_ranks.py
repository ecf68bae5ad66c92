"""Reports that read at scale: above 16 ranks the text report shows the ranks as a
distribution (p50/p90/max per phase, the slowest and fastest ranks), `--all-ranks` lists every
one, `--json` keeps every rank and the distribution (issue 15). Checked on a synthetic job whose
every rank's timing is known exactly (tests/synthetic_jobs.py)."""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import analysed, run_cli
from tests.synthetic_jobs import Job, write

RANKS = 40
SLOW = 17  # its forward takes 25 ms; the others 10.0 + 0.1 ms per rank number


@pytest.fixture(scope="module")
def job() -> Job:
    forward = {r: 10.0 + 0.1 * r for r in range(RANKS)}
    forward[SLOW] = 25.0
    return Job(ranks=RANKS, steps=4, forward_ms=forward)


@pytest.fixture(scope="module")
def run(job: Job, tmp_path_factory: pytest.TempPathFactory) -> Path:
    traces = write(job, tmp_path_factory.mktemp("many") / "traces")
    out = traces.parent / "run"
    result = run_cli("ingest", traces, "-o", out)
    assert result.code == 0, result.err
    return out


def _nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def test_the_json_distribution_matches_the_known_timing(run: Path, job: Job) -> None:
    report = run_cli("report", "--json", run).json()
    assert len(report["ranks"]) == RANKS  # --json keeps every rank
    spread = report["rank_spread"]
    assert spread["ranks"] == RANKS
    forward = [job.forward(r) for r in range(RANKS)]
    measured = spread["breakdown_ms"]["forward"]
    assert measured["p50"] == pytest.approx(_nearest_rank(forward, 0.5), abs=0.05)
    assert measured["p90"] == pytest.approx(_nearest_rank(forward, 0.9), abs=0.05)
    assert (measured["max"], measured["max_rank"]) == (pytest.approx(25.0, abs=0.05), SLOW)
    assert (measured["min"], measured["min_rank"]) == (pytest.approx(10.0, abs=0.05), 0)
    assert spread["slowest_ranks"][:2] == [SLOW, RANKS - 1]  # by own work
    assert spread["fastest_ranks"][0] == 0
    wait = spread["comm_wait_ms"]
    assert wait["min_rank"] == SLOW and wait["min"] == pytest.approx(0.0, abs=0.05)
    assert wait["max"] == pytest.approx(job.wait(0), abs=0.05)  # rank 0 arrives first
    assert wait["p50"] == pytest.approx(
        _nearest_rank([job.wait(r) for r in range(RANKS)], 0.5), abs=0.05
    )


def test_the_text_report_shows_a_distribution_not_forty_rows(run: Path) -> None:
    result = run_cli("report", run)
    assert result.code == 0, result.err
    assert "distribution over 40 ranks" in result.out
    assert "Per rank" not in result.out
    table = result.out.split("distribution over 40 ranks")[1]
    forward = next(line for line in table.splitlines() if line.startswith("forward "))
    assert forward.split()[3:5] == ["25.00", str(SLOW)], forward  # max and its rank
    assert f"most own work: ranks {SLOW} (" in result.out
    assert len(result.out.splitlines()) < 90


def test_all_ranks_lists_every_rank(run: Path) -> None:
    result = run_cli("report", "--all-ranks", run)
    assert result.code == 0, result.err
    assert "Per rank" in result.out and "distribution over" not in result.out
    header = result.out.splitlines().index(
        next(line for line in result.out.splitlines() if line.startswith("Per rank"))
    )
    rows = result.out.splitlines()[header + 2 : header + 2 + RANKS]
    assert [int(line.split()[0].rstrip("*")) for line in rows] == list(range(RANKS))


# --- the ranks × steps heatmap ----------------------------------------------------------------


def test_the_matrix_holds_each_ranks_steps_exactly(run: Path) -> None:
    import pyarrow.compute as pc

    from traceview.analysis.heatmap import step_matrix
    from traceview.model import schema as S

    steps = analysed(run).steps
    # one rank lacks one step, as when it died mid-run
    kept = pc.invert(pc.and_(pc.equal(steps.column(S.RANK), 5), pc.equal(steps.column(S.STEP), 2)))
    matrix = step_matrix(steps.filter(kept))
    assert matrix.ranks == list(range(RANKS))
    rows = steps.to_pylist()
    assert matrix.steps == sorted({r[S.STEP] for r in rows})
    for r in rows:
        i, j = r[S.RANK], matrix.steps.index(r[S.STEP])
        wall = matrix.value("step", i, j)
        forward = matrix.value("forward", i, j)
        if (r[S.RANK], r[S.STEP]) == (5, 2):
            assert math.isnan(wall) and math.isnan(forward)
        else:
            assert wall == r[S.WALL_NS] / 1e6 and forward == r[S.phase_ns("forward")] / 1e6


def _drive(run: Path, scenario: Callable[[Any, Any], Awaitable[None]]) -> None:
    """Open ``run`` in the TUI headless at 100×30, wait until it has loaded, play ``scenario``."""
    import asyncio

    from tests.tui_helpers import loaded
    from traceview.runs import open_run
    from traceview.tui.app import TraceviewApp

    with open_run([run]) as opened:
        app = TraceviewApp([opened])
        app.animation_level = "none"

        async def main() -> None:
            async with app.run_test(size=(100, 30)) as pilot:
                await loaded(pilot)
                await scenario(app, pilot)

        asyncio.run(main())


def test_the_heatmap_shows_the_slow_ranks_forward(run: Path) -> None:
    from textual.widgets import Static

    from traceview.tui.heatmap import PALETTE, Heatmap

    said: list[str] = []
    hot: list[bool] = []

    async def look(app: Any, pilot: Any) -> None:
        await pilot.press("4", "m", "p", "p", "p")  # heatmap of forward
        await pilot.pause()
        heatmap = app.query_one(Heatmap)
        said.append(str(app.query_one("#ranks-summary", Static).content))
        line = heatmap.render_line(0)  # sorted by own work: the slow rank on top
        hot.append(any(f"color({PALETTE[-1]})" in str(s.style) for s in line))
        await pilot.press("down", "right")
        said.append(str(app.query_one("#ranks-summary", Static).content))

    _drive(run, look)
    assert "forward ms, 40 ranks × 4 steps" in said[0]
    assert f"rank {SLOW}, step 0: forward 25.00 ms" in said[0]
    assert hot == [True]
    assert f"rank {RANKS - 1}, step 1: forward" in said[1]  # the next busiest rank


def test_the_ranks_filter_picks_ranks_by_number_range_and_straggler(run: Path) -> None:
    from textual.widgets import DataTable, Static

    from traceview.tui.heatmap import Heatmap

    shown: dict[str, list[int]] = {}
    said: dict[str, str] = {}

    def table_ranks(app: Any) -> list[int]:
        table = app.query_one("#ranks-table", DataTable)
        return [int(str(table.get_row_at(i)[0]).rstrip("*")) for i in range(table.row_count)]

    async def look(app: Any, pilot: Any) -> None:
        # digits go into the filter, not to the screen keys 1-6
        await pilot.press("4", "slash", *"3-5,39", "enter")
        await pilot.pause()
        shown["range"] = table_ranks(app)
        said["range"] = str(app.query_one("#ranks-summary", Static).content)
        await pilot.press("m")  # the heatmap shows the same rows
        await pilot.pause()
        heatmap = app.query_one(Heatmap)
        shown["heatmap"] = [heatmap.matrix.ranks[i] for i in heatmap.rows]
        await pilot.press("m", "slash", *(["backspace"] * 6), *"straggler", "enter")
        await pilot.pause()
        shown["straggler"] = table_ranks(app)
        await pilot.press("slash", *(["backspace"] * 9), "enter")
        await pilot.pause()
        shown["all"] = table_ranks(app)

    _drive(run, look)
    # sorted by own work (forward grows with the rank number): 39 first, then 5, 4, 3
    assert shown["range"] == [39, 5, 4, 3]
    assert "4 of 40 ranks, sorted by busy" in said["range"]
    assert shown["heatmap"] == [39, 5, 4, 3]
    assert shown["straggler"] == [SLOW]
    assert sorted(shown["all"]) == list(range(RANKS))


def test_the_ranks_filter_reads_hosts_and_open_ranges(run: Path) -> None:
    from traceview.runs import open_run
    from traceview.tui.model import filter_ranks

    with open_run([run]) as opened:
        ranks = opened.report().ranks
    hosts = {r: f"node{r // 8:02d}.cluster" for r in range(RANKS)}  # 8 ranks per node

    def chosen(text: str) -> list[int]:
        return sorted(r.rank for r in filter_ranks(ranks, text, hosts))

    assert chosen("node02") == list(range(16, 24))
    assert chosen("NODE04 0") == [0, *range(32, 40)]  # any case; any term chooses
    assert chosen("36-") == list(range(36, 40)) and chosen("-2") == [0, 1, 2]
    assert chosen("") == list(range(RANKS)) and chosen("no-such-host") == []


def test_the_heatmap_reads_without_colour(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NO_COLOR (https://no-color.org): the app drops its colours, and each heatmap cell still
    says where its value lies on the scale, as a digit: the slow rank's forward (25 ms, above
    the 95th percentile) at the top, rank 0's (10.0 ms, the lowest) at the bottom, and the
    others in the order of their forward times (10.0 + 0.1 ms per rank number)."""
    from textual.widgets import Static

    from traceview.tui.heatmap import LABEL, Heatmap

    monkeypatch.setenv("NO_COLOR", "1")
    rows: dict[int, str] = {}
    legend: list[str] = []

    async def look(app: Any, pilot: Any) -> None:
        assert app.no_color
        await pilot.press("4", "m", "p", "p", "p")  # heatmap of forward
        await pilot.pause()
        heatmap = app.query_one(Heatmap)
        for y, row in enumerate(heatmap.rows):
            text = "".join(s.text for s in heatmap.render_line(y - round(heatmap.scroll_offset.y)))
            rows[heatmap.matrix.ranks[row]] = text[LABEL:].replace("[", " ").replace("]", " ")
        legend.append(str(app.query_one("#ranks-summary", Static).content))

    _drive(run, look)
    cells = {rank: text.split() for rank, text in rows.items()}
    assert set(cells) == set(range(RANKS))
    assert cells[SLOW] == ["9"] * 4 and cells[0] == ["0"] * 4
    order = [int(cells[r][1]) for r in range(RANKS) if r != SLOW]  # step 1: no cursor there
    assert order == sorted(order) and order[-1] > order[0]
    assert "0123456789" in legend[0]


def test_the_text_report_reads_without_colour(run: Path) -> None:
    """NO_COLOR beats FORCE_COLOR in the text report: no colour codes at all, and the phases
    still read, by the letters of the breakdown bars (F: forward) and their names."""
    coloured = run_cli("report", run, env={"FORCE_COLOR": "1"})
    plain = run_cli("report", run, env={"FORCE_COLOR": "1", "NO_COLOR": "1"})
    assert coloured.code == plain.code == 0, plain.err
    colour = re.compile(r"\x1b\[(?:[0-9;]*;)?(?:3[0-8]|4[0-8]|9[0-7]|10[0-7])(?:;[0-9;]*)?m")
    assert colour.search(coloured.out)  # (the check sees colour where there is some)
    assert not colour.search(plain.out)
    text = re.sub(r"\x1b\[[0-9;]*m", "", plain.out)
    assert re.search(r"forward .*F{3,}", text)
