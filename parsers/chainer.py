"""Chainer traces, as ``traceview collect`` writes them (``rank-N.chainer.json.gz``).

Chainer has no profiler that writes a timeline; traceview's rank-side collector
(``collectors/rankside_chainer.py``) is one. It writes Chrome-trace JSON: complete events
(``X``) named after each ``FunctionNode`` (category ``forward``; ``backward`` for a node's
backward, named ``<label>.backward``, and for the nodes a backward runs), the Python calls of
each phase (``Link.forward``, ``Variable.backward``: category ``python``; ``Iterator.next``:
``io``; ``to_device``: ``h2d``; ChainerMN communicator calls: ``comm``; ``Optimizer.update``:
``update``) and a ``step#N`` marker per recorded step (category ``traceview``). The top-level key
``traceviewChainer``, written before the events, says who wrote it (rank, world size, host).

This parser only reads: the intervals, and what the file says about itself. The rules
(``parsers/rules/chainer.toml``) give kinds, phases and canonical operators.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from traceview.parsers import ParsedTrace, TraceIdentity, WholeRead
from traceview.parsers.chrome_events import read_events
from traceview.parsers.chrome_stream import read_header

HEADER_KEY = "traceviewChainer"
_MARKER = b'"' + HEADER_KEY.encode() + b'"'


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


class ChainerParser:
    name = "chainer"
    framework = "chainer"
    streams = True  # read a batch at a time (stream)
    rules_file: Path | None = None  # the built-in rules of its framework alone

    def sniff(self, path: Path, head: bytes) -> bool:
        return head.lstrip()[:1] == b"{" and _MARKER in head[:4096]

    def _header(self, path: Path) -> dict[str, Any]:
        header = read_header(path).get(HEADER_KEY)
        return header if isinstance(header, dict) else {}

    def identify(self, path: Path) -> TraceIdentity:
        header = self._header(path)
        return TraceIdentity(
            rank=_int(header.get("rank")),
            world_size=_int(header.get("world_size")),
            host=_str(header.get("host")),
        )

    def parse(self, path: Path) -> ParsedTrace:
        header = self._header(path)
        meta = {
            "chainer_version": _str(header.get("chainer_version")),
            "communicator": _str(header.get("communicator")),
        }
        return read_events(path).parsed(
            path,
            self.framework,
            rank=_int(header.get("rank")),
            world_size=_int(header.get("world_size")),
            host=_str(header.get("host")),
            meta={k: v for k, v in meta.items() if v is not None},
        )

    def stream(self, path: Path) -> WholeRead:
        """The trace read whole, its events handed on a batch at a time (``WholeRead``)."""
        return WholeRead(lambda: self.parse(path))
