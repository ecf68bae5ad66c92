"""The report page's frame: sortable tables, the verdict's words in HTML, the style and the one
small script, all inline (the file opens offline, from disk or an attachment; no ``src`` or
``href`` names anything outside it)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.text import Text

from traceview.views.html.svg import esc


@dataclass(frozen=True)
class Cell:
    """A table cell: what it shows (escaped here) and the value it sorts by (a number: its
    exact figure, kept in ``data-v`` for the sort and for anyone reading the page)."""

    shown: str
    value: float | None = None
    kind: str = ""  # a phase: the cell is tinted with its colour

    @classmethod
    def of(cls, value: object) -> Cell:
        if isinstance(value, Cell):
            return value
        if isinstance(value, bool) or value is None:
            return cls("" if value is None else ("yes" if value else "no"))
        if isinstance(value, int):
            return cls(str(value), float(value))
        if isinstance(value, float):
            return cls(f"{value:.2f}", value)
        return cls(str(value))


def ms_cell(value: float | None) -> Cell:
    return Cell("" if value is None else f"{value:.2f}", value)


def pct_cell(value: float | None) -> Cell:
    return Cell("" if value is None else f"{value * 100:.0f}%", value)


def table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], *, name: str, caption: str = ""
) -> str:
    """A table whose columns sort on a click (numbers by their exact value); ``name`` is its
    ``data-table``, by which tests and readers find it."""
    out = [f'<table class="sortable" data-table="{esc(name)}">']
    if caption:
        out.append(f"<caption>{esc(caption, None)}</caption>")
    out.append("<thead><tr>")
    out += [f'<th scope="col" tabindex="0">{esc(h)}</th>' for h in headers]
    out.append("</tr></thead><tbody>")
    for row in rows:
        out.append("<tr>")
        for raw in row:
            cell = Cell.of(raw)
            attrs = ""
            if cell.value is not None:
                attrs += f' data-v="{cell.value!r}" class="n"'
            if cell.kind:
                attrs += f' data-k="{esc(cell.kind)}"'
            out.append(f"<td{attrs}>{esc(cell.shown, 300)}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def figure(svg: str, *tables: str, note: str = "", side: bool = False) -> str:
    """A figure with its numbers: the drawing, then the table(s) with every figure it draws
    (``side``: narrow tables, beside the drawing on a wide screen)."""
    extra = f'<p class="note">{esc(note, None)}</p>' if note else ""
    kind = "figure side" if side else "figure"
    parts = [*tables, extra] if side else [extra, *tables]  # (the note under the drawing)
    return f'<div class="{kind}"><div class="draw">{svg}</div>{"".join(parts)}</div>'


#: Rich colour names (the terminal views' styles, views/style.py) as the page's classes.
_COLOURS = ("magenta", "cyan", "green", "blue", "yellow", "red", "white", "bright_black")


def rich_html(text: Text) -> str:
    """A ``Text`` of the terminal views (verdicts, advice) as HTML: the same words, bold and
    colour kept, every piece escaped (the text was made safe where it was built)."""
    console = Console(file=io.StringIO(), width=10_000, color_system="truecolor")
    out = []
    for segment in text.render(console):
        piece = "<br>".join(esc(line, None) for line in segment.text.split("\n"))
        style = segment.style
        if style is None or not piece:
            out.append(piece)
            continue
        colour = style.color.name if style.color is not None else ""
        if colour in _COLOURS:
            piece = f'<span class="c-{colour}">{piece}</span>'
        if style.bold:
            piece = f"<b>{piece}</b>"
        out.append(piece)
    return "".join(out)


@dataclass(frozen=True)
class Section:
    id: str
    title: str
    body: str


def page(title: str, sections: Sequence[Section], *, generator: str) -> str:
    """The whole page: a contents line, then each section in order."""
    nav = " · ".join(f'<a href="#{s.id}">{esc(s.title)}</a>' for s in sections)
    body = "".join(
        f'<section id="{s.id}"><h2>{esc(s.title)}</h2>{s.body}</section>' for s in sections
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        # nothing is loaded from anywhere: this policy makes the browser hold the page to it
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">"
        f'<meta name="generator" content="{esc(generator)}">'
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>"
        f"<header><h1>{esc(title)}</h1><nav>{nav}</nav></header><main>{body}</main>"
        f"<script>{SCRIPT}</script></body></html>\n"
    )


#: Phase colours (the terminal's, as the text report and the TUI show them).
PHASE_COLOURS = {
    "io": "#b15cc1",
    "h2d": "#22a6b3",
    "forward": "#3c9a4c",
    "backward": "#3a66c4",
    "update": "#d4a017",
    "comm": "#d0463b",
    "other": "#8e959c",
    "idle": "#d5d9de",
    # what else a figure draws
    "exposed": "#d0463b",
    "hidden": "#f1a9a3",
    "wait": "#7d1f18",
    "transfer": "#d0463b",
    "queued": "#f1a9a3",
    "compute": "#3c9a4c",
    "bubble": "#d5d9de",
    "late_start": "#ffd166",
    "kernel": "#3a66c4",
    "host_bound": "#b15cc1",
    "launch": "#b15cc1",
    "step": "#3a66c4",
    "band": "#9ecae1",
    "peak": "#3a66c4",
    "reserved": "#c6dbef",
    "baseline": "#8e959c",
}
_TEXT_COLOURS = {
    "magenta": "#8e3ea0", "cyan": "#137a84", "green": "#2c7a3a", "blue": "#2f57ab",
    "yellow": "#8a6a00", "red": "#b3322a", "white": "#555", "bright_black": "#6b7178",
}  # fmt: skip

STYLE = (
    "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:#1d2125;"
    "margin:0;background:#fff}header{padding:16px 24px 8px;border-bottom:1px solid #e3e6e9}"
    "h1{font-size:20px;margin:0 0 6px}h2{font-size:17px;margin:28px 0 8px}"
    "nav{font-size:13px}nav a{color:#2f57ab;text-decoration:none}"
    "main{padding:0 24px 40px;max-width:1180px}"
    ".verdict{font-size:15px;background:#f6f8fa;border-left:4px solid #d0463b;padding:10px 14px}"
    ".headline{display:flex;gap:32px;flex-wrap:wrap;margin:12px 0}"
    ".figure-big{font-size:26px;font-weight:600}.figure-big small{font-size:13px;"
    "font-weight:400;color:#6b7178;display:block}"
    ".figure{margin:10px 0 18px}.figure .note{margin:0}"
    ".figure.side{display:grid;grid-template-columns:minmax(420px,3fr) minmax(280px,2fr);"
    "gap:16px;align-items:start}.figure.side .note{grid-column:1/-1}"
    "@media (max-width:900px){.figure.side{grid-template-columns:1fr}}"
    "svg.fig{max-width:100%;height:auto;font-size:11px}svg .unit{text-anchor:end;fill:#6b7178;"
    "font-size:10px}svg .label{text-anchor:end;fill:#1d2125}"
    "svg .tick{text-anchor:middle;fill:#6b7178;font-size:10px}svg .grid{stroke:#eceff1}"
    "svg .note{fill:#6b7178;font-size:10px}svg .faded{opacity:.35}"
    "svg .lane{stroke:#eceff1;stroke-width:1}svg .jump{stroke:#1d2125;stroke-width:1;"
    "stroke-dasharray:2 2}svg rect:hover{stroke:#1d2125;stroke-width:1}"
    "table{border-collapse:collapse;font-size:12.5px;margin:4px 0 12px}"
    "caption{text-align:left;font-weight:600;padding:2px 0 4px}"
    "th,td{padding:3px 8px;border-bottom:1px solid #eceff1;text-align:left;"
    "vertical-align:top;overflow-wrap:anywhere}td.n{text-align:right;"
    "font-variant-numeric:tabular-nums;white-space:nowrap}"
    "th{cursor:pointer;user-select:none;background:#f6f8fa;position:sticky;top:0}"
    "th[aria-sort=ascending]::after{content:' \\25B2'}"
    "th[aria-sort=descending]::after{content:' \\25BC'}"
    ".legend span{display:inline-block;margin-right:12px;font-size:12px}"
    ".legend i{display:inline-block;width:10px;height:10px;margin-right:4px;"
    "vertical-align:-1px}"
    ".muted,.note{color:#6b7178}ul.warnings li{margin:2px 0}"
    "details>summary{cursor:pointer;color:#2f57ab}"
    "@media print{nav{display:none}section{break-inside:avoid-page}"
    "th{position:static}.figure.side{grid-template-columns:1fr}}"
    + "".join(f"svg .k-{k}{{fill:{v}}}td[data-k={k}]{{box-shadow:inset 3px 0 {v}}}"
              f".legend .k-{k}{{background:{v}}}" for k, v in PHASE_COLOURS.items())
    + "".join(f".c-{k}{{color:{v}}}" for k, v in _TEXT_COLOURS.items())
)  # fmt: skip

#: Sorting: a click (or Enter) on a header sorts its table by that column, numbers by their
#: exact value (data-v), text as text; again to reverse.
SCRIPT = """
document.querySelectorAll('table.sortable th').forEach(function (th, _, all) {
  function sort() {
    var table = th.closest('table'), body = table.tBodies[0];
    var col = Array.prototype.indexOf.call(th.parentNode.children, th);
    var down = th.getAttribute('aria-sort') !== 'descending';
    th.parentNode.querySelectorAll('th').forEach(function (h) { h.removeAttribute('aria-sort'); });
    th.setAttribute('aria-sort', down ? 'descending' : 'ascending');
    var rows = Array.prototype.slice.call(body.rows);
    function key(row) {
      var cell = row.cells[col];
      if (!cell) return '';
      var v = cell.getAttribute('data-v');
      return v === null ? cell.textContent : parseFloat(v);
    }
    rows.sort(function (a, b) {
      var x = key(a), y = key(b);
      var c = typeof x === 'number' && typeof y === 'number' ? x - y : String(x).localeCompare(String(y));
      return down ? -c : c;
    });
    rows.forEach(function (row) { body.appendChild(row); });
  }
  th.addEventListener('click', sort);
  th.addEventListener('keydown', function (e) { if (e.key === 'Enter') sort(); });
});
"""


def legend(kinds: Sequence[str], names: dict[str, str] | None = None) -> str:
    names = names or {}
    spans = "".join(f'<span><i class="k-{k}"></i>{esc(names.get(k, k))}</span>' for k in kinds)
    return f'<div class="legend">{spans}</div>'
