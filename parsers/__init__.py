"""Trace parsers: one module per trace format, behind one small protocol and one registry.

A parser turns one trace file into a ``ParsedTrace``: an Arrow table of raw events in
``schema.RAW_SCHEMA`` (times in nanoseconds on the trace's absolute clock where it has one) plus
what the file says about itself (rank, world size, host, process and thread names). It only
reads: kinds, phases, operators and steps are the core's job (the rules, normalize and its
passes), so a parser stays small. A format whose timeline needs laying out before the core can
read it (MXNet's asynchronous engine) names a core layout pass in ``layout``; one that writes no
step markers but says how steps can be found (TensorFlow's step groups, TF1's ``Session.run``
calls) names a core step-inference pass in ``infer_steps``. Third-party parsers register under
the entry-point group ``traceview.parsers`` with the same protocol.
"""

from __future__ import annotations

import functools
import importlib
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from traceview.model import schema as S
from traceview.model.columns import compact_dictionaries
from traceview.model.errors import BadInput, Notes


@dataclass
class ParsedTrace:
    path: Path
    framework: str
    events: pa.Table  # schema.RAW_SCHEMA
    rank: int | None = None  # as the trace itself states it
    world_size: int | None = None
    host: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # backend, devices, versions...
    threads: dict[str, str] = field(default_factory=dict)  # "pid/tid" -> thread name
    notes: Notes = field(default_factory=Notes)
    bytes_read: int = 0
    lost_bytes: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # records not kept as events, by type
    layout: str | None = None  # a core layout pass the format needs (normalize.LAYOUTS)
    # a core pass that finds steps where the trace marks none (normalize.STEP_INFERENCE)
    infer_steps: str | None = None
    process_names: dict[int, str] = field(default_factory=dict)  # pid -> name, as the trace says
    # what the trace holds beside its events, by side input (schema.SIDE_INPUTS: "memory", its
    # memory records as schema.MEMORY_RAW_SCHEMA); an input the format or trace lacks is absent
    side: dict[str, pa.Table] = field(default_factory=dict)


class WholeRead:
    """The stream (as ``KinetoStream``: iterate for raw batches, then read ``result``) of a
    trace its parser reads whole: Chrome JSON whose begin and end records are paired over the
    file, its rows sorted by start (``chrome_events.read_events``). Only its raw events are held, a
    few columns a row (and, where the format names a layout pass, what that pass holds); the
    rank is then normalized and analysed a chunk at a time, as a streamed trace is
    (``traceview.ingest.large.chunked``)."""

    base_ns = 0  # the times are absolute already
    BATCH_ROWS = 1 << 16

    def __init__(self, parse: Callable[[], ParsedTrace]):
        self._parse = parse
        self._result: ParsedTrace | None = None
        #: set by the core: what it does to the whole events before they are handed on (the
        #: layout pass a format names: ``layout``), given the parser's result
        self.prepare: Callable[[ParsedTrace, pa.Table], pa.Table] | None = None

    @property
    def result(self) -> ParsedTrace:
        if self._result is None:
            raise RuntimeError("WholeRead.result read before the stream was exhausted")
        return self._result

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        parsed = self._parse()
        events, parsed.events = parsed.events, S.empty(S.RAW_SCHEMA)
        if self.prepare is not None:
            events = self.prepare(parsed, events)
        for batch in events.to_batches(max_chunksize=self.BATCH_ROWS):
            if batch.num_rows:
                yield compact_dictionaries(batch)
        del events
        self._result = parsed


#: Below this a "pid" may be a device's number (Kineto's GPU rows) or one of a container's
#: first processes: by size alone, not surely an OS process of its own
SURE_PID = 1024


@dataclass
class TraceIdentity:
    """What a trace says about who wrote it, read cheaply before the full parse."""

    rank: int | None = None
    world_size: int | None = None
    host: str | None = None
    # the OS process that wrote it, where the trace says so cheaply: a rank's several files
    # (one per profiler cycle or step) are one process's
    process: int | None = None
    # the framework, where one format is written by several (an XSpace: TensorFlow's or JAX's;
    # None: the parser's own)
    framework: str | None = None
    # the devices one process drove, where it drove several: each is a rank of its own, read
    # with ``parse(path, device)`` (None: the trace is one rank)
    devices: list[str] | None = None


