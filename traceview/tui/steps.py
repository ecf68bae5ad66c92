"""Steps: how much the step time varies from step to step; first (warm-up) steps marked."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from traceview.model import schema as S
from traceview.tui.model import RunView
from traceview.tui.render import SHORT, ms, pct, phase_bar, signed_pct

BAR = 20
MARK_STYLE = {"first": "yellow", "warm-up": "bold yellow", "slow": "bold red"}


class StepsPane(Vertical):
    DEFAULT_CSS = """
    StepsPane #steps-summary { height: auto; }
    StepsPane #steps-table { height: 1fr; }
    """

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.view: RunView | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="steps-summary", markup=False)
        yield DataTable(id="steps-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_column("step", key="step")
        table.add_column("", key="mark")
        table.add_column("mean", key="mean")
        table.add_column("vs med", key="vs_median")
        table.add_column("phases (to scale)", key="bar")
        table.add_column("min", key="min")
        table.add_column("max", key="max")
        table.add_column("slowest", key="slowest")
        for phase in S.BREAKDOWN_PHASES:
            table.add_column(SHORT[phase], key=phase)

    def show(self, view: RunView) -> None:
        self.view = view
        stats = view.stats
        text = Text()
        if stats is None:
            text.append("no steps in this run")
        else:
            text.append(f"{stats.count} steps", style="bold")
            text.append(
                f" · mean {ms(stats.mean_ms)} ms · median {ms(stats.median_ms)}"
                f" · stdev {ms(stats.stdev_ms)} ({pct(stats.cv)} of the mean)"
                f" · min {ms(stats.min_ms)} · max {ms(stats.max_ms)}"
            )
            text.append(
                f"\nms per step, mean of ranks; warm-up: leading steps over"
                f" {stats.warmup_factor:.2f}× the median"
            )
        self.query_one("#steps-summary", Static).update(text)
        table = self.query_one(DataTable)
        table.clear()
        longest = max((row.step_ms for row in view.steps), default=0.0) or 1.0
        for row in view.steps:
            table.add_row(
                Text("-" if row.step is None else str(row.step), justify="right"),
                Text(row.mark, style=MARK_STYLE.get(row.mark, "")),
                Text(ms(row.step_ms), justify="right"),
                Text(signed_pct(row.vs_median), justify="right"),
                phase_bar(row.breakdown_ms, round(BAR * row.step_ms / longest)),
                Text(ms(row.min_ms), justify="right"),
                Text(ms(row.max_ms), justify="right"),
                Text(f"rank {row.slowest_rank}", justify="right"),
                *(Text(ms(row.breakdown_ms[p]), justify="right") for p in S.BREAKDOWN_PHASES),
                key=str(row.step),
            )

    def focus_main(self) -> None:
        self.query_one(DataTable).focus()
