"""Overview: the verdict in words, a stacked bar per rank, the run's mean and the straggler."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.geometry import Size
from textual.widget import Widget
from textual.widgets import Static

from traceview.model import schema as S
from traceview.tui.model import RunView
from traceview.tui.render import (
    PHASE_LETTER,
    PHASE_STYLE,
    communication_text,
    failure_text,
    fsdp_text,
    gpu_rank_text,
    gpu_verdict_text,
    host_bound_text,
    incomplete_text,
    ms,
    pct,
    phase_bar,
    straggler_text,
    untrusted,
    verdict_text,
)
from traceview.views.roles import servers_text
from traceview.views.style import shown_notes, whole_run_text

LABEL = 9  # "rank 123 "
NUMBER = 9  # " 1,234.5 "
MARK = " ◀ straggler"
GPU_RANKS = 4  # GPU ranks described in the notes


class RankBars(Widget):
    """The run's mean and one bar per rank, every bar the exclusive breakdown of a step."""

    DEFAULT_CSS = "RankBars { height: auto; }"

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.view: RunView | None = None

    def show(self, view: RunView) -> None:
        self.view = view
        self.refresh(layout=True)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return 2 + len(self.view.ranks) if self.view else 1

    def render(self) -> Text:
        if self.view is None:
            return Text("")
        view = self.view
        summary = view.report.summary
        straggler = view.straggler
        mark = len(MARK) if straggler else 0
        width = max(self.size.width - LABEL - NUMBER - 1 - mark, 8)
        # Every bar on one scale, so a longer step draws a longer bar.
        longest = max([summary.step_ms, *(r.step_ms for r in view.ranks)]) or 1.0
        text = Text(no_wrap=True)
        text.append(f"{'':<{LABEL}}{'step ms':>{NUMBER}} ", style="bold")
        text.append("each step, every instant once, by phase", style="bold")
        text.append("\n")
        text.append(f"{'mean':<{LABEL}}", style="bold")
        text.append(f"{ms(summary.step_ms):>{NUMBER - 1}}  ", style="bold")
        text.append_text(phase_bar(summary.breakdown_ms, round(width * summary.step_ms / longest)))
        for row in view.ranks:
            text.append("\n")
            highlight = "bold reverse" if row.straggler else ""
            text.append(f"{'rank ' + str(row.rank):<{LABEL}}", style=highlight)
            text.append(f"{ms(row.step_ms):>{NUMBER - 1}}  ")
            text.append_text(phase_bar(row.breakdown_ms, round(width * row.step_ms / longest)))
            if row.straggler:
                text.append(MARK, style="bold")
        return text


class Legend(Widget):
    """The key to the bars, with the run's mean per phase: letter, name, ms and share."""

    DEFAULT_CSS = "Legend { height: auto; }"
    ENTRY = 29

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.view: RunView | None = None

    def show(self, view: RunView) -> None:
        self.view = view
        self.refresh(layout=True)

    def _columns(self, width: int) -> int:
        return 2 if width >= 2 * self.ENTRY + 2 else 1

    def _host_bound(self) -> bool:
        return self.view is not None and self.view.report.summary.host_bound_ms is not None

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        extra = 1 if self._host_bound() else 0  # GPU runs: the phases' host-bound parts
        return 1 + len(S.BREAKDOWN_PHASES) // self._columns(width) + extra

    def render(self) -> Text:
        if self.view is None:
            return Text("")
        summary = self.view.report.summary
        step = summary.step_ms or 1.0
        columns = self._columns(self.size.width)
        per_column = len(S.BREAKDOWN_PHASES) // columns
        text = Text(no_wrap=True)
        text.append("mean per step (ms, share)", style="bold")
        for line in range(per_column):
            text.append("\n")
            for column in range(columns):
                phase = S.BREAKDOWN_PHASES[column * per_column + line]
                value = summary.breakdown_ms[phase]
                if column:
                    text.append("   ")
                text.append(PHASE_LETTER[phase], style=f"reverse {PHASE_STYLE[phase]}")
                text.append(f" {phase:<9}", style=PHASE_STYLE[phase])
                text.append(f"{ms(value):>8} ms {pct(value / step):>4}")
        if summary.host_bound_ms is not None:
            text.append("\n")
            text.append_text(host_bound_text(summary.host_bound_ms))
        return text


class OverviewPane(VerticalScroll):
    """Where the time goes, at a glance."""

    can_focus = True
    DEFAULT_CSS = """
    OverviewPane #verdict, OverviewPane RankBars, OverviewPane Legend { margin: 0 0 1 0; }
    """

    def compose(self) -> ComposeResult:
        yield Static("reading the analysis results…", id="verdict", markup=False)
        yield RankBars(id="bars")
        yield Legend(id="legend")
        yield Static(id="notes", markup=False)

    def show(self, view: RunView) -> None:
        verdict = verdict_text(view.report)
        failed = failure_text(view.report)
        if failed is not None:  # (a job that failed: what went wrong first, above the window's)
            verdict = Text.assemble(failed, "\n", verdict)
        gpu_verdict = gpu_verdict_text(view.report)
        if gpu_verdict is not None:
            verdict.append("\n")
            verdict.append_text(gpu_verdict)
        self.query_one("#verdict", Static).update(verdict)
        self.query_one(RankBars).show(view)
        self.query_one(Legend).show(view)
        notes = Text()
        notes.append_text(communication_text(view.report))
        notes.append("\n")
        notes.append_text(straggler_text(view.report))
        serving = servers_text(view.report)  # (a parameter-server job: workers and servers)
        if serving is not None:
            notes.append("\n")
            notes.append_text(serving)
        # GPU ranks: the device's time explained (the first few; `report` lists them all)
        for row in [r for r in view.report.ranks if r.gpu is not None][:GPU_RANKS]:
            assert row.gpu is not None
            notes.append("\n")
            notes.append_text(gpu_rank_text(row.rank, row.gpu))
        if view.report.fsdp_gathers:
            notes.append("\n")
            notes.append_text(fsdp_text(view.report))
        if view.report.incomplete_steps:
            notes.append("\n")
            notes.append_text(incomplete_text(view.report))
        whole = whole_run_text(view.report.whole_run)  # (every step, from the step record)
        if whole is not None:
            notes.append("\n")
            notes.append_text(whole)
        for warning in shown_notes(view.report.warnings):
            notes.append("\n")
            notes.append_text(untrusted("warning: " + str(warning), style="yellow"))
        for remark in shown_notes(view.report.remarks, "note"):
            notes.append("\n")
            notes.append_text(untrusted("note: " + str(remark), style="bright_black"))
        self.query_one("#notes", Static).update(notes)
