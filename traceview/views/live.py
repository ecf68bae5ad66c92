"""A look at a running job (``LiveSnapshot``) as text: the job's line, the alerts, the ranks
(the slowest, the stopped and the lagging first; at most ``RANKS_SHOWN``), its profile windows.
The live screen (tui/live.py) shows the same pieces."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from traceview.model.escape import safe
from traceview.model.results.live import LiveRank, LiveSnapshot

#: ranks listed (the rest counted by state)
RANKS_SHOWN = 24
_BARS = "▁▂▃▄▅▆▇█"
_STATE_STYLE = {
    "running": "green",
    "finished": "bright_black",
    "blocked": "bold red",
    "stuck": "bold red",
    "crashed": "bold red",
    "killed": "red",
}


def sparkline(values: list[float], width: int = 60) -> str:
    """The last ``width`` values as bars (scaled from their minimum to their maximum)."""
    shown = values[-width:]
    if not shown:
        return ""
    low, high = min(shown), max(shown)
    span = high - low
    return "".join(
        _BARS[min(int((v - low) / span * (len(_BARS) - 1) + 0.5), len(_BARS) - 1)]
        if span
        else _BARS[0]
        for v in shown
    )


def job_line(look: LiveSnapshot, run: Path | None = None) -> Text:
    job, ms = look.job, look.step_ms
    style = {"running": "bold green", "finished": "bold", "failed": "bold red"}[job.state]
    text = Text()
    if run is not None:
        text.append(f"{safe(str(run), 80)} · ")
    text.append(job.state, style=style)
    if job.exit_code is not None:
        text.append(f" (exit code {job.exit_code})")
    text.append(f" · {len(look.ranks)} ranks · step {job.steps}")
    if ms.p50 is not None:
        text.append(
            f" · step {ms.last:.2f} ms, median {ms.p50:.2f}, p99 {ms.p99:.2f}"
            f" (over {ms.over_steps} steps)"
        )
    if look.throughput_steps_s is not None:
        text.append(f" · {look.throughput_steps_s:.1f} steps/s")
    if look.slowest_rank is not None:
        since = (
            f" since step {look.slowest_since_step}" if look.slowest_since_step is not None else ""
        )
        text.append(f" · slowest rank {look.slowest_rank}{since}", style="yellow")
    return text


def alerts_text(look: LiveSnapshot) -> Text:
    text = Text()
    for i, alert in enumerate(look.alerts):
        if i:
            text.append("\n")
        style = "bold red" if alert.kind == "stopped" else "yellow"
        text.append(f"! {safe(alert.text, 300)}", style=style)
    for warning in look.warnings[:3]:
        text.append(f"\nwarning: {safe(warning, 200)}", style="yellow")
    return text


def shown_ranks(look: LiveSnapshot, limit: int = RANKS_SHOWN) -> list[LiveRank]:
    """The ranks worth a row first: stopped ones, the slowest, the most behind, then by rank."""

    def key(r: LiveRank) -> tuple[int, int, float, int]:
        stopped = r.state not in ("running", "finished")
        return (not stopped, r.rank != look.slowest_rank, -r.lag_steps, -(r.own_ms or 0), r.rank)  # type: ignore[return-value]

    return sorted(look.ranks, key=key)[:limit] if len(look.ranks) > limit else look.ranks


def ranks_table(look: LiveSnapshot, limit: int = RANKS_SHOWN) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("rank", "step", "lag", "step ms", "own ms", "state", "in", "since"):
        table.add_column(column, justify="left" if column in ("state", "in") else "right")
    for r in shown_ranks(look, limit):
        table.add_row(
            str(r.rank), str(r.step), str(r.lag_steps),
            "" if r.step_ms is None else f"{r.step_ms:.2f}",
            "" if r.own_ms is None else f"{r.own_ms:.2f}",
            Text(r.state, style=_STATE_STYLE.get(r.state, "")),
            safe(r.in_ or "", 60), "" if r.since_s is None else f"{r.since_s:.0f} s",
        )  # fmt: skip
    if len(look.ranks) > limit:
        counts: dict[str, int] = {}
        for r in look.ranks:
            counts[r.state] = counts.get(r.state, 0) + 1
        words = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        table.caption = f"{len(look.ranks)} ranks: {words} (the first {limit} shown)"
    return table


def windows_text(look: LiveSnapshot) -> Text:
    text = Text("profile windows: ", style="bright_black")
    if not look.windows:
        text.append("none yet")
    for i, w in enumerate(look.windows):
        steps = f"steps {w.first_step}-{w.last_step}" if w.first_step is not None else "steps ?"
        text.append(("; " if i else "") + f"{w.window}: {steps} ({w.state})")
    return text


def render_snapshot(look: LiveSnapshot, run: Path | None = None) -> Group:
    parts: list[Text | Table] = [job_line(look, run)]
    if look.recent_ms:
        parts.append(Text(f"step time  {sparkline(look.recent_ms)}", style="cyan"))
    if look.alerts or look.warnings:
        parts.append(alerts_text(look))
    parts.append(ranks_table(look))
    parts.append(windows_text(look))
    return Group(*parts)


def render_snapshot_to_console(look: LiveSnapshot, run: Path | None = None) -> None:
    Console(highlight=False).print(render_snapshot(look, run))
