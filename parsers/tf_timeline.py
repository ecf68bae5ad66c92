"""TensorFlow 1 Timeline traces: ``timeline.Timeline(step_stats).generate_chrome_trace_format()``.

The Chrome-trace JSON of the TF1 era (and of ``tf.compat.v1`` code today). Processes are devices:

- ``/job:.../device:CPU:0 Compute`` (or ``.../cpu:0 Compute``): ops the executor ran on the CPU;
  its "threads" are lanes the Timeline laid out so that concurrent ops do not overlap;
- ``/job:.../device:GPU:0 Compute``: the host side of GPU ops (their launch);
- ``/device:GPU:0/stream:N Compute``: kernels and copies per stream; ``.../stream:all Compute``
  and ``.../memcpy Compute`` repeat them (left out);
- ``... Tensors`` and ``Allocators``: memory, not time (left out).

Every op event carries ``args.name`` (its full name with name scopes) and ``args.op`` (its type),
named here ``scope/name:Type`` as TensorFlow 2's profiler names them, so one rules file serves
both. The Timeline writes no step markers: each ``Session.run`` starts with the executor's
``_SOURCE`` node, kept here as the op it is, and the core's ``session_runs`` pass cuts a trace of
several merged runs into steps there (a trace of one run is one step); the process names it
needs to find the CPU device's nodes are handed over as ``process_names``. Timestamps are Unix
microseconds.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Union

import msgspec
import numpy as np
import pyarrow as pa

from traceview.model import schema as S
from traceview.model.errors import BadInput, Notes
from traceview.parsers import (
    ParsedTrace,
    TraceIdentity,
    int64_id,
    rank_from_filename,
    raw_events,
    us_durations_to_ns,
    us_to_ns,
)
from traceview.parsers.chrome_stream import (
    CHUNK_BYTES,
    MAX_US,
    ChromeTraceReader,
    corrupt_times,
    decode_records,
)

_STREAM = re.compile(r"/(?:device:)?gpu:\d+/stream:(\d+|all) Compute$", re.IGNORECASE)
_MEMCPY = re.compile(r"/(?:device:)?gpu:\d+/memcpy Compute$", re.IGNORECASE)
_DEVICE_COMPUTE = re.compile(r"/job:[^ ]+ Compute$")


class _Args(msgspec.Struct, frozen=True, gc=False):
    name: str | None = None
    op: str | None = None


_NO_ARGS = _Args()


class _Op(msgspec.Struct, tag_field="ph", tag="X", frozen=True, gc=False):
    name: str | None = None
    pid: int | None = None
    tid: int | None = None
    ts: float | None = None
    dur: float | None = None
    args: _Args = _NO_ARGS


class _Meta(msgspec.Struct, tag_field="ph", tag="M", frozen=True, gc=False):
    name: str | None = None
    pid: int | None = None
    args: _Args = _NO_ARGS


class _Other(msgspec.Struct, tag_field="ph", frozen=True, gc=False):
    """Flows (DataFlow s/t), counters...: counted, not read."""


_OTHER_TAGS = ("s", "t", "f", "B", "E", "C", "b", "e", "n", "i", "I", "P", "O", "N", "D")
_OTHERS = tuple(type(f"_Other{ord(t)}", (_Other,), {}, tag=t) for t in _OTHER_TAGS)
_RECORD_TYPES: tuple[type, ...] = (_Op, _Meta, *_OTHERS)
_RECORD = Union[_RECORD_TYPES]  # type: ignore[valid-type]  # noqa: UP007
_DECODER = msgspec.json.Decoder(list[_RECORD])
# An op event, told by its shape: category "Op" and args naming the op (where the process names
# that say "Compute" come late in the file, or past the head that is sniffed).
_OP_CATEGORY = re.compile(rb'"cat"\s*:\s*"(Op|DataFlow)"')
_OP_ARGS = re.compile(rb'"args"\s*:\s*\{[^{}]*"op"\s*:\s*"')


def _decode_chunk(data: Any) -> tuple[list[Any], int]:
    """The chunk's records, and how many were left out for a field of the wrong type (one odd
    record must not cost the chunk's others)."""
    try:
        return _DECODER.decode(data), 0
    except msgspec.ValidationError:
        pass
    decoded, bad = decode_records(data)
    records = []
    for item in decoded:
        try:
            records.append(msgspec.convert(item, _RECORD, strict=False))
        except msgspec.ValidationError:
            bad += 1
    return records, bad


def sniff_text(head: bytes) -> bool:
    """A TF1 Timeline: device processes named "/job:... Compute" and ops of category "Op"."""
    if (
        b"Compute" in head
        and (b'"Op"' in head or b'"DataFlow"' in head)
        and (b"/job:" in head or b"/device:" in head or b"/gpu:" in head)
    ):
        return True
    return _OP_CATEGORY.search(head) is not None and _OP_ARGS.search(head) is not None


class TimelineParser:
    name = "tf_timeline"
    framework = "tensorflow"
    streams = True  # read a batch at a time (stream)
    rules_file: Path | None = None  # the built-in rules of its framework alone

    def sniff(self, path: Path, head: bytes) -> bool:
        return head.lstrip()[:1] in (b"{", b"[") and sniff_text(head)

    def identify(self, path: Path) -> TraceIdentity:
        return TraceIdentity(rank=rank_from_filename(path))

    def parse(self, path: Path) -> ParsedTrace:
        """The whole trace as one table: ``stream`` with its batches concatenated."""
        stream = self.stream(path)
        batches = list(stream)
        parsed = stream.result
        parsed.events = pa.Table.from_batches(batches, S.RAW_SCHEMA).unify_dictionaries()
        return parsed

    def stream(self, path: Path) -> TimelineStream:
        """The Timeline's raw events as record batches (``schema.RAW_SCHEMA``), a chunk of the
        file at a time; after the last, ``result`` holds the rest, as ``parse`` returns it."""
        return TimelineStream(self, path)