class TraceStream(Protocol):
    """A trace read a batch of raw events at a time (``Parser.stream``): iterate for the
    batches (``schema.RAW_SCHEMA``), then ``result`` holds what the file says about itself (its
    ``events`` empty). ``base_ns``: what the batches' times are relative to."""

    base_ns: int

    @property
    def result(self) -> ParsedTrace: ...

    def __iter__(self) -> Iterator[pa.RecordBatch]: ...


class Parser(Protocol):
    """A trace format. ``streams``: whether ``stream`` reads it a batch at a time for the chunked
    path, which every built-in parser does (a parser that does not, or that predates the
    attribute, is read whole by ``parse`` and normalized as one table: ``streams_of``).
    ``rules_file``: the parser's own rules (TOML, as ``--rules``) for a framework traceview ships
    none for, or that extend the built-in ones (None: the built-in rules of ``framework`` alone;
    ``rules_file_of``). A parser may also read a trace in two parts at once (``split_point``
    and ``stream(path, part)``: ``kineto``)."""

    name: str
    framework: str
    streams: bool
    rules_file: Path | None

    def sniff(self, path: Path, head: bytes) -> bool:
        """Whether ``path`` (whose first decompressed bytes are ``head``) is this format."""
        ...

    def identify(self, path: Path) -> TraceIdentity:
        """Rank, world size and host as the trace states them (all None when it does not)."""
        ...

    def parse(self, path: Path) -> ParsedTrace: ...

    def stream(self, path: Path) -> TraceStream: ...


class PartStream(TraceStream, Protocol):
    """A stream of one part of a trace (``SplittableParser``): what it read is handed to the
    part before it (``then``), from another process (``part_read``, picklable)."""

    def part_read(self) -> Any: ...

    def then(self, later: Any) -> None: ...


class SplittableParser(Parser, Protocol):
    """A parser that can read one trace in two parts at once, each in a process of its own:
    ``split_point`` says where an event starts near a byte (None: not there, or not this
    file), ``stream(path, part)`` reads the bytes [start, stop) of it."""

    def split_point(self, path: Path, near: int) -> int | None: ...

    def stream(self, path: Path, part: tuple[int, int | None] | None = None) -> PartStream: ...


def streams_of(parser: Parser) -> bool:
    """Whether ``parser`` streams (``Parser.streams``; a plugin written before the attribute
    existed does not)."""
    return getattr(parser, "streams", False) is True and callable(getattr(parser, "stream", None))


def rules_file_of(parser: Parser) -> Path | None:
    """The rules ``parser`` ships (``Parser.rules_file``; None where it ships none)."""
    own = getattr(parser, "rules_file", None)
    return Path(own) if own is not None else None


def int64_id(value: int) -> int:
    """An integer id (pid, tid, ...) as int64: 64-bit values keep their bits (2**63 and up as
    negative numbers), wider ones become stable negative hashes."""
    if -(1 << 63) <= value < 1 << 64:
        return value if value < 1 << 63 else value - (1 << 64)
    return -1 - zlib.crc32(str(value).encode())


def raw_events(
    categories: list[str] | pa.Array,
    names: list[str] | pa.Array,
    pid: list[int] | np.ndarray,
    tid: list[int] | np.ndarray,
    ts_ns: Any,
    dur_ns: Any,
    **columns: pa.Array,
) -> pa.Table:
    """A RAW_SCHEMA table from per-event lists or arrays (kinds left to the core, from the
    categories)."""
    table = pa.table(
        {
            S.CAT: _strings(categories).dictionary_encode(),
            S.NAME: _strings(names).dictionary_encode(),
            S.PID: pa.array(pid, pa.int64()),
            S.TID: pa.array(tid, pa.int64()),
            S.TS_NS: ts_ns,
            S.DUR_NS: dur_ns,
            **columns,
        }
    )
    return S.conform(table, S.RAW_SCHEMA)


def _strings(values: list[str] | pa.Array) -> pa.Array:
    return values if isinstance(values, pa.Array) else pa.array(values, pa.string())


