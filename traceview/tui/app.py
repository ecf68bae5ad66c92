"""``traceview tui``: a Textual app over a run's analysis results.

The screens are tabs (keys 1-6, tab and shift+tab): overview, timeline, operators, ranks, steps
and compare. The app reads nothing on the UI thread: a worker opens the runs (ingesting traces
when it is given traces), prepares every screen's rows (``model.build_view``) and hands them to
the panes; until then the overview says what is being opened. The timeline cuts its lanes in
its own worker when it is first shown.
"""

from __future__ import annotations

import asyncio
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Footer, Static, TabbedContent, TabPane

from traceview.model.errors import TraceviewError
from traceview.model.escape import safe
from traceview.model.results import Comparison
from traceview.runs import Run, open_runs
from traceview.tui.comparison import ComparePane
from traceview.tui.help import HelpScreen
from traceview.tui.model import RunView, build_comparison, build_view
from traceview.tui.operators import OperatorsPane
from traceview.tui.overview import OverviewPane
from traceview.tui.ranks import RanksPane
from traceview.tui.render import title_text
from traceview.tui.steps import StepsPane
from traceview.tui.timeline import Timeline, TimelinePane

if TYPE_CHECKING:
    from traceview.model.choice import StepChoice

#: (key, tab id, title) of each screen, in tab order.
SCREENS: tuple[tuple[str, str, str], ...] = (
    ("1", "overview", "Overview"),
    ("2", "timeline", "Timeline"),
    ("3", "operators", "Operators"),
    ("4", "ranks", "Ranks"),
    ("5", "steps", "Steps"),
    ("6", "compare", "Compare"),
)
TAB_IDS = tuple(tab for _, tab, _ in SCREENS)


def _describe(groups: list[list[Path]]) -> str:
    """What is being opened, for the loading line."""
    names = [
        ", ".join(str(p) for p in group[:3]) + (" …" if len(group) > 3 else "") for group in groups
    ]
    return names[0] + "".join(f" (and {name} to compare)" for name in names[1:])


