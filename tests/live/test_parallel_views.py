"""Issue 32's views of real jobs beyond data parallelism: export, the TUI and compare, held to
the jobs' own truth (the groups they built, their calls and their stage timers; the jobs and
their truth: tests/live/test_parallel_jobs.py).

The jobs run once per session (CPU, gloo, torchrun; about 15-60 s each); TV_PARALLEL_JOBS=DIR
reads DIR/<job>/{run,truth} made earlier instead, as test_parallel_jobs.py does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.conftest import run_cli
from tests.live.test_parallel_jobs import Job, declared_groups, job_maker, stage_truth

pytestmark = [pytest.mark.torch]


@pytest.fixture(scope="session")
def parallel_jobs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """job(name): that job of test_parallel_jobs.JOBS run once per session under collect."""
    return job_maker(tmp_path_factory)


def _export(job: Job, out: Path, fmt: str = "parquet") -> Path:
    result = run_cli("export", job.run, "--format", fmt, "-o", out)
    assert result.code == 0, result.err
    return out


# --- export ----------------------------------------------------------------------------------


def test_export_names_each_calls_group_dimension_and_ranks_as_the_mesh_job_built_them(
    parallel_jobs: Any, tmp_path: Path
) -> None:
    """collectives.parquet: every call of the 2-D mesh (dp 2 x tp 2) carries the group the job
    issued it in, that group's dimension and ranks; a matched call's group holds its rank, and
    the calls matched together in a group (one step, view and position) are its ranks' own."""
    job = parallel_jobs("mesh2d")
    out = _export(job, tmp_path / "out")
    calls = pl.read_parquet(out / "collectives.parquet")
    built = {g["name"]: g for g in declared_groups(job)}
    used = calls.select("group", "dim", "group_ranks").unique().sort("group")
    assert used.height >= 4  # two dp groups and two tp groups
    for name, dim, ranks in used.iter_rows():
        assert dim == built[name]["dim"] and ranks == built[name]["ranks"], name
    # the job's own calls: which ranks issued which op in which group
    issued = job.timers.filter(pl.col("name") == "call").select("rank", "op", "group").unique()
    exported = (
        calls.filter(pl.col("view") == "host")
        .select("rank", pl.col("collective").alias("op"), "group")
        .unique()
    )
    assert sorted(exported.rows()) == sorted(issued.rows())
    matched = calls.filter("matched")
    assert matched.height > 0
    assert matched.select(pl.col("group_ranks").list.contains(pl.col("rank")).all()).item()
    spans = matched.group_by("step", "name", "collective", "position", "group").agg(
        pl.col("rank").sort()
    )
    for ranks, group in spans.select("rank", "group").iter_rows():
        assert ranks == built[group]["ranks"], (group, ranks)


def test_export_comm_by_group_is_the_reports_and_counts_the_jobs_calls(
    parallel_jobs: Any, tmp_path: Path
) -> None:
    """comm_by_group.parquet holds report --json's rows (same steps), whose calls per step per
    group, phase and op are those the job issued (its timers); csv writes the same rows."""
    job = parallel_jobs("mesh2d")
    table = pl.read_parquet(_export(job, tmp_path / "pq") / "comm_by_group.parquet")
    report = job.report()["comm_by_group"]
    assert table.to_dicts() == report
    calls = job.recorded("call")
    expected = (
        calls.group_by("rank", "tstep", "group", "phase", "op")
        .agg(pl.len().alias("n"))
        .group_by("group", "phase", "op")
        .agg(pl.col("n").mean())
    )
    rows = {(r["group"], r["phase"], r["op"]): r for r in table.to_dicts()}
    for group, phase, op, n in expected.iter_rows():
        assert rows[(group, phase, op)]["calls_per_step"] == pytest.approx(n), (group, phase, op)
    csv = pl.read_csv(_export(job, tmp_path / "csv", "csv") / "comm_by_group.csv")
    assert csv["ranks"].to_list() == [str(r["ranks"]) for r in report]


def test_export_pipeline_stages_bubble_matches_the_stage_timers(
    parallel_jobs: Any, tmp_path: Path
) -> None:
    """pipeline_stages.parquet of the 2-stage GPipe job whose stage 1 does extra forward work:
    one row per stage, its bubble and compute within 15% of the stage's timers (schedule wall
    time minus its own forward, loss and backward); a data-parallel-only run has no such
    table."""
    job = parallel_jobs("gpipe2-slow")
    stages = pl.read_parquet(_export(job, tmp_path / "out") / "pipeline_stages.parquet")
    truth = stage_truth(job)
    assert stages["stage"].to_list() == [0, 1]
    assert stages["ranks"].to_list() == [[0], [1]]
    assert set(stages["schedule"]) == {"GPipe"} and set(stages["microbatches"]) == {4.0}
    for s, t in zip(stages.iter_rows(named=True), truth.iter_rows(named=True), strict=True):
        assert s["bubble_ms"] == pytest.approx(t["bubble"], rel=0.15, abs=1.0), (s, t)
        assert s["compute_ms"] == pytest.approx(t["compute"], rel=0.15, abs=1.0), (s, t)
    mesh = _export(parallel_jobs("mesh2d"), tmp_path / "mesh")
    assert not (mesh / "pipeline_stages.parquet").exists()


# --- the TUI -----------------------------------------------------------------------------------


