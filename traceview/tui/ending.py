"""How a failed job ended, above the timeline: each rank's last steps from its step record,
along time, and where it stood at the end (``analysis.failure.rank_tails`` and the report's
``ranks_at_end``).

The axis is cut in two: on the left, the ranks' last steps (█ and ▓ in turn, one step each); on
the right, from the latest of those steps' ends to the job's end, how each rank spent it:
░ blocked in a collective, ! stuck outside one, ✗ where it crashed or was killed, nothing once
finished. A hang of seconds after steps of milliseconds shows both halves whole.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from traceview.model.results import Failure, RankAtEnd, RankTail
from traceview.tui.render import untrusted

#: ranks drawn (the failing rank and those waiting for it first); the rest are counted
SHOWN_RANKS = 16
LABEL = 20
#: cells kept right of the bar for the rank's state
STATE = 44
_STATE_CELL = {"blocked": "░", "stuck": "!", "crashed": "✗", "killed": "✗", "running": " "}
_STATE_STYLE = {"blocked": "yellow", "stuck": "bold red", "crashed": "bold red", "killed": "red"}


def _shown(tails: list[RankTail], failure: Failure | None) -> list[RankTail]:
    first = {failure.rank} if failure is not None and failure.rank is not None else set()
    waiting = set(failure.waiting) if failure is not None else set()
    ordered = sorted(tails, key=lambda t: (t.rank not in first, t.rank not in waiting, t.rank))
    return sorted(ordered[:SHOWN_RANKS], key=lambda t: t.rank)


def ending_text(
    tails: list[RankTail], at_end: list[RankAtEnd], failure: Failure | None, width: int
) -> Text:
    """Each shown rank's row (``width`` cells in all), a line each."""
    text = Text("the job's end: each rank's last steps (step record), then until it ended\n")
    text.stylize("bold", 0, len(text) - 1)
    shown = _shown(tails, failure)
    spans = [s for t in shown for s in t.steps]
    if not spans:
        return text.append("(no rank's step record holds a step)", style="bright_black")
    states = {a.rank: a for a in at_end}
    first = min(s.start_ns for s in spans)
    cut = max(s.end_ns for s in spans)
    last = max([cut, *(t.end_ns for t in shown if t.end_ns is not None)])
    bar = max(width - LABEL - STATE, 20)
    left = bar * 3 // 5
    right = bar - left - 1

    def cell(t_ns: int) -> int:
        if t_ns <= cut:
            return min(int((t_ns - first) / max(cut - first, 1) * left), left - 1)
        return left + 1 + min(int((t_ns - cut) / max(last - cut, 1) * right), right - 1)

    for tail in shown:
        cells = [" "] * bar
        cells[left] = "┆"
        for span in tail.steps:
            mark = "█" if span.step % 2 == 0 else "▓"
            for c in range(cell(span.start_ns), cell(span.end_ns) + 1):
                if c != left:
                    cells[c] = mark
        state = states.get(tail.rank)
        kind = state.state if state is not None else "killed"
        if tail.steps and tail.end_ns is not None and kind in _STATE_CELL:
            start = cell(tail.steps[-1].end_ns) + 1
            stop = cell(tail.end_ns)
            for c in range(start, stop + 1):
                if c != left:
                    cells[c] = _STATE_CELL[kind] if kind in ("blocked", "stuck") else " "
            if kind in ("crashed", "killed") and stop != left:
                cells[stop] = "✗"
        steps = f"{tail.steps[0].step}-{tail.steps[-1].step}" if tail.steps else "no steps"
        text.append(f"rank {tail.rank:<4} {steps} ".ljust(LABEL)[:LABEL], style="bold")
        text.append("".join(cells), style=_STATE_STYLE.get(kind, ""))
        said = kind if state is None or not state.in_ else f"{kind} in "
        text.append(f" {said}")
        if state is not None and state.in_:
            text.append_text(untrusted(state.in_[:28]))
        if state is not None and state.since_s:
            text.append(f" {state.since_s:.1f} s")
        text.append("\n")
    if len(tails) > len(shown):
        text.append(
            f"… and {len(tails) - len(shown)} more ranks (report --json: ranks_at_end)\n",
            style="bright_black",
        )
    span_ms = (cut - first) / 1e6
    text.append(
        f"left of ┆: {span_ms:.0f} ms of last steps (█▓ in turn); right: {(last - cut) / 1e9:.1f} s "
        "to the end (░ blocked in a collective, ! stuck outside one, ✗ crashed or killed)",
        style="bright_black",
    )
    return text


class EndingView(Static):
    """``ending_text`` at the widget's width; hidden where the run did not fail."""

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id, markup=False)
        self._data: tuple[list[RankTail], list[RankAtEnd], Failure | None] | None = None
        self.display = False

    def show(self, tails: list[RankTail], at_end: list[RankAtEnd], failure: Failure | None) -> None:
        self._data = (tails, at_end, failure) if failure is not None and tails else None
        self.display = self._data is not None
        self._draw()

    def on_resize(self) -> None:
        self._draw()

    def _draw(self) -> None:
        if self._data is not None:
            self.update(ending_text(*self._data, width=self.size.width or 100))
