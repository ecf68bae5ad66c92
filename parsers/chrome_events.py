"""Chrome-trace JSON read whole and paired: begin/end records (``B``/``E``, async ``b``/``e``,
``(``/``)``) paired into intervals, complete events and instants kept, process and thread names
and storage counters read. The reader MXNet's, Chainer's and the generic Chrome parsers share
(``read_events``); each parser says what the rows are."""

from __future__ import annotations

import zlib
from collections import Counter
from dataclasses import dataclass
from itertools import compress
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traceview.model import schema as S
from traceview.model.columns import dictionary_codes
from traceview.model.errors import Notes
from traceview.parsers import (
    ParsedTrace,
    group_ids,
    int64_id,
    us_durations_to_ns,
    us_to_ns,
)
from traceview.parsers.chrome_stream import (
    MAX_US,
    ChromeTraceInfo,
    ChromeTraceReader,
    corrupt_times,
    decode_records,
    out_of_range,
)

_BEGIN = {"B": 0, "b": 1, "(": 2}  # pair family of each begin record type


_END = {"E": 0, "e": 1, ")": 2}


_INSTANT = frozenset(("i", "I", "n"))


#: The devices MXNet's storage counters (written with profile_memory) can name: a counter
#: ``Memory: gpu/0`` holds its value under its own name.
_STORAGE_DEVICES = tuple(
    f"{kind}/{i}" for kind in ("cpu", "gpu", "cpu_pinned", "cpu_shared") for i in range(16)
)


_STORAGE = "Device Storage"


class _NameArgs(msgspec.Struct, frozen=True, gc=False):
    name: str | None = None  # a metadata record's name


_NAME_ARGS = msgspec.json.Decoder(_NameArgs)


_ARGS = msgspec.json.Decoder(dict[str, Any])


_NO_ARGS = msgspec.Raw(b"{}")


class _Record(msgspec.Struct, gc=False):
    ph: str = ""
    name: str | None = None
    cat: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    id: int | str | None = None
    ts: float | None = None
    dur: float | None = None
    # left undecoded: only metadata and storage counters are read (most records of a trace
    # are counters, whose arguments a struct per record made a third of the decode)
    args: msgspec.Raw = _NO_ARGS


_DECODER = msgspec.json.Decoder(list[_Record])


def _coerce(raw: Any) -> _Record | None:
    """One record decoded without a schema, made to fit ``_Record`` (the slow path)."""
    if not isinstance(raw, dict):
        return None

    def ident(value: Any) -> int | str | None:
        return value if isinstance(value, int | str) and not isinstance(value, bool) else None

    def number(value: Any) -> float | None:
        return (
            float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
        )

    args = raw.get("args")
    return _Record(
        ph=str(raw.get("ph", "")),
        name=None if raw.get("name") is None else str(raw.get("name")),
        cat=None if raw.get("cat") is None else str(raw.get("cat")),
        pid=ident(raw.get("pid")),
        tid=ident(raw.get("tid")),
        id=ident(raw.get("id")),
        ts=number(raw.get("ts")),
        dur=number(raw.get("dur")),
        args=_raw(args),
    )


