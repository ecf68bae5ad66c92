"""xprof's ``Trace`` protobuf (its trace viewer converter's output) read into columns at the
wire level, every event at once with numpy, where the protobuf classes make a Python object an
event (about 1.4 µs each, and their memory).

The layout read (xprof's ``trace_events_old.proto``): ``Trace`` holds ``devices`` (1: a map of
``Device``, read with the protobuf classes: a few) and ``trace_events`` (4: ``TraceEvent``);
an event holds ``device_id`` (1), ``resource_id`` (2), ``name`` (3), ``timestamp_ps`` (9),
``duration_ps`` (10) and ``args`` (11: map entries of a string key (1) and value (2)). The
events' records are found one after the other (each ends where its length says); then each
event's fields are read field by field for all events at once, and each arg entry's the same
way. Fields absent are their defaults (0, ""), a field given twice keeps its last value, an
arg key given twice in one event its last, fields of other numbers are skipped, as a protobuf
parser does. What does not read as that layout is None (the caller reads it with the protobuf
classes, which say why).
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pyarrow as pa

_DEVICES, _EVENTS = 1, 4
_DEVICE_ID, _RESOURCE_ID, _NAME, _TS, _DUR, _ARGS = 1, 2, 3, 9, 10, 11
_KEY, _VALUE = 1, 2
_WIDEST = 10  # bytes of a varint at most


class NotTheLayout(ValueError):
    """The bytes do not read as the layout this module reads."""


def _varints(data: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The varint at each of ``at`` in ``data``: (values, where each ends; past the end of
    ``data`` where it runs past it). A byte at a time, for the varints not yet ended (most end
    in one)."""
    last = len(data) - 1
    byte = data[np.minimum(at, last)]
    values = (byte & 0x7F).astype(np.uint64)
    ends = at + 1
    more = np.flatnonzero(byte >= 0x80)
    shift = 7
    while len(more):
        if shift >= 7 * _WIDEST:
            raise NotTheLayout("a varint longer than 10 bytes")
        byte = data[np.minimum(ends[more], last)]
        values[more] |= (byte & 0x7F).astype(np.uint64) << np.uint64(shift)
        ends[more] += 1
        more = more[byte >= 0x80]
        shift += 7
    return values, ends


