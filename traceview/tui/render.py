"""Rich ``Text`` pieces the screens share: numbers, the verdict, bars, lanes and the legend.

Everything from a trace goes through ``safe`` into a ``Text`` (never a markup string), so names
are shown literally and no control character reaches the terminal.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text

from traceview import schema as S
from traceview.report import PHASE_LETTER, PHASE_STYLE, SHORT, phase_bar
from traceview.text import safe
from traceview.tui.model import PHASE_WORDS, Cell

__all__ = ["PHASE_LETTER", "PHASE_STYLE", "SHORT", "phase_bar"]


def ms(value: float) -> str:
    return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.1f}"


def pct(value: float) -> str:
    return f"{100 * value:.0f}%"


def signed_pct(value: float) -> str:
    return f"{100 * value:+.0f}%"


def untrusted(value: object, limit: int | None = None, style: str = "") -> Text:
    """A name from a trace, shown literally: controls escaped, markup not interpreted."""
    return Text(safe(value, limit), style=style, no_wrap=True, overflow="ellipsis")


def phase_text(phase: str, short: bool = False) -> Text:
    label = SHORT.get(phase, phase) if short else phase
    return Text(label, style=PHASE_STYLE.get(phase, ""))


def title_text(report: dict[str, Any], label: str) -> Text:
    run = report["run"]
    text = Text("traceview", style="bold")
    text.append(" · ")
    text.append(safe(label, 40))
    text.append(f" · {safe(run.get('framework') or '?')}")
    text.append(f" · {run['ranks']} rank{'s' if run['ranks'] != 1 else ''}")
    text.append(f" · {run['steps']} step{'s' if run['steps'] != 1 else ''}")
    text.append(f" · {run.get('timeline') or '?'} timeline")
    return text


def verdict_text(report: dict[str, Any]) -> Text:
    """Where the time goes, in words: the bottleneck and how much communication is hidden."""
    summary = report["summary"]
    bottleneck = summary["bottleneck"]
    if bottleneck is None:
        return Text("no phase time found in this run")
    step, share = summary["step_ms"], summary["bottleneck_share"]
    comm, hidden = summary["comm_total_ms"], summary["comm_hidden_fraction"]
    text = Text()
    text.append(PHASE_WORDS[bottleneck], style=f"bold {PHASE_STYLE[bottleneck]}")
    text.append(f" is the bottleneck: {pct(share)} of the {ms(step)} ms step")
    if bottleneck == S.COMM:
        text.append(f", {pct(hidden)} of it hidden behind compute")
    elif comm > 0:
        text.append(
            f"; communication {ms(comm)} ms per step, {pct(hidden)} of it hidden behind compute"
        )
    if comm > 0:
        exposed = summary["comm_exposed_ms"]
        text.append(
            f" (exposed {ms(exposed)} ms, {pct(exposed / step if step else 0)} of the step;"
        )
        text.append(f" hidden: {summary['hidden']})")
    else:
        text.append("; no communication found")
    return text


def straggler_text(report: dict[str, Any]) -> Text:
    summary = report["summary"]
    rank = summary.get("straggler_rank")
    if rank is None:
        return Text("straggler: one rank, none to compare", style="bright_black")
    excess = summary.get("straggler_excess", 0.0)
    text = Text("straggler: ")
    if summary.get("straggler_significant"):
        text.append(f"rank {rank}", style="bold reverse")
        text.append(f", busy {pct(excess)} longer than the median rank; the others wait for it")
    else:
        text.append(f"rank {rank}", style="bold")
        text.append(f" is busiest, only {pct(excess)} above the median: ranks are balanced")
    return text


def communication_text(report: dict[str, Any]) -> Text:
    summary = report["summary"]
    if summary["comm_total_ms"] <= 0:
        return Text("communication: none found")
    return Text(
        f"communication: total {ms(summary['comm_total_ms'])} ms per step, exposed "
        f"{ms(summary['comm_exposed_ms'])} ms, hidden {pct(summary['comm_hidden_fraction'])}"
        f" (hidden: {summary['hidden']})"
    )


def legend_text(phases: tuple[str, ...] = S.BREAKDOWN_PHASES) -> Text:
    """One letter per phase, coloured as in the bars: the key to read them without colour."""
    text = Text()
    for i, phase in enumerate(phases):
        if i:
            text.append("  ")
        text.append(PHASE_LETTER[phase], style=f"reverse {PHASE_STYLE[phase]}")
        text.append(f" {phase}")
    return text


def lane_cells(cells: list[Cell]) -> Text:
    """A timeline lane from its binned cells: a letter per phase, reversed where the phase fills
    the cell, plain where it fills part of it, '.' for idle time, blank where nothing runs."""
    text = Text(no_wrap=True)
    start = 0
    for i in range(1, len(cells) + 1):
        if i < len(cells) and cells[i] == cells[start]:
            continue
        cell, length = cells[start], i - start
        if cell is None:
            text.append(" " * length)
        else:
            phase, solid = cell
            style = PHASE_STYLE[phase]
            if phase == S.IDLE:
                style = "bright_black"
            elif solid:
                style = f"reverse {style}"
            text.append(PHASE_LETTER[phase] * length, style=style)
        start = i
    return text


def ratio_text(ratio: float | None) -> Text:
    """A ratio against the baseline; slower (above 1.1) in red, faster (below 0.9) in green;
    "-" where the baseline has none, "absent" where this run has none."""
    if ratio is None:
        return Text("-", style="bright_black")
    if ratio == 0:
        return Text("absent", style="bright_black")
    style = "red" if ratio > 1.1 else "green" if ratio < 0.9 else ""
    return Text(f"{ratio:.2f}×", style=style)