#: Built-in parsers, imported only when needed: "module:Class".
BUILTIN_PARSERS: tuple[str, ...] = (
    "traceview.parsers.kineto:KinetoParser",
    "traceview.parsers.tensorflow:XPlaneParser",
    "traceview.parsers.tf_timeline:TimelineParser",
    "traceview.parsers.mxnet:MXNetParser",
    "traceview.parsers.chainer:ChainerParser",
)


def _load(spec: str) -> Parser:
    module_name, _, attr = spec.partition(":")
    parser: Parser = getattr(importlib.import_module(module_name), attr)()
    return parser


def registered() -> list[Parser]:
    """Every parser: built-in ones first, then those registered by other packages."""
    return list(_registered())


@functools.cache
def _registered() -> tuple[Parser, ...]:
    # Once per process: scanning the installed packages' entry points takes ~25 ms, which was
    # half of ingesting a small rank (1,024 ranks: 25 s of 37).
    parsers = [_load(spec) for spec in BUILTIN_PARSERS]
    for entry in entry_points(group="traceview.parsers"):
        parsers.append(entry.load()())
    return tuple(parsers)


#: The fallback for Chrome traces no parser claims, used only with a rules file (``--rules``).
GENERIC_PARSER = "traceview.parsers.generic_chrome:ChromeParser"


@functools.cache
def generic() -> Parser:
    return _load(GENERIC_PARSER)


def parser_named(name: str) -> Parser:
    for parser in (*registered(), generic()):
        if name in (parser.name, parser.framework):
            return parser
    known = ", ".join(p.name for p in registered())
    raise BadInput(f"unknown trace format {name!r} (known: {known})")


_RANK_IN_NAME = (
    re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)", re.IGNORECASE),
    re.compile(r"(?:^|[^a-z])worker[-_]?(\d+)", re.IGNORECASE),
)


def rank_from_filename(path: Path) -> int | None:
    """``rank-3.pt.trace.json`` -> 3, ``worker1.json`` -> 1; looks at the file, then its folder."""
    for part in (path.name, path.parent.name):
        for pattern in _RANK_IN_NAME:
            match = pattern.search(part)
            if match:
                return int(match.group(1))
    return None


# --- helpers the parsers share (parsers may not import the core) -------------------------------


def us_to_ns(us: np.ndarray, base_ns: int = 0) -> np.ndarray:
    """Microseconds (float64) to int64 nanoseconds, exact for integral epoch microseconds."""
    ns = np.empty(len(us), dtype=np.int64)
    small = np.abs(us) < 2**53 / 1000  # the product is still exact to the nanosecond
    ns[small] = np.rint(us[small] * 1000.0).astype(np.int64)
    big = ~small
    if big.any():
        whole = np.floor(us[big])
        ns[big] = whole.astype(np.int64) * 1000 + np.rint((us[big] - whole) * 1000).astype(np.int64)
    return ns + base_ns


def us_durations_to_ns(us: np.ndarray) -> np.ndarray:
    """Durations in microseconds (float64) to int64 nanoseconds; negative or NaN ones are 0."""
    return np.rint(np.nan_to_num(np.maximum(us, 0.0), nan=0.0) * 1000.0).astype(np.int64)


# --- helpers the core shares with the parsers (parsers may not import the core) ---------------


def group_ids(*columns: np.ndarray) -> np.ndarray:
    """Dense ids of the rows' value combinations, in the columns' lexicographic order (one
    1-D factorization per column: much faster than np.unique over stacked rows)."""
    if len(columns[0]) == 0:
        return np.zeros(0, np.int64)
    group = np.zeros(len(columns[0]), np.int64)
    for column in columns:
        _, inverse = np.unique(column, return_inverse=True)
        inverse = np.asarray(inverse, np.int64).ravel()
        _, group = np.unique(group * (int(inverse.max()) + 1) + inverse, return_inverse=True)
        group = np.asarray(group, np.int64).ravel()
    return group


def number_ranges(numbers: list[int]) -> str:
    """[1, 2, 3, 7] -> "1-3, 7"."""
    out: list[str] = []
    start = prev = None
    for n in sorted(numbers):
        if start is None:
            start = prev = n
        elif prev is not None and n == prev + 1:
            prev = n
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = n
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ", ".join(out)
