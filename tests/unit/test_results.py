"""The result model is the one contract: its JSON Schema only grows, every output reads back into
its struct, and the text report, ``--json`` and the TUI say the same thing about every run."""

from __future__ import annotations

import asyncio
import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tests.conftest import REPO, SAMPLES
from tests.golden.cases import SAMPLE_CASES, golden_diff, golden_path
from traceview.model.results import (
    JSON_RESULTS,
    Breakdown,
    Comparison,
    RunReport,
    Scaling,
    from_json,
    json_schema,
)

SCHEMAS = REPO / "docs" / "schema"


def schema_breaks(published: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """How ``current`` breaks a consumer of ``published``: a definition or key dropped, a key
    retyped or no longer required, an enumerated value dropped. Additions break nothing."""
    breaks: list[str] = []

    def walk(old: Any, new: Any, where: str) -> None:
        if isinstance(old, dict) and isinstance(new, dict):
            if "enum" in old:
                gone = set(old["enum"]) - set(new.get("enum", []))
                if gone:
                    breaks.append(f"{where}: values {sorted(gone)} dropped")
                return
            for key in ("type", "$ref"):
                if old.get(key) != new.get(key):
                    breaks.append(f"{where}: {key} {old.get(key)!r} is now {new.get(key)!r}")
            for key in set(old.get("required", [])) - set(new.get("required", [])):
                breaks.append(f"{where}: {key!r} no longer required")
            for key, value in old.get("properties", {}).items():
                if key not in new.get("properties", {}):
                    breaks.append(f"{where}.{key}: dropped")
                else:
                    walk(value, new["properties"][key], f"{where}.{key}")
            for key in ("items", "additionalProperties"):
                if key in old:
                    walk(old[key], new.get(key), f"{where}[{key}]")
            if "anyOf" in old:
                old_types = [json.dumps(o, sort_keys=True) for o in old["anyOf"]]
                new_types = [json.dumps(o, sort_keys=True) for o in new.get("anyOf", [])]
                for option in set(old_types) - set(new_types):
                    breaks.append(f"{where}: no longer accepts {option}")
        elif old != new:
            breaks.append(f"{where}: {old!r} is now {new!r}")

    for name, definition in published.get("$defs", {}).items():
        if name not in current.get("$defs", {}):
            breaks.append(f"$defs.{name}: dropped")
        else:
            walk(definition, current["$defs"][name], name)
    return breaks


def _by_meaning(node: Any) -> Any:
    """A schema with every description's whitespace collapsed and the options of an ``anyOf`` in
    one order: how a generator lays out a docstring or lists a union is not part of the contract;
    keys, types, requiredness and words are."""
    if isinstance(node, dict):
        meant = {
            key: " ".join(value.split())
            if key == "description" and isinstance(value, str)
            else _by_meaning(value)
            for key, value in node.items()
        }
        if isinstance(meant.get("anyOf"), list):
            meant["anyOf"] = sorted(meant["anyOf"], key=lambda o: json.dumps(o, sort_keys=True))
        return meant
    if isinstance(node, list):
        return [_by_meaning(value) for value in node]
    return node


@pytest.mark.parametrize("command", sorted(JSON_RESULTS))
def test_published_json_schema_still_holds(command: str) -> None:
    published = json.loads((SCHEMAS / f"{command}.schema.json").read_text())
    current = json_schema(command)
    breaks = schema_breaks(published, current)
    assert not breaks, (
        f"`{command} --json` no longer matches docs/schema/{command}.schema.json: "
        + "; ".join(breaks)
    )
    if _by_meaning(current) != _by_meaning(published):
        pytest.fail(
            f"keys were added to `{command} --json`: regenerate the published schema "
            f"(traceview schema {command} > docs/schema/{command}.schema.json)"
        )


def test_a_reworded_description_is_a_change_a_reflowed_one_is_not() -> None:
    published = json_schema("report")
    reflowed = copy.deepcopy(published)
    summary = reflowed["$defs"]["Summary"]
    summary["description"] = "\n    ".join(summary["description"].split(" "))
    assert _by_meaning(reflowed) == _by_meaning(published)
    summary["description"] += " Changed."
    assert _by_meaning(reflowed) != _by_meaning(published)


def test_the_schema_check_catches_a_dropped_or_retyped_key() -> None:
    published = json_schema("report")
    dropped = copy.deepcopy(published)
    del dropped["$defs"]["Summary"]["properties"]["straggler_rank"]
    assert schema_breaks(published, dropped) == ["Summary.straggler_rank: dropped"]
    retyped = copy.deepcopy(published)
    retyped["$defs"]["Breakdown"]["properties"]["comm"] = {"type": "string"}
    assert schema_breaks(published, retyped) == ["Breakdown.comm: type 'number' is now 'string'"]
    fewer = copy.deepcopy(published)
    fewer["$defs"]["Summary"]["properties"]["hidden"]["enum"].remove("partly")
    assert schema_breaks(published, fewer) == ["Summary.hidden: values ['partly'] dropped"]
    assert schema_breaks(dropped, published) == [], "adding a key breaks nothing"


def test_breakdown_fields_are_the_phases_in_report_order() -> None:
    from traceview.model import schema as S

    assert Breakdown.__struct_fields__ == S.BREAKDOWN_PHASES
    from traceview.model.results import HostBound

    assert HostBound.__struct_fields__ == S.GPU_HOST_BOUND_PHASES
    b = Breakdown(io=1.0, comm=2.0)
    assert b["comm"] == 2.0 and b.total() == 3.0
    with pytest.raises(KeyError):
        b["not_a_phase"]


def test_the_results_phase_literals_are_the_schemas_phases() -> None:
    """``results`` restates the schema's phases as JSON enums: tied here, so that a phase added
    to one is added to the other."""
    from typing import get_args

    from traceview.model import results
    from traceview.model import schema as S

    assert get_args(results.Phase) == S.BREAKDOWN_PHASES
    assert get_args(results.BottleneckPhase) == (
        *S.BOTTLENECK_PHASES,
        "imbalance",
        "pipeline",
        "dispatch",
    )
    assert get_args(results.StragglerPhase) == (*S.BOTTLENECK_PHASES[:-1], S.OTHER)


@pytest.mark.parametrize("name", sorted(SAMPLE_CASES))
def test_every_output_reads_back_into_its_struct(name: str) -> None:
    """Each golden output decodes into its struct (types and enumerations checked by msgspec)
    and encodes back to the same JSON (a field added since, holding nothing, aside: goldens
    grow, ``golden_diff``)."""
    kind = {"report": RunReport, "compare": Comparison, "scaling": Scaling}[SAMPLE_CASES[name][0]]
    data = json.loads(golden_path(name).read_text())["json"]
    # the golden leaves out what differs between ingests; give it back for the round trip
    if kind is RunReport:
        data["run"].update(path=None, run_id="x")
    result = from_json(json.dumps(data), kind)
    assert golden_diff(json.loads(result.to_json()), data) == []


# --- one verdict, three views -------------------------------------------------------------------

SAMPLE_RUNS = sorted(
    p.parent.relative_to(SAMPLES).as_posix()
    for p in SAMPLES.rglob("groundtruth.json")
    if any(p.parent.glob("rank-*"))
)


def _text_report(report: RunReport) -> str:
    from traceview.views.text import render

    out = io.StringIO()
    render(report, Console(file=out, width=160, highlight=False, markup=False, emoji=False))
    return out.getvalue()


def _tui_screens(run: Any) -> dict[str, str]:
    from textual.widgets import DataTable, Static

    from tests.tui_helpers import loaded
    from traceview.tui.app import TraceviewApp
    from traceview.tui.overview import RankBars

    seen: dict[str, str] = {}

    async def go() -> None:
        app = TraceviewApp([run])
        async with app.run_test(size=(160, 60)) as pilot:
            await loaded(pilot)
            seen["verdict"] = str(app.query_one("#verdict", Static).render())
            seen["notes"] = str(app.query_one("#notes", Static).render())
            seen["bars"] = str(app.query_one(RankBars).render())
            await pilot.press("4")
            table = app.query_one("#ranks-table", DataTable)
            seen["ranks"] = "\n".join(str(table.get_row_at(i)[0]) for i in range(table.row_count))

    asyncio.run(go())
    return seen


def test_top_ops_mean_is_per_call_from_the_ops_table(ddp: Any) -> None:
    """mean_ms is the operator's total time over its calls (all ranks), as the ops table says."""
    import polars as pl

    ops = pl.from_arrow(ddp.ops)
    assert isinstance(ops, pl.DataFrame)
    for op in ddp.report(5).top_ops:
        rows = ops.filter(
            (pl.col("op") == op.op) & (pl.col("phase") == op.phase) & (pl.col("device") == op.device)
            & pl.col("kind").is_in(["op", "kernel", "memcpy", "memset"])
        )  # fmt: skip
        expected = rows["total_ns"].sum() / rows["count"].sum() / 1e6
        assert op.mean_ms == pytest.approx(expected, abs=0.0005)


def test_a_rank_without_steps_is_named_not_silently_left_out(tmp_path: Path) -> None:
    """Rank 1's trace holds only an instant event: no step window, so no figures; the report
    says so instead of showing one rank as if it were the whole run."""
    import gzip

    from traceview.runs import ingest_run, open_run

    folder = tmp_path / "traces"
    folder.mkdir()
    source = SAMPLES / "pytorch" / "ddp" / "rank-0.pt.trace.json.gz"
    (folder / "rank-0.json").write_bytes(gzip.decompress(source.read_bytes()))
    (folder / "rank-1.json").write_text(
        json.dumps(
            {
                "schemaVersion": 1,
                "distributedInfo": {"rank": 1, "world_size": 2},
                "traceEvents": [{"ph": "i", "name": "marker", "pid": 1, "tid": 1, "ts": 1.0}],
            }
        )
    )
    with open_run([ingest_run([folder], tmp_path / "run")]) as run:
        report = run.report()
    assert [r.rank for r in report.ranks] == [0]
    assert any("rank(s) 1: events but no step window" in w for w in report.warnings)
