"""Operators: every canonical operator of the run, sortable, with a filter box and a phase filter;
on GPU runs, `k` turns the table into the kernel launches per operator and phase."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Input, Static

from traceview.model import schema as S
from traceview.model.results import KernelLaunches, TopOp
from traceview.tui.model import OP_SORTS, RunView, filter_kernels, filter_ops, sort_ops
from traceview.tui.render import (
    KERNEL_COLUMNS,
    KERNEL_NOTE,
    kernel_cells,
    kernel_rank,
    ms,
    pct,
    phase_text,
    untrusted,
)

OP_WIDTH = 20
PHASE_FILTERS: tuple[str | None, ...] = (None, *S.EVENT_PHASES)
COLUMNS = (
    ("op", "op"),
    ("phase", "phase"),
    ("on", "on"),
    ("calls", "calls"),
    ("self", "self"),
    ("total", "total"),
    ("mean", "mean"),
    ("p95", "p95"),
    ("share", "share"),
    ("name", "name in the trace"),
)


class OperatorsPane(Vertical):
    """The ops table: per step (mean of ranks), mean and p95 per call."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("s", "sort", "Sort"),
        Binding("p", "phase", "Phase"),
        Binding("k", "kernels", "Kernels"),
        Binding("escape", "leave_filter", "Table", show=False),
    ]

    DEFAULT_CSS = """
    OperatorsPane #ops-bar { height: 1; }
    OperatorsPane #ops-filter { width: 1fr; height: 1; border: none; padding: 0 1; }
    OperatorsPane #ops-state { width: auto; height: 1; padding: 0 1; }
    OperatorsPane #ops-table { height: 1fr; }
    OperatorsPane #ops-detail { height: 1; }
    """

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.view: RunView | None = None
        self.sort = "self"
        self.phase: str | None = None
        self.shown: list[TopOp] = []
        self.kernels = False  # the kernel launches of one GPU rank instead of the operators
        self.shown_kernels: list[KernelLaunches] = []

    def compose(self) -> ComposeResult:
        with Horizontal(id="ops-bar"):
            yield Input(placeholder="/ filter: op or name", id="ops-filter")
            yield Static(id="ops-state", markup=False)
        yield DataTable(id="ops-table", cursor_type="row", zebra_stripes=True)
        yield Static(id="ops-detail", markup=False)

    def on_mount(self) -> None:
        self._columns()
        self._state()

    def _columns(self) -> None:
        table = self.query_one(DataTable)
        table.clear(columns=True)
        if self.kernels:
            table.add_column("op", key="op", width=OP_WIDTH)
            for i, label in enumerate(KERNEL_COLUMNS):
                table.add_column(label, key=f"k{i}")
            return
        for key, label in COLUMNS:
            table.add_column(label, key=key, width=OP_WIDTH if key == "op" else None)

    def show(self, view: RunView) -> None:
        self.view = view
        self.refill()

    @property
    def filter_text(self) -> str:
        return self.query_one("#ops-filter", Input).value

    def refill(self) -> None:
        """Redraw the table from the prepared rows: filter, then sort (no aggregation here)."""
        if self.view is None:
            return
        if self.kernels:
            self._refill_kernels()
            return
        rows = sort_ops(filter_ops(self.view.ops, self.filter_text, self.phase), self.sort)
        self.shown = rows
        table = self.query_one(DataTable)
        table.clear()
        for i, row in enumerate(rows):
            table.add_row(
                untrusted(row.op, OP_WIDTH),
                phase_text(row.phase, short=True),
                row.device,
                Text(f"{row.calls_per_step:g}", justify="right"),
                Text(ms(row.self_ms_per_step), justify="right"),
                Text(ms(row.total_ms_per_step), justify="right"),
                Text(ms(row.mean_ms), justify="right"),
                Text(ms(row.p95_ms), justify="right"),
                Text(pct(row.share), justify="right"),
                untrusted(row.name, 200),
                key=str(i),
            )
        self._state()
        self._detail()

    def _kernel_rows(self) -> tuple[int | None, list[KernelLaunches]]:
        focus = kernel_rank(self.view.report) if self.view is not None else None
        return (focus[0], focus[1].kernels) if focus is not None else (None, [])

    def _refill_kernels(self) -> None:
        _, every = self._kernel_rows()
        rows = filter_kernels(every, self.filter_text, self.phase)
        self.shown_kernels = rows
        table = self.query_one(DataTable)
        table.clear()
        for i, row in enumerate(rows):
            table.add_row(untrusted(row.op or "?", OP_WIDTH), *kernel_cells(row), key=str(i))
        self._state()
        self._detail()

    def _state(self) -> None:
        state = Text()
        state.append(f"phase: {self.phase or 'all'}", style="bold" if self.phase else "")
        if self.kernels:
            rank, every = self._kernel_rows()
            where = f"rank {rank}" if rank is not None else "no GPU rank"
            count = f"{len(self.shown_kernels)} of {len(every)}"
            state.append(f" · kernel launches, {where} · {count} ops · µs")
        else:
            count = f"{len(self.shown)} of {len(self.view.ops)}" if self.view else "0"
            state.append(f" · sort: {self.sort} · {count} ops · ms per step")
        self.query_one("#ops-state", Static).update(state)

    def _detail(self, index: int | None = None) -> None:
        table = self.query_one(DataTable)
        index = table.cursor_row if index is None else index
        detail = Text(no_wrap=True, overflow="ellipsis")
        if self.kernels:
            if 0 <= index < len(self.shown_kernels):
                k = self.shown_kernels[index]
                detail.append_text(untrusted(k.op or "?", 300))
                detail.append(f"  (launch overhead {k.launch_overhead_us_p50:,.1f} µs p50) · ")
            detail.append(KERNEL_NOTE, style="bright_black")
            self.query_one("#ops-detail", Static).update(detail)
            return
        if 0 <= index < len(self.shown):
            row = self.shown[index]
            detail.append_text(untrusted(row.name, 300))
            detail.append(f"  ({row.calls_per_step:g} calls per step, mean {ms(row.mean_ms)} ms)")
        elif self.view is not None:
            detail.append("no operator matches", style="bright_black")
        self.query_one("#ops-detail", Static).update(detail)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._detail(event.cursor_row)

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        key = str(event.column_key.value)
        if key in OP_SORTS and not self.kernels:
            self.sort = key
            self.refill()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.refill()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.query_one(DataTable).focus()

    def action_filter(self) -> None:
        self.query_one("#ops-filter", Input).focus()

    def action_leave_filter(self) -> None:
        self.query_one(DataTable).focus()

    def action_kernels(self) -> None:
        self.kernels = not self.kernels
        self._columns()
        self.refill()

    def action_sort(self) -> None:
        if self.kernels:  # kernel launches stay most launched first
            return
        keys = list(OP_SORTS)
        self.sort = keys[(keys.index(self.sort) + 1) % len(keys)]
        self.refill()

    def action_phase(self) -> None:
        index = PHASE_FILTERS.index(self.phase)
        self.phase = PHASE_FILTERS[(index + 1) % len(PHASE_FILTERS)]
        self.refill()

    def focus_main(self) -> None:
        self.query_one(DataTable).focus()
