"""Any Chrome-trace JSON, read with the user's rules (``--rules FILE``): the generic path.

For a framework traceview has no parser for (CNTK's and Caffe2's profilers, JAX's
``jax.profiler`` Perfetto JSON, PaddlePaddle's profiler, an in-house tool's timeline), the trace
is read as what the Chrome trace format itself says: complete events (``X``), begin/end pairs,
instants, process and thread names. Which events are steps, which phase each belongs to and
which canonical operator it is comes from the rules file (format: README, "Any other framework";
``parsers/rules/chrome.toml`` holds the few defaults it extends).

This parser never claims a file by sniffing: ``ingest`` falls back to it for a Chrome trace no
other parser recognises, and only when a rules file is given (without one, a browser's page-load
trace is refused as before).
"""

from __future__ import annotations

from pathlib import Path

from traceview.parsers import ParsedTrace, TraceIdentity, WholeRead, rank_from_filename
from traceview.parsers.chrome_events import read_events


def looks_like_chrome_trace(head: bytes) -> bool:
    """A JSON document holding a ``traceEvents`` array, or a bare array of event objects."""
    text = head.lstrip()
    if text[:1] == b"{":
        return b'"traceEvents"' in head
    return text[:1] == b"[" and text[1:].lstrip()[:1] in (b"{", b"]") and b'"ph"' in head


class ChromeParser:
    name = "chrome"
    framework = "chrome"
    streams = True  # read a batch at a time (stream)
    rules_file: Path | None = None  # the built-in rules of its framework alone

    def sniff(self, path: Path, head: bytes) -> bool:
        return False  # a fallback only, when the user gives rules (see the module docstring)

    def identify(self, path: Path) -> TraceIdentity:
        return TraceIdentity(rank=rank_from_filename(path))

    def parse(self, path: Path) -> ParsedTrace:
        return read_events(path).parsed(path, self.framework, rank=rank_from_filename(path))

    def stream(self, path: Path) -> WholeRead:
        """The trace read whole, its events handed on a batch at a time (``WholeRead``)."""
        return WholeRead(lambda: self.parse(path))
