"""``traceview watch RUN``: the live screen of a run `collect` is writing. A worker thread looks
at the run every ``interval`` seconds (``runs.live.LiveRun``: only what was added since the
last look is read) and hands the look to the panes: the job's line and step-time sparkline,
the alerts, the ranks (stopped, slowest and lagging first), the profile windows, and the last
lines of the job's output where `collect --live` keeps it (RUN/job.log). Key p asks every rank
to profile its next steps (``traceview profile``), q quits; nothing else writes into the run.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Footer, Static

from traceview.model.errors import TraceviewError
from traceview.model.escape import safe
from traceview.model.results.live import LiveSnapshot
from traceview.runs.live import LiveRun
from traceview.views.live import alerts_text, job_line, ranks_table, sparkline, windows_text

#: the job's output kept by `collect --live`, of which the screen shows the last lines
JOB_LOG = "job.log"
LOG_LINES = 8
#: profile windows are listed (a status file per rank read) at most this often, seconds
WINDOWS_EVERY_S = 2.0


class LiveApp(App[None]):
    TITLE = "traceview watch"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    #job { height: auto; background: $panel; padding: 0 1; }
    #spark { height: 1; padding: 0 1; }
    #alerts { height: auto; max-height: 8; padding: 0 1; }
    #ranks { height: 1fr; padding: 0 1; }
    #windows { height: auto; padding: 0 1; }
    #log { height: auto; max-height: 10; padding: 0 1; color: $text-muted; border-top: solid $panel; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("p", "profile", "Profile the next steps"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, run: Path, interval: float = 0.5, log: Path | None = None) -> None:
        super().__init__()
        self.run_dir = run
        self.interval = interval
        self.log_path = log or run / JOB_LOG
        self.live = LiveRun(run)
        self.look: LiveSnapshot | None = None
        self.error: Exception | None = None
        self._windows_at = 0.0
        self._windows: list = []

    def compose(self) -> ComposeResult:
        yield Static(Text(f"looking at {safe(str(self.run_dir), 120)} ..."), id="job")
        yield Static("", id="spark")
        yield Static("", id="alerts")
        yield Static("", id="ranks")
        yield Static("", id="windows")
        yield Static("", id="log")
        yield Footer()

    def on_mount(self) -> None:
        self._refresh_look()
        self.set_interval(self.interval, self._refresh_look)

    @work(thread=True, exclusive=True, group="look")
    def _refresh_look(self) -> None:
        try:
            now = time.monotonic()
            with_windows = now - self._windows_at >= WINDOWS_EVERY_S
            look = self.live.snapshot(windows=with_windows)
            if with_windows:
                self._windows_at, self._windows = now, look.windows
            else:
                look.windows = self._windows
            log = _tail(self.log_path, LOG_LINES)
        except Exception as exc:  # (never a traceback on the screen: said in one line)
            self.call_from_thread(self._said, f"cannot read the run: {type(exc).__name__}: {exc}")
            return
        self.call_from_thread(self._show, look, log)

    def _show(self, look: LiveSnapshot, log: list[str]) -> None:
        self.look = look
        self.query_one("#job", Static).update(job_line(look, self.run_dir))
        spark = sparkline(look.recent_ms, max(self.size.width - 16, 10)) if look.recent_ms else ""
        self.query_one("#spark", Static).update(Text(f"step time  {spark}", style="cyan"))
        self.query_one("#alerts", Static).update(alerts_text(look))
        rows = max(self.size.height - 16, 4)
        self.query_one("#ranks", Static).update(ranks_table(look, rows))
        self.query_one("#windows", Static).update(windows_text(look))
        if log:
            self.query_one("#log", Static).update(Text("\n".join(safe(line, 300) for line in log)))

    def _said(self, line: str) -> None:
        self.query_one("#alerts", Static).update(Text(safe(line, 300), style="bold red"))

    def action_profile(self) -> None:
        self._ask_profile()

    @work(thread=True, exclusive=True, group="ask")
    def _ask_profile(self) -> None:
        from traceview.runs.live import ask_profile
        from traceview.runs.windows import collect_steps

        try:
            window, start, ranks = ask_profile(self.run_dir, collect_steps(self.run_dir), None)
        except TraceviewError as exc:
            self.call_from_thread(self.notify, safe(str(exc), 300), severity="error")
            return
        self._windows_at = 0.0  # (listed again at the next look)
        self.call_from_thread(
            self.notify, f"asked {ranks} rank(s) for window {window} from step {start}"
        )


def _tail(path: Path, lines: int) -> list[str]:
    """The last ``lines`` lines of the job's output (read from its last 16 KiB)."""
    with contextlib.suppress(OSError), open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(size - 16384, 0))
        text = f.read().decode("utf-8", "replace")
        return [line for line in text.splitlines() if line.strip()][-lines:]
    return []
