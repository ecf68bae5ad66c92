"""xprof's trace events of an XSpace (``xplane_batches.columns``), read as TensorFlow's events.

What each event is (a step marker, a graph op, tf.data work, a kernel, a copy...) follows from
its process (a host or a device plane), its thread's line, its name and a few args. The events
come as columns, and are classified column by column: a test on a string is made once per
distinct value (names, lines and args repeat), in Python, so that every test keeps the meaning it
has on one event (``str.upper``, a regular expression); the rest is numpy over every event.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traceview.model import schema as S
from traceview.model.errors import Notes
from traceview.parsers import int64_id, raw_events, us_durations_to_ns, us_to_ns
from traceview.parsers.chrome_stream import MAX_US
from traceview.parsers.xplane_batches import ARG
from traceview.parsers.xplane_devices import (
    CPU_DEVICE_PID,
    Devices,
    device_of_plane,
    find_devices,
    gpu_private,
    replica_of,
)
from traceview.parsers.xspace_hlo import NOTHING, HloFacts

# Lines xprof derives from the device's kernels; keeping them would count the kernels twice.
DERIVED_LINES = frozenset(
    ("TensorFlow Ops", "TensorFlow Name Scope", "Steps", "XLA Ops", "XLA Modules", "Source",
     "Framework Ops", "Framework Name Scope", "XLA TraceMe", "SparseCore", "Launch Stats")
)  # fmt: skip
#: The latest profile start time read as one (the year 2112, as the other readers' MAX_US)
LATEST_NS = int(MAX_US) * 1000
_SHAPE_SUFFIX = re.compile(r"#.*$")
_MEMCPY_SIZE = re.compile(r"size:(\d+)")
#: How JAX names the XLA programs it compiles (TensorFlow's are ``a_inference_...``)
_JAX_MODULE = re.compile(r"^(jit|pjit|pmap|xmap|shard_map)_")
#: The categories the events are read as, by their code here
KINDS = ("tf_step", "xla_op", "tf_host", "tf_data", "tf_op", "tf_collective", "tf_memcpy",
         "tf_memset", "tf_kernel")  # fmt: skip
STEP, XLA, HOST, DATA, OP, COLLECTIVE, MEMCPY, MEMSET, KERNEL = range(len(KINDS))


@dataclasses.dataclass
class Read:
    """``read_events``' result: the whole profile's events and what it says of itself."""

    events: pa.Table
    devices: Devices
    meta: dict[str, Any]
    threads: dict[str, str]
    process_names: dict[int, str]
    skipped: dict[str, int]
    notes: Notes
    host_pid: int | None
    jax_programs: bool = False  # XLA programs named as JAX names them (jit_step, pmap_step)
    # per event: the XLA program a host's call runs (null: none)
    programs: pa.Array = dataclasses.field(default_factory=lambda: pa.array([], pa.string()))
    # each _Recv's start and end (ExecutorState::ProcessAsync): key, done, pid, ts_ns, dur_ns
    receives: tuple[list[str], list[bool], list[int], np.ndarray, np.ndarray] | None = None


def _int(value: str | int | None) -> int | None:
    """An id (correlation, group) as int64: a uint64 above 2**63 keeps its bits, as pid/tid do."""
    if value is None or value == "":
        return None
    try:
        return int64_id(int(value))
    except ValueError:
        return None


class _Columns:
    """The events' columns, and what is worked out once per distinct value of a string column."""

    def __init__(self, events: pa.Table):
        self.table = events
        self.n = events.num_rows
        self._encoded: dict[str, tuple[list[str | None], np.ndarray]] = {}

    def arg(self, key: str) -> pa.Array:
        """An arg's column (null where an event has none)."""
        name = ARG + key
        if name not in self.table.column_names:
            return pa.nulls(self.n, pa.string())
        return self.table.column(name).combine_chunks()

    def _values(self, column: str) -> tuple[list[str | None], np.ndarray]:
        """A string column's distinct values (None last) and each event's index into them."""
        if column not in self._encoded:
            values = (
                self.table.column(column).combine_chunks()
                if column in self.table.column_names
                else pa.nulls(self.n, pa.string())
            )
            encoded = pc.dictionary_encode(values)
            distinct = [*encoded.dictionary.to_pylist(), None]
            at = encoded.indices.fill_null(len(distinct) - 1).to_numpy(zero_copy_only=False)
            self._encoded[column] = (distinct, at)
        return self._encoded[column]

    def test(self, column: str, fn: Callable[[str], object]) -> np.ndarray:
        """``fn`` of each event's value of ``column`` (a name or ``ARG`` + key); False where
        it has none."""
        distinct, at = self._values(column)
        return np.fromiter((v is not None and bool(fn(v)) for v in distinct), bool, len(distinct))[
            at
        ]

    def mapped(
        self, column: str, fn: Callable[[str | None], Any], rows: np.ndarray
    ) -> tuple[list[Any], np.ndarray]:
        """``fn`` of the value of ``column`` of each of ``rows`` (indices), once per value: the
        results, and each row's index into them."""
        distinct, at = self._values(column)
        codes, inverse = np.unique(at[rows], return_inverse=True)
        return [fn(distinct[c]) for c in codes.tolist()], inverse.ravel()

    def map(self, column: str, fn: Callable[[str | None], Any], rows: np.ndarray) -> list[Any]:
        """``fn`` of the value of ``column`` of each of ``rows`` (indices), once per value."""
        if not len(rows):
            return []
        results, inverse = self.mapped(column, fn, rows)
        out = np.empty(len(results), object)
        for i, result in enumerate(results):  # (a tuple stays one value)
            out[i] = result
        return list(out[inverse])

    def ints(self, column: str) -> tuple[np.ndarray, np.ndarray]:
        """``_int`` of each event's value: (values, 0 where none; whether there is one): ids
        and numbers given as text."""
        distinct, at = self._values(column)
        values = [_int(v) for v in distinct]
        valid = np.asarray([v is not None for v in values], bool)
        return np.asarray([v or 0 for v in values], np.int64)[at], valid[at]

    def take(self, column: str, rows: np.ndarray) -> list[Any]:
        """The values of ``column`` of ``rows`` (indices)."""
        distinct, at = self._values(column)
        return [distinct[c] for c in at[rows].tolist()]

    def has(self, column: str) -> np.ndarray:
        """Each event's value is not null."""
        distinct, at = self._values(column)
        return at != len(distinct) - 1

    def truthy(self, column: str) -> np.ndarray:
        """Each event's value is neither null nor empty."""
        return self.test(column, bool)


