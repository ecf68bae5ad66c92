"""The report as one self-contained HTML file (``report --html``, ``export --format html``):
the verdict, then figures each beside the table of its numbers. Everything inline; every name
from a trace escaped."""

from __future__ import annotations

from pathlib import Path

from traceview.analysis.heatmap import StepMatrix
from traceview.model.results import RunReport
from traceview.views.html import sections as X
from traceview.views.html.page import page
from traceview.views.style import title_text


def render_html(
    report: RunReport, matrix: StepMatrix | None = None, generator: str = "traceview"
) -> str:
    """The page for ``report`` (``matrix``: the ranks × steps heatmap's values; ``generator``:
    what made it, with its version)."""
    drawn = [
        X.verdict(report),
        X.breakdown(report) if report.ranks else None,
        X.critical_path(report),
        X.communication(report) if report.ranks else None,
        X.servers(report),
        X.heatmap_section(report, matrix),
        X.pipeline(report),
        X.memory(report),
        X.whatif(report),
        X.operators(report),
        X.warnings(report),
    ]
    return page(
        title_text(report).plain,
        [s for s in drawn if s is not None],
        generator=generator,
    )


def write_html(
    report: RunReport, matrix: StepMatrix | None, out: Path, in_place: bool, generator: str
) -> int:
    """Write the page to ``out`` (atomically; a special file in place); returns its bytes."""
    from traceview.views.export import write_bytes

    data = render_html(report, matrix, generator).encode()
    write_bytes(out, data, in_place)
    return len(data)