class TimelineStream:
    """One pass over a Timeline: iterate for raw batches, then read ``result``.

    An op's category comes from its process's name (``_category``). A Timeline names its
    processes before their ops; an op whose process is not named yet holds itself and the ops
    after it back until it is (or the file ends), so the rows keep the file's order."""

    base_ns = 0  # the times are Unix microseconds: nothing to add
    chunk_bytes = CHUNK_BYTES  # of the file, decoded at a time

    def __init__(self, parser: TimelineParser, path: Path):
        self.parser = parser
        self.path = path
        self._result: ParsedTrace | None = None

    @property
    def result(self) -> ParsedTrace:
        if self._result is None:
            raise RuntimeError("TimelineStream.result read before the stream was exhausted")
        return self._result

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        path = self.path
        reader = ChromeTraceReader(path, _decode_chunk, self.chunk_bytes)
        held: list[_Op] = []  # in file order, the first one's process not named yet
        processes: dict[int, str] = {}
        categories: dict[int, str | None] = {}  # per process, from its name as the ops came
        skipped: Counter[str] = Counter()
        other = wrong = ops = kept = 0
        for chunk, bad in reader:
            wrong += bad
            for record in chunk:
                if isinstance(record, _Op):
                    held.append(record)
                elif isinstance(record, _Meta):
                    if (
                        record.name == "process_name"
                        and record.pid is not None
                        and record.args.name
                    ):
                        processes[record.pid] = record.args.name
                else:
                    other += 1
            ready = next(
                (i for i, op in enumerate(held) if op.pid is not None and op.pid not in processes),
                len(held),
            )
            if ready:
                ops += ready
                batch = _events(held[:ready], processes, categories, skipped)
                del held[:ready]
                if batch is not None:
                    kept += batch.num_rows
                    yield batch
        ops += len(held)
        batch = _events(held, processes, categories, skipped)  # (the file's end: named or not)
        held.clear()
        if batch is not None:
            kept += batch.num_rows
            yield batch
        info = reader.info
        notes = Notes()
        if damage := info.damage_warning(path, ops):
            notes.warn(damage)
        if wrong:
            notes.warn(
                f"{path.name}: {wrong} record(s) with a field of the wrong type (or a number "
                "out of range) not read"
            )
        if skipped["corrupt_time"]:
            notes.warn(corrupt_times(path.name, skipped["corrupt_time"]))
        if not kept:
            raise BadInput(f"{path}: the TensorFlow Timeline holds no op events")
        found = dict(skipped)
        found["flow_and_other"] = other
        if wrong:
            found["wrong_type"] = wrong
        self._result = ParsedTrace(
            path=path,
            framework=self.parser.framework,
            events=S.empty(S.RAW_SCHEMA),
            rank=rank_from_filename(path),
            meta={"devices": sorted(set(processes.values()))},
            threads={},
            process_names={int64_id(pid): name for pid, name in processes.items()},
            infer_steps="session_runs",
            notes=notes,
            bytes_read=info.stream.bytes_read,
            lost_bytes=info.lost_bytes,
            skipped=found,
        )


def _category(process: str) -> str | None:
    """What a Timeline process holds: host ops, device work (per stream), or nothing timed."""
    if _MEMCPY.search(process):
        return None  # the copies again, as on their own streams
    stream = _STREAM.search(process)
    if stream:
        return None if stream.group(1) == "all" else "tf_kernel"
    if _DEVICE_COMPUTE.search(process):
        return "tf_op"
    return None


def _events(
    ops: list[_Op],
    processes: dict[int, str],
    categories: dict[int, str | None],
    skipped: Counter[str],
) -> pa.RecordBatch | None:
    """Ops as raw events (None: none kept), each process's category taken from its name the
    first time one of its ops comes; what is left out counted in ``skipped``."""
    cat: list[str] = []
    name: list[str] = []
    pid: list[int] = []
    tid: list[int] = []
    ts: list[float] = []
    dur: list[float] = []
    scope: list[str | None] = []
    for op in ops:
        kind = None
        if op.pid is not None:
            if op.pid not in categories and op.pid in processes:
                categories[op.pid] = _category(processes[op.pid])
            kind = categories.get(op.pid)
        if kind is None or op.ts is None:
            skipped["not_timed" if op.ts is not None else "no_timestamp"] += 1
            continue
        if not abs(op.ts) < MAX_US or abs(op.dur or 0.0) >= MAX_US:
            skipped["corrupt_time"] += 1
            continue
        full = f"{op.args.name}:{op.args.op}" if op.args.name and op.args.op else (op.name or "")
        if kind == "tf_op":
            label, own_scope = full, None
        elif (op.args.op or op.name or "").upper().startswith("MEMCPY"):
            kind, label, own_scope = "tf_memcpy", op.args.op or op.name or "memcpy", None
        else:
            label, own_scope = op.args.op or op.name or "", full
        cat.append(kind)
        name.append(label)
        pid.append(int64_id(op.pid or 0))
        tid.append(int64_id(op.tid or 0))
        ts.append(op.ts)
        dur.append(op.dur or 0.0)
        scope.append(own_scope)
    if not cat:
        return None
    ts_ns = us_to_ns(np.asarray(ts, np.float64))
    dur_ns = us_durations_to_ns(np.asarray(dur, np.float64))
    scopes = pa.array(scope, pa.string()).dictionary_encode()
    table = raw_events(cat, name, pid, tid, ts_ns, dur_ns, **{S.SCOPE: scopes})
    return table.combine_chunks().to_batches()[0]
