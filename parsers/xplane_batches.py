"""An XSpace's trace events from xprof, with a bounded number of threads, in a child process.

xprof's trace events of an XSpace not yet grouped into steps (TensorFlow writes them so) derive
each GPU plane's lines on a pool of one thread per GPU plane (``GenerateDerivedTimeLines``:
``XprofThreadPoolExecutor("derived_timeline_trace_events", planes)``), each thread reserving a
stack of RLIMIT_STACK (8 MB by default): 1,000 planes reserve 8 GB of address space, and under
an address-space limit (``ulimit -v``) a thread's creation fails and xprof aborts the process.

So an XSpace with more GPU planes than ``batch_size()`` is cut, at the protobuf's wire level
(no plane is decoded), into XSpaces that each hold every other plane (the host's, whose events
group the devices' into steps) and a batch of its GPU planes, converted one after the other;
``merge`` puts their trace events together as the whole's: the other planes' once (from the
first batch), each GPU plane's from its batch. An XSpace of fewer GPU planes is converted whole,
as before. xprof names a GPU plane's process by its id (pid = 1 + id; the host's threads are
701): in a batch the GPU planes are numbered afresh, their pids put back after (a plane whose
own pid would be the host's gets ``FAR_PID`` + its id instead). The conversion runs in a child
process (``native_child``): where xprof dies anyway, the file is refused with one line.
"""

from __future__ import annotations

import contextlib
import importlib.util
import mmap
import operator
import os
import resource
import stat
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from traceview.model.errors import BadInput
from traceview.parsers import xprof_trace
from traceview.parsers.native_child import (
    Child,
    NativeDied,
    NativeFailed,
    cores,
    forks,
    in_two,
    run,
)
from traceview.parsers.native_child import start as start_child

GPU_PREFIX = "/device:GPU:"  # the planes xprof's pool has a thread for (kGpuPlanePrefix)
#: The address space the stacks of one batch's threads may reserve
STACKS_BUDGET = 256 * 1024 * 1024
MAX_BATCH = 64
MIN_BATCH = 4
HOST_PID = 701  # xprof's process of the host's threads (kHostThreadsDeviceId)
FAR_PID = 1 << 20  # a GPU plane whose own pid xprof would give the host's threads
_PLANES, _ID, _NAME = 1, 1, 2  # XSpace.planes; XPlane.id, XPlane.name


