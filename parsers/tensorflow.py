"""TensorFlow 2 profiler output: ``*.xplane.pb`` (an XSpace protobuf, one per host and session).

The XSpace is turned into trace events by the profiler's own library (xprof, the package behind
TensorBoard's profile plugin: its "trace_viewer" converter), so the XSpace is not decoded here
(``xplane_batches``: in a child process, many GPU planes a batch at a time, the converter's
trace-event protobuf read into columns: ``xprof_trace``). What this module and
``xplane_events`` (each event's meaning, column by column) add is TensorFlow's meaning:

- host threads: graph ops run by the executor (named by their full name,
  ``scope/op_name:OpType``), tf.data iterator work, the runtime's own regions, and step markers
  (``tf.profiler.experimental.Trace(name, step_num=N)``, Keras batches);
- device streams: kernels and copies, each with the op it belongs to as its scope (the name
  TensorFlow annotates every kernel with), so a kernel is classified as its op;
- the lines xprof derives from those (TensorFlow Ops, Name Scope, Steps, XLA Modules) are left
  out: they repeat the kernels.

Times are made absolute with the session's ``profile_start_time`` where the XSpace records it
(TensorFlow 2.x writes it on a "Task Environment" plane); older files keep the session's clock.
Each event's ``group_id`` (TensorFlow's own grouping of events into steps) is kept as its
``step_group``: without step markers, the core's ``step_groups`` pass makes the steps from it.
"""

from __future__ import annotations

import dataclasses
import functools
import mmap
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from traceview.model import schema as S
from traceview.model.errors import BadInput, Notes
from traceview.parsers import (
    ParsedTrace,
    TraceIdentity,
    WholeRead,
    rank_from_filename,
    raw_events,
    xspace_lines,
)
from traceview.parsers.tf_roles import REMOTE_TID, remote_waits, task_role
from traceview.parsers.xplane_batches import trace_events
from traceview.parsers.xplane_devices import (
    Devices,
    device_of_plane,
    one_device,
)
from traceview.parsers.xplane_events import LATEST_NS, Read, read_events, starts_by_name
from traceview.parsers.xspace_hlo import hlo_facts, space_with_events

SUFFIX = ".xplane.pb"
HOST_PLANE = "/host:CPU"
_RANK_DIR = re.compile(r"^rank-(\d+)$")


def _native_error(lines: list[str]) -> str:
    """The last error xprof logged, without its log prefix."""
    errors = [line for line in lines if line.startswith("E0000") or " error" in line.lower()]
    message = (errors or lines or ["unknown error"])[-1]
    return message.split("] ", 1)[-1].strip()


def _require_xprof() -> Any:
    try:
        from xprof.convert import raw_to_tool_data
    except ImportError:
        raise BadInput(
            "reading TensorFlow .xplane.pb traces needs the xprof package: "
            "pip install 'traceview[tensorflow]'"
        ) from None
    return raw_to_tool_data


def rank_from_path(path: Path) -> int | None:
    """``RUN/raw/rank-00003/plugins/profile/<session>/<host>.xplane.pb`` -> 3."""
    for part in reversed(path.parts[:-1]):
        match = _RANK_DIR.match(part)
        if match:
            return int(match.group(1))
    return rank_from_filename(path)


