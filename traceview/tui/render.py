"""Rich ``Text`` pieces of the TUI: the shared view pieces (``views.style``) and timeline lanes."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import groupby

from rich.text import Text

from traceview.analysis.lanes import Cell
from traceview.model import schema as S
from traceview.model.results import GatherSpan
from traceview.views.style import (
    KERNEL_COLUMNS,
    KERNEL_NOTE,
    PHASE_LETTER,
    PHASE_STYLE,
    SHORT,
    communication_text,
    dimension_comm_text,
    failure_text,
    fsdp_text,
    gpu_rank_text,
    gpu_verdict_text,
    host_bound_text,
    incomplete_text,
    kernel_cells,
    kernel_rank,
    legend_text,
    ms,
    pct,
    phase_bar,
    phase_text,
    ratio_text,
    signed_pct,
    straggler_text,
    title_text,
    untrusted,
    verdict_text,
)

__all__ = [
    "BUBBLE",
    "GATHER_MARKS",
    "KERNEL_COLUMNS",
    "KERNEL_NOTE",
    "PHASE_LETTER",
    "PHASE_STYLE",
    "SHORT",
    "communication_text",
    "dimension_comm_text",
    "failure_text",
    "fsdp_text",
    "gather_cells",
    "gpu_rank_text",
    "gpu_verdict_text",
    "host_bound_text",
    "incomplete_text",
    "kernel_cells",
    "kernel_rank",
    "lane_cells",
    "legend_text",
    "ms",
    "pct",
    "phase_bar",
    "phase_text",
    "pipeline_cells",
    "ratio_text",
    "signed_pct",
    "straggler_text",
    "title_text",
    "untrusted",
    "verdict_text",
]


def _runs(cells: list[Cell]) -> Iterator[tuple[Cell, int]]:
    """Consecutive equal cells: each cell and how many in a row."""
    start = 0
    for i in range(1, len(cells) + 1):
        if i == len(cells) or cells[i] != cells[start]:
            yield cells[start], i - start
            start = i


def lane_cells(cells: list[Cell]) -> Text:
    """A timeline lane from its binned cells: a letter per phase, reversed where the phase fills
    the cell, plain where it fills part of it, '.' for idle time, blank where nothing runs."""
    text = Text(no_wrap=True)
    for cell, length in _runs(cells):
        if cell is None:
            text.append(" " * length)
        else:
            phase, solid = cell
            style = PHASE_STYLE[phase]
            if phase == S.IDLE:
                style = "bright_black"
            elif solid:
                style = f"reverse {style}"
            text.append(PHASE_LETTER[phase] * length, style=style)
    return text


#: A pipeline stage's bubble in a timeline cell: blocked on a neighbour, or idle.
BUBBLE = "░"
#: What a pipeline row draws as its stage's own work; the rest of the step is bubble.
_STAGE_WORK = (S.FORWARD, S.BACKWARD, S.UPDATE, S.IO, S.H2D, S.OTHER)


def pipeline_cells(cells: list[Cell], collective: list[bool] | None = None) -> Text:
    """A pipeline stage's lane: its own work (compute, data, other) as in ``lane_cells``, the
    rest (blocked in communication: waiting on a neighbour's message; idle) as bubble ░.
    ``collective``: per cell, whether a collective call of the stage (its data-parallel
    all-reduce, say) runs there: its communication is drawn as communication, not bubble (as
    the analysis leaves collectives out of the bubble)."""
    text = Text(no_wrap=True)
    marks = collective if collective is not None else [False] * len(cells)
    keyed = [(c, m and c is not None and c[0] == S.COMM) for c, m in zip(cells, marks, strict=True)]
    for (cell, in_collective), run in groupby(keyed):
        length = sum(1 for _ in run)
        if cell is not None and cell[0] not in _STAGE_WORK and not in_collective:
            text.append(BUBBLE * length, style="red")
        else:
            text.append_text(lane_cells([cell] * length))
    return text


#: How the FSDP view draws an all-gather's cells: in flight (prefetched, or gathered on
#: demand), its unit waiting for it (exposed), done before its unit used it (ready).
GATHER_MARKS = {
    "exposed": ("!", "bold white on red", "its unit waits for it"),
    "prefetched": ("g", "cyan", "prefetched gather in flight"),
    "on_demand": ("G", "yellow", "gathered on demand"),
    "ready": ("·", "green", "done before its use"),
}


def gather_cells(spans: list[GatherSpan], lo: int, hi: int, width: int) -> Text:
    """One FSDP unit's all-gathers over [lo, hi) in ``width`` cells: a cell shows the most
    telling thing that touches it: its unit waiting for a gather (from the use to the gather's
    end), a gather in flight (issue to end), or a gather done before its use (end to use)."""
    text = Text(no_wrap=True)
    if hi <= lo or width <= 0:
        return text
    step = (hi - lo) / width
    marks: list[str | None] = [None] * width
    order = list(GATHER_MARKS)

    def mark(kind: str, a: int, b: int) -> None:
        if b < lo or a >= hi:
            return
        first = max(int((a - lo) // step), 0)
        last = min(max(int(-((lo - b) // step)), first + 1), width)  # (a short one: a cell)
        for i in range(first, last):
            held = marks[i]
            if held is None or order.index(kind) < order.index(held):
                marks[i] = kind

    for g in spans:
        needed = g.needed_ns
        flight = "prefetched" if g.prefetched else "on_demand"
        if needed is not None and needed < g.end_ns:
            mark("exposed", max(needed, g.issued_ns), g.end_ns)
            mark(flight, g.issued_ns, max(needed, g.issued_ns))
        else:
            mark(flight, g.issued_ns, g.end_ns)
            if needed is not None:
                mark("ready", g.end_ns, needed)
    for kind, run in groupby(marks):
        length = sum(1 for _ in run)
        if kind is None:
            text.append(" " * length)
        else:
            letter, style, _ = GATHER_MARKS[kind]
            text.append(letter * length, style=style)
    return text
