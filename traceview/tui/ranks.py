"""Ranks: per-rank step time, own work, time blocked (and of it, waiting for the last rank to
arrive at a collective against transfer) and phases side by side, slowest first. In a run
whose process groups form a mesh (or whose ranks form a pipeline), the ranks are grouped by one
of its dimensions (``g`` cycles them: dp, tp, …, stage, none), each group under a row of its
ranks' means."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.widgets import DataTable, Input, Static

from traceview.model import schema as S
from traceview.model.results import RankSummary, RunMemory
from traceview.tui.heatmap import DIGITS, INK, PALETTE, Heatmap
from traceview.tui.model import (
    RANK_SORTS,
    RunView,
    filter_ranks,
    group_ranks,
    rank_list,
    sort_ranks,
)
from traceview.tui.render import (
    SHORT,
    dimension_comm_text,
    ms,
    pct,
    phase_bar,
    signed_pct,
    straggler_text,
)

BAR = 20


def _maybe_ms(value: float | None) -> str:
    return ms(value) if value is not None else "-"


class RanksPane(Vertical):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("s", "sort", "Sort"),
        Binding("m", "toggle_map", "Heatmap"),
        Binding("g", "group", "Group", show=False),
        Binding("p", "metric", "Phase", show=False),
        Binding("escape", "leave_filter", "Table", show=False),
    ]

    DEFAULT_CSS = """
    RanksPane #ranks-filter { height: 1; border: none; padding: 0 1; }
    RanksPane #ranks-summary { height: auto; }
    RanksPane #ranks-table { height: 1fr; }
    RanksPane #ranks-heatmap { height: 1fr; display: none; }
    """

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.view: RunView | None = None
        self.sort = "busy"
        self.grouping: str | None = None  # the dimension the rows are grouped by

    def compose(self) -> ComposeResult:
        yield Input(placeholder="/ filter: ranks (0-15, 32) · straggler · host", id="ranks-filter")
        yield Static(id="ranks-summary", markup=False)
        yield DataTable(id="ranks-table", cursor_type="row", zebra_stripes=True)
        yield Heatmap(id="ranks-heatmap")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_column("rank", key="rank")
        table.add_column("step", key="step")
        table.add_column("busy", key="busy")
        table.add_column("vs med", key="imbalance")
        table.add_column("blocked", key="blocked")
        table.add_column("wait", key="wait")
        table.add_column("xfer", key="transfer")
        table.add_column("hidden", key="hidden")
        table.add_column("phases (to scale)", key="bar")
        for phase in S.BREAKDOWN_PHASES:
            table.add_column(SHORT[phase], key=phase)

    def show(self, view: RunView) -> None:
        self.view = view
        self.grouping = next(iter(view.dimensions), None)  # the first dimension, if any
        table = self.query_one(DataTable)
        if self.memory and "mem" not in table.columns:  # only runs with memory records
            table.add_column("mem MiB", key="mem")
            table.add_column("mem at", key="mem_phase")
        self.refill()

    @property
    def memory(self) -> bool:
        """Whether the run has memory records (its ranks then get memory columns)."""
        return self.view is not None and self.view.report.summary.memory is not None

    def refill(self) -> None:
        if self.view is None:
            return
        rows = sort_ranks(self.shown_ranks(), self.sort)
        grouped = group_ranks(rows, self.view.dimensions.get(self.grouping or "", {}))
        if self.grouping is not None:
            rows = [row for _, members in grouped for row in members]
        self.query_one(Heatmap).show(
            self.view.matrix,
            [r.rank for r in rows],
            {r.rank for r in rows if r.straggler},
        )
        table = self.query_one(DataTable)
        table.clear()
        longest = max((row.step_ms for row in rows), default=0.0) or 1.0
        peak = self.view.report.summary.memory
        for group, members in grouped if self.grouping is not None else [(None, rows)]:
            if self.grouping is not None:
                self._group_row(table, group, members)
            for row in members:
                self._rank_row(table, row, longest, peak)
        self._summary()

    def _group_row(
        self, table: DataTable[Text], group: list[int] | None, rows: list[RankSummary]
    ) -> None:
        """A group's row above its ranks: the group and its ranks' means."""
        name = f"{self.grouping} {rank_list(group)}" if group else f"no {self.grouping}"

        def mean(values: list[float | None]) -> Text:
            known = [v for v in values if v is not None]
            return Text(
                ms(sum(known) / len(known)) if known else "-", justify="right", style="bold"
            )

        table.add_row(
            Text(name, style="bold underline"),
            mean([r.step_ms for r in rows]),
            mean([r.busy_ms for r in rows]),
            Text(""),
            mean([r.blocked_ms for r in rows]),
            mean([r.comm_wait_ms for r in rows]),
            mean([r.comm_transfer_ms for r in rows]),
            Text(""),
            Text(f"{len(rows)} rank(s)", style="bright_black"),
            *(mean([r.breakdown_ms[p] for r in rows]) for p in S.BREAKDOWN_PHASES),
            *([Text(""), Text("")] if self.memory else []),
            key=f"{self.grouping}:{name}",
        )

    def _rank_row(
        self, table: DataTable[Text], row: RankSummary, longest: float, peak: RunMemory | None
    ) -> None:
        memory: list[Text] = []
        if self.memory:
            mem = row.memory
            flagged = peak is not None and peak.imbalanced and peak.peak_rank == row.rank
            memory = [
                Text(
                    f"{mem.peak_mb:,.1f}" if mem and mem.peak_mb is not None else "-",
                    justify="right",
                    style="bold yellow" if flagged else "",
                ),
                Text(mem.peak_phase or "-" if mem else "-"),
            ]
        mark = "*" if row.straggler else ""
        table.add_row(
            Text(f"{row.rank}{mark}", style="bold" if row.straggler else "", justify="right"),
            Text(ms(row.step_ms), justify="right"),
            Text(ms(row.busy_ms), justify="right"),
            Text(signed_pct(row.imbalance), justify="right"),
            Text(ms(row.blocked_ms), justify="right"),
            Text(_maybe_ms(row.comm_wait_ms), justify="right", style="bold red"),
            Text(_maybe_ms(row.comm_transfer_ms), justify="right"),
            Text(pct(row.comm_hidden_fraction) if row.comm_total_ms > 0 else "-", justify="right"),
            phase_bar(row.breakdown_ms, round(BAR * row.step_ms / longest)),
            *(Text(ms(row.breakdown_ms[p]), justify="right") for p in S.BREAKDOWN_PHASES),
            *memory,
            key=str(row.rank),
        )

    def shown_ranks(self) -> list[RankSummary]:
        assert self.view is not None
        text = self.query_one("#ranks-filter", Input).value
        return filter_ranks(self.view.ranks, text, self.view.hosts)

    def _summary(self) -> None:
        assert self.view is not None
        ranks = self.view.ranks
        text = Text()
        if self.mapped:
            self._heatmap_summary(text)
            self.query_one("#ranks-summary", Static).update(text)
            return
        shown = len(self.shown_ranks())
        count = f"{len(ranks)} ranks" if shown == len(ranks) else f"{shown} of {len(ranks)} ranks"
        dims = self.view.dimensions
        if not dims:
            text.append(f"{count}, sorted by {self.sort}", style="bold")
            text.append(" (/: filter, s: sort, m: heatmap) · ms per step")
        else:
            within = f" within each {self.grouping} group" if self.grouping else ""
            text.append(f"{count}, sorted by {self.sort}{within}", style="bold")
            choices = ", ".join([*dims, "none"])
            text.append(f" (/: filter, s: sort, g: group by {choices}, m: heatmap) · ms per step")
        text.append(" · busy = step - exposed comm - idle;")
        text.append(" blocked = exposed comm + idle; of the exposed comm, wait = waiting for the")
        text.append(" last rank to arrive at a collective, xfer = the rest")
        report = self.view.report
        summary = report.summary
        if self.grouping is not None:
            text.append("\n")
            text.append_text(dimension_comm_text(report, self.grouping))
        if ranks and summary.straggler_rank is not None:
            step = summary.step_ms or 1.0
            text.append("\n")
            text.append_text(straggler_text(report))
            text.append(
                f"; ranks are blocked {ms(summary.blocked_ms)} ms per step on average"
                f" ({pct(summary.blocked_ms / step)} of the step)"
            )
        self.query_one("#ranks-summary", Static).update(text)

    @property
    def mapped(self) -> bool:
        return bool(self.query_one(Heatmap).display)

    def _heatmap_summary(self, text: Text) -> None:
        heatmap = self.query_one(Heatmap)
        matrix = heatmap.matrix
        if matrix is None:
            text.append("no steps to draw: this run has no step windows")
            return
        metric = heatmap.metric
        ranks, steps = len(heatmap.rows), len(matrix.steps)
        text.append(f"{metric} ms, {ranks} ranks × {steps} steps", style="bold")
        text.append(f" (rows sorted by {self.sort}; /: filter, s: sort, p: phase, m: table) · ")
        text.append(f"{ms(matrix.low_ms[metric])} ")
        for colour, digit, ink in zip(PALETTE, DIGITS, INK, strict=True):
            text.append(digit, style=f"{ink} on color({colour})")
        text.append(f" {ms(matrix.high_ms[metric])} (5th to 95th percentile) · · no such step")
        cell = heatmap.cell()
        if cell is not None:
            rank, step, value = cell
            where = f"rank {rank}, step {step if step is not None else '-'}"
            shown = "-" if value != value else f"{ms(value)} ms"  # NaN: the rank lacks it
            text.append(f"\n{where}: {metric} {shown}", style="bold")

    def on_heatmap_moved(self, _: Heatmap.Moved) -> None:
        if self.view is not None:
            self._summary()

    def action_toggle_map(self) -> None:
        heatmap, table = self.query_one(Heatmap), self.query_one(DataTable)
        heatmap.display, table.display = not heatmap.display, heatmap.display
        (heatmap if heatmap.display else table).focus()
        if self.view is not None:
            self._summary()

    def action_metric(self) -> None:
        if self.mapped:
            self.query_one(Heatmap).cycle_metric()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.refill()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.focus_main()

    def action_filter(self) -> None:
        self.query_one("#ranks-filter", Input).focus()

    def action_leave_filter(self) -> None:
        self.focus_main()

    def action_group(self) -> None:
        """Group the rows by the next dimension of the run (then none)."""
        if self.view is None or not self.view.dimensions:
            self.app.notify("no process groups of a mesh or pipeline stages to group ranks by")
            return
        order = [*self.view.dimensions, None]
        self.grouping = order[(order.index(self.grouping) + 1) % len(order)]
        self.refill()

    def action_sort(self) -> None:
        keys = list(RANK_SORTS)
        self.sort = keys[(keys.index(self.sort) + 1) % len(keys)]
        self.refill()

    def focus_main(self) -> None:
        (self.query_one(Heatmap) if self.mapped else self.query_one(DataTable)).focus()