class XPlaneParser:
    name = "xplane"
    framework = "tensorflow"  # or "jax", as each profile says (``identify``)
    streams = True  # read a batch at a time (stream)
    rules_file: Path | None = None  # the built-in rules of its framework alone

    def sniff(self, path: Path, head: bytes) -> bool:
        return path.name.endswith(SUFFIX)

    def identify(self, path: Path) -> TraceIdentity:
        """Rank and host from the path; the framework and, where one process drove several
        devices, the devices (each a rank: ``parse(path, device)``) from the profile itself,
        read once here and kept for the parse that follows (``_whole``). A profile that does not
        read is identified by its path alone (its parse says why)."""
        identity = TraceIdentity(rank=rank_from_path(path), host=path.name[: -len(SUFFIX)] or None)
        try:
            whole = _whole(path)
        except BadInput:
            return identity
        identity.framework = whole.parsed.framework
        if whole.devices.several:
            identity.devices = list(whole.devices.names)
        return identity

    def stream(self, path: Path, device: str | None = None) -> WholeRead:
        """The profile read whole (a protobuf cannot be streamed), its events handed on a
        batch at a time (``WholeRead``; the core infers its steps first)."""
        return WholeRead(lambda: self.parse(path, device))

    def parse(self, path: Path, device: str | None = None) -> ParsedTrace:
        """The profile as one rank; with ``device``, that device's rank of a profile of several
        (``xplane_devices``)."""
        whole = _whole(path)
        if device is None or not whole.devices.several:
            parsed = dataclasses.replace(whole.parsed, notes=_copy(whole.parsed.notes))
            if whole.devices.several:  # (as one rank: xprof's step lines repeat the markers)
                parsed.events = parsed.events.filter(pa.array(~whole.devices.step_line))
            return parsed
        if device not in whole.devices.names:
            raise BadInput(f"{path}: no device {device!r} in this profile")
        parsed = one_device(whole.parsed, whole.devices, device, whole.host_pid)
        parsed.notes = _copy(parsed.notes)
        return parsed


def _planes_left_out(census: dict[str, int], read: Read, path: Path) -> None:
    """Planes with lines that xprof's trace events leave out (a device of a kind it does not
    know): named, their events are not read."""
    converted = set(read.meta.get("planes") or [])
    lost = sorted(
        name
        for name, lines in census.items()
        if lines and name not in converted and name.startswith(("/device:", "/host:CPU"))
    )
    if lost:
        read.notes.warn(
            f"{path.name}: plane(s) of a kind xprof does not read, not read: {', '.join(lost)}"
        )


def _device_notes(read: Read, path: Path) -> None:
    """What a profile of several devices leaves unsaid, said once: devices that are no rank,
    planes without events, devices whose steps are the host's markers where others have their
    own, devices whose events lie outside the host's window (another clock)."""
    devices, notes = read.devices, read.notes
    if devices.left_out:
        shown = ", ".join(f"{d} ({n})" for d, n in sorted(devices.left_out.items()))
        notes.warn(
            f"{path.name}: device(s) with copies but no kernels or ops are not ranks; their "
            f"events are not read: {shown}"
        )
    named = {device_of_plane(p) for p in read.meta.get("devices") or []}
    empty = sorted(d for d in named if d and d not in devices.names and d not in devices.left_out)
    if empty:
        notes.remark(f"{path.name}: device plane(s) without events: {', '.join(empty)}")
    codes = devices.of_row
    own = {devices.names[c] for c in np.unique(codes[devices.step_line]) if c >= 0}
    if own and len(own) < len(devices.names):
        rest = [d for d in devices.names if d not in own]
        notes.warn(
            f"{path.name}: {', '.join(rest)} without a step line of their own (xprof's Steps, "
            f"which {', '.join(sorted(own))} have): their steps are the host's markers"
        )
    ts = read.events.column(S.TS_NS).to_numpy()
    if not ((codes < 0) & ~devices.host_marker).any():
        notes.remark(f"{path.name}: no host events: each device's rank holds its own work alone")
    host = codes < 0  # (its step markers too)
    if not host.any():
        return
    low, high = int(ts[host].min()), int(ts[host].max())
    span = max(high - low, 1)
    apart = []
    for i, device in enumerate(devices.names):
        mine = ts[(codes == i) & ~devices.step_line]
        if len(mine) and (int(mine.min()) > high + span or int(mine.max()) < low - span):
            apart.append(device)
    if apart:
        notes.warn(
            f"{path.name}: the events of {', '.join(apart)} lie outside the host's profiled "
            "window (a clock of their own?): read as they are, not aligned"
        )