class TraceviewApp(App[None]):
    """The TUI over ``runs`` (already open), or over ``groups`` of paths it opens itself in a
    worker (each group one run: a run directory, a folder of traces or trace files). The first
    run is the one shown; a second is compared with it."""

    TITLE = "traceview"
    ENABLE_COMMAND_PALETTE = False  # every action has its key; keeps the footer short
    CSS = """
    #title { height: 1; background: $panel; padding: 0 1; }
    TabbedContent { height: 1fr; }
    TabbedContent > ContentSwitcher { height: 1fr; }
    TabPane { height: 1fr; padding: 0; }
    TabPane > * { height: 1fr; }
    TimelinePane #timeline-header { height: auto; max-height: 2; }
    TimelinePane #timeline-axis { height: 1; }
    TimelinePane #timeline-ending { height: auto; max-height: 20; margin: 0 0 1 0; }
    TimelinePane #timeline-legend { height: auto; color: $text-muted; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        *(Binding(key, f"show_tab('{tab}')", title, show=False) for key, tab, title in SCREENS),
        Binding("tab", "cycle_tab(1)", "Next screen", show=False, priority=True),
        Binding("shift+tab", "cycle_tab(-1)", "Previous screen", show=False, priority=True),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        runs: list[Run] | None = None,
        *,
        groups: list[list[Path]] | None = None,
        rules: Path | None = None,
        views: list[RunView] | None = None,
        comparison: Comparison | None = None,
        choice: StepChoice | None = None,
        window: int | None = None,
    ) -> None:
        """Show ``runs`` (open run directories), the runs at ``groups`` (opened here), or
        prepared ``views`` (and their ``comparison``), which need no run directory: the
        timeline then has no events to draw."""
        super().__init__()
        if not runs and not groups and not views:
            raise ValueError("TraceviewApp needs runs, groups of paths or views")
        self.runs: list[Run] = list(runs or [])
        self.groups = groups
        self.rules = rules
        self.choice = choice  # the steps --steps/--skip chose (None: warm-up left out)
        self.window = window  # of a run collect made, its profile window (None: the newest)
        self.prepared = list(views or [])
        self.views: list[RunView] = []
        self.comparison: Comparison | None = comparison
        self.error: Exception | None = None  # why the runs could not be opened
        self.ready = asyncio.Event()  # set once the screens show the run (or it failed)
        self._stack = ExitStack()  # the runs the app opened itself

    def compose(self) -> ComposeResult:
        yield Static(Text("traceview", style="bold"), id="title", markup=False)
        with TabbedContent(initial="overview"):
            with TabPane(f"1 {SCREENS[0][2]}", id="overview"):
                yield OverviewPane(id="overview-pane")
            with TabPane(f"2 {SCREENS[1][2]}", id="timeline"):
                yield TimelinePane(id="timeline-pane")
            with TabPane(f"3 {SCREENS[2][2]}", id="operators"):
                yield OperatorsPane(id="operators-pane")
            with TabPane(f"4 {SCREENS[3][2]}", id="ranks"):
                yield RanksPane(id="ranks-pane")
            with TabPane(f"5 {SCREENS[4][2]}", id="steps"):
                yield StepsPane(id="steps-pane")
            with TabPane(f"6 {SCREENS[5][2]}", id="compare"):
                yield ComparePane(id="compare-pane")
        yield Footer()

    def on_mount(self) -> None:
        if self.groups and not self.runs:
            what = safe(_describe(self.groups), 300)
            self.query_one("#verdict", Static).update(Text(f"opening {what} …"))
        self._focus_tab("overview")
        self._load()

    # --- loading, off the UI thread ----------------------------------------------------------

    @work(thread=True, exclusive=True, group="load", name="open runs")
    def _load(self) -> None:
        if self.prepared:
            self.call_from_thread(self._show, [], self.prepared, self.comparison)
            return
        try:
            with ExitStack() as stack:
                runs = self.runs
                if not runs:
                    assert self.groups is not None
                    runs = stack.enter_context(
                        open_runs(
                            self.groups,
                            self.rules,
                            choice=self.choice,
                            windows=[self.window] * len(self.groups),
                        )
                    )
                views = [build_view(run) for run in runs]
                comparison = build_comparison(runs, views)
                self._stack = stack.pop_all()  # the runs stay open until the app ends
        except Exception as exc:
            self.call_from_thread(self._failed, exc)
            return
        self.call_from_thread(self._show, runs, views, comparison)

    def _show(self, runs: list[Run], views: list[RunView], comparison: Comparison | None) -> None:
        self.runs, self.views, self.comparison = runs, views, comparison
        view = views[0]
        self.query_one("#title", Static).update(title_text(view.report, view.label))
        self.query_one(OverviewPane).show(view)
        self.query_one(Timeline).load(runs[0] if runs else None, view)
        self.query_one(TimelinePane).show_ending(view)
        self.query_one(OperatorsPane).show(view)
        self.query_one(RanksPane).show(view)
        self.query_one(StepsPane).show(view)
        self.query_one(ComparePane).show(comparison)
        if self.query_one(TabbedContent).active == "timeline":
            self.query_one(Timeline).activate()
        self.ready.set()

    def _failed(self, error: Exception) -> None:
        self.error = error
        self.ready.set()
        self.exit(return_code=error.exit_code if isinstance(error, TraceviewError) else 1)

    def close_runs(self) -> None:
        """Close what the app opened (temporary run directories are deleted); idempotent."""
        stack, self._stack = self._stack, ExitStack()
        stack.close()

    def on_unmount(self) -> None:
        self.close_runs()

    # --- screens -----------------------------------------------------------------------------

    def action_show_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
        self._focus_tab(tab)

    def action_cycle_tab(self, delta: int) -> None:
        if isinstance(self.screen, HelpScreen):
            return
        current = self.query_one(TabbedContent).active
        index = TAB_IDS.index(current) if current in TAB_IDS else 0
        self.action_show_tab(TAB_IDS[(index + delta) % len(TAB_IDS)])

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        # A tab chosen with the mouse: the keyboard follows it.
        self._focus_tab(event.pane.id or "overview")

    def _focus_tab(self, tab: str) -> None:
        if tab == "timeline":
            timeline = self.query_one(Timeline)
            timeline.focus()
            if self.views:
                timeline.activate()  # cut the lanes once the run is loaded
            return
        pane = self.query_one(f"#{tab}-pane")
        if isinstance(pane, (OperatorsPane, RanksPane, StepsPane)):
            pane.focus_main()
        else:
            pane.focus()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())
