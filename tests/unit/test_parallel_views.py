"""Issue 32's views of jobs beyond data parallelism, on hand-made inputs (the figures worked
out here): export's group columns and tables. Real jobs: tests/live/test_parallel_views.py."""

from __future__ import annotations

from typing import Any

import msgspec
import pyarrow as pa

from tests.tui_models import mesh_report, pipeline_report
from traceview.analysis.groups import Groups, with_group_columns
from traceview.model import schema as S
from traceview.model.results import ProcessGroup
from traceview.views import export


def _calls(groups: list[str | None]) -> pa.Table:
    n = len(groups)
    return pa.table(
        {
            S.RANK: pa.array([0] * n, pa.int32()),
            S.GROUP: pa.array(groups, pa.string()),
            S.START_NS: pa.array(range(n), pa.int64()),
        }
    )


def test_each_call_gets_its_groups_dimension_and_ranks_and_null_where_undeclared() -> None:
    groups = Groups(
        [
            ProcessGroup(name="3", desc="mesh_tp", dim="tp", ranks=[0, 1]),
            ProcessGroup(name="0", desc="default_pg", dim=None, ranks=[0, 1, 2, 3]),
        ]
    )
    out = with_group_columns(_calls(["3", "0", "9", None, "3"]), groups)
    assert out.column(S.DIM).to_pylist() == ["tp", None, None, None, "tp"]
    assert out.column(S.GROUP_RANKS).to_pylist() == [[0, 1], [0, 1, 2, 3], None, None, [0, 1]]
    assert (
        out.schema.field(S.GROUP_RANKS).type
        == S.EXPORT_COLLECTIVES_SCHEMA.field(S.GROUP_RANKS).type
    )
    # a run that declares no group: the columns are there, null
    bare = with_group_columns(_calls(["0", None]), Groups())
    assert bare.column(S.DIM).null_count == bare.column(S.GROUP_RANKS).null_count == 2


def test_comm_by_group_and_pipeline_stages_tables_hold_the_reports_rows() -> None:
    report = mesh_report()
    tables = export.report_tables(report)
    assert set(tables) == {"comm_by_group"}  # no pipeline: no stages table
    table = tables["comm_by_group"]
    assert table.schema == S.COMM_BY_GROUP_SCHEMA
    assert table.to_pylist() == [row.to_builtins() for row in report.comm_by_group]

    piped = export.report_tables(pipeline_report())
    stages = piped["pipeline_stages"]
    assert stages.schema == S.PIPELINE_STAGES_SCHEMA
    assert stages.to_pylist() == [
        {"stage": 0, "ranks": [0], "compute_ms": 32.0, "bubble_ms": 68.0, "transfer_ms": 0.4,
         "schedule": "GPipe", "microbatches": 4.0},
        {"stage": 1, "ranks": [1], "compute_ms": 80.0, "bubble_ms": 20.0, "transfer_ms": 0.4,
         "schedule": "GPipe", "microbatches": 4.0},
    ]  # fmt: skip


def test_a_data_parallel_report_adds_no_pipeline_table() -> None:
    from tests.tui_models import straggler_report

    assert export.report_tables(straggler_report()) == {}


def test_csv_writes_a_list_as_a_json_array() -> None:
    table = pa.table({"ranks": pa.array([[0, 2], None, []], pa.list_(pa.int32()))})
    assert export._plain(table).column("ranks").to_pylist() == ["[0, 2]", None, "[]"]


# --- compare ---------------------------------------------------------------------------------


def _compare(*reports: Any) -> Any:
    from traceview.analysis.compare import compare

    return compare(list(reports), [pa.table({})] * len(reports), ["a", "b"][: len(reports)])