def _executions_as_steps(read: Read, path: Path) -> None:
    """A JAX profile without step markers (no StepTraceAnnotation, no device step lines): each
    host call of the XLA program it runs most is a step, from the call to the next one (a
    device's step then stretches to the end of its ops of that execution: ``one_device``), as
    a step marker on the calling thread. Compilation and the programs run once are outside."""
    devices = read.devices
    if devices.host_marker.any() or devices.step_line.any():
        return
    calls = [(i, p) for i, p in enumerate(read.programs.to_pylist()) if p]
    counts = Counter(p for _, p in calls)
    if not counts:
        return
    main = max(counts, key=lambda p: (counts[p], p))
    if counts[main] < 2:
        return
    rows = np.asarray([i for i, p in calls if p == main], np.int64)
    ts = read.events.column(S.TS_NS).to_numpy()[rows]
    rows = rows[np.argsort(ts, kind="stable")]
    ts = read.events.column(S.TS_NS).to_numpy()[rows]
    own = read.events.column(S.DUR_NS).to_numpy()[rows]
    _mark_steps(read, rows, np.append(np.diff(ts), own[-1]).astype(np.int64), main)
    read.notes.remark(
        f"{path.name}: no step markers: each call of the XLA program {main} (the one run most, "
        f"{len(rows)} times) is a step"
    )


def _mark_steps(
    read: Read,
    rows: np.ndarray,
    dur: np.ndarray,
    name: str,
    one_thread: bool = False,
    ts: np.ndarray | None = None,
) -> None:
    """Step markers on the threads of events ``rows`` (in time order), from their starts (or
    ``ts``) for ``dur``, named ``name`` and their number; ``one_thread``: all on the thread that
    has most of them (calls served by a pool of threads, one at a time)."""
    events, n = read.events, len(rows)
    tids = events.column(S.TID).to_numpy()[rows]
    if one_thread:
        values, counts = np.unique(tids, return_counts=True)
        tids = np.full(n, values[np.argmax(counts)])
    markers = raw_events(
        ["tf_step"] * n,
        [f"{name} {k}" for k in range(n)],
        events.column(S.PID).to_numpy()[rows].tolist(),
        tids.tolist(),
        pa.array(events.column(S.TS_NS).to_numpy()[rows] if ts is None else ts, pa.int64()),
        pa.array(dur, pa.int64()),
    )
    _append(read, markers, step_markers=True)


def _append(read: Read, table: pa.Table, step_markers: bool) -> None:
    """Events of traceview's making after the profile's own, with their (absent) devices."""
    n, devices = table.num_rows, read.devices
    read.events = pa.concat_tables([read.events, S.conform(table, read.events.schema)])
    devices.of_row = np.append(devices.of_row, np.full(n, -1, np.int64))
    devices.host_marker = np.append(devices.host_marker, np.full(n, step_markers))
    devices.step_line = np.append(devices.step_line, np.zeros(n, bool))
    if devices.run is not None:
        devices.run = np.append(devices.run, np.full(n, -1, np.int64))


def _parameter_server_task(read: Read, path: Path) -> None:
    """A task of a parameter-server job without step markers (``tf_roles``): its role in the
    metadata; a worker's steps are the work of each execution of the function the coordinator
    hands it (its executors' first event to their last, on their threads)."""
    if read.devices.host_marker.any() or read.devices.step_line.any():
        return
    found = task_role(read.events)
    if found is None:
        return
    read.meta.update(role=found.role, role_from="trace", task=found.figures)
    if found.role != "worker" or len(found.steps) < 1:
        return
    waits = remote_waits(read.receives)
    if waits is not None:
        _append(read, waits, step_markers=False)
        read.threads.setdefault(f"{waits[S.PID][0].as_py()}/{REMOTE_TID}", "remote reads")
    _mark_steps(
        read, found.steps, found.dur, found.function or "closure", one_thread=True, ts=found.start
    )
    read.notes.remark(
        f"{path.name}: a parameter-server worker: each of the {len(found.steps)} executions of "
        f"{found.function} its coordinator handed it is a step"
    )


def _copy(notes: Notes) -> Notes:
    copied = Notes()
    copied.extend(notes)
    return copied


@dataclasses.dataclass
class _Whole:
    """A profile read whole: every event (``parsed``, as one rank), and its devices."""

    parsed: ParsedTrace
    devices: Devices
    host_pid: int | None


