"""What the HTML report's tests share: the page read back with the standard library's parser
(its sortable tables by name, each cell's text and exact value), and runs with hostile names."""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from tests.conftest import SAMPLES
from traceview.runs import ingest_run

#: A name that is markup in a browser: a script that must not run, an element that must not be
#: made, and an attribute break; the terminal's escapes too.
HOSTILE = (
    '</script><script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
    "\"'><b>bold</b>\u001b[2J"
)
#: What a page must never hold literally (each would be markup, not text).
MARKUP = ("<script>window.__pwned", "<img src=x", "<b>bold</b>")
#: No URL outside the page in any src or href (a #fragment is the page's own).
OUTSIDE = re.compile(r"""\b(?:src|href)\s*=\s*["']?(?!#)[^\s"'>]""", re.I)


@dataclass
class Cell:
    text: str
    value: float | None


@dataclass
class Page(HTMLParser):
    tables: dict[str, list[list[Cell]]] = field(default_factory=dict)
    headers: dict[str, list[str]] = field(default_factory=dict)
    figures: dict[str, float] = field(default_factory=dict)
    sections: list[str] = field(default_factory=list)
    _table: str | None = None
    _cell: Cell | None = None
    _in_head: bool = False

    def __post_init__(self) -> None:
        super().__init__()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "section" and a.get("id"):
            self.sections.append(a["id"] or "")
        elif tag == "table" and a.get("data-table"):
            self._table = a["data-table"]
            self.tables[self._table or ""] = []
            self.headers[self._table or ""] = []
        elif tag == "tr" and self._table is not None and not self._in_head:
            self.tables[self._table].append([])
        elif tag == "thead":
            self._in_head = True
        elif tag in ("td", "th") and self._table is not None:
            v = a.get("data-v")
            self._cell = Cell("", float(v) if v is not None else None)
        elif tag == "div" and a.get("data-figure"):
            self.figures[a["data-figure"] or ""] = float(a["data-v"] or "nan")

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._table = None
        elif tag == "thead":
            self._in_head = False
        elif tag in ("td", "th") and self._cell is not None and self._table is not None:
            if self._in_head:
                self.headers[self._table].append(self._cell.text)
            else:
                self.tables[self._table][-1].append(self._cell)
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.text += data

    def column(self, table: str, header: str) -> list[Cell]:
        i = self.headers[table].index(header)
        return [row[i] for row in self.tables[table]]

    def row(self, table: str, first: str) -> dict[str, Cell]:
        """The row whose first cell reads ``first``, by header."""
        (found,) = [r for r in self.tables[table] if r[0].text == first]
        return dict(zip(self.headers[table], found, strict=True))


def read_page(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text())
    return page


def hostile_run(root: Path) -> Path:
    """The DDP sample with an operator, the gloo thread and the process group named
    ``HOSTILE``, and a file beside the traces whose name holds markup (it is no trace: the
    report's warning names it)."""
    out = root / "hostile-html"
    if out.exists():
        return out
    traces = root / "hostile-html-traces"
    traces.mkdir(parents=True, exist_ok=True)
    for source in sorted((SAMPLES / "pytorch" / "ddp").glob("rank-*.json.gz")):
        with gzip.open(source, "rt") as f:
            trace = json.load(f)
        for event in trace["traceEvents"]:
            if event.get("name") == "aten::mm":
                event["name"] = "aten::mm" + HOSTILE
            if event.get("ph") == "M" and "gloo" in str(event.get("args", {}).get("name", "")):
                event["args"]["name"] = "gloo" + HOSTILE
        trace["distributedInfo"]["pg_config"][0]["pg_name"] = "pg" + HOSTILE
        (traces / source.name.removesuffix(".gz")).write_text(json.dumps(trace))
    (traces / '<img src=x onerror="window.__pwned=3">.txt').write_text("not a trace")
    ingest_run([traces], out)
    return out
