"""The report page's figures as inline SVG, drawn here from the report's own numbers.

Plain SVG rather than a plotting library (docs/design.md, "The HTML report"): the figures are
bars, lanes and a grid of cells, the page must stay small and open offline, print as vectors,
and show every figure with scripts off. Each shape carries its number in a ``<title>`` (the
browser shows it on hover); every string from a trace is escaped here, once (``esc``).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

from traceview.model.escape import safe

#: Width of every figure's drawing area, in SVG user units (the page scales it to its column).
WIDTH = 760
LABEL = 70  # the least room for the row labels on the left
LABEL_CHARS = 44  # a longer label is cut (whole in its hover text)
ROW = 18  # one bar's height
GAP = 4


def esc(value: object, limit: int | None = 200) -> str:
    """Untrusted text as HTML/SVG text or an attribute value: control characters replaced
    (``safe``), then <, >, &, quotes escaped."""
    return html.escape(safe(str(value), limit) if limit else safe(str(value)), quote=True)


def num(value: float) -> str:
    """A coordinate, short."""
    return f"{value:.1f}".rstrip("0").rstrip(".")


@dataclass(frozen=True)
class Part:
    """One piece of a bar: its class (a phase's colour), value and hover text."""

    kind: str
    value: float
    title: str


@dataclass(frozen=True)
class Bar:
    label: str  # (escaped by the figure)
    parts: Sequence[Part]
    faded: bool = False  # drawn lighter: a step the headline figures leave out
    note: str = ""  # after the bar (escaped by the figure)


def _label_room(labels: Sequence[str]) -> float:
    """Room for the longest label (about 6.2 units a character at the figures' 11 px)."""
    longest = max((min(len(label), LABEL_CHARS + 1) for label in labels), default=0)
    return max(LABEL, longest * 6.2 + 10)


def _cut(label: str) -> str:
    return label if len(label) <= LABEL_CHARS else label[: LABEL_CHARS - 1] + "…"


def _size(width: float, height: float) -> str:
    """Drawn at its own size (shrunk, never grown, to the column: the CSS's max-width)."""
    return f'width="{num(width)}" height="{num(height)}" viewBox="0 0 {num(width)} {num(height)}"'


def _whole(label: str) -> str:
    """The whole label on hover, where it is cut."""
    return f"<title>{esc(label, 400)}</title>" if len(label) > LABEL_CHARS else ""


def _ticks(top: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to about ``top``."""
    if top <= 0:
        return [0.0]
    raw = top / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return [i * step for i in range(int(top / step) + 1)]


def _axis(left: float, scale: float, top: float, y: float, unit: str) -> list[str]:
    out = []
    for tick in _ticks(top):
        x = left + tick * scale
        out.append(
            f'<line class="grid" x1="{num(x)}" y1="0" x2="{num(x)}" y2="{num(y)}"/>'
            f'<text class="tick" x="{num(x)}" y="{num(y + 12)}">{tick:g}</text>'
        )
    out.append(f'<text class="unit" x="{WIDTH}" y="{num(y + 24)}">{unit}</text>')
    return out


def bars(rows: Sequence[Bar], *, label: str, unit: str = "ms", top: float | None = None) -> str:
    """Horizontal bars, each a stack of parts from the left, on one scale; ``label`` names the
    figure for screen readers."""
    if not rows:
        return ""
    longest = max(sum(p.value for p in r.parts) for r in rows)
    top = max(top or longest, 1e-9)
    left = _label_room([r.label for r in rows])
    scale = (WIDTH - left - 60) / top
    height = len(rows) * (ROW + GAP)
    out = [f'<svg class="fig" {_size(WIDTH, height + 28)} role="img" aria-label="{esc(label)}">']
    out += _axis(left, scale, top, height, unit)
    for i, row in enumerate(rows):
        y = i * (ROW + GAP)
        faded = ' class="faded"' if row.faded else ""
        out.append(
            f"<g{faded}>"
            f'<text class="label" x="{num(left - 6)}" y="{num(y + ROW - 5)}">'
            f"{_whole(row.label)}{esc(_cut(row.label))}</text>"
        )
        x = left
        for part in row.parts:
            w = part.value * scale
            if w <= 0:
                continue
            out.append(
                f'<rect class="k-{esc(part.kind)}" x="{num(x)}" y="{num(y)}" width="{num(w)}" '
                f'height="{ROW}"><title>{esc(part.title, 400)}</title></rect>'
            )
            x += w
        if row.note:
            out.append(f'<text class="note" x="{num(x + 4)}" y="{num(y + ROW - 5)}">'
                       f"{esc(row.note)}</text>")  # fmt: skip
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)


#: The heatmap's colour ramp: light (fast) to dark (slow).
RAMP = ("#f7fbff", "#deebf7", "#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#084594")


def heatmap(
    rows: Sequence[str],
    columns: Sequence[str],
    values: Sequence[Sequence[float | None]],
    *,
    low: float,
    high: float,
    label: str,
    unit: str = "ms",
) -> str:
    """A grid of cells, one row per ``rows`` and one column per ``columns``, coloured from
    ``low`` to ``high`` (clamped); a missing value is left blank."""
    if not rows or not columns:
        return ""
    left = _label_room(rows)
    cell_w = max((WIDTH - left) / len(columns), 0.5)
    cell_h = 14 if len(rows) <= 64 else 10
    height = len(rows) * cell_h
    out = [
        f'<svg class="fig" {_size(left + cell_w * len(columns), height + 30)} role="img" '
        f'aria-label="{esc(label)}">'
    ]
    span = high - low
    for r, name in enumerate(rows):
        y = r * cell_h
        out.append(f'<text class="label" x="{num(left - 6)}" y="{num(y + cell_h - 3)}">'
                   f"{esc(_cut(name))}</text>")  # fmt: skip
        for c, value in enumerate(values[r]):
            if value is None or math.isnan(value):
                continue
            level = 0 if span <= 0 else int((value - low) / span * len(RAMP))
            colour = RAMP[min(max(level, 0), len(RAMP) - 1)]
            out.append(
                f'<rect x="{num(left + c * cell_w)}" y="{y}" width="{num(cell_w)}" '
                f'height="{cell_h}" fill="{colour}"><title>{esc(name)} · step '
                f"{esc(columns[c])}: {value:.2f} {unit}</title></rect>"
            )
    every = max(1, math.ceil(len(columns) / 12))
    for c in range(0, len(columns), every):
        out.append(
            f'<text class="tick" x="{num(left + (c + 0.5) * cell_w)}" y="{height + 12}">'
            f"{esc(columns[c])}</text>"
        )
    out.append(
        f'<text class="unit" x="{num(left + cell_w * len(columns))}" y="{height + 26}">'
        f"step · colour: {low:.2f} to {high:.2f} {unit}</text></svg>"
    )
    return "".join(out)


@dataclass(frozen=True)
class Segment:
    lane: int
    start: float
    length: float
    kind: str
    title: str


def lanes(names: Sequence[str], segments: Sequence[Segment], *, total: float, label: str) -> str:
    """Segments on lanes along one time axis (ms), joined in order where the path moves from
    one lane to another."""
    if not names or not segments:
        return ""
    left = _label_room(names)
    scale = (WIDTH - left - 10) / max(total, 1e-9)
    lane_h = ROW + 10
    height = len(names) * lane_h
    out = [f'<svg class="fig" {_size(WIDTH, height + 28)} role="img" aria-label="{esc(label)}">']
    out += _axis(left, scale, total, height, "ms from the step's start")
    for i, name in enumerate(names):
        y = i * lane_h
        out.append(
            f'<line class="lane" x1="{num(left)}" y1="{y + ROW / 2}" x2="{WIDTH}" y2="{y + ROW / 2}"/>'
            f'<text class="label" x="{num(left - 6)}" y="{num(y + ROW - 5)}">{esc(_cut(name))}</text>'
        )
    previous: Segment | None = None
    for s in segments:
        x, y = left + s.start * scale, s.lane * lane_h
        if previous is not None and previous.lane != s.lane:  # the path moves to another rank
            px = left + (previous.start + previous.length) * scale
            py = previous.lane * lane_h + ROW / 2
            out.append(f'<line class="jump" x1="{num(px)}" y1="{num(py)}" x2="{num(x)}" '
                       f'y2="{num(y + ROW / 2)}"/>')  # fmt: skip
        out.append(
            f'<rect class="k-{esc(s.kind)}" x="{num(x)}" y="{y}" '
            f'width="{num(max(s.length * scale, 0.6))}" height="{ROW}">'
            f"<title>{esc(s.title, 400)}</title></rect>"
        )
        previous = s
    out.append("</svg>")
    return "".join(out)
