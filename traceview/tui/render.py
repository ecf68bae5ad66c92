"""Rich ``Text`` pieces of the TUI: the shared view pieces (``views.style``) and timeline lanes."""

from __future__ import annotations

from rich.text import Text

from traceview.analysis.lanes import Cell
from traceview.model import schema as S
from traceview.views.style import (
    KERNEL_COLUMNS,
    KERNEL_NOTE,
    PHASE_LETTER,
    PHASE_STYLE,
    SHORT,
    communication_text,
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
    "KERNEL_COLUMNS",
    "KERNEL_NOTE",
    "PHASE_LETTER",
    "PHASE_STYLE",
    "SHORT",
    "communication_text",
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
    "ratio_text",
    "signed_pct",
    "straggler_text",
    "title_text",
    "untrusted",
    "verdict_text",
]


def lane_cells(cells: list[Cell]) -> Text:
    """A timeline lane from its binned cells: a letter per phase, reversed where the phase fills
    the cell, plain where it fills part of it, '.' for idle time, blank where nothing runs."""
    text = Text(no_wrap=True)
    start = 0
    for i in range(1, len(cells) + 1):
        if i < len(cells) and cells[i] == cells[start]:
            continue
        cell, length = cells[start], i - start
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
        start = i
    return text