def _tui(job: Job, scenario: Any, size: tuple[int, int] = (160, 40)) -> None:
    from tests.tui_helpers import play
    from traceview.runs import open_run
    from traceview.tui.app import TraceviewApp

    with open_run([job.run]) as run:
        play(TraceviewApp([run]), scenario, size)


def test_tui_groups_the_mesh_jobs_ranks_by_the_groups_it_built(parallel_jobs: Any) -> None:
    """Ranks screen of the dp 2 x tp 2 job: its ranks under the dp groups the job built, then
    (g) under its tp groups."""
    from textual.widgets import DataTable

    from tests.tui_helpers import settle

    job = parallel_jobs("mesh2d")
    built = declared_groups(job)
    expected = {dim: sorted(g["ranks"] for g in built if g["dim"] == dim) for dim in ("dp", "tp")}
    seen: dict[str, list[list[int]]] = {}

    async def scenario(app: Any, pilot: Any) -> None:
        await pilot.press("4")
        for dim in ("dp", "tp"):
            await settle(pilot)
            table = app.query_one("#ranks-table", DataTable)
            groups: list[list[int]] = []
            for i in range(table.row_count):
                cell = str(table.get_row_at(i)[0])
                if cell.startswith(f"{dim} "):
                    groups.append([])
                else:
                    groups[-1].append(int(cell.rstrip("*")))
            seen[dim] = sorted(sorted(g) for g in groups)
            await pilot.press("g")

    _tui(job, scenario)
    assert seen == expected


def test_tui_pipeline_view_draws_each_stages_bubble_as_its_timers_find_it(
    parallel_jobs: Any,
) -> None:
    """The timeline's pipeline view (p) of the 2-stage GPipe job whose stage 1 does extra
    forward work: a row per stage in stage order; the share of each row drawn as bubble (░),
    over the recorded steps, within 0.1 of the stage's bubble over its schedule time (timers)."""
    from tests.tui_helpers import settle
    from traceview.tui.timeline import Timeline

    job = parallel_jobs("gpipe2-slow")
    truth = stage_truth(job)
    drawn: dict[int, list[float]] = {0: [], 1: []}
    labels: list[str] = []

    async def scenario(app: Any, pilot: Any) -> None:
        await pilot.press("2", "p")
        await settle(pilot)
        timeline = app.query_one(Timeline)
        for index in range(len(timeline.view.step_numbers)):
            timeline.step_index = index
            timeline._update_rows()
            timeline._compute()
            await settle(pilot)
            width, label = timeline.bar_width(), timeline.label_width()
            for y, row in enumerate(timeline.rows):
                line = timeline.render_line(y).text
                labels.append(line[:label].strip())
                bar = line[label + 1 :][:width].strip()  # (the rank's own window on the clock)
                drawn[row.rank].append(bar.count("░") / max(len(bar), 1))

    _tui(job, scenario)
    assert labels[0].startswith("stage 0 r0") and labels[1].startswith("stage 1* r1")
    for stage, timers in enumerate(truth.iter_rows(named=True)):
        share = sum(drawn[stage]) / len(drawn[stage])
        print(
            f"stage {stage}: drawn bubble {share:.3f}, timers {timers['bubble'] / timers['schedule']:.3f}"
        )
        assert share == pytest.approx(timers["bubble"] / timers["schedule"], abs=0.1)


# --- compare -----------------------------------------------------------------------------------


def test_compare_two_pipelines_stage_by_stage_as_their_timers(parallel_jobs: Any) -> None:
    """compare --json of the 2-stage GPipe job whose stage 1 does extra forward work against
    the balanced one: each run's stages' compute and bubble within 15% of that job's stage
    timers, plus the stage's Python that runs no operator (its idle, which the trace counts as
    bubble and the timers partly as compute: as tests/live/test_parallel_jobs.py holds the
    report's; a 11.25 ms bubble read 12.96 ms without it); the communication by group and phase
    lists the pairs' sends and receives of both; the text puts the pipelines side by side."""
    slow, balanced = parallel_jobs("gpipe2-slow"), parallel_jobs("gpipe2-balanced")
    result = run_cli(
        "compare", slow.run, balanced.run, "--label", "slow", "--label", "even", "--json"
    )
    assert result.code == 0, result.err
    comparison = result.json()
    for run, job in zip(comparison["runs"], (slow, balanced), strict=True):
        truth = stage_truth(job)
        stages = run["pipeline"]["stages"]
        idle = {r["rank"]: r["breakdown_ms"]["idle"] for r in job.report()["ranks"]}
        for s, t in zip(stages, truth.iter_rows(named=True), strict=True):
            unplaced = sum(idle[r] for r in s["ranks"]) / len(s["ranks"])
            for kind in ("compute", "bubble"):
                slack = max(0.15 * t[kind], 1.0) + unplaced
                assert abs(s[f"{kind}_ms"] - t[kind]) <= slack, (job.name, s, t, unplaced)
    ops = {(r["op"], r["phase"]) for r in comparison["comm_by_group"]}
    assert {op for op, _ in ops} == {"send", "recv"}
    assert all(None not in r["total_ms"] for r in comparison["comm_by_group"])
    text = run_cli("compare", slow.run, balanced.run, "--label", "slow", "--label", "even")
    assert text.code == 0, text.err
    assert "Pipeline (ms per step)" in text.out and "stage 1 compute" in text.out
    assert "Communication by group and phase" in text.out
