"""Overlap / timeline: one step drawn along time, a lane per rank, and per thread and stream.

The first lane of a rank is every instant of its step as the breakdown counts it (the exclusive
attribution); under the selected rank (or every rank, `e`) come its threads and GPU streams, so
one sees whether communication runs under backward or after it. Lanes are cut by
``analysis.lanes.rank_lanes`` in a worker thread, one rank at a time, and cached per
(rank, step); until a rank's lanes arrive its row says so.

``c`` picks one of the step's collectives matched across ranks (the most skewed first) and
marks each rank's arrival at it on the rank's row: ▼ where the last rank arrived, ▽ elsewhere;
the gap between the marks is what the others waited.

``x`` draws the step's critical path across ranks (analysis/critical_path/): the stretches of
each rank's row that lie on it are underlined; ``.`` and ``,`` step through its segments, the
chosen one marked and described in the header.

``p`` (a run whose point-to-point calls form a pipeline) shows the stages instead: a row per
stage and rank, in stage order, its every-instant lane drawn as compute (the phase's letter)
against bubble (░: blocked or idle, waiting on a neighbour), each row labelled with the stage's
bubble share of its step (analysis/pipeline.py).

``f`` (a run with FSDP's all-gathers) shows the selected rank's row and under it a row per FSDP
unit: its all-gathers along the step, in flight (g prefetched, G gathered on demand), its unit
waiting for one (!: exposed) and done before its use (·: ready ahead) (analysis/fsdp.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Static
from textual.worker import get_current_worker

from traceview.analysis.lanes import RankLanes, bin_lane, bin_memory, rank_lanes, window_read_span
from traceview.model.results import GatherSpan, PathStretch, StepCollective
from traceview.runs import Run
from traceview.tui.ending import EndingView
from traceview.tui.model import RunView, nice_ticks
from traceview.tui.render import (
    BUBBLE,
    GATHER_MARKS,
    gather_cells,
    lane_cells,
    legend_text,
    ms,
    pct,
    pipeline_cells,
    untrusted,
)
from traceview.views.style import ideal_share

MAX_ZOOM = 4096.0


@dataclass(frozen=True)
class Row:
    rank: int
    lane: int | None  # index into the rank's lanes; None: lanes not ready (or none); MEMORY
    unit: str | None = None  # the FSDP view's row of this unit's all-gathers (lane GATHERS)


#: Row.lane of a rank's memory lane (under its critical path, where it has memory records)
MEMORY = -1
#: Row.lane of an FSDP unit's all-gathers (the FSDP view)
GATHERS = -2
SPARKS = " ▁▂▃▄▅▆▇█"


def lane_role(label: str) -> str:
    """A thread or stream lane's label without its rank (the row above says it), the thread's
    name before its id so a narrow label column still shows it: ``rank 0 · thread 6299
    (pt_gloo_runloop)`` reads ``pt_gloo_runloop 6299``."""
    role = label.split(" · ", 1)[-1]
    if role.startswith("thread ") and role.endswith(")") and " (" in role:
        tid, _, name = role.removeprefix("thread ").partition(" (")
        return f"{name[:-1]} {tid}"
    return role


class Timeline(ScrollView, can_focus=True):
    """The lanes of one step. Owns the step, zoom, pan and rank selection."""

    DEFAULT_CSS = """
    Timeline { height: 1fr; overflow-x: hidden; overflow-y: auto; scrollbar-gutter: stable; }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left,h", "pan(-1)", "Pan", key_display="←→"),
        Binding("right,l", "pan(1)", "Pan", show=False),
        Binding("plus,equals_sign", "zoom(2)", "Zoom", key_display="+-"),
        Binding("minus", "zoom(0.5)", "Zoom out", show=False),
        Binding("0", "reset_zoom", "Whole step", show=False),
        Binding("left_square_bracket", "step(-1)", "Step", key_display="[]"),
        Binding("right_square_bracket", "step(1)", "Next step", show=False),
        Binding("up,k", "rank(-1)", "Rank", key_display="↑↓"),
        Binding("down,j", "rank(1)", "Next rank", show=False),
        Binding("e", "expand", "Threads"),
        Binding("a", "align", "Align", show=False),
        Binding("c", "collective", "Collective"),
        Binding("p", "pipeline", "Pipeline", show=False),
        Binding("f", "fsdp", "FSDP", show=False),
        Binding("x", "path", "Critical path"),
        Binding("full_stop", "segment(1)", "Segment", key_display=".,", show=False),
        Binding("comma", "segment(-1)", "Previous segment", show=False),
    ]

    class LanesReady(Message):
        def __init__(self, result: RankLanes) -> None:
            super().__init__()
            self.result = result

    class Changed(Message):
        """The step, range, selection or lanes changed: the header and axis need redrawing."""

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.run: Run | None = None
        self.view: RunView | None = None
        self.step_index = 0
        self.zoom = 1.0
        self.center = 0.5
        self.selected = 0  # index into the view's ranks
        self.expand_all = False
        self.aligned = False  # False: the run's clock; True: each rank from its own step start
        self.pipeline = False  # the pipeline's stages (p), not the ranks
        self.fsdp = False  # the selected rank's FSDP all-gathers, a row per unit (f)
        self.cache: dict[tuple[int, int | None], RankLanes] = {}
        self.rows: list[Row] = []
        self._cells: dict[tuple[object, ...], Text] = {}
        self._active = False
        # the matched collectives per step (read on first use), and the one marked
        self._collectives: dict[int | None, list[StepCollective]] | None = None
        self.collective_index: int | None = None
        # the critical path (x): every step's stretches (read on first use), the one chosen
        self.show_path = False
        self._paths: dict[int | None, list[PathStretch]] | None = None
        self.segment_index: int | None = None
        # the pipeline view's collective calls per (rank, step): [start, end) on the rank's clock
        self._spans: dict[tuple[int, int | None], list[tuple[int, int]]] | None = None
        # the FSDP view's all-gathers per (rank, step) (read on first use)
        self._gathers: dict[tuple[int, int | None], list[GatherSpan]] | None = None

    # --- data -------------------------------------------------------------------------------

    def load(self, run: Run | None, view: RunView) -> None:
        self.run, self.view = run, view
        self._collectives, self.collective_index = None, None
        self._paths, self.segment_index = None, None
        self._spans = self._gathers = None
        # Start on a typical step: the first one not marked first, warm-up or slow.
        typical = [i for i, row in enumerate(view.steps) if not row.mark]
        self.step_index = typical[0] if typical else 0
        self._update_rows()
        if self._active:
            self._compute()

    def activate(self) -> None:
        """The timeline is on screen: cut the lanes of the current step (once)."""
        self._active = True
        self._compute()

    @property
    def step(self) -> int | None:
        if self.view is None or not self.view.step_numbers:
            return None
        return self.view.step_numbers[self.step_index]

    @property
    def ranks(self) -> list[int]:
        return self.view.rank_numbers if self.view else []

    @property
    def pending(self) -> int:
        return sum((rank, self.step) not in self.cache for rank in self.ranks)

    def _compute(self) -> None:
        if self.run is None or not self.ranks:
            return
        selected = self.ranks[self.selected]
        order = [selected, *(r for r in self.ranks if r != selected)]
        order = [r for r in order if (r, self.step) not in self.cache]
        if order:
            self._cut_lanes(self.run, self.step, order)

    @work(thread=True, exclusive=True, group="timeline-lanes")
    def _cut_lanes(self, run: Run, step: int | None, ranks: list[int]) -> None:
        worker = get_current_worker()
        threads = self.view.threads if self.view else {}
        all_windows = self.view.windows if self.view and step is not None else {}
        windows = all_windows.get(step, {})
        for rank in ranks:
            if worker.is_cancelled:
                return
            try:
                # a known step reads only the row groups of its window (and of the step before,
                # which its attribution looks back to), not the rank's events
                window = windows.get(rank)
                span = window_read_span(all_windows, step, rank) if step is not None else None
                events = run.window_events(rank, *span) if span else run.events([rank])
                result = rank_lanes(
                    events, rank, step, threads.get(rank, {}), run.side("memory", [rank]), window
                )
            except Exception as exc:  # one bad rank must not take the view down
                result = RankLanes(
                    rank, step, 0, 0, [], f"could not cut lanes: {type(exc).__name__}"
                )
            self.post_message(self.LanesReady(result))

    def on_timeline_lanes_ready(self, message: LanesReady) -> None:
        result = message.result
        self.cache[(result.rank, result.step)] = result
        if result.step == self.step:
            self._update_rows()

    # --- geometry ---------------------------------------------------------------------------

    def label_width(self, width: int | None = None) -> int:
        width = self.scrollable_content_region.width if width is None else width
        return min(max(width // 4, 22), 30)

    def bar_width(self) -> int:
        width = self.scrollable_content_region.width
        return max(width - self.label_width(width) - 1, 1)

    def fractions(self) -> tuple[float, float]:
        """The visible part of the step, as fractions of the whole axis."""
        span = 1.0 / self.zoom
        lo = min(max(self.center - span / 2, 0.0), 1.0 - span)
        return lo, lo + span

    def axis(self) -> tuple[int, int]:
        """(origin, length) in ns of the time axis: from the earliest rank's step start to the
        latest end on the run's clock, or the longest step when each rank is aligned."""
        windows = self.view.windows.get(self.step, {}) if self.view else {}
        if not windows:
            return 0, 0
        if not self.aligned:  # each rank's window on the run's clock
            windows = {
                r: (s - self.clock_offset(r), e - self.clock_offset(r))
                for r, (s, e) in windows.items()
            }
        starts = [s for s, _ in windows.values()]
        if self.aligned:
            return min(starts), max(e - s for s, e in windows.values())
        return min(starts), max(e for _, e in windows.values()) - min(starts)

    def range_of(self, rank: int) -> tuple[int, int]:
        """The visible [lo, hi) ns of ``rank``'s lanes."""
        origin, length = self.axis()
        if self.aligned and self.view:
            origin = self.view.windows.get(self.step, {}).get(rank, (origin, 0))[0]
        else:
            origin += self.clock_offset(rank)  # the run's clock, read on the rank's own
        lo, hi = self.fractions()
        return origin + round(length * lo), origin + round(length * hi)

    def clock_offset(self, rank: int) -> int:
        """ns the rank's clock reads ahead of the run's (estimated from collectives)."""
        return self.view.clock_offsets.get(rank, 0) if self.view else 0

    def visible_ms(self) -> tuple[float, float, float]:
        """(first, last, whole) visible milliseconds, from the start of the axis."""
        _, length = self.axis()
        lo, hi = self.fractions()
        return length * lo / 1e6, length * hi / 1e6, length / 1e6

    # --- rows -------------------------------------------------------------------------------

    def expanded(self, rank: int) -> bool:
        return self.expand_all or (bool(self.ranks) and rank == self.ranks[self.selected])

    def stages(self) -> list[tuple[int, int]]:
        """(stage, rank) of the run's pipeline, in stage order (empty: no pipeline)."""
        pipeline = self.view.report.pipeline if self.view else None
        if pipeline is None:
            return []
        # (a rank holding several virtual stages: one row, at its first stage)
        first: dict[int, int] = {}
        for s in pipeline.stages:
            for rank in s.ranks:
                first.setdefault(rank, s.stage)
        return [(stage, rank) for rank, stage in first.items()]

    def gathers(self, rank: int) -> list[GatherSpan]:
        """``rank``'s FSDP all-gathers in this step, in the order they were issued."""
        if self._gathers is None:
            self._gathers = self.run.gather_spans() if self.run is not None else {}
        return self._gathers.get((rank, self.step), [])

    def _update_rows(self) -> None:
        rows: list[Row] = []
        if self.fsdp and self.ranks:
            rank = self.ranks[self.selected]
            lanes = self.cache.get((rank, self.step))
            rows.append(Row(rank, 0 if lanes is not None and lanes.lanes else None))
            units = dict.fromkeys(g.unit for g in self.gathers(rank))  # (in order of issue)
            rows.extend(Row(rank, GATHERS, unit) for unit in units)
        elif self.pipeline:
            for _, rank in self.stages():
                lanes = self.cache.get((rank, self.step))
                rows.append(Row(rank, 0 if lanes is not None and lanes.lanes else None))
        for rank in self.ranks if not (self.pipeline or self.fsdp) else []:
            lanes = self.cache.get((rank, self.step))
            if lanes is None or not lanes.lanes:
                rows.append(Row(rank, None))
                continue
            count = len(lanes.lanes) if self.expanded(rank) else 1
            rows.append(Row(rank, 0))
            if lanes.memory is not None:
                rows.append(Row(rank, MEMORY))
            rows.extend(Row(rank, i) for i in range(1, count))
        self.rows = rows
        self.virtual_size = Size(self.scrollable_content_region.width, len(rows))
        self._cells.clear()
        self.refresh()
        self.post_message(self.Changed())

    def _scroll_to_selected(self) -> None:
        if not self.ranks:
            return
        rank = self.ranks[self.selected]
        ys = [y for y, row in enumerate(self.rows) if row.rank == rank]
        if ys:
            self.scroll_to_region(Region(0, ys[0], 1, len(ys)), animate=False, immediate=True)

    def on_resize(self) -> None:
        self._update_rows()

    # --- drawing ----------------------------------------------------------------------------

    def _label(self, row: Row) -> Text:
        rank = row.rank
        selected = bool(self.ranks) and rank == self.ranks[self.selected]
        lanes = self.cache.get((rank, self.step))
        if self.pipeline:
            return self._stage_label(rank, selected)
        if row.lane == GATHERS and row.unit is not None:
            spans = [g for g in self.gathers(rank) if g.unit == row.unit]
            named = Text("  unit ")
            named.append_text(untrusted(row.unit, 16))
            prefetched = sum(g.prefetched for g in spans)
            named.append(f" {prefetched}/{len(spans)}p", style="bright_black")
            return named
        if row.lane == MEMORY and lanes is not None and lanes.memory is not None:
            peak = lanes.memory.peak_bytes / (1 << 20)
            return Text(
                f"  memory {peak:,.0f} MiB", style="reverse" if selected else "bright_black"
            )
        if row.lane is None or row.lane == 0 or lanes is None:
            marker = "▾" if self.expanded(rank) else "▸"
            straggler = (
                self.view is not None
                and self.view.straggler is not None
                and (self.view.straggler.rank == rank)
            )
            return Text(
                f"{marker} rank {rank}{'*' if straggler else ''}",
                style="bold reverse" if selected else "bold",
            )
        label = lane_role(lanes.lanes[row.lane].label)
        return Text("  " + label, style="reverse" if selected else "")

    def _in_collective(self, rank: int, lo: int, hi: int, width: int) -> list[bool]:
        """Per cell of a pipeline row, whether one of the rank's collective calls (not a
        point-to-point one) runs at its middle."""
        if self._spans is None:
            self._spans = self.run.collective_spans() if self.run is not None else {}
        spans = self._spans.get((rank, self.step), [])
        if not spans or hi <= lo or width <= 0:
            return [False] * max(width, 0)
        mids = (lo + (i + 0.5) * (hi - lo) / width for i in range(width))
        return [any(start <= m < end for start, end in spans) for m in mids]

    def _bar(self, row: Row, width: int) -> Text:
        lanes = self.cache.get((row.rank, self.step))
        if lanes is None:
            return Text("cutting lanes…", style="italic bright_black")
        if row.lane is None:
            return Text(lanes.error or "nothing on this rank in this step", style="bright_black")
        lo, hi = self.range_of(row.rank)
        if row.lane == MEMORY:
            return self._memory_bar(lanes, lo, hi, width)
        if row.lane == GATHERS:
            spans = [g for g in self.gathers(row.rank) if g.unit == row.unit]
            return gather_cells(spans, lo, hi, width)
        key = (row.rank, self.step, row.lane, lo, hi, width, self.pipeline)
        if key not in self._cells:
            binned = bin_lane(lanes.lanes[row.lane], lo, hi, width)
            self._cells[key] = (
                pipeline_cells(binned, self._in_collective(row.rank, lo, hi, width))
                if self.pipeline
                else lane_cells(binned)
            )
        cells = self._cells[key]
        if self.show_path and row.lane == 0 and not self.pipeline and hi > lo:
            cells = self._path_marked(cells, row.rank, lo, hi, width)
        call = self.collective
        if call is None or row.lane != 0 or row.rank not in call.arrivals or hi <= lo:
            return cells
        at = call.arrivals[row.rank]
        column = int((at - lo) / (hi - lo) * width)
        if not 0 <= column < len(cells):
            return cells
        last = row.rank == call.last_rank
        marked = cells[:column]
        marked.append("▼" if last else "▽", style="bold white on red" if last else "bold")
        marked.append_text(cells[column + 1 :])
        return marked

    @property
    def path(self) -> list[PathStretch]:
        """The current step's critical path, as stretches of one rank and phase."""
        if self._paths is None:
            self._paths = self.run.critical_path_stretches() if self.run is not None else {}
        return self._paths.get(self.step, [])

    def _path_marked(self, cells: Text, rank: int, lo: int, hi: int, width: int) -> Text:
        """``cells`` with the stretches of the path on ``rank`` underlined (the chosen one
        reversed), at the rank's own clock."""
        marked = cells.copy()
        offset = self.clock_offset(rank)
        for i, piece in enumerate(self.path):
            if piece.rank != rank:
                continue
            a = (piece.start_ns + offset - lo) / (hi - lo) * width
            b = (piece.start_ns + piece.dur_ns + offset - lo) / (hi - lo) * width
            first, last = max(int(a), 0), min(max(int(b + 0.999), int(a) + 1), width)
            if first >= last:
                continue
            chosen = i == self.segment_index
            marked.stylize("reverse bold magenta" if chosen else "underline", first, last)
        return marked

    def _stage_label(self, rank: int, selected: bool) -> Text:
        """A pipeline row's label: its stage, rank and the stage's bubble share of its step."""
        pipeline = self.view.report.pipeline if self.view else None
        held = [s for s in pipeline.stages if rank in s.ranks] if pipeline else []
        if pipeline is None or not held:
            return Text(f"rank {rank}", style="bold reverse" if selected else "bold")
        # its stages (virtual stages: several), their compute together, the rank's bubble
        step = sum(s.compute_ms for s in held) + held[0].bubble_ms
        share = f" {BUBBLE}{pct(held[0].bubble_ms / step)}" if step > 0 else ""
        names = "+".join(
            f"{s.stage}{'*' if s.stage == pipeline.slowest_stage else ''}" for s in held[:4]
        )
        return Text(f"stage {names} r{rank}{share}", style="bold reverse" if selected else "bold")

    def _memory_bar(self, lanes: RankLanes, lo: int, hi: int, width: int) -> Text:
        """Allocated memory over the step as a sparkline from 0 to the step's peak, the peak's
        cell marked."""
        lane = lanes.memory
        if lane is None:
            return Text()
        cells = bin_memory(lane, lo, hi, width)
        scale = max(lane.peak_bytes, 1)
        peak_cell = (
            int((lane.peak_ts - lo) * width // (hi - lo))
            if hi > lo and lo <= lane.peak_ts < hi
            else -1
        )
        text = Text(no_wrap=True)
        for i, value in enumerate(cells):
            if value is None:
                text.append(" ")
                continue
            spark = SPARKS[max(1, min(8, round(8 * value / scale)))]
            text.append(spark, style="bold reverse yellow" if i == peak_cell else "yellow")
        return text

    @property
    def collective(self) -> StepCollective | None:
        """The collective marked in this step, if any."""
        if self.collective_index is None or self._collectives is None:
            return None
        calls = self._collectives.get(self.step, [])
        return calls[self.collective_index] if self.collective_index < len(calls) else None

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        index = y + round(self.scroll_offset.y)
        if index >= len(self.rows) or width <= 0:
            return Strip.blank(width, self.rich_style)
        row = self.rows[index]
        label_width = self.label_width(width)
        text = self._label(row)
        text.truncate(label_width, overflow="ellipsis", pad=True)
        text.append(" ")
        text.append_text(self._bar(row, width - label_width - 1))
        text.truncate(width, pad=True)
        return Strip(list(text.render(self.app.console)), width).apply_style(self.rich_style)

    def header_text(self) -> Text:
        if self.view is None or not self.view.step_numbers:
            return Text("no steps in this run")
        first, last, whole = self.visible_ms()
        n = len(self.view.step_numbers)
        mark = self.view.steps[self.step_index].mark
        text = Text()
        text.append(f"step {self.step}", style="bold")
        text.append(f" ({self.step_index + 1} of {n}{', ' + mark if mark else ''})")
        text.append(f" · {ms(first)}–{ms(last)} ms of {ms(whole)} ms")
        text.append(f" · zoom {self.zoom:g}×")
        pipeline = self.view.report.pipeline
        if pipeline is not None and self.pipeline:
            text.append(
                f" · pipeline {pipeline.schedule}, {pipeline.depth} stages × "
                f"{pipeline.microbatches:g} micro-batches: bubble {pct(pipeline.bubble_fraction)}"
                f" (ideal {ideal_share(pipeline)}; p: ranks)"
            )
        elif pipeline is not None:
            text.append(" · p: pipeline stages")
        if self.fsdp and self.ranks:
            text.append(f" · FSDP all-gathers of rank {self.ranks[self.selected]} (f: ranks)")
        elif self.view.report.fsdp_gathers:
            text.append(" · f: FSDP all-gathers")
        if self.aligned:
            text.append(" · ranks aligned at their step start")
        elif self.view is not None and self.view.clock_offsets:
            text.append(" · run clock (hosts' clocks aligned from collectives)")
        else:
            text.append(" · run clock")
        if self.show_path:
            path = self.path
            if not path:
                text.append("\ncritical path (x): none in this step", style="bright_black")
            else:
                length = sum(p.dur_ns for p in path)
                text.append(f"\ncritical path {ms(length / 1e6)} ms", style="bold")
                text.append(f" ({len(path)} segments, underlined; .,: step through)")
                if self.segment_index is not None and self.segment_index < len(path):
                    p = path[self.segment_index]
                    what = p.kind if p.phase is None else f"{p.phase} {p.kind}"
                    text.append(f"\n{self.segment_index + 1}/{len(path)}: rank {p.rank} {what} ")
                    if p.op:
                        text.append_text(untrusted(p.op, 30))
                    text.append(f" {ms(p.dur_ns / 1e6)} ms")
        call = self.collective
        if call is not None:
            calls = len((self._collectives or {}).get(self.step, []))
            text.append(f"\n{call.collective} #{call.position} ", style="bold")
            text.append_text(untrusted(call.name, 40))
            if call.group is not None:
                text.append(" in group ")
                text.append_text(untrusted(call.group, 30))
            text.append(
                f" ({(self.collective_index or 0) + 1} of {calls}, c: next): arrivals "
                f"{ms(call.skew_ns / 1e6)} ms apart, rank {call.last_rank} last ▼"
            )
        pending = self.pending
        if pending:
            text.append(f" · cutting lanes: {len(self.ranks) - pending}/{len(self.ranks)}")
        return text

    def axis_text(self) -> Text:
        """Tick marks in ms from the start of the axis, under the lanes."""
        width = self.bar_width()
        first, last, _ = self.visible_ms()
        line = [" "] * width
        if last > first:
            tick = nice_ticks(last - first, width)
            value = (first // tick) * tick
            while value <= last:
                pos = round((value - first) / (last - first) * width)
                label = f"╵{value:g} ms" if tick < 1000 else f"╵{value / 1000:g} s"
                if (
                    pos >= 0
                    and pos + len(label) <= width
                    and all(c == " " for c in line[pos : pos + len(label) + 1])
                ):
                    line[pos : pos + len(label)] = label
                value += tick
        text = Text(" " * (self.label_width() + 1), no_wrap=True)
        text.append("".join(line), style="bright_black")
        return text

    # --- actions ----------------------------------------------------------------------------

    def _moved(self) -> None:
        self._cells.clear()
        self.refresh()
        self.post_message(self.Changed())

    def action_pan(self, direction: int) -> None:
        span = 1.0 / self.zoom
        self.center = min(max(self.center + direction * span / 4, span / 2), 1 - span / 2)
        self._moved()

    def action_zoom(self, factor: float) -> None:
        self.zoom = min(max(self.zoom * factor, 1.0), MAX_ZOOM)
        span = 1.0 / self.zoom
        self.center = min(max(self.center, span / 2), 1 - span / 2)
        self._moved()

    def action_reset_zoom(self) -> None:
        self.zoom, self.center = 1.0, 0.5
        self._moved()

    def action_step(self, delta: int) -> None:
        if self.view is None or not self.view.step_numbers:
            return
        index = min(max(self.step_index + delta, 0), len(self.view.step_numbers) - 1)
        if index != self.step_index:
            self.step_index = index
            self._update_rows()
            self._compute()

    def action_rank(self, delta: int) -> None:
        if not self.ranks:
            return
        self.selected = min(max(self.selected + delta, 0), len(self.ranks) - 1)
        self._update_rows()
        self._scroll_to_selected()
        if (self.ranks[self.selected], self.step) not in self.cache:
            self._compute()

    def action_expand(self) -> None:
        self.expand_all = not self.expand_all
        self._update_rows()
        self._scroll_to_selected()

    def action_align(self) -> None:
        self.aligned = not self.aligned
        self._moved()

    def action_pipeline(self) -> None:
        """Show the pipeline's stages (compute against bubble), or the ranks again."""
        if not self.stages():
            self.pipeline = False
            self.app.notify("no pipeline in this run: its point-to-point calls form no stages")
            return
        self.pipeline, self.fsdp = not self.pipeline, False
        self._update_rows()

    def action_fsdp(self) -> None:
        """Show the selected rank's FSDP all-gathers, a row per unit, or the ranks again."""
        if self.view is None or not self.view.report.fsdp_gathers:
            self.fsdp = False
            self.app.notify("no FSDP all-gathers in this run")
            return
        self.fsdp, self.pipeline = not self.fsdp, False
        self._update_rows()

    def action_path(self) -> None:
        """Draw the step's critical path across ranks, or not."""
        self.show_path = not self.show_path
        self.segment_index = None
        if self.show_path and not self.path:
            self.app.notify("no critical path in this step")
        self._moved()

    def action_segment(self, delta: int) -> None:
        """Choose the next (previous) segment of the path."""
        if not self.show_path:
            self.action_path()
        path = self.path
        if not path:
            return
        index = -1 if self.segment_index is None else self.segment_index
        self.segment_index = (index + delta) % len(path)
        self._moved()

    def action_collective(self) -> None:
        """Mark the next of the step's matched collectives (most skewed first), then none."""
        if self.run is None:
            return
        if self._collectives is None:
            self._collectives = self.run.step_collectives()
        calls = self._collectives.get(self.step, [])
        index = -1 if self.collective_index is None else self.collective_index
        self.collective_index = index + 1 if index + 1 < len(calls) else None
        if not calls:
            self.app.notify("no collective in this step was matched across ranks")
        self._moved()


def timeline_legend(pipeline: bool = False, fsdp: bool = False) -> Text:
    """The key under the lanes: of the ranks' lanes, of the pipeline's stages, or of FSDP's
    all-gathers."""
    legend = legend_text()
    if fsdp:
        legend.append("\n")
        for letter, style, words in GATHER_MARKS.values():
            legend.append(letter, style=style)
            legend.append(f" {words}  ")
        legend.append("\nunit U k/np: k of its n all-gathers in this step prefetched.")
        return legend
    if pipeline:
        legend.append("  ")
        legend.append(BUBBLE, style="red")
        legend.append(" bubble")
        legend.append("\nstage S rN ░x%: the stage's bubble share of its step, * the slowest")
        legend.append(" stage. Bubble: blocked on a neighbour or idle; the rest, its own work.")
        return legend
    legend.append("\n▾ rank N: every instant, as the breakdown counts it; under it: its")
    legend.append(" threads and streams. Reversed: fills the cell; plain letter: part of it.")
    legend.append(" x: the critical path, underlined.")
    return legend


class TimelinePane(Vertical):
    _legend = (False, False)  # the legend drawn: the pipeline's, FSDP's

    def compose(self) -> ComposeResult:
        yield EndingView(id="timeline-ending")
        yield Static(id="timeline-header", markup=False)
        yield Timeline(id="timeline")
        yield Static(id="timeline-axis", markup=False)
        yield Static(timeline_legend(), id="timeline-legend", markup=False)

    def show_ending(self, view: RunView) -> None:
        """A failed run: how each rank ended, above the step drawn."""
        report = view.report
        self.query_one(EndingView).show(view.tails, report.ranks_at_end, report.failure)

    def on_timeline_changed(self, message: Timeline.Changed) -> None:
        timeline = self.query_one(Timeline)
        self.query_one("#timeline-header", Static).update(timeline.header_text())
        self.query_one("#timeline-axis", Static).update(timeline.axis_text())
        if (timeline.pipeline, timeline.fsdp) != self._legend:
            self._legend = (timeline.pipeline, timeline.fsdp)
            self.query_one("#timeline-legend", Static).update(timeline_legend(*self._legend))