def _whole(path: Path) -> _Whole:
    try:
        stat = path.stat()
    except OSError as exc:
        raise BadInput(f"{path}: cannot read ({exc.strerror or exc})") from None
    return _read_whole(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=1)
def _read_whole(name: str, mtime_ns: int, size: int) -> _Whole:
    """The profile read and decoded once (the last one read is kept: a profile of several
    devices is identified, then parsed once per device)."""
    path = Path(name)
    if size == 0:
        raise BadInput(f"{path}: empty file")
    read_beside: dict[str, Any] = {}

    def meanwhile() -> None:  # (what is read of the XSpace here, while xprof converts it)
        read_beside["facts"] = hlo_facts(path)
        read_beside["memory"] = _memory_read(path)

    described, columns = trace_events(_require_xprof, path, _native_error, meanwhile)
    facts = read_beside["facts"]
    read = read_events(described, columns, facts.start_ns, path, facts)
    _planes_left_out(facts.lines, read, path)
    if read.events.num_rows == 0:
        raise BadInput(f"{path}: the TensorFlow profile holds no events")
    start_ns = read.meta["base_time_ns"]  # (None where the profile's was no time)
    memory = _memory_profile(path, read_beside["memory"], columns, start_ns or 0, read.notes)
    framework = "jax" if facts.stats.get("jax_version") or read.jax_programs else "tensorflow"
    if framework == "jax":
        _executions_as_steps(read, path)
    else:
        _parameter_server_task(read, path)
    meta = read.meta
    for key in ("jax_version", "jaxlib_version", "cpu_version"):
        if facts.stats.get(key):
            meta[key] = str(facts.stats[key])
    if isinstance(facts.stats.get("process_id"), int):
        meta["process_id"] = facts.stats["process_id"]
    events = read.events
    if not read.devices.several:  # one rank: xprof's per-device step lines repeat its markers
        events = events.filter(pa.array(~read.devices.step_line))
    else:
        _device_notes(read, path)
    parsed = ParsedTrace(
        side={"memory": memory} if memory is not None else {},
        path=path,
        framework=framework,
        events=events,
        rank=rank_from_path(path),
        host=path.name[: -len(SUFFIX)] or None,
        meta=meta,
        threads=read.threads,
        notes=read.notes,
        bytes_read=size,
        skipped=read.skipped,
        # (a parameter server or a coordinator runs no steps of its own: none inferred)
        infer_steps=None if meta.get("role") in ("server", "chief") else "step_groups",
        process_names=read.process_names,
    )
    return _Whole(parsed, read.devices, read.host_pid)


_GPU_ALLOCATOR = re.compile(r"^GPU_(\d+)_bfc$")


def _allocator_device(name: str) -> str:
    """``GPU_0_bfc`` -> ``gpu:0``; ``cpu``, ``mklcpu``, ``cpu_bfc`` -> ``cpu``; others by name.
    A bare number is a name the XSpace stores by reference, which xprof's ProfileData does not
    resolve: in the CPU runs seen, the CPU's allocator (``mklcpu``: oneDNN's, which records only
    the allocations it serves unless TF_CPU_ALLOCATOR_USE_BFC=true puts all of them in a BFC)."""
    if name.isdigit():
        return "cpu"
    match = _GPU_ALLOCATOR.match(name)
    if match:
        return f"gpu:{match.group(1)}"
    base = name.lower().removesuffix("_bfc")
    return "cpu" if base in ("cpu", "mklcpu") else base


_MEMORY_EVENTS = ("MemoryAllocation", "MemoryDeallocation")


def _names_any(path: Path, names: tuple[str, ...]) -> bool:
    """Whether the XSpace's bytes hold any of ``names``: an event's name is a string of its
    plane's metadata, written as is, so a profile without one has no such event. (Not a regular
    file, as a FIFO, which opening would wait on: the walk decides, as before.)"""
    if not path.is_file():
        return True
    try:
        with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return any(buf.find(name.encode()) >= 0 for name in names)
    except (OSError, ValueError):  # (not mappable: the walk decides)
        return True


