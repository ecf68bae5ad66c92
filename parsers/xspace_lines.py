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
field that is not length-delimited) raises ``NotTheLayout``: the caller reads the file with the
protobuf classes instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from traceview.parsers.xprof_trace import NotTheLayout, _Fields, _records, _varints
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
        stamps = starts[fields == _TIMESTAMP]
        if len(stamps):  # (given twice: its last)
            line_ns[k] = _varints(data, stamps[-1:])[0][0].astype(np.int64)
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
    """The fields of the one message ``raw[start:end]``, one after the other: (numbers, where
    each one's content starts, where it ends: a varint's bytes, a length-delimited field's
    content, a fixed field's bytes). NotTheLayout for a group or a field cut short."""
    numbers: list[int] = []
    firsts: list[int] = []
    lasts: list[int] = []
    pos = start
    while pos < end:
        tag, pos = _varint_at(raw, pos, end)
        wire = tag & 7
        if wire == 0:
            first = pos
            while pos < end and raw[pos] >= 0x80:
                pos += 1
            pos += 1
        elif wire == 2:
            size, first = _varint_at(raw, pos, end)
            pos = first + size
        elif wire in (1, 5):
            first = pos
            pos += 8 if wire == 1 else 4
        else:
            raise NotTheLayout("a group, or a wire type protobuf does not have")
        if pos > end:
            raise NotTheLayout("a field past its message's end")
        numbers.append(tag >> 3)
        firsts.append(first)
        lasts.append(pos)
    return (np.asarray(x, np.int64) for x in (numbers, firsts, lasts))  # type: ignore[return-value]


def _varint_at(raw: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``pos`` and where it ends."""
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise NotTheLayout("a varint cut short")
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _delimited(number: int, payload: bytes) -> bytes:
    """A length-delimited field: its tag, its length, ``payload``."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)