class _Labels:
    """Device labels (``CPU:3``) as codes: -1 where an event names none."""

    def __init__(self, n: int):
        self.code = np.full(n, -1, np.int64)
        self.names: list[str] = []
        self._index: dict[str, int] = {}

    def number(self, label: str | None) -> int:
        if label is None:
            return -1
        if label not in self._index:
            self._index[label] = len(self.names)
            self.names.append(label)
        return self._index[label]

    def set(self, rows: np.ndarray, labels: list[str | None], at: np.ndarray | None = None) -> None:
        """``rows`` labelled ``labels`` (one each), or ``labels[at]`` (``at``: an index each)."""
        if len(rows):
            numbers = np.asarray([self.number(x) for x in labels], np.int64)
            self.code[rows] = numbers if at is None else numbers[at]

    def array(self, rows: np.ndarray | None = None) -> pa.Array:
        code = self.code if rows is None else self.code[rows]
        return pa.DictionaryArray.from_arrays(
            pa.array(code, pa.int32(), mask=code < 0), pa.array(self.names, pa.string())
        ).cast(pa.string())


def read_events(
    meta: pa.Table, events: pa.Table, start_ns: int | None, path: Path, facts: HloFacts = NOTHING
) -> Read:
    """The trace events of one XSpace (``xplane_batches.columns``) as TensorFlow's events."""
    notes = Notes()
    planes: dict[int, str] = {}
    lines: dict[tuple[int, int], str] = {}
    meta_records = 0
    for p, t, name in zip(
        meta.column("pid").to_pylist(), meta.column("tid").to_pylist(),
        meta.column("name").to_pylist(), strict=True,
    ):  # fmt: skip
        meta_records += 1 + bool(name)  # (xprof's sort index, and the name where there is one)
        if name:
            if t is None:
                planes[p] = name
            else:
                lines[(p, t)] = name
    host_pids = sorted(pid for pid, name in planes.items() if name.startswith("/host:"))
    device_pids = sorted(pid for pid, name in planes.items() if name.startswith("/device:"))
    device_of = {pid: device_of_plane(planes[pid]) for pid in device_pids}

    col = _Columns(events)
    n = col.n
    pid = events.column("pid").to_numpy()
    tid = events.column("tid").to_numpy()
    ts_ps = events.column("ts_ps").to_numpy()
    dur_ps = events.column("dur_ps").to_numpy()
    timed = dur_ps != 0  # (an instant has no duration: xprof's "i")
    host = np.isin(pid, host_pids) & timed
    device = np.isin(pid, device_pids) & timed
    active = set(np.unique(pid[device]).tolist())
    # a GPU's plane has streams, and xprof's lines derived from them; a TPU's has its ops on
    # "XLA Ops" (and no streams)
    streamed = sorted(
        {p for (p, _), line in lines.items() if p in active and line.startswith("Stream")}
    )
    # no device plane at work: the devices are the host's (JAX's CPU devices; TensorFlow's
    # logical CPU devices), known by their ops
    host_devices = not active
    long_name = ARG + "long_name"
    replicas = host_devices and bool(
        (col.test(long_name, lambda v: replica_of(v) is not None) & host).any()
    )
    on_line = _lines_of(pid, tid, lines)

    # --- the host's events: the first test that holds says what each is
    kind = np.full(n, -1, np.int8)
    free = host.copy()

    def claim(test: np.ndarray, code: int) -> np.ndarray:
        rows = free & test
        kind[rows] = code
        free[rows] = False
        return rows

    steps = claim(col.has(ARG + "step_num"), STEP)
    hlo_op = col.truthy(ARG + "hlo_op")
    no = np.zeros(n, bool)
    xla = claim(hlo_op & col.has(ARG + "device_ordinal"), XLA) if host_devices else no
    claim(col.test("name", lambda v: v.startswith("ThreadpoolListener")), HOST)
    iterator = col.test("name", lambda v: v.startswith("Iterator::"))
    data = claim(iterator | on_line(lambda x: x.startswith("tf_data")), DATA)
    ops = claim(col.test(long_name, lambda v: ":" in v), OP)
    claim(on_line(lambda x: x.startswith("collective_ops")), COLLECTIVE)
    kind[free] = HOST
    # --- the devices' events: xprof's Steps (numbered), kernels, copies; not the lines derived
    step_line = device & on_line(lambda x: x == "Steps")
    numbered = col.test("name", lambda v: v.strip().isdigit())
    derived = device & ~step_line & on_line(lambda x: x in DERIVED_LINES)
    derived &= ~(on_line(lambda x: x == "XLA Ops") & ~np.isin(pid, streamed))
    derived |= step_line & ~numbered
    kernels = device & ~step_line & ~derived
    kind[step_line & numbered] = STEP
    memcpy = col.test("name", lambda v: "MEMCPY" in v.upper())
    kind[kernels] = KERNEL
    kind[kernels & col.test("name", lambda v: "MEMSET" in v.upper())] = MEMSET
    kind[kernels & memcpy] = MEMCPY
    keep = (host | device) & ~derived
    skipped: dict[str, int] = {"metadata": meta_records} if meta_records else {}
    other = ~(host | device)
    for why, rows_ in sorted((("other", other), ("derived", derived)), key=lambda w: _first(w[1])):
        if rows_.any():
            skipped[why] = int(rows_.sum())

    # --- names: a host step's own, the op's full name, a device step's number
    overrides: dict[int, str] = {}
    step_rows = np.flatnonzero(steps)
    for i, own, num, given in zip(
        step_rows.tolist(), col.take("name", step_rows), col.take(ARG + "step_num", step_rows),
        col.take(ARG + "step_name", step_rows), strict=True,
    ):  # fmt: skip
        # "train 3": the step's name as TensorFlow shows it, ending in its number
        overrides[i] = f"{(given or own).strip()} {num}".removeprefix(f"{num} ")
    numbered_steps = np.flatnonzero(step_line & numbered)
    device_steps = col.map("name", lambda v: f"step {str(v).strip()}", numbered_steps)
    overrides.update(zip(numbered_steps.tolist(), device_steps, strict=True))
    label = pc.if_else(pa.array(ops), col.arg("long_name"), events.column("name").combine_chunks())
    # a host's call of an XLA program: the program's name
    execute = np.where(ops, col.test(long_name, lambda v: "Execute" in v),
                       col.test("name", lambda v: "Execute" in v))  # fmt: skip
    for i in step_rows.tolist():
        execute[i] = "Execute" in overrides[i]
    called = host & col.has(ARG + "run_id") & execute & col.truthy(ARG + "name")
    program = pc.if_else(pa.array(called), col.arg("name"), pa.nulls(n, pa.string()))
    # --- devices: the device plane's, an XLA op's, a replica's
    labels = _Labels(n)
    device_rows = np.flatnonzero(device)
    planes_at, plane_of = np.unique(pid[device_rows], return_inverse=True)
    labels.set(device_rows, [device_of.get(p) for p in planes_at.tolist()], plane_of.ravel())
    xla_rows = np.flatnonzero(xla)
    labels.set(
        xla_rows, *col.mapped(ARG + "device_ordinal", lambda v: f"CPU:{_int(v) or 0}", xla_rows)
    )
    if replicas:
        shard = np.flatnonzero(
            data & col.test("name", lambda v: v.startswith("GetNextFromShard") and v[16:].isdigit())
        )
        labels.set(shard, *col.mapped("name", lambda v: f"CPU:{int(str(v)[16:])}", shard))
        op_rows = np.flatnonzero(ops)
        labels.set(
            op_rows, *col.mapped(long_name, lambda v: f"CPU:{replica_of(str(v)) or 0}", op_rows)
        )
        keyed = np.flatnonzero(
            ops & col.test(long_name, lambda v: "Collective" in v) & col.has(ARG + "instance_key")
        )
        if len(keyed):
            renamed = _collectives_by_replica(
                keyed, col.take(long_name, keyed), col.take(ARG + "instance_key", keyed), labels
            )
            overrides.update(renamed)
    # --- the op each kernel is of: its XLA op's framework op, else its annotation
    scope: list[str | None] = []
    hlo_rows = np.flatnonzero(xla | (kernels & hlo_op))
    pairs = [
        (m or "", str(o))
        for m, o in zip(col.take(ARG + "hlo_module", hlo_rows), col.take(ARG + "hlo_op", hlo_rows),
                        strict=True)
    ]  # fmt: skip
    scope += _xla_scopes(pairs, facts)
    jax = any(_JAX_MODULE.match(m) for m in {m for m, _ in pairs})
    annotated = np.flatnonzero(kernels & ~hlo_op)
    if len(annotated):  # (the first of these args it has)
        text = np.full(len(annotated), None, object)
        left = np.ones(len(annotated), bool)
        for key in ("level 0", "annotation", "long_name"):
            has = left & col.truthy(ARG + key)[annotated]
            text[has] = col.map(ARG + key, _without_shape, annotated[has])
            left &= ~has
        scope += text.tolist()
    # --- copies' sizes
    sized = np.flatnonzero((host & col.truthy(ARG + "memcpy_details")) | (kernels & memcpy))
    sizes = col.map(ARG + "memcpy_details", _copy_size, sized)

    # --- the events kept, in their order
    rows = np.flatnonzero(keep)
    if overrides:
        label = _replaced(label, overrides)
    correlation, has_correlation = (a[rows] for a in col.ints(ARG + "correlation_id"))
    run, has_run = (a[rows] for a in col.ints(ARG + "run_id"))
    group, has_group = (a[rows] for a in col.ints(ARG + "group_id"))
    if start_ns is not None and not 0 <= start_ns < LATEST_NS:
        notes.warn(
            f"{path.name}: the profile's start time ({start_ns} ns) is before 1970 or past the "
            "year 2112: times are relative to the profiling session"
        )
        start_ns = None
    elif start_ns is None:
        notes.remark(
            f"{path.name}: no profile start time in this XSpace (written before TensorFlow 2.x "
            "recorded it): times are relative to the profiling session"
        )
    base = start_ns or 0
    ts_ns = us_to_ns(ts_ps[rows] / 1e6, base)
    dur_ns = us_durations_to_ns(dur_ps[rows] / 1e6)
    pids = pid[rows].astype(np.int64)
    tids = tid[rows].view(np.int64).copy()
    if host_devices:
        _inherit_device(labels, rows, pids, tids, ts_ns, dur_ns)
    line_device = {
        k: f"GPU:{g}" for k, line in lines.items() if (g := gpu_private(line)) is not None
    }
    cats = pa.DictionaryArray.from_arrays(
        pa.array(kind[rows], pa.int8()), pa.array(KINDS, pa.string())
    ).cast(pa.string())
    devices = find_devices(
        labels.array(rows),
        cats,
        line_device,
        pids,
        tids,
        np.where(has_correlation, correlation, -1),
    )
    devices.run = np.where(has_run, run, -1)
    process_names = {p: planes[p] for p in planes}
    thread_names = {f"{p}/{t}": name for (p, t), name in lines.items()}
    moved = kind[rows] == XLA
    if moved.any():  # a CPU device's ops: on a process of that device's own
        code = labels.code[rows][moved]
        ordinal = np.asarray([int(x.rpartition(":")[2]) for x in labels.names] + [0], np.int64)[
            np.where(code >= 0, code, len(labels.names))
        ]
        new = CPU_DEVICE_PID + ordinal
        for p, t, d in {
            (int(a), int(b), f"CPU:{int(a) - CPU_DEVICE_PID}")
            for a, b in zip(new, tids[moved], strict=True)
        }:
            process_names[p] = f"/device:{d}"
            source = next((x for (_, ht), x in lines.items() if ht == t), str(t))
            thread_names[f"{p}/{t}"] = f"XLA ops ({source})"
        pids[moved] = new
    at = np.full(n, -1, np.int64)  # each event's row, where it is kept
    at[rows] = np.arange(len(rows))
    scoped = np.concatenate([hlo_rows, annotated])
    table = raw_events(
        cats, label.take(rows), pids, tids, ts_ns, dur_ns,
        **{
            S.CORRELATION: pa.array(correlation, pa.int64(), mask=~has_correlation),
            S.BYTES: _scatter(at[sized], sizes, len(rows), pa.int64()),
            S.SCOPE: _scatter(at[scoped], scope, len(rows), pa.string()).dictionary_encode(),
            S.STEP_GROUP: pa.array(group, pa.int64(), mask=~has_group),
        },
    )  # fmt: skip
    read_meta = {
        "planes": sorted(set(planes.values())),
        "devices": sorted(planes[p] for p in device_pids),
        "base_time_ns": start_ns,
    }
    return Read(
        table, devices, read_meta, thread_names, process_names, skipped, notes,
        min(host_pids) if host_pids else None, jax, program.take(pa.array(rows)),
        _receives(col, host, pid, ts_ps, dur_ps, base),
    )  # fmt: skip