def _id64(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return int64_id(value)
    return -1 - zlib.crc32(str(value).encode())


def _ids(values: list[Any]) -> np.ndarray:
    """pid/tid/id values as int64: 64-bit hashes keep their bits, labels get stable ids."""
    try:
        return np.array(values, dtype=np.int64)
    except (OverflowError, TypeError, ValueError):
        pass
    # Hashes above 2**63 (most of MXNet's thread ids) and labels: convert each distinct value once.
    cache = {value: _id64(value) for value in set(values)}
    return np.fromiter(map(cache.__getitem__, values), np.int64, len(values))


@dataclass
class _Chunk:
    batch: pa.RecordBatch
    process_names: dict[int, str]
    thread_names: dict[tuple[int, int], str]
    counts: Counter[str]
    out_of_range: int = 0  # records holding a number beyond a float's range, left out
    memory: list[tuple[str, Any, Any, float | None, Any]] | None = None  # storage counters


def _raw(args: Any) -> msgspec.Raw:
    """Arguments decoded without a schema, raw again (the slow path)."""
    try:
        return msgspec.Raw(msgspec.json.encode(args)) if isinstance(args, dict) else _NO_ARGS
    except (TypeError, ValueError, OverflowError):
        return _NO_ARGS


def _arguments(raw: msgspec.Raw) -> dict[str, Any]:
    """A record's arguments ({} where they are not an object)."""
    try:
        return _ARGS.decode(raw)
    except msgspec.MsgspecError:
        return {}


def _meta_name(raw: msgspec.Raw) -> str | None:
    """A metadata record's name (None where it has none, or not a string)."""
    try:
        return _NAME_ARGS.decode(raw).name
    except msgspec.MsgspecError:
        return None


def _decode_chunk(data: Any) -> _Chunk:
    # (the records' raw arguments point into what is decoded: a copy, which they may outlive,
    # as in kineto.chunk._decode_chunk; the reader's buffer is reused)
    data = bytes(data)
    bad = 0
    try:
        records: list[_Record] = _DECODER.decode(data)
    except msgspec.ValidationError:
        decoded, bad = decode_records(data)
        records = [r for r in map(_coerce, decoded) if r is not None]
    phs = list(map(attrgetter("ph"), records))
    counts = Counter(phs)
    process_names: dict[int, str] = {}
    thread_names: dict[tuple[int, int], str] = {}
    if "M" in counts:
        for meta in compress(records, (p == "M" for p in phs)):
            label = _meta_name(meta.args)
            if not label:
                continue
            pid = int(_ids([meta.pid])[0])
            if meta.name == "process_name":
                process_names[pid] = label
            elif meta.name == "thread_name":
                thread_names[(pid, int(_ids([meta.tid])[0]))] = label
    memory = None
    if "C" in counts:  # the storage counters (profile_memory): device, pid, tid, ts, value
        memory = []
        for record in compress(records, (p == "C" for p in phs)):
            if record.cat != _STORAGE or not record.name or not record.name.startswith("Memory: "):
                continue
            device = record.name[8:]
            value = _arguments(record.args).get(record.name) if device in _STORAGE_DEVICES else None
            memory.append((device, record.pid, record.tid, record.ts, value))
    # Counters and metadata are counted, not kept.
    timed = [p not in ("C", "M") for p in phs]
    if not all(timed):
        records = list(compress(records, timed))
        phs = list(compress(phs, timed))
    batch = pa.RecordBatch.from_pydict(
        {
            "ph": pa.array(phs, pa.string()).dictionary_encode(),
            "name": pa.array(
                list(map(attrgetter("name"), records)), pa.string()
            ).dictionary_encode(),
            "cat": pa.array(list(map(attrgetter("cat"), records)), pa.string()).dictionary_encode(),
            "pid": _ids(list(map(attrgetter("pid"), records))),
            "tid": _ids(list(map(attrgetter("tid"), records))),
            "id": _ids(list(map(attrgetter("id"), records))),
            "has_id": pa.array([r.id is not None for r in records], pa.bool_()),
            "ts_us": pa.array(list(map(attrgetter("ts"), records)), pa.float64()),
            "dur_us": pa.array(list(map(attrgetter("dur"), records)), pa.float64()),
        }
    )
    return _Chunk(batch, process_names, thread_names, counts, bad, memory)


def _pair(group: np.ndarray, ts: np.ndarray, begin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Match begin and end records within each group by nesting level.

    Rows are in file order. Sorted by (group, time, file order), a begin opens the level one
    above the running depth and an end closes the current one; at each level of a group the
    begins and ends then alternate, so each begin pairs with the end that follows it there.
    Returns (begin rows, end rows); anything else is unmatched (a file cut short).
    """
    n = len(group)
    if n == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty
    order = np.lexsort((np.arange(n), ts, group))
    g, b = group[order], begin[order]
    # the depth before each record (its group's running begins less ends)
    before = np.cumsum(np.where(b, 1, -1), dtype=np.int64)
    before -= np.where(b, 1, -1)
    first = np.concatenate(([True], g[1:] != g[:-1]))
    offset = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    del first
    level = before - before[offset]  # the depth within the group ...
    del before, offset
    level += b  # ... a begin opening the level above it
    by_level = np.lexsort((np.arange(n), level, g))
    gl, ll, bl = g[by_level], level[by_level], b[by_level]
    del g, level, b
    matched = bl[:-1] & ~bl[1:] & (gl[:-1] == gl[1:]) & (ll[:-1] == ll[1:])
    del gl, ll, bl
    starts = order[by_level[:-1][matched]]
    ends = order[by_level[1:][matched]]
    return starts, ends


@dataclass
class ChromeEvents:
    """A Chrome trace's timed records as intervals (``read_events``)."""

    events: pa.Table  # schema.RAW_SCHEMA, sorted by start
    info: ChromeTraceInfo
    notes: Notes
    counts: Counter[str]  # records by type ("ph")
    unmatched: int  # begin/end records without their other half
    no_timestamp: int
    operators: bool  # whether any event of MXNet's ``operator`` domain is there
    corrupt: int  # records with an absurd time or duration, left out
    process_names: dict[int, str]
    thread_names: dict[tuple[int, int], str]
    # MXNet's storage counters (device, pid, tid, ts, value), for its memory records
    storage: list[tuple[str, Any, Any, float | None, Any]]

    def parsed(self, path: Path, framework: str, **fields: Any) -> ParsedTrace:
        """These records as a parser's result, with a note of what could not be read (begin/end
        halves, a damaged file) and counts of what was skipped; ``fields``: the rest
        (rank, meta, ...)."""
        if self.unmatched:
            self.notes.warn(
                f"{path.name}: {self.unmatched} begin/end records without their other half not read"
            )
        if damage := self.info.damage_warning(path, self.events.num_rows):
            self.notes.warn(damage)
        skipped = {
            "counter": self.counts.get("C", 0),
            "metadata": self.counts.get("M", 0),
            "unmatched": self.unmatched,
            "no_timestamp": self.no_timestamp,
        }
        if self.corrupt:
            skipped["corrupt_time"] = self.corrupt
        return ParsedTrace(
            path=path,
            framework=framework,
            events=self.events,
            threads={f"{p}/{t}": label for (p, t), label in self.thread_names.items()},
            notes=self.notes,
            bytes_read=self.info.stream.bytes_read,
            lost_bytes=self.info.lost_bytes,
            skipped=skipped,
            process_names=self.process_names,
            **fields,
        )


def read_events(path: Path) -> ChromeEvents:
    """Every timed record of a Chrome trace as an interval: complete events (``X``), begin/end
    pairs (``B``/``E``, async ``b``/``e``, frames ``(``/``)``) and instants; counters and
    metadata counted, not kept (metadata names processes and threads). Shared by the parsers of
    Chrome traces that need nothing more (MXNet's, Chainer's, any other through ``--rules``)."""
    reader = ChromeTraceReader(path, _decode_chunk)
    batches: list[pa.RecordBatch] = []
    process_names: dict[int, str] = {}
    thread_names: dict[tuple[int, int], str] = {}
    counts: Counter[str] = Counter()
    storage: list[tuple[str, Any, Any, float | None, Any]] = []
    bad = 0
    for chunk in reader:
        storage.extend(chunk.memory or [])
        batches.append(chunk.batch)
        process_names.update(chunk.process_names)
        thread_names.update(chunk.thread_names)
        counts.update(chunk.counts)
        bad += chunk.out_of_range
    info = reader.info
    notes = Notes()
    if bad:
        notes.warn(out_of_range(path.name, bad))
    info.require_events(path, sum(b.num_rows for b in batches), counts)
    tables = [pa.Table.from_batches(batches).unify_dictionaries()]
    del batches
    raw, unmatched, no_ts, operators, corrupt = _intervals(tables)  # (freed there)
    if corrupt:
        notes.warn(corrupt_times(path.name, corrupt))
    return ChromeEvents(
        raw,
        info,
        notes,
        counts,
        unmatched,
        no_ts,
        operators,
        corrupt,
        process_names,
        thread_names,
        storage,
    )


def _intervals(tables: list[pa.Table]) -> tuple[pa.Table, int, int, bool, int]:
    """Begin/end pairs and complete events as intervals; instants as zero-length rows, sorted
    by start. ``tables``: the records (one table, taken out and freed once its columns are
    read: the file's every timed record, the largest thing held).

    Returns (raw events, unmatched begin/end records, records without a timestamp, whether any
    operator of the ``operator`` domain is there, records with an absurd time or duration). Kinds
    are left to the core (from the categories), except instants'.
    """
    table = tables.pop()
    ph_codes, ph_values = dictionary_codes(table.column("ph"))

    begin_family, end_family = (
        np.array([m.get(str(v), -1) for v in ph_values] + [-1], np.int8)[ph_codes]
        for m in (_BEGIN, _END)
    )
    instant = np.array([str(v) in _INSTANT for v in ph_values] + [False])[ph_codes]
    complete = np.array([str(v) == "X" for v in ph_values] + [False])[ph_codes]
    del ph_codes
    ts_us = table.column("ts_us").to_numpy(zero_copy_only=False)
    has_ts = np.abs(ts_us) < MAX_US  # NaN (none) and absurd times (beyond the year 2112) fail
    absurd = ~has_ts & ~np.isnan(ts_us)
    dur_us = table.column("dur_us").to_numpy(zero_copy_only=False)
    corrupt = int(absurd.sum()) + int((has_ts & (np.abs(dur_us) >= MAX_US)).sum())
    no_ts = int((~has_ts).sum()) - int(absurd.sum())
    del absurd
    ts = np.zeros(len(ts_us), np.int64)
    ts[has_ts] = us_to_ns(ts_us[has_ts])
    del ts_us
    dur_us = np.where(np.abs(dur_us) < MAX_US, dur_us, 0.0)
    pid = table.column("pid").to_numpy()
    tid = table.column("tid").to_numpy()
    edge = np.flatnonzero(((begin_family >= 0) | (end_family >= 0)) & has_ts)
    has_id = table.column("has_id").to_numpy(zero_copy_only=False)[edge]
    ident = np.where(has_id, table.column("id").to_numpy()[edge], tid[edge])
    del has_id
    cat, cats = dictionary_codes(table.column("cat"))
    name, names = dictionary_codes(table.column("name"))
    cat, name = cat.astype(np.int32), name.astype(np.int32)
    del table

    # Begin/end records pair within (family, process, thread); async ones within (process, id,
    # name): MXNet gives every async event of a thread the same id, and a step's Task can end
    # inside another Task of the thread.
    family = np.maximum(begin_family, end_family)[edge]
    is_async = family == 1
    key = np.where(is_async, ident, tid[edge])
    del ident
    group = group_ids(family, pid[edge], key, np.where(is_async, name[edge], -1))
    del family, is_async, key
    first, last = _pair(group, ts[edge], begin_family[edge] >= 0)
    del group
    starts, ends = edge[first], edge[last]
    unmatched = len(edge) - 2 * len(starts)
    del edge, first, last

    single = np.flatnonzero((complete | instant) & has_ts)
    del complete, has_ts
    rows = np.concatenate([starts, single])
    dur = np.concatenate(
        [
            ts[ends] - ts[starts],
            np.where(instant[single], 0, us_durations_to_ns(dur_us[single])),
        ]
    )
    del dur_us, ends
    # The operator domain repeats every device operator as an async pair: keep the device's.
    is_async = np.concatenate([begin_family[starts] == 1, np.zeros(len(single), bool)])
    del begin_family, end_family, starts, single
    cat_names = [str(c) if c is not None else "" for c in cats]
    operator_cat = cat_names.index("operator") if "operator" in cat_names else -2
    op_rows = cat[rows] == operator_cat
    if (op_rows & ~is_async).any():
        keep = ~(op_rows & is_async)
        rows, dur, is_async = rows[keep], dur[keep], is_async[keep]
    order = np.argsort(ts[rows], kind="stable")
    rows, dur = rows[order], dur[order]
    del order, is_async
    kind = np.where(instant[rows], 0, -1)
    raw = pa.table(
        {
            S.KIND: pa.DictionaryArray.from_arrays(
                pa.array(kind.astype(np.int32), pa.int32(), mask=kind < 0),
                pa.array([S.KIND_INSTANT]),
            ),
            S.CAT: _dictionary(cat[rows], cats),
            S.NAME: pc.fill_null(_dictionary(name[rows], names).cast(pa.string()), ""),
            S.PID: pa.array(pid[rows], pa.int64()),
            S.TID: pa.array(tid[rows], pa.int64()),
            S.TS_NS: pa.array(ts[rows], pa.int64()),
            S.DUR_NS: pa.array(np.maximum(dur, 0), pa.int64()),
        }
    )
    return S.conform(raw, S.RAW_SCHEMA), unmatched, no_ts, bool(op_rows.any()), corrupt


def _dictionary(codes: np.ndarray, values: list[Any]) -> pa.DictionaryArray:
    indices = pa.array(codes.astype(np.int32), pa.int32(), mask=codes < 0)
    return pa.DictionaryArray.from_arrays(
        indices, pa.array([None if v is None else str(v) for v in values], pa.string())
    )
