"""Progress is drawn on a terminal only, in place (one line rewritten: ``\\r`` and erase to the
end of the line), not before a stage has run a moment nor more often than a few times a second,
and erased when done, so it never mixes with what the command prints."""

from __future__ import annotations

import io

import pytest

from traceview.views import progress as P


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [100.0]
    monkeypatch.setattr(P.time, "monotonic", lambda: now[0])
    monkeypatch.delenv(P.FORCE_ENV, raising=False)
    return now


def test_a_stage_is_drawn_in_place_after_a_moment_and_erased_at_the_end(clock: list[float]) -> None:
    screen = Terminal()
    with P.TerminalProgress(screen) as progress:
        progress("looking at files", 0, 20_000)  # the stage starts: nothing yet
        clock[0] += P.DELAY_S / 2
        progress("looking at files", 10, 20_000)
        assert screen.getvalue() == ""
        clock[0] += P.DELAY_S
        progress("looking at files", 12_345, 20_000)
        assert screen.getvalue() == "\r\x1b[Ktraceview: looking at files 12,345/20,000"
        clock[0] += P.INTERVAL_S / 4  # too soon to draw again...
        progress("looking at files", 12_346, 20_000)
        assert screen.getvalue().count("\r") == 1
        progress("looking at files", 20_000, 20_000)  # ...but the end of a stage is drawn
        assert screen.getvalue().endswith("looking at files 20,000/20,000")
    assert screen.getvalue().endswith("\r\x1b[K")  # erased


def test_a_new_stage_waits_its_own_moment(clock: list[float]) -> None:
    screen = Terminal()
    progress = P.TerminalProgress(screen)
    progress("looking at files", 0, 3)
    clock[0] += 2 * P.DELAY_S
    progress("looking at files", 2, 3)
    progress("ingesting ranks", 0, 3)
    clock[0] += P.DELAY_S / 2
    progress("ingesting ranks", 1, 3)
    assert "ingesting" not in screen.getvalue()
    clock[0] += P.DELAY_S
    progress("ingesting ranks", 2, None)
    assert screen.getvalue().endswith("\r\x1b[Ktraceview: ingesting ranks 2")


def test_nothing_is_drawn_where_stderr_is_not_a_terminal(clock: list[float]) -> None:
    log = io.StringIO()
    with P.TerminalProgress(log) as progress:
        for done in range(5):
            clock[0] += 1.0
            progress("ingesting ranks", done, 5)
    assert log.getvalue() == ""


def test_a_quick_command_draws_and_erases_nothing(clock: list[float]) -> None:
    screen = Terminal()
    with P.TerminalProgress(screen) as progress:
        progress("ingesting ranks", 1, 1)
    assert screen.getvalue() == ""