def _lines_of(
    pid: np.ndarray, tid: np.ndarray, lines: dict[tuple[int, int], str]
) -> Callable[[Callable[[str], bool]], np.ndarray]:
    """A test of each event's line (its thread's name, "" where it has none): once per thread."""
    pid_values, pid_at = np.unique(pid, return_inverse=True)
    tid_values, tid_at = np.unique(tid, return_inverse=True)
    width = max(1, len(tid_values))
    threads, thread_at = np.unique(pid_at.ravel().astype(np.int64) * width + tid_at.ravel(),
                                   return_inverse=True)  # fmt: skip
    names = [
        lines.get((int(pid_values[k // width]), int(tid_values[k % width])), "")
        for k in threads.tolist()
    ]
    thread_at = thread_at.ravel()

    def on_line(fn: Callable[[str], bool]) -> np.ndarray:
        return np.fromiter((bool(fn(x)) for x in names), bool, len(names))[thread_at]

    return on_line


def _first(rows: np.ndarray) -> int:
    return int(np.argmax(rows)) if rows.any() else len(rows)


def _without_shape(text: str | None) -> str:
    """The op a kernel belongs to: ``scope/name:Type`` without xprof's ``#shape=...#`` tail."""
    return _SHAPE_SUFFIX.sub("", text or "")


def _copy_size(details: str | None) -> int | None:
    """A copy's size in bytes from its ``memcpy_details`` (None where it says none that fits)."""
    match = _MEMCPY_SIZE.search(details or "")
    size = int(match.group(1)) if match else None
    return size if size is not None and size < 1 << 63 else None


def _replaced(values: pa.Array, replacements: dict[int, str]) -> pa.Array:
    mask = np.zeros(len(values), bool)
    rows = sorted(replacements)
    mask[rows] = True
    return pc.replace_with_mask(
        values, pa.array(mask), pa.array([replacements[i] for i in rows], pa.string())
    )


def _scatter(at: np.ndarray, values: list[Any], n: int, kind: pa.DataType) -> pa.Array:
    """A column of ``n`` rows holding ``values`` at rows ``at`` (-1: not kept), null elsewhere."""
    index = np.full(n, len(values), np.int64)
    kept = at >= 0
    index[at[kept]] = np.flatnonzero(kept)
    return pa.array([*values, None], kind).take(pa.array(index))


def _receives(
    col: _Columns, host: np.ndarray, pid: np.ndarray, ts_ps: np.ndarray, dur_ps: np.ndarray,
    base: int,
) -> tuple[list[str], list[bool], list[int], np.ndarray, np.ndarray] | None:  # fmt: skip
    """Each _Recv's start and end on the host (ExecutorState::ProcessAsync): its key (step and
    rendezvous), whether it is the end, its process, start and duration."""
    rows = np.flatnonzero(
        host & col.test(ARG + "kernel_type", lambda v: v == "_Recv") & col.has(ARG + "step_id")
    )
    if not len(rows):
        return None
    keys = [
        f"{step}/{name}"
        for step, name in zip(col.take(ARG + "step_id", rows), col.take(ARG + "name", rows),
                              strict=True)
    ]  # fmt: skip
    done = [str(x).endswith("Done") for x in col.take("name", rows)]
    return (
        keys, done, pid[rows].tolist(), us_to_ns(ts_ps[rows] / 1e6, base),
        us_durations_to_ns(dur_ps[rows] / 1e6),
    )  # fmt: skip


def _xla_scopes(pairs: list[tuple[str, str]], facts: HloFacts) -> list[str]:
    """Each XLA op's scope (``pairs``: its module and op): the framework op its program says it
    comes from (JAX's ``jit(step)/transpose(jvp(loss))/dot_general``), else its HLO name."""
    ran: dict[str, set[str]] = {}
    for module, op in pairs:
        ran.setdefault(module, set()).add(op)
    names = {module: facts.op_names(module, ops) for module, ops in ran.items()}
    return [names[module].get(op) or op for module, op in pairs]


def _collectives_by_replica(
    rows: np.ndarray, names: list[str], keys: list[str], labels: _Labels
) -> dict[int, str]:
    """A mirrored strategy's collective ops on CPU devices, one per replica and instance
    (``keys``: their instance keys): the replicas' ops are made in replica order, so within an
    instance key the op named first (``CollectiveReduceV2``, then ``_1``, ``_2``...) is replica
    0's. Each is named as replica 0's (the name without the suffix that tells the replicas' ops
    apart): one call of the replicas, matched across them as one. Their new names, by event."""
    by_key: dict[str, set[str]] = {}
    for name, key in zip(names, keys, strict=True):
        by_key.setdefault(key, set()).add(name)
    order = {
        k: {n: i for i, n in enumerate(sorted(ns, key=_op_number))} for k, ns in by_key.items()
    }
    labels.set(rows, [f"CPU:{order[k][n]}" for n, k in zip(names, keys, strict=True)])
    renamed = {}
    for i, name in zip(rows.tolist(), names, strict=True):
        stem, kind = _op_number(name)[0], name.partition(":")[2]
        renamed[i] = f"{stem}:{kind}" if kind else stem
    return renamed


def _op_number(full: str) -> tuple[str, int]:
    """``sgd/CollectiveReduceV2_2:CollectiveReduceV2`` -> ("sgd/CollectiveReduceV2", 2)."""
    op = full.partition(":")[0]
    stem, _, number = op.rpartition("_")
    return (stem, int(number)) if number.isdigit() and stem else (op, 0)


def _inherit_device(
    labels: _Labels, rows: np.ndarray, pid: np.ndarray, tid: np.ndarray, ts: np.ndarray,
    dur: np.ndarray,
) -> None:  # fmt: skip
    """An event of no device of its own (of ``rows``, the events kept), inside one of a
    device's on the same thread (an XLA op's rendezvous, an op's executor calls), is that
    device's."""
    code = labels.code[rows]
    labelled = code >= 0
    if not labelled.any() or labelled.all():
        return
    _, thread = np.unique(pid * (1 << 32) + tid, return_inverse=True)
    thread = thread.ravel()
    low = int(ts.min())
    span = int(ts.max()) - low + 1
    key = thread.astype(np.int64) * span + (ts - low)  # (thread, start) in one number
    outer = np.flatnonzero(labelled)
    outer = outer[np.argsort(key[outer], kind="stable")]
    inner = np.flatnonzero(~labelled)
    # the latest device event that starts at or before each free one: on its thread, and
    # around it
    k = np.searchsorted(key[outer], key[inner], side="right") - 1
    found = k >= 0
    o = outer[np.maximum(k, 0)]
    inside = found & (thread[o] == thread[inner]) & (ts[inner] + dur[inner] <= ts[o] + dur[o])
    code[inner[inside]] = code[o[inside]]
    labels.code[rows] = code


def starts_by_name(events: pa.Table, names: set[str]) -> dict[str, list[float]]:
    """The starts (µs, as xprof's trace events give them) of the events (not instants) named
    each of ``names``: what the memory records' clock is matched against."""
    if not names:
        return {}
    timed = pc.and_(
        pc.not_equal(events.column("dur_ps"), 0),
        pc.is_in(events.column("name"), pa.array(sorted(names))),
    )
    chosen = events.filter(timed)
    starts: dict[str, list[float]] = {}
    for name, ts in zip(
        chosen.column("name").to_pylist(), (chosen.column("ts_ps").to_numpy() / 1e6).tolist(),
        strict=True,
    ):  # fmt: skip
        starts.setdefault(name, []).append(ts)
    return starts