def batch_size() -> int:
    """GPU planes per conversion: their threads' stacks within ``STACKS_BUDGET``."""
    stack = resource.getrlimit(resource.RLIMIT_STACK)[0]
    if stack == resource.RLIM_INFINITY or stack <= 0:
        stack = 8 * 1024 * 1024  # glibc's stack of a thread where the limit is unlimited
    return max(MIN_BATCH, min(MAX_BATCH, STACKS_BUDGET // stack))


@dataclass(frozen=True)
class _Field:
    number: int
    start: int  # of its tag
    end: int
    payload: tuple[int, int] | None = None  # a length-delimited field's content


@dataclass
class Batch:
    """One XSpace to convert (``xspace``), and how its GPU planes' pids map to the whole's."""

    # the whole's top-level fields it holds, in order: (start, end, content start, new id or
    # None: copied as written)
    parts: list[tuple[int, int, int, int | None]]
    pids: dict[int, int]  # pid xprof gives a GPU plane here -> its pid in the whole
    gpu_names: frozenset[str]  # the names of this batch's GPU planes


def _varint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(buf: Any, pos: int, end: int) -> Iterator[_Field]:
    """The fields of one message, as written (ValueError where it is not well formed)."""
    while pos < end:
        start = pos
        tag, pos = _varint(buf, pos, end)
        number, kind = tag >> 3, tag & 7
        if kind == 0:
            _, pos = _varint(buf, pos, end)
            yield _Field(number, start, pos)
        elif kind == 1 or kind == 5:
            pos += 8 if kind == 1 else 4
            if pos > end:
                raise ValueError("truncated fixed-width field")
            yield _Field(number, start, pos)
        elif kind == 2:
            size, pos = _varint(buf, pos, end)
            if size > end - pos:
                raise ValueError("length past the end")
            yield _Field(number, start, pos + size, (pos, pos + size))
            pos += size
        else:
            raise ValueError(f"wire type {kind} not read here")


def _plane_head(buf: Any, start: int, end: int) -> tuple[int, str | None]:
    """A plane's id and name (0 and None where absent). Protobuf writes fields in number order:
    the two come first, and the plane's lines and metadata after are not walked through."""
    plane_id, name = 0, None
    for f in _fields(buf, start, end):
        if f.number == _ID and f.payload is None:
            plane_id = _varint(buf, _varint(buf, f.start, f.end)[1], f.end)[0]
        elif f.number == _NAME and f.payload is not None:
            name = bytes(buf[f.payload[0] : f.payload[1]]).decode("utf-8", "replace")
        elif f.number > _NAME and name is not None:
            break
    return plane_id, name


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if not value:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def batches(buf: Any, size: int) -> list[Batch] | None:
    """``buf`` (a serialized XSpace) cut into batches of at most ``size`` GPU planes; None
    where it has no more than ``size`` (or is no well-formed XSpace: xprof says what)."""
    try:
        top = list(_fields(buf, 0, len(buf)))
        heads = {
            i: _plane_head(buf, *f.payload)
            for i, f in enumerate(top)
            if f.number == _PLANES and f.payload is not None
        }
    except (ValueError, IndexError):
        return None
    gpu = [i for i, (_, name) in heads.items() if name and name.startswith(GPU_PREFIX)]
    if len(gpu) <= size:
        return None
    used = {plane_id for i, (plane_id, _) in heads.items() if i not in gpu}
    fresh = [n for n in range(HOST_PID - 1) if n not in used][:size]  # (pids below the host's)
    if len(fresh) < size:
        return None
    whole = {}  # index of a GPU plane -> its pid in the whole's trace events
    for i in gpu:
        pid = (1 + heads[i][0]) & 0xFFFFFFFF  # (xprof's is a uint32)
        whole[i] = pid if pid != HOST_PID else FAR_PID + heads[i][0]
    gpus = set(gpu)
    Part = tuple[int, int, int, int | None]
    shared: list[Part] = [
        (f.start, f.end, f.start, None) for i, f in enumerate(top) if i not in gpus
    ]
    out = []
    for k in range(0, len(gpu), size):
        part = gpu[k : k + size]
        planes: list[Part] = [
            (top[i].start, top[i].end, (top[i].payload or (0, 0))[0], fresh[n])
            for n, i in enumerate(part)
        ]
        out.append(
            Batch(
                parts=shared + planes,
                pids={1 + fresh[n]: whole[i] for n, i in enumerate(part)},
                gpu_names=frozenset(str(heads[i][1]) for i in part),
            )
        )
    return out


def xspace(buf: Any, batch: Batch) -> bytes:
    """The batch's XSpace: its fields as written, a GPU plane's id set afresh (a second id
    field after the plane's own: protobuf keeps the last)."""
    out = []
    for start, end, content, plane_id in batch.parts:
        if plane_id is None:
            out.append(bytes(buf[start:end]))
        else:
            plane = bytes(buf[content:end]) + b"\x08" + _varint_bytes(plane_id)
            out.append(b"\x0a" + _varint_bytes(len(plane)) + plane)
    return b"".join(out)


def merge(parts: Sequence[tuple[Batch, pa.Table, pa.Table]]) -> tuple[pa.Table, pa.Table]:
    """The batches' (metadata, events) as the whole XSpace's: the metadata by process; the first
    batch's events (the other planes', then its GPU planes'), then each later batch's GPU
    planes'; each batch's GPU planes given back their pids in the whole."""
    metas: list[pa.Table] = []
    tables: list[pa.Table] = []
    for number, (batch, meta, events) in enumerate(parts):
        pids = meta.column("pid").to_numpy()
        named = {
            int(p): n
            for p, t, n in zip(pids, meta.column("tid").is_null().to_numpy(zero_copy_only=False),
                               meta.column("name").to_pylist(), strict=True)
            if t and n
        }  # fmt: skip
        mine = {p: batch.pids[p] for p in batch.pids if named.get(p) in batch.gpu_names}
        keys = np.asarray(sorted(mine), np.int64)
        whole = np.asarray([mine[int(k)] for k in keys], np.int64)
        for table, into in ((meta, metas), (events, tables)):
            pid = table.column("pid").to_numpy()
            own = np.isin(pid, keys)
            if len(keys):
                pid = pid.copy()
                pid[own] = whole[np.searchsorted(keys, pid[own])]
                table = table.set_column(
                    table.schema.get_field_index("pid"), "pid", pa.array(pid, pa.int64())
                )
            into.append(table.filter(pa.array(own)) if number else table)  # (others: the first's)
    meta = pa.concat_tables(metas)
    order = np.argsort(meta.column("pid").to_numpy(), kind="stable")
    return meta.take(pa.array(order)), pa.concat_tables(tables, promote_options="default")


def trace_events(
    tools: Callable[[], Any],
    path: Path,
    native_error: Callable[[list[str]], str],
    meanwhile: Callable[[], object] | None = None,
) -> tuple[pa.Table, pa.Table]:
    """The XSpace at ``path`` as xprof's trace events: (metadata, events), as ``columns``
    reads them; in batches where it has many GPU planes, in a child process (``meanwhile()``
    run here while it converts); BadInput where xprof cannot read it or dies. ``tools()``:
    xprof's converter module, imported only where this process starts the conversion (a
    conversion begun ahead, ``head_start``, leaves xprof's native library to its child)."""
    buf: Any = b""  # (not a file mmap maps, as a FIFO, which opening would wait on: read whole)
    try:
        if path.is_file():
            with open(path, "rb") as f:
                buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise BadInput(f"{path}: cannot read ({exc.strerror or exc})") from None
    except ValueError:
        pass
    with contextlib.closing(buf) if isinstance(buf, mmap.mmap) else contextlib.nullcontext():
        plan = batches(buf, batch_size()) if buf else None
        started = _claimed(path) if buf else None
        try:
            if started is not None:  # (its conversion begun as the command started)
                docs, logged = started.finish(meanwhile)
            else:
                converter = tools()
                docs, logged = run(lambda: _documents(converter, path, buf, plan), meanwhile)
        except NativeFailed as exc:
            raise BadInput(f"{path}: not a readable XSpace: {exc}") from None
        except NativeDied as exc:
            raise BadInput(f"{path}: xprof died reading this profile: {exc}") from None
    if not all(docs):
        raise BadInput(
            f"{path}: not a readable TensorFlow profile (xplane.pb): {native_error(logged)}"
        )
    try:
        if plan is None:
            return columns(docs[0])
        return merge([(b, *columns(d)) for b, d in zip(plan, docs, strict=True)])
    except (ValueError, pa.ArrowInvalid) as exc:  # pragma: no cover - the child writes them
        raise BadInput(f"{path}: xprof produced unreadable trace events: {exc}") from None


def _documents(tools: Any, path: Path, buf: Any, plan: list[Batch] | None) -> Iterator[Any]:
    """What the child converting the XSpace at ``path`` (``buf``: its bytes, or empty where it
    is no file) sends: a document per conversion (``_trace_columns``), one per batch of
    ``plan``. (xprof's Python turns the converter's protobuf into JSON an event at a time:
    ``_trace_columns`` reads it at once; every xprof the extra allows has the converter.)"""
    native = tools._pywrap_profiler_plugin
    if plan is None:
        yield _trace_columns(native.xspace_to_tools_data([str(path)], *_TRACE))
        return
    # (named without a host: xprof refuses an XSpace whose host is not the one its file name
    # says, and a batch is no file)
    nameless = str(path.with_name(".xplane.pb"))
    for batch in plan:
        yield _trace_columns(
            native.xspace_to_tools_data_from_byte_string([xspace(buf, batch)], [nameless], *_TRACE)
        )


#: Conversions begun before their read (``head_start``), by path: the file's identity when
#: begun, and the child converting it.
_HEAD_STARTS: dict[str, tuple[tuple[int, int, int, int], Child]] = {}


def _identity(path: str) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def head_start(path: Path) -> None:
    """Begin converting the profile at ``path`` now, in a child (as ``trace_events`` would),
    while the command imports what it reads it with: its read takes the child over where the
    file is still the one it read (``_claimed``). Nothing where this process cannot fork or
    has one core, or where xprof is not installed (the read says so)."""
    key = os.path.abspath(path)
    identity = _identity(key)
    if identity is None or key in _HEAD_STARTS or not forks() or cores() < 2:
        return
    if importlib.util.find_spec("xprof") is None:
        return
    try:
        child = start_child(lambda: _converted(Path(key)))
    except OSError:
        return
    _HEAD_STARTS[key] = (identity, child)


def _converted(path: Path) -> Iterator[Any]:  # pragma: no cover - the head start's child
    """``_documents`` of the profile at ``path``, from the file alone."""
    from xprof.convert import raw_to_tool_data

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        yield from _documents(raw_to_tool_data, path, buf, batches(buf, batch_size()))


def _claimed(path: Path) -> Child | None:
    """The child a head start left converting ``path``, where the file is the one it read
    (else it is ended: the file changed since)."""
    key = os.path.abspath(path)
    begun = _HEAD_STARTS.pop(key, None)
    if begun is None:
        return None
    identity, child = begun
    if _identity(key) != identity:
        child.cancel()
        return None
    return child


def cancel_head_starts() -> None:
    """End the conversions begun that no read took (the command ended first)."""
    while _HEAD_STARTS:
        _, child = _HEAD_STARTS.popitem()[1]
        child.cancel()


#: The trace viewer's data as xprof's native converter gives it to xprof's Python: the ``Trace``
#: protobuf that ``xprof.convert.raw_to_tool_data.process_raw_trace`` turns into JSON.
_TRACE = ("trace_viewer", {"use_saved_result": True})
#: Events read into columns at a time (a batch's Python objects are all that is held besides
#: the columns made)
_BATCH_EVENTS = 65_536
#: The args of xprof's events read (all strings), each a column ``ARG`` + its key
ARGS = frozenset(
    {
        "long_name", "step_num", "step_name", "group_id", "correlation_id", "level 0",
        "annotation", "memcpy_details", "device_ordinal", "hlo_op", "hlo_module",
        "instance_key", "run_id", "kernel_type", "step_id", "name",
    }
)  # fmt: skip
ARG = "arg:"
_FIELDS = tuple(
    operator.attrgetter(f)
    for f in ("name", "device_id", "resource_id", "timestamp_ps", "duration_ps", "args")
)
_FRAME = struct.Struct("<Q")


def _trace_columns(result: Any) -> bytes:
    """xprof's trace viewer events, from its ``Trace`` protobuf, as Arrow tables in frames
    (``columns`` reads them): first the metadata, a row per device (tid null) and per
    resource, with its name ("" where none); then the events: name, pid, tid, ts_ps, dur_ps (0:
    an instant) and the args of ``ARGS`` (null where absent). The same events and values as
    xprof's own JSON (``xprof.convert.trace_events_json``), where xprof builds a dict an event
    and encodes each with ``json.dumps`` (about 13 µs an event). The events are read at the
    wire level (``xprof_trace``), or where their bytes are not laid out as it reads them, by the
    protobuf classes a batch of events at a time (about 1.4 µs an event)."""
    raw, ok = result
    if not ok or not raw:
        return b""
    from xprof.protobuf import trace_events_old_pb2

    try:
        devices, table = xprof_trace.read(raw, ARGS, ARG)
    except xprof_trace.NotTheLayout:  # (read by the protobuf classes, event by event)
        trace = trace_events_old_pb2.Trace.FromString(raw)
        return b"".join([*_frame(_devices(trace)), _events_read_one_by_one(trace.trace_events)])
    trace = trace_events_old_pb2.Trace.FromString(devices)
    return b"".join(_frame(_devices(trace)) + _frame(table))


def _devices(trace: Any) -> pa.Table:
    """The metadata: a row per device (tid null) and per resource, with its name."""
    rows: list[tuple[int, int | None, str]] = []
    for did, device in sorted(trace.devices.items()):
        rows.append((did, None, device.name))
        rows += [(did, rid, res.name) for rid, res in sorted(device.resources.items())]
    pid, tid, name = zip(*rows, strict=True) if rows else ((), (), ())
    return pa.table(
        {
            "pid": _int64_bits(pid),
            "tid": pa.array(tid, pa.uint64()),
            "name": pa.array(name, pa.string()),
        }
    )


def _events_read_one_by_one(events: Any) -> bytes:
    n = len(events)
    if n < 2 * _BATCH_EVENTS:
        return _event_frames(events, 0, n)
    half = n // 2  # (half of them read beside, on the other core)
    return b"".join(
        in_two(lambda: _event_frames(events, 0, half), lambda: _event_frames(events, half, n))
    )


def _event_frames(events: Any, first: int, last: int) -> bytes:
    """``events[first:last]`` as tables, a batch at a time, each in its frame."""
    frames: list[Any] = []
    for start in range(first, last, _BATCH_EVENTS):
        batch = events[start : min(last, start + _BATCH_EVENTS)]  # (their messages, made once)
        name, pid, tid, ts, dur, args = (list(map(f, batch)) for f in _FIELDS)
        del batch
        found: dict[str, dict[int, str]] = {}
        for i, a in enumerate(args):
            if a:
                for key in a:
                    if key in ARGS:
                        found.setdefault(key, {})[i] = a[key]
        del args
        table = {
            "name": pa.array(name, pa.string()),
            "pid": _int64_bits(pid),
            "tid": pa.array(tid, pa.uint64()),
            "ts_ps": pa.array(ts, pa.uint64()),
            "dur_ps": pa.array(dur, pa.uint64()),
        }
        for key in sorted(found):
            values: list[str | None] = [None] * len(name)
            for i, value in found[key].items():
                values[i] = value
            table[ARG + key] = pa.array(values, pa.string())
        frames += _frame(pa.table(table))
    return b"".join(frames)


def _int64_bits(ids: Any) -> pa.Array:
    """uint64 ids (xprof's device ids) as int64, their bits kept (as the reader of the wire)."""
    return pa.array(np.asarray(ids, np.uint64).view(np.int64))


def _frame(table: pa.Table) -> list[Any]:
    """``table`` as an Arrow stream, after its length: the two parts to join."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    data = sink.getvalue()
    return [_FRAME.pack(data.size), data]


def columns(doc: Any) -> tuple[pa.Table, pa.Table]:
    """A document of ``_trace_columns``: (metadata, events), the events' batches as one table
    (an arg no event of a batch had: null there)."""
    buf = pa.py_buffer(doc)
    tables = []
    at = 0
    while at < buf.size:
        if at + _FRAME.size > buf.size:
            raise ValueError("a frame cut short")
        (size,) = _FRAME.unpack(buf[at : at + _FRAME.size].to_pybytes())
        at += _FRAME.size
        if at + size > buf.size:
            raise ValueError("a frame cut short")
        tables.append(pa.ipc.open_stream(buf.slice(at, size)).read_all())
        at += size
    if not tables:
        raise ValueError("no metadata")
    meta, batches_ = tables[0], tables[1:]
    if not batches_:
        return meta, _EMPTY_EVENTS
    return meta, pa.concat_tables(batches_, promote_options="default")


_EMPTY_EVENTS = pa.table(
    {
        "name": pa.array([], pa.string()),
        "pid": pa.array([], pa.int64()),
        "tid": pa.array([], pa.uint64()),
        "ts_ps": pa.array([], pa.uint64()),
        "dur_ps": pa.array([], pa.uint64()),
    }
)
