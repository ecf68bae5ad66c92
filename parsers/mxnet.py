"""MXNet profiler traces (``mx.profiler`` Chrome-trace JSON, plain or gzip).

What MXNet writes (1.x): every operator twice, as a ``B``/``E`` pair on its device
(``pid`` = the device number of ``cpu/0``, ``gpu/0``..., ``tid`` = the engine worker thread) and as
an async ``b``/``e`` pair of the ``operator`` domain; C API calls as async pairs (cat
``MXNET_C_API``) on the calling thread; counters (``C``: ``Device Storage``, call counts);
profiler domains of the script's own (``Task``: ``b``/``e``, ``Frame``: ``(``/``)``, ``Event``:
``B``/``E``, ``Marker``: ``n``). Timestamps are integer epoch microseconds; pids and tids of
domains and threads are 64-bit hashes (above 2**53: kept exact as int64 bit patterns).

This parser only reads: it pairs the records into intervals (``chrome_events``) (one row per event, the operator
domain's duplicate of each device operator dropped) and says what the file states about itself.
MXNet runs operators asynchronously on its engine's worker threads, so the timeline that matters
is the engine's: the parser asks the core for the ``mxnet_engine`` layout
(``traceview/normalize/mxnet_engine.py``), which finds that timeline, the steps and their phases.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from traceview.model import schema as S
from traceview.model.errors import Notes
from traceview.parsers import (
    ParsedTrace,
    TraceIdentity,
    WholeRead,
    us_to_ns,
)
from traceview.parsers.chrome_events import _STORAGE_DEVICES, _ids, read_events
from traceview.parsers.chrome_stream import (
    MAX_US,
)

_DEVICE_NAME = re.compile(r"^(cpu|gpu)/\d+$")


_MARKERS = (b'"MXNET_C_API"', b'"Device Storage"', b'"MXNet C API Calls"')


#: The layout pass this format needs (see the module docstring).
LAYOUT = "mxnet_engine"


class MXNetParser:
    name = "mxnet"
    framework = "mxnet"
    streams = True  # read a batch at a time (stream)
    rules_file: Path | None = None  # the built-in rules of its framework alone

    def sniff(self, path: Path, head: bytes) -> bool:
        if b'"traceEvents"' not in head and not head.lstrip().startswith(b"["):
            return False
        if any(marker in head for marker in _MARKERS):
            return True
        return (
            b'"operator"' in head and re.search(rb'"name"\s*:\s*"(cpu|gpu)/\d+"', head) is not None
        )

    def identify(self, path: Path) -> TraceIdentity:
        return TraceIdentity()  # MXNet traces do not say who wrote them

    def stream(self, path: Path) -> WholeRead:
        """The trace read whole, its events handed on a batch at a time (``WholeRead``; the
        core lays them out first)."""
        return WholeRead(lambda: self.parse(path))

    def parse(self, path: Path) -> ParsedTrace:
        read = read_events(path)
        raw, info, notes, counts = read.events, read.info, read.notes, read.counts
        unmatched, no_ts, operators = read.unmatched, read.no_timestamp, read.operators
        corrupt, process_names, thread_names = read.corrupt, read.process_names, read.thread_names
        storage = read.storage
        if not operators:
            notes.remark(
                f"{path.name}: no MXNet operator events (profile_imperative/symbolic off?)"
            )
        if unmatched:
            notes.warn(
                f"{path.name}: {unmatched} begin/end records without their other half not read"
            )
        if damage := info.damage_warning(path, raw.num_rows):
            notes.warn(damage)
        threads = {f"{p}/{t}": label for (p, t), label in thread_names.items()}
        skipped = {
            "counter": counts.get("C", 0),
            "metadata": counts.get("M", 0),
            "unmatched": unmatched,
            "no_timestamp": no_ts,
        }
        if corrupt:
            skipped["corrupt_time"] = corrupt
        meta: dict[str, Any] = {
            "devices": sorted(
                {label for label in process_names.values() if _DEVICE_NAME.match(label)}
            ),
        }
        memory = _memory(storage, path.name, notes)
        return ParsedTrace(
            path=path,
            framework=self.framework,
            events=raw,
            side={"memory": memory} if memory is not None else {},
            meta={k: v for k, v in meta.items() if v not in (None, [], "")},
            threads=threads,
            notes=notes,
            bytes_read=info.stream.bytes_read,
            lost_bytes=info.lost_bytes,
            skipped=skipped,
            layout=LAYOUT,
            process_names=process_names,
        )


def _memory(
    storage: list[tuple[str, Any, Any, float | None, Any]], name: str, notes: Notes
) -> pa.Table | None:
    """MXNet's storage counters (``Memory: gpu/0``: bytes its storage manager holds on the
    device) as schema.MEMORY_RAW_SCHEMA; devices named ``cpu``, ``gpu:0``, ``cpu_pinned:0``. A
    value that is not a number, negative or beyond 1 PiB, or an absurd time, is dropped with a
    warning naming how many. MXNet keeps no separate reserve: reserved is null."""
    if not storage:
        return None
    devices = [d for d, *_ in storage]
    ts = np.array([t if t is not None else np.nan for *_, t, _ in storage], np.float64)
    values = [v for *_, v in storage]
    number = np.array(
        [isinstance(v, int | float) and not isinstance(v, bool) for v in values], bool
    )
    value = np.array([float(v) if n else -1.0 for v, n in zip(values, number, strict=True)])
    known = np.array([d in _STORAGE_DEVICES for d in devices], bool)
    if unknown := int((~known).sum()):
        names = ", ".join(sorted({d for d in devices if d not in _STORAGE_DEVICES})[:3])
        notes.warn(f"{name}: {unknown} memory record(s) of other devices ({names}) not read")
    with np.errstate(invalid="ignore"):
        keep = number & (value >= 0) & (value <= float(1 << 50)) & (np.abs(ts) < MAX_US)
    keep[~known] = False
    if dropped := int((~keep & known).sum()):
        notes.warn(
            f"{name}: {dropped} memory record(s) dropped: not a number, negative or beyond 1 "
            "PiB (a wrapped counter), or an absurd time"
        )
    rows = np.flatnonzero(keep)
    rows = rows[np.argsort(ts[rows], kind="stable")]
    named = {d: "cpu" if d == "cpu/0" else d.replace("/", ":") for d in set(devices)}
    table = pa.table(
        {
            S.DEVICE: pa.array([named[devices[i]] for i in rows], pa.string()),
            S.PID: pa.array(_ids([storage[i][1] for i in rows]), pa.int64()),
            S.TID: pa.array(_ids([storage[i][2] for i in rows]), pa.int64()),
            S.TS_NS: us_to_ns(ts[rows]),
            S.ALLOCATED_BYTES: pa.array(value[rows].astype(np.int64), pa.int64()),
        }
    )
    return S.conform(table, S.MEMORY_RAW_SCHEMA)