@dataclasses.dataclass
class _MemoryRead:
    """The XSpace's memory records as read (``_memory_read``), before their clock is matched:
    (device, start ns, allocated, reserved, signed size, line) each; every host event's starts
    by name; how many records were dropped."""

    rows: list[tuple[str, int, int, int | None, int, int]]
    host_starts: dict[str, list[int]]
    bad: int = 0


def _memory_read(path: Path) -> _MemoryRead | None:
    """TensorFlow's ``MemoryAllocation``/``MemoryDeallocation`` events of each BFC allocator,
    read whole from the XSpace (xprof's memory_profile tool samples them at random), and every
    host event's start by name (to match clocks); None where it holds none (TensorFlow writes
    them from its BFC allocators only, which CPU runs do not use by default) or cannot be read.
    Times and stats as xprof's ProfileData gives them: a start is the line's time plus the
    event's offset, in ns as a double; a stat by reference is its number."""
    if not _names_any(path, _MEMORY_EVENTS):
        return None
    from google.protobuf.message import DecodeError  # (xprof's own protobuf)

    try:
        raw = path.read_bytes()
    except OSError:
        return None
    try:
        return _memory_read_at_the_wire_level(raw)
    except (xspace_lines.NotTheLayout, DecodeError, ValueError, RuntimeError):
        pass  # (read by the protobuf classes, which decide)
    space = space_with_events(path)
    return None if space is None else _memory_read_by_classes(space)


def _memory_read_by_classes(space: Any) -> _MemoryRead:
    """``_memory_read`` of an XSpace decoded by the protobuf classes (the minimal schema's
    ``XSpaceEvents``: every event an object)."""
    read = _MemoryRead([], {})
    for plane in space.planes:
        host = plane.name.startswith("/host:")
        names = {m.key: m.value.name for m in plane.event_metadata}
        wanted = [k for k, name in names.items() if name in _MEMORY_EVENTS]
        stat_names = {m.key: m.value.name for m in plane.stat_metadata}
        for number, line in enumerate(plane.lines):
            events = line.events
            ids = np.fromiter((e.metadata_id for e in events), np.int64, len(events))
            offsets = np.fromiter((e.offset_ps for e in events), np.int64, len(events))
            with np.errstate(invalid="ignore"):  # (a time past int64's: a hostile file's)
                starts = (line.timestamp_ns + offsets / 1000).astype(np.int64)
            if host and len(ids):
                order = np.argsort(ids, kind="stable")
                for group in np.split(order, np.flatnonzero(np.diff(ids[order])) + 1):
                    name = names.get(int(ids[group[0]]), "")
                    read.host_starts.setdefault(name, []).extend(starts[group].tolist())
            for i in np.flatnonzero(np.isin(ids, wanted)).tolist() if wanted else ():
                stats = {stat_names.get(s.metadata_id, ""): _stat_text(s) for s in events[i].stats}
                row = _memory_row(names[int(ids[i])], int(starts[i]), stats, number)
                if row is None:
                    read.bad += 1
                else:
                    read.rows.append(row)
    return read


def _memory_read_at_the_wire_level(raw: bytes) -> _MemoryRead:
    """``_memory_read`` of the XSpace ``raw``, its lines and events read at the wire level
    (``xspace_lines``): the same rows and starts, in the same order."""
    read = _MemoryRead([], {})
    for plane in xspace_lines.planes(raw):
        names = plane.names
        with np.errstate(invalid="ignore"):  # (a time past int64's: a hostile file's)
            starts = (plane.line_ns[plane.line] + plane.offsets / 1000).astype(np.int64)
        if plane.name.startswith("/host:") and len(plane.ids):
            # each line's starts by name: by metadata id, in the line's order within one
            order = np.lexsort((plane.ids, plane.line))
            ids, lines = plane.ids[order], plane.line[order]
            heads = np.flatnonzero(
                np.append(True, (ids[1:] != ids[:-1]) | (lines[1:] != lines[:-1]))
            )
            ordered = starts[order].tolist()
            for a, b, number in zip(
                heads.tolist(), [*heads[1:].tolist(), len(ids)], ids[heads].tolist(), strict=True
            ):
                read.host_starts.setdefault(names.get(number, ""), []).extend(ordered[a:b])
        wanted = [k for k, name in names.items() if name in _MEMORY_EVENTS]
        rows = np.flatnonzero(np.isin(plane.ids, wanted)) if wanted else np.zeros(0, np.int64)
        for i, event in zip(rows.tolist(), plane.events_of(rows), strict=True):
            stats = {plane.stat_names.get(s.metadata_id, ""): _stat_text(s) for s in event.stats}
            row = _memory_row(names[int(plane.ids[i])], int(starts[i]), stats, int(plane.line[i]))
            if row is None:
                read.bad += 1
            else:
                read.rows.append(row)
    return read


