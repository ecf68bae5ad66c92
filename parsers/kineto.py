"""PyTorch profiler traces (Kineto Chrome-trace JSON, plain or gzip), both generations.

Current Kineto writes categories cpu_op, user_annotation, python_function, cuda_runtime, kernel,
gpu_memcpy, gpu_memset, gpu_user_annotation and ac2g flows; the 2021 format writes Operator,
Runtime, Kernel, Memcpy, Memset and ``async`` flows. ROCm traces use the same categories with
hip* names. Device activities carry the ``correlation`` id of the runtime call that launched
them, which is all the core needs to link the two, so flow events are counted, not kept.
"""

from __future__ import annotations

import math
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter
from pathlib import Path
from typing import Any, Union

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traceview.model import schema as S
from traceview.model.columns import encode_ranks, ints
from traceview.model.errors import BadInput, Notes
from traceview.parsers import (
    ParsedTrace,
    TraceIdentity,
    int64_id,
    us_durations_to_ns,
    us_to_ns,
)
from traceview.parsers.chrome_stream import (
    ABSURD,
    ChromeTraceInfo,
    ChromeTraceReader,
    absurd_times,
    corrupt_times,
    decode_records,
    out_of_range,
    read_header,
    split_point,
)

_DTYPE_BYTES = {
    "float": 4, "float32": 4, "Float": 4, "double": 8, "float64": 8, "Double": 8,
    "c10::Half": 2, "Half": 2, "half": 2, "float16": 2, "c10::BFloat16": 2, "BFloat16": 2,
    "bfloat16": 2, "long int": 8, "int64": 8, "Long": 8, "int": 4, "int32": 4, "Int": 4,
    "short int": 2, "int16": 2, "Short": 2, "signed char": 1, "int8": 1, "Char": 1,
    "unsigned char": 1, "uint8": 1, "Byte": 1, "bool": 1, "Bool": 1,
    "c10::complex<float>": 8, "c10::complex<double>": 16, "Float8_e4m3fn": 1, "Float8_e5m2": 1,
}  # fmt: skip
_COMM_PREFIXES = ("nccl:", "gloo:", "mpi:", "ucc:", "xccl:", "c10d::", "record_param_comms")
#: Operators whose first input leads with the mini-batch dimension (N, C, H, W) or (N, ..., F):
#: the most common leading size among their calls is the trace's batch size, where shapes were
#: recorded.
_BATCH_OPS = frozenset(("aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::linear"))


#: An ``args`` value not written (an empty Raw: false).
_NO_RAW = msgspec.Raw(b"")


class _Args(msgspec.Struct, frozen=True, gc=False):
    """The few ``args`` the core needs; everything else in ``args`` is skipped while decoding."""

    external_id: int | str | None = msgspec.field(default=None, name="External id")
    external_id_old: int | str | None = msgspec.field(default=None, name="external id")
    correlation: int | str | None = None
    nbytes: int | float | str | None = msgspec.field(default=None, name="bytes")
    collective: str | None = msgspec.field(default=None, name="Collective name")
    group: str | None = msgspec.field(default=None, name="Process Group Name")
    in_nelems: int | str | None = msgspec.field(default=None, name="In msg nelems")
    in_split: msgspec.Raw = msgspec.field(default=_NO_RAW, name="In split size")
    out_split: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Out split size")
    dtype: str | None = None
    # (a plain Raw: msgspec decodes ``Raw | None`` as null only, failing every recorded shape)
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    concrete_inputs: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Concrete Inputs")
    meta_name: str | None = msgspec.field(default=None, name="name")
    # [memory] records (profile_memory=True): the allocator's totals after the record
    total_allocated: int | float | str | None = msgspec.field(default=None, name="Total Allocated")
    total_reserved: int | float | str | None = msgspec.field(default=None, name="Total Reserved")
    mem_bytes: int | float | str | None = msgspec.field(default=None, name="Bytes")
    device_type: int | str | None = msgspec.field(default=None, name="Device Type")
    device_id: int | str | None = msgspec.field(default=None, name="Device Id")
    # a kernel's launch configuration, kept as the trace writes it ("[80, 1, 1]")
    grid: msgspec.Raw = _NO_RAW
    block: msgspec.Raw = _NO_RAW


_NO_ARGS = _Args()


class _Complete(msgspec.Struct, tag_field="ph", tag="X", gc=False):
    """A timed event; the record type ("ph") selects the class while decoding."""

    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float | None = None
    args: _Args = _NO_ARGS


class _Instant(_Complete, tag="i"):
    pass


class _GlobalInstant(_Complete, tag="I"):
    pass


class _Meta(msgspec.Struct, tag_field="ph", tag="M", gc=False):
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    args: _Args = _NO_ARGS


class _Skipped(msgspec.Struct, tag_field="ph", gc=False):
    """Records traceview counts but does not keep (flows, counters...): decoded without fields."""


# Every other record type of the Chrome trace format, skipped without reading its fields.
_SKIPPED_TAGS = ("s", "t", "f", "B", "E", "C", "b", "e", "n", "P", "O", "N", "D", "R", "(", ")",
                 "S", "T", "p", "F", "c", "v", "V")  # fmt: skip
_SKIPPED = tuple(type(f"_Skipped{ord(t)}", (_Skipped,), {}, tag=t) for t in _SKIPPED_TAGS)
_TAG_OF: dict[type, str] = {
    _Complete: "X", _Instant: "i", _GlobalInstant: "I", _Meta: "M",
    **dict(zip(_SKIPPED, _SKIPPED_TAGS, strict=True)),
}  # fmt: skip
_CLASS_OF = {tag: cls for cls, tag in _TAG_OF.items()}
_TIMED = frozenset((_Complete, _Instant, _GlobalInstant))
_INSTANTS = frozenset((_Instant, _GlobalInstant))
_RECORD_TYPES: tuple[type, ...] = (_Complete, _Instant, _GlobalInstant, _Meta, *_SKIPPED)
_DECODER = msgspec.json.Decoder(list[Union[_RECORD_TYPES]])  # type: ignore[valid-type]  # noqa: UP007