def _records(buf: bytes, data: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The fields of the message ``buf`` (``data``: its bytes), all length-delimited,
    one after the other: (numbers, where each begins, where its content starts, where it
    ends). Only where each begins is found one field at a time (each ends where its length
    says); NotTheLayout for another wire type or a field cut short."""
    begins: list[int] = []
    append = begins.append
    pos, end = 0, len(buf)
    while pos < end - 1:
        append(pos)
        size = buf[pos + 1]
        if size < 0x80:  # (one byte of length: most)
            pos += 2 + size
            continue
        size &= 0x7F
        shift, pos = 7, pos + 2
        while True:
            if pos >= end or shift > 35:
                raise NotTheLayout("a length cut short")
            byte = buf[pos]
            pos += 1
            size |= (byte & 0x7F) << shift
            if byte < 0x80:
                break
            shift += 7
        pos += size
    if pos != end:
        raise NotTheLayout("a field past the end, or cut short")
    at = np.asarray(begins, np.int64)
    tags = data[at]
    if ((tags >= 0x80) | (tags & 7 != 2)).any():  # (the numbers read here fit a byte's tag)
        raise NotTheLayout("a top-level field that is not length-delimited")
    sizes, starts = _varints(data, at + 1)
    return (tags >> 3).astype(np.int64), at, starts, starts + sizes.astype(np.int64)


class _Fields:
    """The fields of many messages (each ``[start, end)`` of ``data``), read for all at once:
    varints by number, length-delimited contents by number (the message each is of, and where
    its content lies)."""

    def __init__(self, data: np.ndarray, start: np.ndarray, end: np.ndarray, wanted: set[int]):
        n = len(start)
        self.varints: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # number: (value, given)
        self.spans: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
        pos = start.copy()
        active = np.flatnonzero(pos < end)
        while len(active):
            tag, after = _varints(data, pos[active])
            number, wire = (tag >> np.uint64(3)).astype(np.int64), (tag & np.uint64(7))
            value, past = _varints(data, after)  # (a varint's value, or a length)
            new = np.full(len(active), -1, np.int64)
            plain = wire == 0
            new[plain] = past[plain]
            delimited = wire == 2
            new[delimited] = past[delimited] + value[delimited].astype(np.int64)
            for wire_type, width in ((1, 8), (5, 4)):
                fixed = wire == wire_type
                new[fixed] = after[fixed] + width
            if (new < 0).any() or (new > end[active]).any():
                raise NotTheLayout("a field of another wire type, or past its message's end")
            for k in wanted:
                mine = number == k
                if not mine.any():
                    continue
                if (mine & plain).any():
                    values, given = self.varints.setdefault(
                        k, (np.zeros(n, np.uint64), np.zeros(n, bool))
                    )
                    rows = active[mine & plain]
                    values[rows] = value[mine & plain]
                    given[rows] = True
                chosen = mine & delimited
                if chosen.any():
                    self.spans.setdefault(k, []).append((active[chosen], past[chosen], new[chosen]))
            pos[active] = new
            active = active[new < end[active]]

    def varint(self, number: int, n: int) -> np.ndarray:
        values = self.varints.get(number)
        return values[0] if values is not None else np.zeros(n, np.uint64)

    def span(self, number: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(message, content start, content end) of each field ``number``, in message order, a
        message's later ones after its earlier ones."""
        parts = self.spans.get(number, [])
        if not parts:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty
        rows, starts, ends = (np.concatenate(p) for p in zip(*parts, strict=True))
        order = np.argsort(rows, kind="stable")
        return rows[order], starts[order], ends[order]


def _last(rows: np.ndarray) -> np.ndarray:
    """Of sorted ``rows``, whether each is the last of its value."""
    return np.append(rows[1:] != rows[:-1], True) if len(rows) else np.zeros(0, bool)


#: Bytes of strings gathered at a time (their index arrays: 8 bytes a byte, transient)
_GATHER_BYTES = 1 << 22


def _strings(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> pa.Array:
    """The bytes ``[start, end)`` of each as a string array (NotTheLayout: not UTF-8)."""
    lengths = ends - starts
    offsets = np.zeros(len(starts) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    blocks = np.searchsorted(offsets, np.arange(0, int(offsets[-1]), _GATHER_BYTES), "right") - 1
    cuts = [*np.unique(blocks).tolist(), len(starts)]
    parts = [_gathered(data, starts[a:b], ends[a:b]) for a, b in pairwise(cuts)]
    values = pa.Array.from_buffers(
        pa.large_binary(),
        len(starts),
        [
            None,
            pa.py_buffer(offsets),
            pa.py_buffer(np.concatenate([np.zeros(0, np.uint8), *parts])),
        ],
    )
    try:
        return values.cast(pa.large_string()).cast(pa.string())
    except (pa.ArrowInvalid, pa.ArrowCapacityError) as exc:
        raise NotTheLayout(f"a string that is no UTF-8: {exc}") from None


def _gathered(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The bytes ``[start, end)`` of each, one after the other."""
    some = ends > starts
    starts, ends = starts[some], ends[some]
    if not len(starts):
        return np.zeros(0, np.uint8)
    lengths = ends - starts
    first = np.zeros(len(starts), np.int64)
    np.cumsum(lengths[:-1], out=first[1:])
    # each byte's place in ``data``: one past the byte before, or its string's start
    step = np.ones(int(first[-1] + lengths[-1]), np.int64)
    step[first[1:]] = starts[1:] - ends[:-1] + 1
    step[0] = starts[0]
    return data[np.cumsum(step)]


def _equal(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, text: bytes) -> np.ndarray:
    """Which of the byte strings ``[start, end)`` are ``text``."""
    same = ends - starts == len(text)
    candidates = np.flatnonzero(same)
    for k, byte in enumerate(text):
        if not len(candidates):
            break
        match = data[starts[candidates] + k] == byte
        same[candidates[~match]] = False
        candidates = candidates[match]
    return same


def _column(rows: np.ndarray, values: pa.Array, n: int) -> pa.Array:
    """A column of ``n`` events: ``values[i]`` at event ``rows[i]``, null elsewhere."""
    index = np.full(n, len(values), np.int64)
    index[rows] = np.arange(len(rows))
    return pa.concat_arrays([values, pa.nulls(1, pa.string())]).take(pa.array(index))


#: Events read at a time: the arrays of a block's fields and arg entries (a dozen 8-byte
#: values per field or entry, and a real profile's events hold several args each) are what the
#: reading holds beside the columns made, not those of every event at once.
BLOCK_EVENTS = 1 << 16


def read(raw: bytes, wanted_args: frozenset[str], arg_prefix: str) -> tuple[bytes, pa.Table]:
    """The ``Trace`` ``raw``: (its devices' records, as a Trace holding only them; its events
    as columns: name, pid, tid, ts_ps, dur_ps and each of ``wanted_args`` an event has, named
    ``arg_prefix`` + key), ``BLOCK_EVENTS`` events at a time."""
    data = np.frombuffer(raw, np.uint8)
    kind, begins, at, stop = _records(raw, data)
    mine = kind == _DEVICES
    devices = b"".join(
        raw[b:e] for b, e in zip(begins[mine].tolist(), stop[mine].tolist(), strict=True)
    )
    events = kind == _EVENTS
    start, end = at[events], stop[events]
    del kind, begins, at, stop, mine, events
    n = len(start)
    cuts = [*range(0, n, BLOCK_EVENTS), n] if n else [0, 0]
    blocks = [
        _events(data, start[a:b], end[a:b], wanted_args, arg_prefix) for a, b in pairwise(cuts)
    ]
    if len(blocks) == 1:
        return devices, blocks[0]
    # (an arg no event of a block has: null there; the columns in one block's order)
    table = pa.concat_tables(blocks, promote_options="default")
    base = ["name", "pid", "tid", "ts_ps", "dur_ps"]
    return devices, table.select(base + sorted(set(table.column_names) - set(base)))


def _events(
    data: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    wanted_args: frozenset[str],
    arg_prefix: str,
) -> pa.Table:
    """The events ``[start, end)`` of ``data`` as ``read``'s columns."""
    n = len(start)
    fields = _Fields(data, start, end, {_DEVICE_ID, _RESOURCE_ID, _NAME, _TS, _DUR, _ARGS})
    name_rows, name_s, name_e = fields.span(_NAME)
    last = _last(name_rows)
    names = _column(name_rows[last], _strings(data, name_s[last], name_e[last]), n)
    columns: dict[str, pa.Array] = {
        "name": names.fill_null(""),
        "pid": pa.array(fields.varint(_DEVICE_ID, n).view(np.int64)),
        "tid": pa.array(fields.varint(_RESOURCE_ID, n)),
        "ts_ps": pa.array(fields.varint(_TS, n)),
        "dur_ps": pa.array(fields.varint(_DUR, n)),
    }
    entry_rows, entry_s, entry_e = fields.span(_ARGS)
    if len(entry_rows):
        entries = _Fields(data, entry_s, entry_e, {_KEY, _VALUE})
        key_rows, key_s, key_e = entries.span(_KEY)
        value_rows, value_s, value_e = entries.span(_VALUE)
        last = _last(value_rows)  # (a value given twice in one entry: its last)
        value_at = np.full(len(entry_rows), -1, np.int64)
        value_at[value_rows[last]] = np.flatnonzero(last)
        last = _last(key_rows)
        key_rows, key_s, key_e = key_rows[last], key_s[last], key_e[last]
        for key in sorted(wanted_args):
            mine = key_rows[_equal(data, key_s, key_e, key.encode())]
            if not len(mine):
                continue
            rows = entry_rows[mine]
            last = _last(rows)  # (an event's key given twice: its last)
            rows, mine = rows[last], mine[last]
            at = value_at[mine]
            given = at >= 0  # (an entry without a value: "")
            starts = np.where(given, value_s[np.maximum(at, 0)], 0)
            ends = np.where(given, value_e[np.maximum(at, 0)], 0)
            columns[arg_prefix + key] = _column(rows, _strings(data, starts, ends), n)
    return pa.table(columns)
