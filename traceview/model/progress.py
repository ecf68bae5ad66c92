"""How a long stage says how far it has come, without knowing who shows it (a terminal line,
nothing): ``progress(stage, done, total)`` after each unit of work (a file looked at, a rank
ingested). Calls are cheap; the view decides how often to draw."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def __call__(self, stage: str, done: int, total: int | None = None) -> None: ...


def quiet(stage: str, done: int, total: int | None = None) -> None:
    """No progress shown (a library call, a test, output that is not a terminal)."""