def _as_int(value: Any) -> int | None:
    """Ids and counts as integers, whatever the trace wrote ("7", 7.0, "stream 7", "0x1f")."""
    if value is None or value.__class__ is int:
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) else None
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("stream "):
            text = text[7:]
        try:
            return int(text, 0) if text.startswith(("0x", "0X")) else int(text)
        except ValueError:
            return None
    return None


def _fits_int64(number: int) -> bool:
    return -(1 << 63) <= number < 1 << 63


def _size(value: Any) -> int | None:
    """A size or count as int64; one wider than 64 bits is not a real size (None)."""
    number = _as_int(value)
    return number if number is None or _fits_int64(number) else None


def _id(value: Any) -> int | None:
    """A correlation or external id as int64; a wider one is folded as pid/tid are, the same
    way on both ends of a link, so the link survives."""
    number = _as_int(value)
    return number if number is None or _fits_int64(number) else _thread_id(number)


def _thread_id(value: Any) -> int:
    """pid/tid as int64: numbers as they are, labels ("Spans", "") as stable negative ids."""
    number = _as_int(value)
    if number is not None:
        return int64_id(number)  # 64 bits kept exactly; wider numbers hashed
    return -1 - zlib.crc32(str(value).encode())  # labels


def _coerce(raw: dict[str, Any]) -> Any:
    """One event decoded without a schema, made to fit the classes above (the slow path)."""
    args = raw.get("args")
    parsed_args = _NO_ARGS
    if isinstance(args, dict):
        dims = args.get("Input Dims")
        types = args.get("Input type")
        parsed_args = _Args(
            external_id=_as_int(args.get("External id")),
            external_id_old=_as_int(args.get("external id")),
            correlation=_as_int(args.get("correlation")),
            nbytes=_as_int(args.get("bytes")),
            collective=_str_or_none(args.get("Collective name")),
            group=_str_or_none(args.get("Process Group Name")),
            in_nelems=_as_int(args.get("In msg nelems")),
            in_split=_raw_of(args.get("In split size")),
            out_split=_raw_of(args.get("Out split size")),
            dtype=_str_or_none(args.get("dtype")),
            input_dims=msgspec.Raw(msgspec.json.encode(dims)) if dims is not None else _NO_RAW,
            input_type=msgspec.Raw(msgspec.json.encode(types)) if types is not None else _NO_RAW,
            concrete_inputs=msgspec.Raw(msgspec.json.encode(concrete))
            if (concrete := args.get("Concrete Inputs")) is not None
            else _NO_RAW,
            meta_name=_str_or_none(args.get("name")),
            grid=_raw_of(args.get("grid")),
            block=_raw_of(args.get("block")),
            total_allocated=_as_int(args.get("Total Allocated")),
            total_reserved=_as_int(args.get("Total Reserved")),
            mem_bytes=_as_int(args.get("Bytes")),
            device_type=_as_int(args.get("Device Type")),
            device_id=_as_int(args.get("Device Id")),
        )
    cls = _CLASS_OF.get(str(raw.get("ph", "")), _Skipped)
    ids = {k: raw.get(k) if isinstance(raw.get(k), int | str) else None for k in ("pid", "tid")}
    if cls is _Meta:
        return _Meta(name=_str_or_none(raw.get("name")), args=parsed_args, **ids)
    if cls in _TIMED:
        return cls(
            cat=_str_or_none(raw.get("cat")),
            name=_str_or_none(raw.get("name")),
            ts=_float_or_none(raw.get("ts")),
            dur=_float_or_none(raw.get("dur")),
            args=parsed_args,
            **ids,
        )
    return cls()


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _float_or_none(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def _int_array(values: list[Any], convert: Callable[[Any], int | None] = _size) -> pa.Array:
    """Integers (ids, sizes) as int64; floats are truncated, numeric strings parsed, numbers
    wider than 64 bits made to fit by ``convert``."""
    if values.count(None) == len(values):
        return S.all_null(len(values), pa.int64())  # (pyarrow is very slow on all-null lists)
    try:
        return pa.array(values, pa.int64())  # the common case: ints and nulls
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        pass
    try:
        array = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return pa.array([convert(v) for v in values], pa.int64())
    if pa.types.is_floating(array.type) and (pc.max(pc.abs(array)).as_py() or 0) < 2**63:
        return pc.cast(array, pa.int64(), safe=False)
    return pa.array([convert(v) for v in values], pa.int64())


def _sizes(values: list[Any]) -> tuple[pa.Array, int]:
    """Sizes as int64, and how many were numbers too wide for 64 bits (left out: null)."""
    array = _int_array(values)
    wide = 0
    if array.null_count > values.count(None):  # some did not convert: were they too wide?
        wide = sum(1 for v in values if (n := _as_int(v)) is not None and not _fits_int64(n))
    return array, wide


_DICT = pa.dictionary(pa.int32(), pa.string())


def _strings(values: list[Any]) -> pa.Array:
    if values.count(None) == len(values):
        return pa.nulls(len(values), pa.string())  # (pyarrow is very slow on all-null lists)
    return pa.array(values, pa.string())


def _dictionary(values: list[Any]) -> pa.Array:
    return pa.array(values, _DICT)


#: The longest launch configuration kept (a grid or block is three small numbers).
_DIMS_BYTES = 48


def _raw_of(value: Any) -> msgspec.Raw:
    return msgspec.Raw(msgspec.json.encode(value)) if value is not None else _NO_RAW


def _dims(values: list[msgspec.Raw]) -> pa.Array:
    """Launch configurations (``grid``, ``block``) as the trace's JSON text; null where there is
    none or it is longer than a configuration can be."""
    if not any(values):
        return pa.nulls(len(values), _DICT)
    lengths = np.fromiter(map(len, values), np.int64, len(values))
    text: list[str | None] = [None] * len(values)
    for i in np.flatnonzero((lengths > 0) & (lengths <= _DIMS_BYTES)).tolist():
        text[i] = bytes(values[i]).decode("utf-8", "replace")
    return _dictionary(text)


def _comm_bytes(args: _Args) -> int | None:
    """Message size of a collective from ``In msg nelems``/``dtype`` or the input shapes."""
    if args.in_nelems is not None:
        size = _DTYPE_BYTES.get(args.dtype or "")
        count = _as_int(args.in_nelems)
        return count * size if size and count is not None else None
    if not args.input_dims or not args.input_type:
        return None
    try:
        dims = msgspec.json.decode(args.input_dims)
        types = msgspec.json.decode(args.input_type)
    except (msgspec.DecodeError, RecursionError):
        return None
    if not dims or not types or not isinstance(dims, list) or not isinstance(types, list):
        return None
    size = _DTYPE_BYTES.get(types[0]) if isinstance(types[0], str) else None
    first = dims[0]
    if size is None or not isinstance(first, list) or not all(isinstance(d, int) for d in first):
        return None  # a tensor list or an unknown dtype: the size cannot be told
    count = 1
    for d in first:
        count *= d
    return count * size


class _Chunk:
    """Columns of one decoded chunk's events, its metadata records, and counts by record type."""

    __slots__ = (
        "batch",
        "batch_sizes",
        "counts",
        "memory",
        "out_of_range",
        "threads",
        "wide_sizes",
    )

    def __init__(
        self,
        batch: pa.RecordBatch,
        threads: dict[str, str],
        counts: dict[str, int],
        batch_sizes: Counter[int],
        wide_sizes: int = 0,
        out_of_range: int = 0,
        memory: pa.RecordBatch | None = None,
    ):
        self.batch = batch
        self.threads = threads
        self.counts = counts
        self.batch_sizes = batch_sizes
        self.wide_sizes = wide_sizes  # message sizes wider than 64 bits, left out
        self.out_of_range = out_of_range  # records holding a number beyond a float's range
        self.memory = memory  # the chunk's [memory] records (_memory_batch), if any


def _leading_size(dims: msgspec.Raw) -> int | None:
    """The first dimension of the first input, when that input has at least two dimensions."""
    if not dims:
        return None
    try:
        shapes = msgspec.json.decode(dims)
        first = shapes[0]
        if (
            isinstance(first, list)
            and len(first) >= 2
            and isinstance(first[0], int)
            and 0 < first[0] < 1 << 63
        ):
            return int(first[0])
    except (msgspec.DecodeError, RecursionError, IndexError, KeyError, TypeError):
        pass
    return None


#: gloo's point-to-point spans: record_function regions that gloo ends from its own thread when
#: the transfer completes, on the thread that posted them; they overlap whatever that thread runs
#: meanwhile instead of nesting in it.
_ASYNC_SPANS = frozenset(("gloo:send", "gloo:recv"))
#: Set on the thread id of those spans: a lane of their own beside the thread.
ASYNC_LANE = 1 << 62


def _async_lanes(tids: pa.Array, names: list[str | None], events: Sequence[Any]) -> pa.Array:
    """``tids`` with each async span (``_ASYNC_SPANS``) moved to a lane beside its thread: the
    first lane free when it begins (overlapping spans on lanes of their own, so none is taken
    for a call nested in another)."""
    if _ASYNC_SPANS.isdisjoint(names):
        return tids
    values = ints(tids, 0)
    moved = values.copy()
    rows = [i for i, n in enumerate(names) if n in _ASYNC_SPANS]
    rows.sort(key=lambda i: (values[i], events[i].ts or 0.0))
    free_at: dict[tuple[int, int], float] = {}  # (thread, lane) -> when its last span ends
    for i in rows:
        start = events[i].ts or 0.0
        end = start + (events[i].dur or 0.0)
        lane = 0
        while free_at.get((int(values[i]), lane), -math.inf) > start:
            lane += 1
        free_at[(int(values[i]), lane)] = end
        moved[i] = values[i] ^ (ASYNC_LANE | lane << 48)
    return pa.array(
        moved, pa.int64(), mask=np.asarray(pc.is_null(tids)) if tids.null_count else None
    )


def _ids(values: list[Any]) -> pa.Array:
    """pid/tid column: integers, and a few labels ("Spans") turned into stable negative ids."""
    try:
        return pa.array(values, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        mapping = {v: _thread_id(v) for v in set(values)}
        return pa.array(list(map(mapping.__getitem__, values)), pa.int64())


def _decode_chunk(data: Any) -> _Chunk:
    # The records' Raw values point into what is decoded, and the reader's buffer cannot be
    # released while one lives: decoded from a copy, they may outlive the call (in a traceback,
    # or a frame that a sampling profiler holds, as Dask's workers run one: "BufferError:
    # memoryview has N exported buffers"). A copy of a 4 MB chunk: 2% of its decode.
    data = bytes(data)
    bad = 0
    try:
        records: Sequence[Any] = _DECODER.decode(data)
    except msgspec.ValidationError:
        decoded, bad = decode_records(data)
        records = [_coerce(e) for e in decoded if isinstance(e, dict)]
    return _columns(records, bad)


def _columns(records: Sequence[Any], bad: int) -> _Chunk:
    # Flows, counters and metadata are counted, not kept: drop them before building columns.
    counts = {_TAG_OF.get(cls, "?"): n for cls, n in Counter(map(type, records)).items()}
    threads = {}
    if "M" in counts:
        for meta in (r for r in records if type(r) is _Meta):
            if meta.name == "thread_name" and meta.args.meta_name:
                threads[f"{_thread_id(meta.pid)}/{_thread_id(meta.tid)}"] = meta.args.meta_name
    if any(tag not in ("X", "i", "I") for tag in counts):
        records = list(compress(records, map(_TIMED.__contains__, map(type, records))))
    events: Sequence[_Complete] = records

    names = list(map(attrgetter("name"), events))
    args = list(map(attrgetter("args"), events))
    nbytes, wide = _sizes(list(map(attrgetter("nbytes"), args)))
    distinct = set(names)  # (once: the passes below ask what names there are)
    comm_names = {n for n in distinct if n and n.startswith(_COMM_PREFIXES)}
    if comm_names:
        values = nbytes.to_pylist()
        for i in compress(range(len(names)), map(comm_names.__contains__, names)):
            if values[i] is None:
                values[i] = _comm_bytes(args[i])
        nbytes, more = _sizes(values)
        wide += more
    batch_sizes: Counter[int] = Counter()
    if not _BATCH_OPS.isdisjoint(distinct):
        for i in compress(range(len(names)), map(_BATCH_OPS.__contains__, names)):
            size = _leading_size(args[i].input_dims)
            if size is not None:
                batch_sizes[size] += 1
    external = _int_array(list(map(attrgetter("external_id"), args)), _id)
    older = _int_array(list(map(attrgetter("external_id_old"), args)), _id)  # the 2021 spelling
    if older.null_count < len(older):
        external = pc.coalesce(external, older)
    batch = pa.RecordBatch.from_pydict(
        {
            "instant": pa.array(list(map(_INSTANTS.__contains__, map(type, events))), pa.bool_()),
            S.CAT: _dictionary(list(map(attrgetter("cat"), events))),
            S.NAME: _dictionary(names),
            S.PID: _ids(list(map(attrgetter("pid"), events))),
            S.TID: _async_lanes(_ids(list(map(attrgetter("tid"), events))), names, events),
            "ts_us": pa.array(list(map(attrgetter("ts"), events)), pa.float64()),
            "dur_us": pa.array(list(map(attrgetter("dur"), events)), pa.float64()),
            S.CORRELATION: _int_array(list(map(attrgetter("correlation"), args)), _id),
            S.EXTERNAL_ID: external,
            S.BYTES: nbytes,
            S.COLLECTIVE: _strings(list(map(attrgetter("collective"), args))),
            **_groups_and_peers(names, args, distinct),
            S.SPLIT_IMBALANCE: _split_imbalances(names, args, comm_names),
            S.GRID: _dims(list(map(attrgetter("grid"), args))),
            S.BLOCK: _dims(list(map(attrgetter("block"), args))),
        }
    )
    memory = None
    if MEMORY_RECORD in names:
        rows = [i for i, n in enumerate(names) if n == MEMORY_RECORD]
        memory = _memory_batch([events[i] for i in rows], [args[i] for i in rows])
    return _Chunk(batch, threads, counts, batch_sizes, wide, bad, memory)


#: Point-to-point calls whose recorded scalar arguments (``Concrete Inputs``, written with
#: ``record_shapes``) hold the peer, at this position: ``c10d::send(tensors, group, dst, tag)``,
#: ``c10d::recv_(tensors, group, src, tag)`` (the rank inside the call's group).
_PEER_ARGUMENT = {"c10d::send": 2, "c10d::recv_": 2}
_PEER_DECODER = msgspec.json.Decoder(list[str | int | float | None])


#: ``traceview collect``'s region around each collective call, naming its process group and a
#: point-to-point call's peer (``traceview.pg:<group>[:<peer>]``: collectors/rankside_groups.py).
GROUP_REGION = "traceview.pg:"


def _groups_and_peers(
    names: list[str | None], args: list[_Args], distinct: set[str | None]
) -> dict[str, pa.Array]:
    """Each event's process group and point-to-point peer: from its arguments (NCCL's
    ``Process Group Name``, c10d's recorded scalars) or, for traceview's own region, its name
    (``distinct``: the names there are)."""
    groups: list[str | None] = list(map(attrgetter("group"), args))
    peers = _peers(names, args, distinct)
    regions = {n for n in distinct if n and n.startswith(GROUP_REGION)}
    if regions:
        peers = peers or [None] * len(names)
        parsed = {}
        for name in regions:
            group, _, peer = name[len(GROUP_REGION) :].partition(":")
            parsed[name] = (group or None, int(peer) if peer.isdigit() and len(peer) < 10 else None)
        for i in compress(range(len(names)), map(regions.__contains__, names)):
            groups[i], peers[i] = parsed[names[i]]  # type: ignore[index]
    peer = pa.nulls(len(names), pa.int32()) if peers is None else pa.array(peers, pa.int32())
    return {S.GROUP: _strings(groups), S.PEER: peer}


#: All-to-alls whose recorded scalar arguments hold the split sizes, at these positions:
#: ``c10d::alltoall_base_(output, input, group, output_split_sizes, input_split_sizes, ...)``.
_SPLIT_ARGUMENTS = {"c10d::alltoall_base_": (3, 4)}
_SPLIT_DECODER = msgspec.json.Decoder(list[int] | str)
#: Most split sizes read from one call (one per rank of its group).
MAX_SPLITS = 1 << 16


def _imbalance(raw: msgspec.Raw | str | None) -> float | None:
    """max / mean of a list of split sizes (as JSON, or a string holding it: "[3, 4]"); None
    where there is no list, an empty one (an even split), or it is not sizes."""
    try:
        value: Any = _SPLIT_DECODER.decode(raw) if isinstance(raw, msgspec.Raw) else raw
        if isinstance(value, str):
            if not value.startswith("[") or len(value) > 16 * MAX_SPLITS:
                return None
            value = _SPLIT_DECODER.decode(value)
    except (msgspec.DecodeError, RecursionError):
        return None
    if not isinstance(value, list) or not value or len(value) > MAX_SPLITS:
        return None
    if any(v < 0 for v in value):
        return None
    total = sum(value)
    return max(value) * len(value) / total if total > 0 else None


def _split_imbalances(names: list[str | None], args: list[_Args], comm_names: set[str]) -> pa.Array:
    """Each all-to-all's split imbalance (schema.SPLIT_IMBALANCE) where its arguments record
    the splits: NCCL's ``In split size``/``Out split size``, or c10d's recorded split
    arguments (gloo, with ``record_shapes``); null elsewhere."""
    out: list[float | None] = [None] * len(names)
    if not comm_names:
        return pa.array(out, pa.float64())
    for i in compress(range(len(names)), map(comm_names.__contains__, names)):
        a = args[i]
        found = [_imbalance(a.in_split) if a.in_split else None,
                 _imbalance(a.out_split) if a.out_split else None]  # fmt: skip
        positions = _SPLIT_ARGUMENTS.get(names[i] or "")
        if positions and a.concrete_inputs:
            try:
                values = _PEER_DECODER.decode(a.concrete_inputs)
                found += [_imbalance(str(values[p])) for p in positions]
            except (msgspec.DecodeError, IndexError):
                pass
        known = [f for f in found if f is not None]
        out[i] = max(known) if known else None
    return pa.array(out, pa.float64())


def _peers(
    names: list[str | None], args: list[_Args], distinct: set[str | None]
) -> list[int | None] | None:
    """Each event's point-to-point peer, where its recorded arguments state it (else null;
    None: no event is a call that could state one)."""
    if not _PEER_ARGUMENT.keys() & distinct:
        return None
    peers: list[int | None] = [None] * len(names)
    for i in compress(range(len(names)), map(_PEER_ARGUMENT.__contains__, names)):
        raw = args[i].concrete_inputs
        if not raw:
            continue
        try:
            values = _PEER_DECODER.decode(raw)
            peer = _as_int(values[_PEER_ARGUMENT[names[i]]])  # type: ignore[index]
        except (msgspec.DecodeError, IndexError):
            continue
        if peer is not None and 0 <= peer < 1 << 31:
            peers[i] = peer
    return peers


#: Most process groups one trace's ``pg_config`` is read for (more: the rest is not read).
MAX_GROUPS = 4096


def read_pg_config(value: object) -> tuple[list[dict[str, str]], int]:
    """A trace's ``distributedInfo.pg_config`` as manifest entries ``{name, desc, ranks}``
    (ranks encoded), and how many entries were not usable."""
    if not isinstance(value, list):
        return [], 0
    groups: list[dict[str, str]] = []
    bad = 0
    for entry in value[:MAX_GROUPS]:
        if not isinstance(entry, dict):
            bad += 1
            continue
        name, ranks = entry.get("pg_name"), entry.get("ranks")
        if not isinstance(name, str | int) or not isinstance(ranks, list):
            bad += 1
            continue
        members = sorted({r for r in ranks if isinstance(r, int) and 0 <= r < 1 << 31})
        if len(members) != len(ranks):
            bad += 1
        desc = entry.get("pg_desc")
        groups.append(
            {
                "name": str(name),
                "desc": str(desc) if isinstance(desc, str | int) else "",
                "ranks": encode_ranks(members),
            }
        )
    return groups, bad + max(0, len(value) - MAX_GROUPS)


#: The name of Kineto's memory records (instants written with profile_memory=True).
MEMORY_RECORD = "[memory]"
#: c10::DeviceType numbers as Kineto writes them in "Device Type", and how traceview names them.
_DEVICE_TYPES = {0: "cpu", 1: "cuda", 6: "hip", 12: "xpu", 13: "mps", 20: "privateuse1"}
#: Totals above this are not a real allocator's (a wrapped or corrupt counter): 1 PiB.
MAX_MEMORY_BYTES = 1 << 50


def _memory_batch(events: list[_Complete], args: list[_Args]) -> pa.RecordBatch:
    """The [memory] records' columns: device, thread, time (µs), totals and size as stated."""
    return pa.RecordBatch.from_pydict(
        {
            "device_type": _int_array([a.device_type for a in args]),
            "device_id": _int_array([a.device_id for a in args]),
            S.PID: _ids([e.pid for e in events]),
            S.TID: _ids([e.tid for e in events]),
            "ts_us": pa.array([e.ts for e in events], pa.float64()),
            S.ALLOCATED_BYTES: _int_array([a.total_allocated for a in args]),
            S.RESERVED_BYTES: _int_array([a.total_reserved for a in args]),
            S.BYTES: _int_array([a.mem_bytes for a in args]),
        }
    )


def _device_names(kinds: np.ndarray, ids: np.ndarray) -> list[str]:
    """ "cpu", "cuda:0"... from Kineto's device type and id (-1: the only one)."""
    names = {}
    for kind, index in set(zip(kinds.tolist(), ids.tolist(), strict=True)):
        base = _DEVICE_TYPES.get(kind, f"device{kind}")
        names[kind, index] = base if base == "cpu" or index < 0 else f"{base}:{index}"
    return [names[k] for k in zip(kinds.tolist(), ids.tolist(), strict=True)]


def memory_table(
    batches: list[pa.RecordBatch], base_ns: int, name: str, notes: Notes
) -> tuple[pa.Table | None, dict[str, Any]]:
    """The trace's memory records as ``schema.MEMORY_RAW_SCHEMA`` (None: there are none), and
    what the parser found out about them (for the rank's meta).

    Totals the trace does not state (Kineto before 2022 writes only each record's size) are
    summed from the sizes, so they count from the profiler's start. PyTorch's CPU allocator
    keeps no reserve and writes "Total Reserved" 0: that is null here, never 0. Records with an
    absurd time, a negative or impossible total (a record cut short, a wrapped counter) are
    dropped with one warning naming how many."""
    if not batches:
        return None, {}
    table = pa.Table.from_batches(batches)
    ts_us = np.asarray(table.column("ts_us").to_numpy(zero_copy_only=False), np.float64)
    kinds = ints(table.column("device_type"), -1)
    ids = ints(table.column("device_id"), -1)
    allocated = table.column(S.ALLOCATED_BYTES)
    reserved = table.column(S.RESERVED_BYTES)
    size = table.column(S.BYTES)
    devices = np.array(_device_names(kinds, ids), dtype=object)
    meta: dict[str, Any] = {}
    keep = ~absurd_times(ts_us, np.zeros(len(ts_us)))
    order = np.argsort(np.where(keep, ts_us, np.inf), kind="stable")
    alloc = np.array(pc.fill_null(allocated, -1).to_numpy(), np.int64)
    stated = np.array(pc.is_valid(allocated).to_numpy(zero_copy_only=False), bool)
    summed: list[str] = []
    for device in sorted(set(devices.tolist())):
        rows = order[(devices[order] == device) & keep[order]]
        if rows.size and not stated[rows].any():  # the 2021 format: sizes only
            sizes = ints(size, 0)[rows]
            alloc[rows] = np.cumsum(sizes)
            stated[rows] = True
            summed.append(device)
    if summed:
        meta["memory_summed_from_sizes"] = summed
    # what counts only from the profiler's start: the CPU allocator's records, summed totals
    since_start = {"cpu"} & set(devices[keep].tolist()) | set(summed)
    if since_start:
        meta["memory_since_start"] = sorted(since_start)
    res = np.array(pc.fill_null(reserved, -1).to_numpy(), np.int64)
    res_valid = np.array(pc.is_valid(reserved).to_numpy(zero_copy_only=False), bool)
    on_cpu = devices == "cpu"
    res_valid &= ~(on_cpu & (res == 0))  # the CPU allocator keeps no reserve: not 0 but null
    summed_rows = np.isin(devices, summed)
    impossible = (
        (stated & ~summed_rows & ((alloc < 0) | (alloc > MAX_MEMORY_BYTES)))
        | (res_valid & ((res < 0) | (res > MAX_MEMORY_BYTES)))
        | (stated & res_valid & (res > 0) & (res < alloc) & ~on_cpu)
    )
    keep &= stated & ~impossible
    if dropped := int((~keep).sum()):
        notes.warn(
            f"{name}: {dropped} memory record(s) dropped: a negative or impossible total "
            f"(allocated or reserved outside 0-{MAX_MEMORY_BYTES >> 40} TiB, reserved below "
            "allocated), no total or an absurd time (a record cut short, a wrapped counter)"
        )
    rows = order[keep[order]]
    out = pa.table(
        {
            S.DEVICE: pa.array(devices[rows].tolist(), pa.string()),
            S.PID: table.column(S.PID).take(rows),
            S.TID: table.column(S.TID).take(rows),
            S.TS_NS: us_to_ns(ts_us[rows], base_ns),
            S.ALLOCATED_BYTES: pa.array(alloc[rows], pa.int64()),
            S.RESERVED_BYTES: pa.array(res[rows], pa.int64(), mask=~res_valid[rows]),
            S.BYTES: table.column(S.BYTES).take(rows),
        }
    )
    return S.conform(out, S.MEMORY_RAW_SCHEMA), meta


class KinetoParser:
    name = "kineto"
    framework = "pytorch"

    def sniff(self, path: Path, head: bytes) -> bool:
        if b'"traceEvents"' not in head and not head.lstrip().startswith(b"["):
            return False
        markers = (b'"schemaVersion"', b'"cpu_op"', b'"Operator"', b'"ProfilerStep#', b'"ac2g"')
        return any(marker in head for marker in markers)

    def identify(self, path: Path) -> TraceIdentity:
        header = read_header(path)
        distributed = header.get("distributedInfo")
        distributed = distributed if isinstance(distributed, dict) else {}
        return TraceIdentity(
            rank=_as_int(distributed.get("rank")),
            world_size=_as_int(distributed.get("world_size")),
            host=_str_or_none(header.get("host_name")),
        )

    def parse(self, path: Path) -> ParsedTrace:
        """The whole trace as one table: ``stream`` with its batches concatenated."""
        stream = self.stream(path)
        batches = list(stream)
        parsed = stream.result
        table = pa.Table.from_batches(batches, S.RAW_SCHEMA) if batches else None
        del batches
        if table is None:
            table = S.RAW_SCHEMA.empty_table()
        base_ns = stream.base_ns
        if base_ns:
            ts = pc.add(table.column(S.TS_NS), pa.scalar(base_ns, pa.int64()))
            table = table.set_column(table.schema.get_field_index(S.TS_NS), S.TS_NS, ts)
        parsed.events = S.conform(table, S.RAW_SCHEMA).unify_dictionaries()
        return parsed

    def split_point(self, path: Path, near: int) -> int | None:
        """Where a part of the trace read on its own (``stream``'s ``part``) can start: the
        first event at or after byte ``near`` (None: gzip, or none found)."""
        return split_point(path, near, _DECODER.decode)

    def stream(self, path: Path, part: tuple[int, int | None] | None = None) -> KinetoStream:
        """The trace's raw events as record batches (``schema.RAW_SCHEMA``), read and decoded
        a chunk at a time: a multi-GB trace is never whole in memory. Times are on the trace's
        own clock *before* its baseTimeNanoseconds is added (``KinetoStream.base_ns``: the
        header may name it after the events); after the last batch, ``result`` holds the rest
        (metadata, notes, memory records) as ``parse`` returns it, with no events.
        ``part``: (start, stop) bytes of a plain file, only the events there (``split_point``
        gives where one may start); see ``KinetoStream``."""
        return KinetoStream(self, path, part)


@dataclass
class _Totals:
    """What a pass over the trace's events adds up besides the events themselves."""

    threads: dict[str, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)  # records by type ("ph")
    batch_sizes: Counter[int] = field(default_factory=Counter)
    memory: list[pa.RecordBatch] = field(default_factory=list)
    wide_sizes: int = 0
    out_of_range: int = 0
    rows: int = 0
    no_ts: int = 0
    absurd: int = 0
    kept: int = 0

    def add(self, chunk: _Chunk) -> None:
        self.rows += chunk.batch.num_rows
        if chunk.memory is not None:
            self.memory.append(chunk.memory)
        self.batch_sizes.update(chunk.batch_sizes)
        self.wide_sizes += chunk.wide_sizes
        self.out_of_range += chunk.out_of_range
        self.threads.update(chunk.threads)
        for ph, count in chunk.counts.items():
            self.counts[ph] = self.counts.get(ph, 0) + count

    def then(self, later: _Totals) -> None:
        """Add the totals of the part read after this one."""
        self.threads.update(later.threads)
        for ph, count in later.counts.items():
            self.counts[ph] = self.counts.get(ph, 0) + count
        self.batch_sizes.update(later.batch_sizes)
        self.memory.extend(later.memory)
        self.wide_sizes += later.wide_sizes
        self.out_of_range += later.out_of_range
        self.rows += later.rows
        self.no_ts += later.no_ts
        self.absurd += later.absurd
        self.kept += later.kept


@dataclass
class KinetoPart:
    """A later part's read (``KinetoStream`` with ``part``), handed to the stream of the part
    before it (``KinetoStream.then``): it may come from another process."""

    totals: _Totals
    info: ChromeTraceInfo


class KinetoStream:
    """One pass over a Kineto trace: iterate for raw batches, then read ``result``.

    With ``part`` (byte offsets, ``ChromeTraceReader``), only the events in those bytes: a part
    that ends before the file's end has no ``result`` until the later part's read is added
    (``then``); the later part's is ``KinetoPart`` (``part_read``)."""

    def __init__(
        self, parser: KinetoParser, path: Path, part: tuple[int, int | None] | None = None
    ):
        self.parser = parser
        self.path = path
        self.part = part
        self._result: ParsedTrace | None = None
        self.base_ns = 0
        self._totals = _Totals()
        self._info: ChromeTraceInfo | None = None

    @property
    def result(self) -> ParsedTrace:
        if self._result is None:
            raise RuntimeError("KinetoStream.result read before the stream was exhausted")
        return self._result

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        reader = ChromeTraceReader(self.path, _decode_chunk, part=self.part)
        totals = self._totals
        for chunk in reader:
            totals.add(chunk)
            raw, missing, absurd = _raw_batch(chunk.batch)
            del chunk
            totals.no_ts += missing
            totals.absurd += absurd
            totals.kept += raw.num_rows
            if raw.num_rows:
                yield raw
        self._info = reader.info
        if self.part is None:
            self._finish()

    def part_read(self) -> KinetoPart:
        """This part's read, for the stream of the part before it (``then``)."""
        if self._info is None:
            raise RuntimeError("KinetoStream.part_read before the stream was exhausted")
        return KinetoPart(self._totals, self._info)

    def then(self, later: KinetoPart) -> None:
        """Add the read of the part after this one (to the file's end): ``result`` is then the
        whole trace's."""
        if self._info is None:
            raise RuntimeError("KinetoStream.then before the stream was exhausted")
        self._totals.then(later.totals)
        self._info = self._info.then(later.info)
        self._finish()

    def _finish(self) -> None:
        path, info, totals = self.path, self._info, self._totals
        assert info is not None
        counts, n_absurd, kept = totals.counts, totals.absurd, totals.kept
        notes = Notes()
        top = info.top_level
        info.require_events(path, totals.rows, counts)
        if n_absurd:
            if not kept:
                raise BadInput(f"{path}: every event's time or duration is corrupt ({ABSURD})")
            notes.warn(corrupt_times(path.name, n_absurd))
        if totals.out_of_range:
            notes.warn(out_of_range(path.name, totals.out_of_range))
        if totals.wide_sizes:
            notes.warn(
                f"{path.name}: {totals.wide_sizes} message size(s) too large for 64 bits left "
                "out (args bytes / In msg nelems)"
            )
        base_ns = _base_time(top.get("baseTimeNanoseconds"), path, notes)
        self.base_ns = base_ns
        memory_records, memory_meta = memory_table(totals.memory, base_ns, path.name, notes)
        totals.memory = []

        info_value = top.get("distributedInfo")
        distributed: dict[str, Any] = info_value if isinstance(info_value, dict) else {}
        skipped = {
            "flow": sum(counts.get(p, 0) for p in ("s", "f", "t")),
            "metadata": counts.get("M", 0),
            "other": sum(
                v for p, v in counts.items() if p not in ("X", "i", "I", "s", "f", "t", "M")
            ),
            "no_timestamp": totals.no_ts,
        }
        if n_absurd:
            skipped["corrupt_time"] = n_absurd
        if skipped["other"]:
            kinds = ", ".join(
                sorted(p for p in counts if p not in ("X", "i", "I", "s", "f", "t", "M"))
            )
            notes.warn(
                f"{path.name}: {skipped['other']} events of unsupported types ({kinds}) not read"
            )
        if damage := info.damage_warning(path, kept):
            notes.warn(damage)
        if info.header_damage:
            notes.warn(f"{path.name}: the keys before traceEvents not read ({info.header_damage})")
        devices = top.get("deviceProperties")
        batch_sizes = totals.batch_sizes
        process_groups, bad_groups = read_pg_config(distributed.get("pg_config"))
        if bad_groups:
            notes.warn(
                f"{path.name}: {bad_groups} process group(s) of distributedInfo.pg_config not read"
                " (no name, or ranks that are not ranks)"
            )
        meta: dict[str, Any] = {
            "schema_version": top.get("schemaVersion"),
            "backend": distributed.get("backend"),
            "nccl_version": distributed.get("nccl_version"),
            "devices": [d.get("name") for d in devices if isinstance(d, dict)]
            if isinstance(devices, list)
            else [],
            "base_time_ns": base_ns or None,
            "trace_name": top.get("traceName"),
            # from the recorded input shapes of convolutions and linear layers (a guess)
            "batch_size": batch_sizes.most_common(1)[0][0] if batch_sizes else None,
            # the rank's process groups as the trace declares them (name, desc, ranks encoded)
            "process_groups": process_groups,
            **memory_meta,
        }
        self._result = ParsedTrace(
            path=path,
            framework=self.parser.framework,
            events=S.RAW_SCHEMA.empty_table(),
            rank=_as_int(distributed.get("rank")),
            world_size=_as_int(distributed.get("world_size")),
            host=_str_or_none(top.get("host_name")),
            meta={k: v for k, v in meta.items() if v not in (None, [], "")},
            threads=totals.threads,
            notes=notes,
            bytes_read=info.stream.bytes_read,
            lost_bytes=info.lost_bytes,
            skipped=skipped,
            memory=memory_records,
            # no ProfilerStep markers (the autograd profiler API, a hand-placed profile): steps
            # where the training loop repeats (normalize/step_inference.py: from_repeats)
            infer_steps="repeats",
        )


def _raw_batch(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, int, int]:
    """One decoded chunk's events as ``schema.RAW_SCHEMA`` (times in ns on the trace's own
    clock, baseTimeNanoseconds not yet added), less those without a time and those with an
    absurd one; and how many of each were left out."""
    has_ts = pc.is_valid(batch.column("ts_us"))
    no_ts = batch.num_rows - int(pc.sum(has_ts).as_py() or 0)
    if no_ts:
        batch = batch.filter(has_ts)
    ts_us = batch.column("ts_us").to_numpy(zero_copy_only=False)
    dur = batch.column("dur_us").to_numpy(zero_copy_only=False)
    absurd = absurd_times(ts_us, dur)
    n_absurd = int(absurd.sum())
    if n_absurd:
        keep = ~absurd
        batch, ts_us, dur = batch.filter(pa.array(keep)), ts_us[keep], dur[keep]
    ts_ns = us_to_ns(ts_us, 0)
    dur_ns = us_durations_to_ns(dur)
    # the one kind the format states: instants; the core reads the rest off the categories
    kind = pc.if_else(batch.column("instant"), S.KIND_INSTANT, pa.scalar(None, pa.string()))
    raw = pa.RecordBatch.from_pydict(
        {
            S.KIND: kind.dictionary_encode(),
            S.CAT: batch.column(S.CAT),
            S.NAME: pc.fill_null(batch.column(S.NAME), ""),
            S.PID: batch.column(S.PID),
            S.TID: batch.column(S.TID),
            S.TS_NS: pa.array(ts_ns),
            S.DUR_NS: pa.array(dur_ns),
            S.CORRELATION: batch.column(S.CORRELATION),
            S.EXTERNAL_ID: batch.column(S.EXTERNAL_ID),
            S.BYTES: batch.column(S.BYTES),
            S.COLLECTIVE: batch.column(S.COLLECTIVE).dictionary_encode(),
            S.GROUP: batch.column(S.GROUP),
            S.PEER: batch.column(S.PEER),
            S.SPLIT_IMBALANCE: batch.column(S.SPLIT_IMBALANCE),
            S.GRID: batch.column(S.GRID),
            S.BLOCK: batch.column(S.BLOCK),
        }
    )
    return _conform_batch(raw), no_ts, n_absurd


def _conform_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    table = S.conform(pa.Table.from_batches([batch]), S.RAW_SCHEMA).combine_chunks()
    if table.num_rows == 0:
        return pa.RecordBatch.from_pylist([], schema=S.RAW_SCHEMA)
    return table.to_batches()[0]


#: The latest start baseTimeNanoseconds may give: 2**62 ns (the year 2116), so that adding
#: it to a time that passed ``absurd_times`` (under 2**52 µs) cannot overflow int64.
_MAX_BASE_NS = 1 << 62


def _base_time(value: Any, path: Path, notes: Notes) -> int:
    """The header's baseTimeNanoseconds; one of the wrong type or absurd size is not used."""
    if value is None or value == 0:
        return 0
    number = None if isinstance(value, bool) else _as_int(value)
    if number is not None and 0 <= number < _MAX_BASE_NS:
        return number
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    notes.warn(
        f"{path.name}: baseTimeNanoseconds {shown} is not a time in nanoseconds (wrong type or "
        "absurd size): not used, times are the trace's own"
    )
    return 0
