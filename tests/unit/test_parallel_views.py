"""Issue 32's views of jobs beyond data parallelism, on hand-made inputs (the figures worked
out here): export's group columns and tables. Real jobs: tests/live/test_parallel_views.py."""

from __future__ import annotations

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
