"""Pass 2 over a large trace: the spilled rows read back and routed to their chunks' files (a
device activity to the chunk of the call that launched it).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traceview.ingest.large.plan import Firsts
from traceview.ingest.large.sinks import WorkerProcess
from traceview.ingest.large.spill import spill_batches
from traceview.model import schema as S
from traceview.model.columns import (
    DEVICE,
    ints,
)


class ChunkFiles:
    """An Arrow IPC stream per chunk (``work/PREFIX-C.arrows``), opened when rows first reach
    it; all closed on leaving."""

    def __init__(self, work: Path, prefix: str):
        self.work, self.prefix = work, prefix
        self.open: dict[int, tuple[pa.OSFile, pa.ipc.RecordBatchStreamWriter]] = {}

    def write(self, chunk: int, rows: pa.RecordBatch) -> None:
        if chunk not in self.open:
            sink = pa.OSFile(str(self.work / f"{self.prefix}-{chunk}.arrows"), "wb")
            self.open[chunk] = (sink, pa.ipc.new_stream(sink, rows.schema))
        self.open[chunk][1].write_batch(rows)

    def __enter__(self) -> ChunkFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        for sink, writer in self.open.values():
            writer.close()
            sink.close()


@dataclass
class Routing:
    """What routing a row takes: the chunk bounds, and each device activity's launcher's
    chunk by correlation (runtime calls) or external id (operators)."""

    bounds: np.ndarray
    runtime: Firsts
    ops: Firsts


#: The chunk files' prefixes: the rows this process routed, and the helper's (the later part).
_HERE, _LATER = "chunk", "chunk-later"


def _route(spills: list[tuple[Path, int]], routing: Routing, work: Path, prefix: str) -> None:
    """Pass 2: each event to its chunk's file (``work``/PREFIX-C.arrows; a device activity to
    its launcher's chunk); ``spills``: the first pass's files, each with the number of its
    first row."""
    with ChunkFiles(work, prefix) as files:
        for batch in (_renumbered(b, first) for p, first in spills for b in spill_batches(p)):
            ts = ints(batch.column(S.TS_NS), 0)
            kind = np.asarray(batch.column("_kind").to_numpy(zero_copy_only=False), np.int64)
            chunk = np.searchsorted(routing.bounds, ts, side="right")
            device = np.flatnonzero(DEVICE[kind])
            if len(device):
                corr = ints(batch.column(S.CORRELATION), -1)[device]
                ext = ints(batch.column(S.EXTERNAL_ID), -1)[device]
                found = routing.runtime.get(corr)
                found = np.where(found >= 0, found, routing.ops.get(ext))
                chunk[device] = np.where(found >= 0, found, chunk[device])
            order = np.argsort(chunk, kind="stable")
            sorted_chunk = chunk[order]
            edges = np.flatnonzero(np.diff(sorted_chunk)) + 1
            for piece in np.split(np.arange(len(order)), edges):
                if len(piece):
                    files.write(int(sorted_chunk[piece[0]]), batch.take(pa.array(order[piece])))


def route_later_part(job: Path) -> None:
    """Pass 2 over the later part's spill (``traceview.ingest.large.worker`` runs it beside the ingest's
    own): ``job`` holds the spill, the number of its first row and the ``Routing``."""
    with job.open("rb") as fh:
        spill, first, routing = pickle.load(fh)
    _route([(spill, first)], routing, job.parent, _LATER)


def route_both(
    spills: list[tuple[Path, int]], routing: Routing, work: Path, helper: WorkerProcess | None
) -> None:
    """Pass 2: with a helper waiting (the one that read the later part) and two spills, each
    process routes one; else (or where the helper fails) this process routes them all."""
    if helper is None or len(spills) != 2:
        _route(spills, routing, work, _HERE)
        return
    job = work / "route.pickle"
    with job.open("wb") as fh:
        pickle.dump((*spills[1], routing), fh, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        helper.outbox.send(("route", str(job)))
        sent = True
    except OSError:
        sent = False
    _route(spills[:1], routing, work, _HERE)
    try:
        done = sent and helper.inbox.recv() == ("routed",)
    except (EOFError, OSError):
        done = False
    if not done:  # its files may be cut short: routed again here
        for partial in work.glob(f"{_LATER}-*.arrows"):
            partial.unlink()
        _route(spills[1:], routing, work, _LATER)


def _renumbered(batch: pa.RecordBatch, first: int) -> pa.RecordBatch:
    if not first:
        return batch
    rows = pc.add(batch.column("_row"), pa.scalar(first, pa.int64()))
    return batch.set_column(batch.schema.get_field_index("_row"), "_row", rows)


def chunk_files(work: Path, chunk: int) -> list[Path]:
    """A chunk's routed rows: this process's, then the helper's (later rows: ids in order)."""
    return [work / f"{prefix}-{chunk}.arrows" for prefix in (_HERE, _LATER)]


def read_chunk(work: Path, chunk: int, shift: int) -> pa.Table | None:
    batches = [b for path in chunk_files(work, chunk) for b in spill_batches(path)]
    if not batches:
        return None
    table = pa.Table.from_batches(batches)
    table = table.drop_columns(["_kind"])
    if shift:
        ts = pc.add(table.column(S.TS_NS), pa.scalar(shift, pa.int64()))
        table = table.set_column(table.schema.get_field_index(S.TS_NS), S.TS_NS, ts)
    return table
