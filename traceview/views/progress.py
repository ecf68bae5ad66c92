"""Progress on a terminal: one line on stderr, rewritten in place (``traceview: ingesting
ranks 1,234/20,000``), drawn at most a few times a second and only once a stage has run a
moment; erased when the command is done, so what stays on the screen is the command's output.
Where stderr is not a terminal (a pipe, a file, CI) nothing is drawn: logs hold results, not
progress."""

from __future__ import annotations

import os
import sys
import time
from types import TracebackType
from typing import TextIO

#: Not drawn before a stage has run this long (a quick command shows no progress), nor more
#: often than every INTERVAL_S.
DELAY_S = 0.5
INTERVAL_S = 0.2
#: Set to draw progress where stderr is not a terminal (tests of the line itself).
FORCE_ENV = "TRACEVIEW_PROGRESS"


class TerminalProgress:
    """A ``model.progress.Progress`` drawn on ``stream``; a context manager that erases it."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        try:
            tty = self.stream.isatty()
        except (AttributeError, ValueError):
            tty = False
        self.enabled = tty or os.environ.get(FORCE_ENV) == "1"
        self.stage: str | None = None
        self.stage_started = 0.0
        self.last_drawn = 0.0
        self.drawn = False

    def __call__(self, stage: str, done: int, total: int | None = None) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if stage != self.stage:
            self.stage, self.stage_started = stage, now
        finished = total is not None and done >= total
        if now - self.stage_started < DELAY_S or (
            now - self.last_drawn < INTERVAL_S and not finished
        ):
            return
        count = f"{done:,}/{total:,}" if total is not None else f"{done:,}"
        self._write(f"\r\x1b[Ktraceview: {stage} {count}")
        self.last_drawn, self.drawn = now, True

    def close(self) -> None:
        if self.drawn:
            self._write("\r\x1b[K")
            self.drawn = False

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken terminal: progress is not worth an error
            self.enabled = False

    def __enter__(self) -> TerminalProgress:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
