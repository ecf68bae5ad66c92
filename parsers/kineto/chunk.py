"""One chunk of the trace's events decoded and turned into columns (``_Chunk``): its events,
metadata records, counts by record type, batch sizes and memory records."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import compress
from operator import attrgetter
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from traceview.model import schema as S
from traceview.parsers.chrome_stream import decode_records
from traceview.parsers.kineto.columns import (
    _async_lanes,
    _dictionary,
    _dims,
    _ids,
    _int_array,
    _sizes,
    _strings,
)
from traceview.parsers.kineto.comm import _comm_bytes, _groups_and_peers, _split_imbalances
from traceview.parsers.kineto.memory import MEMORY_RECORD, _memory_batch
from traceview.parsers.kineto.records import (
    _DECODER,
    _INSTANTS,
    _TAG_OF,
    _TIMED,
    _coerce,
    _Complete,
    _id,
    _Meta,
    _thread_id,
)

_COMM_PREFIXES = ("nccl:", "gloo:", "mpi:", "ucc:", "xccl:", "c10d::", "record_param_comms")
#: Operators whose first input leads with the mini-batch dimension (N, C, H, W) or (N, ..., F):
#: the most common leading size among their calls is the trace's batch size, where shapes were
#: recorded.
_BATCH_OPS = frozenset(("aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::linear"))


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
