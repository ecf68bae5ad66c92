"""The HTML page's sections from report objects alone (no run): a pipeline's stages and a mesh's
groups drawn with their numbers, hostile names in every kind of cell escaped, and a figure's
parts adding up to the number it stands for."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest

from tests.html_page import HOSTILE, MARKUP, OUTSIDE, read_page
from tests.tui_models import mesh_report, pipeline_report, straggler_report
from traceview.model.results import RunReport
from traceview.views.html import render_html


def page_of(report, tmp_path):  # type: ignore[no-untyped-def]
    out = tmp_path / "page.html"
    out.write_text(render_html(report))
    return read_page(out), out.read_text()


def test_a_pipeline_draws_each_stage_with_its_compute_and_bubble(tmp_path) -> None:  # type: ignore[no-untyped-def]
    report = pipeline_report()
    page, text = page_of(report, tmp_path)
    assert report.pipeline is not None and "pipeline" in page.sections
    for stage in report.pipeline.stages:
        row = page.row("pipeline", str(stage.stage))
        assert row["compute"].value == pytest.approx(stage.compute_ms)
        assert row["bubble"].value == pytest.approx(stage.bubble_ms)
        # the bar's two parts, on hover, say the same figures
        assert f"stage {stage.stage}: bubble {stage.bubble_ms:.2f} ms" in text


def test_a_mesh_draws_each_groups_communication(tmp_path) -> None:  # type: ignore[no-untyped-def]
    report = mesh_report()
    page, _ = page_of(report, tmp_path)
    rows = page.tables["comm-by-group"]
    assert len(rows) == len(report.comm_by_group)
    for row, group in zip(rows, report.comm_by_group, strict=True):
        assert row[0].text == (group.group or "default") and row[3].text == group.op
        assert row[5].value == pytest.approx(group.total_ms)
        assert row[6].value == pytest.approx(group.exposed_ms)
        assert row[8].value == pytest.approx(group.wait_ms)


def test_every_kind_of_name_is_escaped(tmp_path) -> None:  # type: ignore[no-untyped-def]
    report = mesh_report()
    groups = [msgspec.structs.replace(g, group=HOSTILE, op=HOSTILE) for g in report.comm_by_group]
    report = msgspec.structs.replace(report, comm_by_group=groups, warnings=[HOSTILE],
                                     remarks=[HOSTILE])  # fmt: skip
    page, text = page_of(report, tmp_path)
    for markup in MARKUP:
        assert markup not in text
    assert text.count("<script>") == 1 and "\x1b" not in text
    assert page.tables["comm-by-group"][0][0].text.startswith("</script><script>window.__pwned")


def test_a_ranks_bar_is_its_phases_end_to_end(tmp_path) -> None:  # type: ignore[no-untyped-def]
    report = straggler_report()
    _, text = page_of(report, tmp_path)
    rank = report.ranks[0]
    # the rank's bar: one rect per phase with time, their widths in proportion to the ms
    bar = re.search(rf'<text class="label"[^>]*>rank {rank.rank}[ *]*</text>(.*?)</g>', text)
    assert bar is not None
    widths = [
        float(w) for w in re.findall(r'<rect class="k-(?:\w+)"[^>]* width="([\d.]+)"', bar[1])
    ]
    shown = [v for _, v in rank.breakdown_ms.items() if v > 0]
    assert len(widths) == len(shown)
    scale = widths[0] / shown[0]
    assert widths == pytest.approx([v * scale for v in shown], abs=0.11)


GOLDEN = sorted((Path(__file__).parents[1] / "golden").glob("report-*.json"))


@pytest.mark.parametrize("golden", GOLDEN, ids=[g.stem for g in GOLDEN])
def test_every_golden_report_draws_with_its_numbers(golden: Path, tmp_path: Path) -> None:
    """Every framework's report (the goldens: PyTorch CPU and GPU, TensorFlow, MXNet, Chainer)
    renders, and its headline and per-rank figures are in the page as the report has them."""
    said = json.loads(golden.read_text())["json"]
    said["run"].update(path=None, run_id=None)  # (left out of the goldens: they vary)
    report = msgspec.convert(said, RunReport)
    page, text = page_of(report, tmp_path)
    assert page.sections[0] == "verdict" and not OUTSIDE.search(text)
    if report.ranks:
        assert page.figures["step-ms"] == pytest.approx(report.summary.step_ms)
        for phase, value in report.summary.breakdown_ms.items():
            assert page.row("breakdown", phase)["ms"].value == pytest.approx(value)
        for rank in report.ranks:
            assert page.row("ranks", str(rank.rank))["step"].value == pytest.approx(rank.step_ms)
    assert ("memory" in page.sections) == (report.summary.memory is not None)
    assert ("pipeline" in page.sections) == (report.pipeline is not None)
    assert ("critical-path" in page.sections) == bool(
        report.critical_path and report.critical_path.segments
    )
