"""Kineto's memory records (``[memory]`` instants, written with profile_memory=True): their
columns as decoded, and the trace's memory table (``schema.MEMORY_RAW_SCHEMA``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traceview.model import schema as S
from traceview.model.columns import ints
from traceview.model.errors import Notes
from traceview.parsers import us_to_ns
from traceview.parsers.chrome_stream import absurd_times
from traceview.parsers.kineto.columns import _ids, _int_array
from traceview.parsers.kineto.records import _Args, _Complete

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
