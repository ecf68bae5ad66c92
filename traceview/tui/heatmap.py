"""A ranks × steps heatmap: one coloured cell per rank and step, of the step time or one phase,
with the colour step's digit (0-9) in it, so that it reads without colour as well.

Only the rows on screen are drawn (Textual's line API), so 1,024 ranks by hundreds of steps
scroll as smoothly as ten. The colour scale runs from the metric's 5th to its 95th percentile
over the whole matrix, so one outlier does not wash the rest out; the arrow keys move a cursor
whose value the pane's summary line reads out.
"""

from __future__ import annotations

from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from traceview.analysis.heatmap import METRICS, StepMatrix, level

#: Colour steps, cool to hot (xterm-256 colours, readable on dark and light terminals).
PALETTE = (17, 19, 25, 31, 37, 107, 142, 178, 208, 196)
#: Each colour step's digit, written in its cell: the map reads without colour too (NO_COLOR,
#: a monochrome terminal, colour blindness), 0 the lowest tenth of the scale, 9 the highest.
DIGITS = tuple(str(i) for i in range(len(PALETTE)))
#: The digits' text: white on the dark colours, black on the light ones.
INK = tuple("white" if i < 5 else "black" for i in range(len(PALETTE)))
LABEL = 8  # "  1023* " : the rank, right-aligned, and the straggler mark
CELL = 3


class Heatmap(ScrollView, can_focus=True):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "move(0, -1)", "Up", show=False),
        Binding("down", "move(0, 1)", "Down", show=False),
        Binding("left", "move(-1, 0)", "Left", show=False),
        Binding("right", "move(1, 0)", "Right", show=False),
        Binding("pageup", "move(0, -20)", show=False),
        Binding("pagedown", "move(0, 20)", show=False),
        Binding("home", "move(-100000, 0)", show=False),
        Binding("end", "move(100000, 0)", show=False),
    ]

    class Moved(Message):
        """The cursor moved (or the metric changed): the summary line reads the cell out."""

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.matrix: StepMatrix | None = None
        self.metric = METRICS[0]
        self.rows: list[int] = []  # matrix rows in display order
        self.marked: set[int] = set()  # ranks to mark (the straggler)
        self.cursor = (0, 0)  # (column, display row)

    def show(self, matrix: StepMatrix | None, order: list[int], marked: set[int]) -> None:
        """``order``: the ranks in the order to show them (the ranks table's sort)."""
        self.matrix = matrix
        self.marked = marked
        if matrix is not None:
            index = {rank: i for i, rank in enumerate(matrix.ranks)}
            self.rows = [index[r] for r in order if r in index]
            self.virtual_size = Size(LABEL + CELL * len(matrix.steps), len(self.rows))
        self.cursor = (0, 0)
        self.refresh()
        self.post_message(self.Moved())

    def cycle_metric(self) -> None:
        self.metric = METRICS[(METRICS.index(self.metric) + 1) % len(METRICS)]
        self.refresh()
        self.post_message(self.Moved())

    def cell(self) -> tuple[int, int | None, float] | None:
        """(rank, step, ms) under the cursor."""
        if self.matrix is None or not self.rows:
            return None
        column, row = self.cursor
        matrix_row = self.rows[row]
        value = self.matrix.value(self.metric, matrix_row, column)
        return self.matrix.ranks[matrix_row], self.matrix.steps[column], value

    def action_move(self, dx: int, dy: int) -> None:
        if self.matrix is None or not self.rows:
            return
        column = min(max(self.cursor[0] + dx, 0), len(self.matrix.steps) - 1)
        row = min(max(self.cursor[1] + dy, 0), len(self.rows) - 1)
        self.cursor = (column, row)
        height = self.scrollable_content_region.height
        if row < self.scroll_offset.y:
            self.scroll_to(y=row, animate=False)
        elif row >= self.scroll_offset.y + height:
            self.scroll_to(y=row - height + 1, animate=False)
        width = self.scrollable_content_region.width - LABEL
        x = column * CELL
        if x < self.scroll_offset.x:
            self.scroll_to(x=x, animate=False)
        elif x + CELL > self.scroll_offset.x + width:
            self.scroll_to(x=x + CELL - width, animate=False)
        self.refresh()
        self.post_message(self.Moved())

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        row = y + round(self.scroll_offset.y)
        matrix = self.matrix
        if matrix is None or row >= len(self.rows) or width <= 0:
            return Strip.blank(width, self.rich_style)
        matrix_row = self.rows[row]
        rank = matrix.ranks[matrix_row]
        mark = "*" if rank in self.marked else " "
        label = f"{rank:>{LABEL - 2}}{mark} "[:LABEL]
        segments = [Segment(label, Style(bold=rank in self.marked, reverse=row == self.cursor[1]))]
        low, high = matrix.low_ms[self.metric], matrix.high_ms[self.metric]
        cells: list[Segment] = []
        for column in range(len(matrix.steps)):
            value = matrix.value(self.metric, matrix_row, column)
            step = level(value, low, high, len(PALETTE))
            here = (column, row) == self.cursor
            if step is None:  # this rank has no such step (it died, or was cut off)
                cells.append(Segment(" · ", Style(dim=True, reverse=here)))
            else:
                digit = DIGITS[step]
                text = f"[{digit}]" if here else f" {digit} "
                style = Style(color=INK[step], bgcolor=f"color({PALETTE[step]})", bold=here)
                cells.append(Segment(text, style))
        x = round(self.scroll_offset.x)
        body = Strip(cells, CELL * len(matrix.steps)).crop(x, x + max(width - LABEL, 0))
        line = Strip([*segments, *body]).extend_cell_length(width).crop(0, width)
        return line.apply_style(self.rich_style)