def test_compare_puts_each_dimensions_communication_side_by_side() -> None:
    """Two 2-D mesh runs: a dimension's row is the mean of its groups' (dp all-gathers in
    forward: 12.1 and 11.8 ms, 11.95), matched by dimension, phase and op (group names differ
    between runs); b's tp all-reduces take twice a's, which a highlight says."""
    a = mesh_report()
    tp = [
        msgspec.structs.replace(c, total_ms=c.total_ms * 2, exposed_ms=c.exposed_ms * 2)
        if c.dim == "tp"
        else c
        for c in a.comm_by_group
    ]
    b = msgspec.structs.replace(a, comm_by_group=tp[:-1])  # b lacks group 4's all-reduces
    result = _compare(a, b)
    rows = {r.label(): r for r in result.comm_by_group}
    dp = rows["dp allgather in forward"]
    assert dp.total_ms == [11.95, 11.95] and dp.ratio == [1.0, 1.0]
    assert dp.exposed_ms == [2.3, 2.3] and dp.wait_ms == [0.95, 0.95]
    tp_row = rows["tp allreduce in forward"]
    assert tp_row.total_ms == [3.1, 6.0]  # a: (3.0 + 3.2) / 2; b: group 3 alone, 2 x 3.0
    assert tp_row.ratio == [1.0, round(6.0 / 3.1, 3)]
    assert next(iter(rows)) == "dp allgather in forward"  # the largest first
    assert any("b's tp allreduce in forward takes 1.9× a's" in h for h in result.highlights)


def test_compare_pipelines_side_by_side_and_says_when_the_bubble_grows() -> None:
    a = pipeline_report()
    assert a.pipeline is not None
    stages = [msgspec.structs.replace(s, bubble_ms=s.bubble_ms / 4) for s in a.pipeline.stages]
    balanced = msgspec.structs.replace(a.pipeline, stages=stages, bubble_fraction=0.22)
    result = _compare(a, msgspec.structs.replace(a, pipeline=balanced))
    assert [r.pipeline for r in result.runs] == [a.pipeline, balanced]
    assert "a's pipeline bubble is 44% of the stages' time against b's 22%" not in result.highlights
    assert any(
        h.startswith("b's pipeline bubble is 22% of the stages' time against a's 44%")
        for h in result.highlights
    )
    text = _text(result)
    assert "bubble share (ideal)  44% (20%)  22% (20%)" in text
    assert "stage 0 bubble            68.00      17.00  ×0.25" in text


def test_compare_of_data_parallel_runs_adds_nothing() -> None:
    """Data-parallel runs (one kind of communication, no pipeline): no rows by group, no
    pipeline, and the text has neither section."""
    from tests.tui_models import straggler_report

    result = _compare(straggler_report(), straggler_report())
    assert result.comm_by_group == [] and all(r.pipeline is None for r in result.runs)
    text = _text(result)
    assert "Communication by group" not in text and "Pipeline" not in text


def _text(result: Any) -> str:
    import io

    from rich.console import Console

    from traceview.views.text import render_comparison

    out = io.StringIO()
    render_comparison(result, Console(file=out, width=100, no_color=True))
    return out.getvalue()


def test_a_pipeline_with_a_stage_without_a_trace_counts_it_in_its_depth() -> None:
    """Four stages, stage 2's trace missing: three are listed, the header says four and names
    the one without a trace (not "3 stages"); a pipeline read whole says nothing more."""
    from traceview.views.style import pipeline_text

    whole = pipeline_report().pipeline
    assert whole is not None
    assert pipeline_text(whole).plain.startswith("pipeline: 2 stages × 4 micro-batches (GPipe);")
    stage = whole.stages[0]
    listed = [msgspec.structs.replace(stage, stage=k, ranks=[k]) for k in (0, 1, 3)]
    missing = msgspec.structs.replace(whole, stages=listed, stage_count=4)
    assert missing.depth == 4 and missing.untraced == [2]
    text = pipeline_text(missing).plain
    assert text.startswith("pipeline: 4 stages (stage 2 without a trace) × 4 micro-batches"), text
    assert [line.split(" (")[0].strip() for line in text.splitlines()[1:]] == [
        "stage 0", "stage 1", "stage 3",
    ]  # fmt: skip
