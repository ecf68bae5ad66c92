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
import mmap
import resource
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from traceview.model.errors import BadInput
from traceview.parsers.native_child import NativeDied, NativeFailed, in_two, run

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


class _Args(Protocol):
    @property
    def name(self) -> str | None: ...


class Record(Protocol):
    """What ``merge`` reads of a trace event (tensorflow's ``_Record``)."""

    @property
    def ph(self) -> str | None: ...
    @property
    def name(self) -> str | None: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def args(self) -> _Args: ...


def merge(
    parts: Sequence[tuple[Batch, list[Any]]], with_pid: Callable[[Any, int], Any]
) -> list[Any]:
    """The batches' trace events as the whole XSpace's: metadata first, by process; then the
    first batch's events (the other planes', then its GPU planes'), then each later batch's
    GPU planes'. ``with_pid(record, pid)``: the record with another pid."""
    meta: list[tuple[int, int, Any]] = []  # (pid, order, record)
    events: list[Any] = []
    ending: list[Any] = []  # xprof's closing {}
    for number, (batch, records) in enumerate(parts):
        names = {
            r.pid: r.args.name
            for r in records
            if r.ph == "M" and r.name == "process_name" and r.pid is not None
        }
        mine = {p for p in batch.pids if names.get(p) in batch.gpu_names}
        for r in records:
            if r.pid in mine:
                r = with_pid(r, batch.pids[r.pid])
            elif number:
                continue  # another plane's: read from the first batch
            if r.ph == "M" and r.pid is not None:
                meta.append((r.pid, len(meta), r))
            elif r.ph is None and r.pid is None:
                ending.append(r)
            else:
                events.append(r)
    meta.sort(key=lambda m: (m[0], m[1]))
    return [m[2] for m in meta] + events + ending[:1]


def trace_events(
    tools: Any,
    path: Path,
    decode: Callable[[Any], list[Any]],
    with_pid: Callable[[Any, int], Any],
    native_error: Callable[[list[str]], str],
    meanwhile: Callable[[], object] | None = None,
) -> list[Any]:
    """The XSpace at ``path`` as xprof's trace events (``decode``: a document's rows, ``ROW``),
    in batches where it has many GPU planes, in a child process (``meanwhile()`` run here while
    it converts); BadInput where xprof cannot read it or dies."""
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

        def work() -> Iterator[Any]:
            # (xprof's Python turns the converter's protobuf into JSON an event at a time:
            # ``_trace_rows`` does it at once; every xprof the extra allows has the converter)
            native = tools._pywrap_profiler_plugin
            if plan is None:
                yield _trace_rows(native.xspace_to_tools_data([str(path)], *_TRACE))
                return
            # (named without a host: xprof refuses an XSpace whose host is not the one its
            # file name says, and a batch is no file)
            nameless = str(path.with_name(".xplane.pb"))
            for batch in plan:
                yield _trace_rows(
                    native.xspace_to_tools_data_from_byte_string(
                        [xspace(buf, batch)], [nameless], *_TRACE
                    )
                )

        try:
            docs, logged = run(work, meanwhile)
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
            return decode(docs[0])
        return merge([(b, decode(d)) for b, d in zip(plan, docs, strict=True)], with_pid)
    except ValueError as exc:  # pragma: no cover - the child writes valid rows
        raise BadInput(f"{path}: xprof produced unreadable trace events: {exc}") from None


#: The trace viewer's data as xprof's native converter gives it to xprof's Python: the ``Trace``
#: protobuf that ``xprof.convert.raw_to_tool_data.process_raw_trace`` turns into JSON.
_TRACE = ("trace_viewer", {"use_saved_result": True})
#: Events encoded at a time (a batch's rows are all that is held besides the encoded ones).
_ENCODE_EVENTS = 65_536
#: The fields of a row, in order: a trace event of xprof's JSON as an array
ROW = ("ph", "name", "pid", "tid", "ts", "dur", "args")


def _trace_rows(result: Any) -> bytes:
    """xprof's trace viewer events, from its ``Trace`` protobuf, as one MessagePack array of
    rows (``ROW``): the events ``xprof.convert.trace_events_json`` makes, metadata first (the
    same fields and values, less an instant's ``"s"`` and the fake last event), where xprof
    builds a dict an event and encodes each with ``json.dumps`` (about 13 µs an event)."""
    raw, ok = result
    if not ok or not raw:
        return b""
    import msgspec
    from xprof.protobuf import trace_events_old_pb2

    trace = trace_events_old_pb2.Trace()
    trace.ParseFromString(raw)
    del raw
    meta: list[tuple[Any, ...]] = []
    for did, device in sorted(trace.devices.items()):
        if device.name:
            meta.append(("M", "process_name", did, None, None, None, {"name": device.name}))
        meta.append(("M", "process_sort_index", did, None, None, None, {"sort_index": did}))
        for rid, res in sorted(device.resources.items()):
            if res.name:
                meta.append(("M", "thread_name", did, rid, None, None, {"name": res.name}))
            meta.append(("M", "thread_sort_index", did, rid, None, None, {"sort_index": rid}))
    encode = msgspec.msgpack.Encoder().encode
    events = trace.trace_events
    parts = [_array_head(len(meta) + len(events))]
    if meta:
        parts.append(_items(encode(meta), len(meta)))
    n = len(events)
    if n < 2 * _ENCODE_EVENTS:
        parts.append(_encoded_rows(events, 0, n))
    else:  # (half of them encoded beside, on the other core)
        half = n // 2
        parts += in_two(
            lambda: _encoded_rows(events, 0, half), lambda: _encoded_rows(events, half, n)
        )
    return b"".join(parts)


def _encoded_rows(events: Any, first: int, last: int) -> bytes:
    """``events[first:last]`` as rows, encoded a batch at a time: the items of an array."""
    import msgspec

    encode = msgspec.msgpack.Encoder().encode
    parts = []
    for start in range(first, last, _ENCODE_EVENTS):
        batch: list[tuple[Any, ...]] = []
        for e in events[start : min(last, start + _ENCODE_EVENTS)]:
            d = e.duration_ps
            row = ("X" if d else "i", e.name, e.device_id, e.resource_id,
                   e.timestamp_ps / 1000000.0, d / 1000000.0 if d else None)  # fmt: skip
            a = e.args
            batch.append((*row, {k: a[k] for k in a}) if a else row)  # (no args: a row of six)
        parts.append(_items(encode(batch), len(batch)))
    return b"".join(parts)


def _array_head(n: int) -> bytes:
    """MessagePack's header of an array of ``n`` items."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def _items(encoded: bytes, n: int) -> bytes:
    """An encoded array of ``n`` items without its header: its items, to join with others'."""
    return encoded[len(_array_head(n)) :]
