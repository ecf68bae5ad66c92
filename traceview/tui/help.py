"""The help overlay (`?`): every key, and how to read the screens."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from traceview.tui.render import legend_text

KEYS = (
    ("Everywhere", ""),
    ("1-6, tab", "overview, timeline, operators, ranks, steps, compare"),
    ("?", "this help (esc or ? closes it)"),
    ("q", "quit"),
    ("Timeline", ""),
    ("← → h l", "pan along time"),
    ("+ -  0", "zoom in, out; the whole step"),
    ("[ ]", "previous, next step"),
    ("↑ ↓ k j", "select a rank (its threads and streams open under it)"),
    ("e", "threads and streams of every rank"),
    ("a", "align ranks at their step start / the run's clock"),
    ("c", "mark each rank's arrival at a collective (next, most skewed first; ▼ last)"),
    ("p", "pipeline: a row per stage, its compute against its bubble ░ (pipeline runs)"),
    ("f", "FSDP: a row per unit, its all-gathers in flight g G, ready ·, waited for ! (FSDP runs)"),
    ("x  . ,", "the step's critical path across ranks, underlined; step through its segments"),
    ("Operators", ""),
    ("/", "filter by operator or trace name (enter or esc: back to the table)"),
    ("s", "sort: self, total, calls, mean, p95, op"),
    ("p", "phase filter: all, io, h2d, forward, backward, update, comm, other"),
    ("k", "kernel launches per operator and phase (GPU runs; again: back to operators)"),
    ("Ranks", ""),
    ("/", "filter: ranks 0-15, 32, 1000-; straggler; part of a host name"),
    ("s", "sort: busy, step, blocked, wait, rank"),
    ("m", "heatmap: ranks × steps (arrows move, p: step or a phase)"),
    ("g", "group by mesh dimension: dp, tp, …, pipeline stage, none (runs with a mesh)"),
)

READING = (
    "Bars and lanes carry one letter per phase, so they read without colour. The breakdown "
    "counts every instant of a step once, for the most important thing running then: "
    "forward | backward | update > h2d > io > comm > other > idle. Communication under "
    "compute is hidden; the rest is exposed. Names from traces are shown literally."
)


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,question_mark,q", "dismiss", "Close"),
    ]

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 90%; max-width: 90; height: 90%; max-height: 32;
        border: round $accent; background: $surface; padding: 0 1;
    }
    """

    def compose(self) -> ComposeResult:
        keys = Table(box=None, show_header=False, pad_edge=False, padding=(0, 2, 0, 0))
        keys.add_column(no_wrap=True, style="bold")
        keys.add_column()  # wraps under itself, not under the keys
        for key, what in KEYS:
            if what:
                keys.add_row("  " + key, what)
            else:
                keys.add_row(Text(key, style="bold underline"), "")
        reading = Text("\n")
        reading.append_text(legend_text())
        reading.append("\n\n" + READING)
        with VerticalScroll():
            yield Static(keys, id="help-keys")
            yield Static(reading, id="help-reading", markup=False)

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)