def _stat_text(stat: Any) -> str:
    """A stat's value as ProfileData gives it: text (a reference: its number)."""
    for field in ("str_value", "int64_value", "uint64_value", "double_value", "ref_value"):
        if stat.HasField(field):
            return str(getattr(stat, field))
    return ""


def _memory_row(
    name: str, start_ns: int, stats: dict[str, str], line: int
) -> tuple[str, int, int, int | None, int, int] | None:
    """A memory record's row (None: a negative or impossible total, or a record without one)."""
    try:
        held = int(stats["bytes_allocated"])
        reserved = int(stats.get("bytes_reserved") or 0) or None
        size = int(stats.get("allocation_bytes") or 0)
    except (KeyError, TypeError, ValueError):
        return None
    if not 0 <= held <= 1 << 50 or (reserved or 0) < 0:
        return None
    device = _allocator_device(str(stats.get("allocator_name", "")))
    sign = -1 if name == "MemoryDeallocation" else 1
    return (device, start_ns, held, reserved, sign * size, line)


def _memory_profile(
    path: Path, read: _MemoryRead | None, events: pa.Table, base_ns: int, notes: Notes
) -> pa.Table | None:
    """The memory records ``_memory_read`` read, as schema.MEMORY_RAW_SCHEMA: allocated =
    ``bytes_allocated`` after the record, reserved = ``bytes_reserved`` (null when 0: not a
    pool's reserve but the stack's), the allocating thread's line.

    The XSpace's event times may be on another origin than the trace events xprof makes: the
    offset is the median difference of the events both have, by name (names that occur as
    often in both, matched in time order)."""
    if read is None:
        return None
    if read.bad:
        notes.warn(
            f"{path.name}: {read.bad} memory record(s) dropped: a negative or impossible total, "
            "or a record without one"
        )
    rows = read.rows
    if not rows:
        return None
    trace = starts_by_name(events, {n for n in read.host_starts if n})
    shifts = [
        a * 1e3 - b
        for n, t in read.host_starts.items()
        if len(t) == len(trace.get(n, ()))
        for a, b in zip(sorted(trace[n]), sorted(t), strict=True)
    ]
    if not shifts:
        notes.warn(f"{path.name}: memory records not read (their clock could not be matched)")
        return None
    shift = round(float(np.median(shifts))) + base_ns
    order = sorted(range(len(rows)), key=lambda i: rows[i][1])
    timed = [i for i in order if 0 <= rows[i][1] + shift < LATEST_NS]
    if len(timed) < len(order):
        notes.warn(
            f"{path.name}: {len(order) - len(timed)} memory record(s) dropped: their time is "
            "before 1970 or past the year 2112"
        )
        if not timed:
            return None
        order = timed
    table = pa.table(
        {
            S.DEVICE: pa.array([rows[i][0] for i in order], pa.string()),
            S.TID: pa.array([-1 - rows[i][5] for i in order], pa.int64()),
            S.TS_NS: pa.array([rows[i][1] + shift for i in order], pa.int64()),
            S.ALLOCATED_BYTES: pa.array([rows[i][2] for i in order], pa.int64()),
            S.RESERVED_BYTES: pa.array([rows[i][3] for i in order], pa.int64()),
            S.BYTES: pa.array([rows[i][4] for i in order], pa.int64()),
        }
    )
    return S.conform(table, S.MEMORY_RAW_SCHEMA)
