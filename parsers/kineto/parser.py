"""The Kineto parser (``KinetoParser``) and its one pass over a trace (``KinetoStream``): raw
batches a chunk at a time, then the rest of what the trace says (metadata, notes, memory)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from traceview.model import schema as S
from traceview.model.errors import BadInput, Notes
from traceview.parsers import (
    SURE_PID,
    ParsedTrace,
    TraceIdentity,
    us_durations_to_ns,
    us_to_ns,
)
from traceview.parsers.chrome_stream import (
    ABSURD,
    ChromeTraceInfo,
    ChromeTraceReader,
    absurd_times,
    corrupt_times,
    out_of_range,
    read_head,
    read_header,
    split_point,
)
from traceview.parsers.kineto.chunk import _Chunk, _decode_chunk
from traceview.parsers.kineto.comm import read_pg_config
from traceview.parsers.kineto.memory import memory_table
from traceview.parsers.kineto.records import _DECODER, _as_int, _str_or_none


class KinetoParser:
    name = "kineto"
    framework = "pytorch"
    streams = True  # read a batch at a time (stream)
    rules_file: Path | None = None  # the built-in rules of its framework alone

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
            process=_first_process(path),
        )

    def parse(self, path: Path) -> ParsedTrace:
        """The whole trace as one table: ``stream`` with its batches concatenated."""
        stream = self.stream(path)
        batches = list(stream)
        parsed = stream.result
        table = pa.Table.from_batches(batches, S.RAW_SCHEMA) if batches else None
        del batches
        if table is None:
            table = S.empty(S.RAW_SCHEMA)
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
        held: pa.RecordBatch | None = None  # a small chunk, raw with the next one
        for chunk in reader:
            totals.add(chunk)
            batch = chunk.batch
            del chunk
            if held is not None and held.schema.equals(batch.schema):
                batch = _one_batch(held, batch)
            elif held is not None:
                raw, held = self._raw(held), None
                if raw is not None:
                    yield raw
            held = None
            if batch.num_rows < _HOLD_ROWS and batch.nbytes < _HOLD_BYTES:
                held = batch
                continue
            # (each decoded chunk let go before its raw batch is yielded: held while the caller
            # works on it, it cost a 4.5 MB trace 4 ms more of system time in page faults)
            raw, batch = self._raw(batch), None
            if raw is not None:
                yield raw
        if held is not None:
            raw, held = self._raw(held), None
            if raw is not None:
                yield raw
        self._info = reader.info
        if self.part is None:
            self._finish()

    def _raw(self, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        """``batch`` made raw, its events counted (None: none left)."""
        raw, missing, absurd = _raw_batch(batch)
        totals = self._totals
        totals.no_ts += missing
        totals.absurd += absurd
        totals.kept += raw.num_rows
        return raw if raw.num_rows else None

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
            events=S.empty(S.RAW_SCHEMA),
            rank=_as_int(distributed.get("rank")),
            world_size=_as_int(distributed.get("world_size")),
            host=_str_or_none(top.get("host_name")),
            meta={k: v for k, v in meta.items() if v not in (None, [], "")},
            threads=totals.threads,
            notes=notes,
            bytes_read=info.stream.bytes_read,
            lost_bytes=info.lost_bytes,
            skipped=skipped,
            side={"memory": memory_records} if memory_records is not None else {},
            # no ProfilerStep markers (the autograd profiler API, a hand-placed profile): steps
            # where the training loop repeats (normalize/step_inference.py: from_repeats)
            infer_steps="repeats",
        )


#: Decoded chunks of fewer events than this are made raw with the next one: the reader ends a
#: trace on a piece of its own (its last event, decoded apart to find where the events end),
#: so a small trace was two chunks, each paying the ~0.25 ms of making a batch raw.
_HOLD_ROWS = 4096
_HOLD_BYTES = 1 << 20  # (and of less than this: a few events of huge names are not held)


def _one_batch(first: pa.RecordBatch, then: pa.RecordBatch) -> pa.RecordBatch:
    """Two decoded chunks' batches (of one schema) as one."""
    if first.num_rows == 0 or then.num_rows == 0:
        return then if first.num_rows == 0 else first
    return pa.Table.from_batches([first, then]).combine_chunks().to_batches()[0]


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


_PID = re.compile(rb'"pid"\s*:\s*(\d{1,10})\b')
# Kineto labels the host process "CPU" (its devices "GPU0"...) in a metadata record of no
# nested object but its args: the record, then its pid, whatever the key order.
_LABELS = re.compile(rb'\{[^{}]*"process_labels"[^{}]*\{\s*"labels"\s*:\s*"CPU"\s*\}[^{}]*\}')


def _first_process(path: Path) -> int | None:
    """The OS process the trace is of: the one Kineto labels "CPU" at its head, of any pid
    (a container's processes are numbered from 1); else the process most of the first events
    are in, where that is surely an OS pid; None where the head says neither."""
    try:
        head = read_head(path)
    except (OSError, BadInput):
        return None
    events = head.find(b'"traceEvents"')
    labelled = _LABELS.search(head, max(events, 0))
    pid = _PID.search(labelled.group(0)) if labelled else None
    if pid:
        return int(pid.group(1))
    pids = [int(m.group(1)) for m in _PID.finditer(head, max(events, 0))]
    pids = [p for p in pids if p >= SURE_PID]
    return Counter(pids).most_common(1)[0][0] if pids else None
