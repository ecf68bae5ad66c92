"""An XSpace's lines and their events read at the wire level with numpy (``xprof_trace``'s
reader), where the protobuf classes make an object an event (and hold several times the file):
each plane's name and metadata by the minimal schema (``xspace_hlo``), then its lines' times
and their events' metadata ids and offsets, all lines and all events at once. An event's stats
are decoded only for the events asked for (``Plane.events_of``), by the minimal schema.

Field numbers as in ``tsl/profiler/protobuf/xplane.proto``: XSpace.planes (1); XPlane.name (2),
lines (3), event_metadata (4), stat_metadata (5); XLine.timestamp_ns (3), events (4);
XEvent.metadata_id (1), offset_ps (2). As protobuf reads them: a field absent is 0, a field
given twice keeps its last value, a field of another wire type than its own is skipped, unknown
fields are skipped. What does not read as that layout (a group, a field cut short, a top-level
field that is not length-delimited) raises ValueError (``NotTheLayout`` at the top level): the
caller reads the file with the protobuf classes instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from traceview.parsers.xplane_batches import _fields, _varint
from traceview.parsers.xprof_trace import NotTheLayout, _Fields, _records
from traceview.parsers.xspace_hlo import _classes

__all__ = ["NotTheLayout", "Plane", "planes"]

_PLANES = 1
_NAME, _LINES, _EVENT_METADATA, _STAT_METADATA = 2, 3, 4, 5
_TIMESTAMP, _EVENTS = 3, 4
_METADATA_ID, _OFFSET = 1, 2


@dataclass
class Plane:
    """A plane: its name and metadata (event and stat names by id); per line, its time; per
    event (line by line, each line's in order), its line, metadata id and offset."""

    raw: bytes
    name: str
    names: dict[int, str]  # event metadata id -> name
    stat_names: dict[int, str]  # stat metadata id -> name
    line_ns: np.ndarray  # per line: timestamp_ns
    line: np.ndarray  # per event: its line's number in the plane
    ids: np.ndarray  # per event: metadata_id
    offsets: np.ndarray  # per event: offset_ps
    spans: tuple[np.ndarray, np.ndarray]  # per event: where its bytes lie in ``raw``

    def events_of(self, rows: np.ndarray) -> list[Any]:
        """The events ``rows`` decoded (the minimal schema's XEvent: their stats), in order."""
        if not len(rows):
            return []
        start, end = self.spans
        line = b"".join(
            _delimited(_EVENTS, self.raw[a:b])
            for a, b in zip(start[rows].tolist(), end[rows].tolist(), strict=True)
        )
        space = _classes()["XSpaceEvents"]()
        space.ParseFromString(_delimited(_PLANES, _delimited(_LINES, line)))
        return list(space.planes[0].lines[0].events)


def planes(raw: bytes) -> Iterator[Plane]:
    """The planes of the XSpace ``raw``, in order."""
    data = np.frombuffer(raw, np.uint8)
    number, _, at, stop = _records(raw, data)
    for start, end in zip(
        at[number == _PLANES].tolist(), stop[number == _PLANES].tolist(), strict=True
    ):
        yield _plane(raw, data, start, end)


def _plane(raw: bytes, data: np.ndarray, start: int, end: int) -> Plane:
    number, first, last = _walk(raw, start, end)
    # the name and metadata decoded by the minimal schema, from their fields alone
    head = b"".join(
        _delimited(k, raw[a:b])
        for k, a, b in zip(number.tolist(), first.tolist(), last.tolist(), strict=True)
        if k in (_NAME, _EVENT_METADATA, _STAT_METADATA)
    )
    space = _classes()["XSpace"]()
    space.ParseFromString(_delimited(_PLANES, head))
    plane = space.planes[0]
    names = {m.key: m.value.name for m in plane.event_metadata}
    stat_names = {m.key: m.value.name for m in plane.stat_metadata}
    lines = number == _LINES
    line_ns = np.zeros(int(lines.sum()), np.int64)
    parts: list[tuple[int, np.ndarray, np.ndarray]] = []
    for k, (a, b) in enumerate(zip(first[lines].tolist(), last[lines].tolist(), strict=True)):
        fields, starts, ends = _walk(raw, a, b)
        for i in np.flatnonzero(fields == -1 - _TIMESTAMP)[::-1].tolist():  # (the last varint)
            tag, at = _varint(raw, int(starts[i]), int(ends[i]))
            if tag & 7 == 0:
                line_ns[k] = np.uint64(_varint(raw, at, int(ends[i]))[0]).view(np.int64)
                break
        events = fields == _EVENTS
        parts.append((k, starts[events], ends[events]))
    line = np.concatenate([np.full(len(s), k, np.int64) for k, s, _ in parts] or [_NONE])
    event_s = np.concatenate([s for _, s, _ in parts] or [_NONE])
    event_e = np.concatenate([e for _, _, e in parts] or [_NONE])
    events = _Fields(data, event_s, event_e, {_METADATA_ID, _OFFSET})
    n = len(event_s)
    return Plane(
        raw,
        plane.name,
        names,
        stat_names,
        line_ns,
        line,
        events.varint(_METADATA_ID, n).view(np.int64),
        events.varint(_OFFSET, n).view(np.int64),
        (event_s, event_e),
    )


_NONE = np.zeros(0, np.int64)


def _walk(raw: bytes, start: int, end: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The length-delimited fields of the one message ``raw[start:end]``, one after the other:
    (numbers, where each one's content starts, where it ends), and the others' as a negative
    number (-1 - number) with their tag and value's span. ValueError for a group or a field cut
    short (``xplane_batches._fields``)."""
    numbers: list[int] = []
    firsts: list[int] = []
    lasts: list[int] = []
    for field in _fields(raw, start, end):
        if field.payload is None:
            numbers.append(-1 - field.number)
            firsts.append(field.start)
            lasts.append(field.end)
        else:
            numbers.append(field.number)
            firsts.append(field.payload[0])
            lasts.append(field.payload[1])
    return (np.asarray(x, np.int64) for x in (numbers, firsts, lasts))  # type: ignore[return-value]


def _delimited(number: int, payload: bytes) -> bytes:
    """A length-delimited field: its tag, its length, ``payload``."""
    return _encoded(number << 3 | 2) + _encoded(len(payload)) + payload


def _encoded(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)
