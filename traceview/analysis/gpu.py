"""GPU runs explained: device busy and idle time, what the device waited for, kernel launches.

Per rank and step window (the breakdown's, ``attribution.step_windows``) on a rank that has
device activity:

- **busy**: the union of the rank's kernels, copies and memsets; its time per phase
  (``device_<phase>_ns``) is cut by the attribution rule among device events alone, so the
  phases add up to ``busy_ns``. On GPU timelines the breakdown's h2d, forward, backward and
  update are exactly these device times plus the phase's host-bound time below.
- **gaps** of the device timeline (window minus busy) are split by what the host does at that
  instant, on the breakdown's own cut (``attribution.level_times``): where the training thread
  is inside an operator or region of h2d, forward, backward or update, or another host thread
  runs such an operator (PyTorch's autograd thread), and no communication runs on any host
  thread, the device waits for the host to launch its next work:
  *host-bound*, that phase's time (``host_bound_<phase>_ns``, the same figure as the steps
  table's); in data loading: *data* (``idle_data_ns``); anything else (Python between phases,
  a synchronize outside any phase, the host waiting for a collective): *other*
  (``idle_other_ns``). busy + host-bound + data + other = the window, exactly.
- **sync**: the training thread's time blocked in device or stream synchronization, a blocking
  copy or ``.item()`` (``sync_ns``), the union of those calls.
- **queue**: device operations launched (runtime call started) and not yet started on the
  device (HTA's queue length, summed over streams), over the window: its maximum and
  time-weighted mean.

Per (phase, canonical op) and for the rank as a whole (phase and op null): kernels launched
(kernels linked to a runtime launch call), their launch delay (runtime call start to kernel
start) split into **queueing** (the kernel's stream busy with earlier work: a deep queue, the
host running ahead, which is healthy) and **launch latency** (the stream idle while the
kernel had not started: only this is a launch problem), kernel duration and launch overhead (the runtime call's own duration), as medians and p95, and
how many kernels ran shorter than their launch call took: the device cannot be kept busy by a
host launching them one by one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from traceview.analysis.attribution import (
    LEVEL,
    RankTimeline,
    _clip,
    _union_by_window,
    covered_by_level,
    level_times,
    merge_intervals,
    name_mask,
    rank_timeline,
)
from traceview.model import schema as S
from traceview.model.columns import (
    DEVICE,
    HOST_TREE,
    KIND_CODE,
    EventArrays,
    coded,
    dictionary_codes,
    group_quantile,
    group_sums,
    ints,
    kind_table,
    sorted_in_groups,
    unique_inverse,
    window_index,
)
from traceview.model.results import GpuIdle, GpuPhase, GpuVerdict, KernelLaunches, RankGpu

#: Device events compete by the attribution rule's order (compute > h2d > io > comm > other).
DEVICE_PHASES = tuple(p for p in S.ATTRIBUTION_PRIORITY if p != S.IDLE)
_DEVICE_LEVEL = np.array([DEVICE_PHASES.index(p) for p in S.EVENT_PHASES])
#: Host phases in which a device gap counts as host-bound (the host is launching that phase).
HOST_BOUND_PHASES = S.GPU_HOST_BOUND_PHASES
#: Runtime calls and operators in which the host waits for the device.
SYNC_PATTERN = (
    r"^(cuda|hip)(Device|Stream|Event)Synchronize$|^cu(Ctx|Stream|Event)Synchronize$"
    r"|^(cuda|hip)Memcpy$|^cuMemcpyDtoH|^aten::(item|_local_scalar_dense)$"
)


def _piece_windows(
    lo: np.ndarray, hi: np.ndarray, w_start: np.ndarray, w_end: np.ndarray
) -> np.ndarray:
    """Window index of each elementary piece [lo, hi) (-1: outside every window)."""
    return window_index(w_start, w_end, lo + (hi - lo) // 2)


def gpu_steps(events: pa.Table, tl: RankTimeline | None = None) -> pa.Table:
    """The GPU table (schema.GPU_SCHEMA) of one rank: one row per step window, none on CPU runs."""
    tl = tl or rank_timeline(events)
    n = len(tl.w_start)
    if not tl.gpu or n == 0:
        return S.empty(S.GPU_SCHEMA)
    ev = tl.ev
    rank = int(events.column(S.RANK)[0].as_py())
    w_start, w_end = tl.w_start, tl.w_end
    device = DEVICE[ev.kind] & (ev.end > ev.ts)
    columns: dict[str, object] = {
        S.RANK: np.full(n, rank, np.int32),
        S.STEP: pa.array(tl.numbers, pa.int64(), mask=tl.numbers < 0),
        S.WALL_NS: w_end - w_start,
    }

    # Device time per phase, cut by the attribution rule among device events.
    covered, _ = covered_by_level(
        ev.ts[device],
        ev.end[device],
        _DEVICE_LEVEL[ev.phase[device]],
        w_start,
        w_end,
        len(DEVICE_PHASES),
    )
    busy = covered[-1]
    columns[S.BUSY_NS] = busy
    for i, phase in enumerate(DEVICE_PHASES):
        columns[S.device_ns(phase)] = covered[i + 1] - covered[i]

    # The device's gaps, by what the host does: the breakdown's own cut (attribution.level_times)
    # ranks the host-bound levels below every device level, so their time lies in the gaps.
    times = level_times(tl)
    bound_total = np.zeros(n, np.int64)
    for phase in HOST_BOUND_PHASES:
        part = times.host_bound(phase)
        columns[S.host_bound_ns(phase)] = part
        bound_total += part
    # data: the host loads data (the io level) while the device has nothing to do
    io = (tl.levels == LEVEL[S.IO]) & ~tl.on_device
    with_io = (
        np.concatenate([ev.ts[device], tl.starts[io]]),
        np.concatenate([ev.end[device], tl.ends[io]]),
    )
    window, s, e, _ = _clip(*with_io, np.zeros(len(with_io[0]), np.int64), w_start, w_end)
    order = np.lexsort((s, window))
    data = _union_by_window(window[order], s[order], e[order], n) - busy
    columns[S.IDLE_DATA_NS] = data
    columns[S.IDLE_OTHER_NS] = (w_end - w_start) - busy - bound_total - data
    on_training = (
        HOST_TREE[ev.kind] & (ev.pid == tl.training[0]) & (ev.tid == tl.training[1])
        if tl.training is not None
        else np.zeros(len(ev.ts), bool)
    )

    # Host blocked waiting for the device.
    sync = on_training & name_mask(events, SYNC_PATTERN) & (ev.end > ev.ts)
    ss, se = merge_intervals(ev.ts[sync], ev.end[sync])
    sw, s2, e2, _ = _clip(ss, se, np.zeros(len(ss), np.int64), w_start, w_end)
    columns[S.SYNC_NS] = np.bincount(sw, weights=(e2 - s2), minlength=n).astype(np.int64)

    q_max, q_mean = _queue(ev, w_start, w_end)
    columns[S.QUEUE_MAX] = q_max
    columns[S.QUEUE_MEAN] = q_mean
    return pa.table(columns, schema=S.GPU_SCHEMA)


def _launched(
    ev: EventArrays, kinds: tuple[str, ...] = (S.KIND_KERNEL,)
) -> tuple[np.ndarray, np.ndarray]:
    """(device rows of ``kinds``, their launch call rows): those whose parent is a runtime call."""
    kind, parent = ev.kind, ev.parent_row
    rows = np.flatnonzero(kind_table(kinds)[kind])
    launcher = parent[rows]
    ok = launcher >= 0
    ok[ok] = kind[launcher[ok]] == KIND_CODE[S.KIND_RUNTIME]
    return rows[ok], launcher[ok]


def _queue(
    ev: EventArrays, w_start: np.ndarray, w_end: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per window: the most device operations queued (launch call started, the kernel, copy or
    memset not yet started: HTA's queue length, over all streams) and their time-weighted
    mean."""
    n = len(w_start)
    kernels, launcher = _launched(ev, S.DEVICE_ACTIVITY_KINDS)
    if len(kernels) == 0:
        return np.zeros(n, np.int64), np.zeros(n)
    times = np.concatenate([ev.ts[launcher], ev.ts[kernels], w_start, w_end])
    delta = np.concatenate([np.ones(len(kernels)), -np.ones(len(kernels)), np.zeros(2 * n)]).astype(
        np.int64
    )
    order = np.lexsort((delta, times))  # at one instant, starts before launches
    times, delta = times[order], delta[order]
    depth = np.cumsum(delta)
    lo, hi = times[:-1], times[1:]
    level = depth[:-1]
    window = _piece_windows(lo, hi, w_start, w_end)
    inside = (window >= 0) & (hi > lo)
    q_max = np.zeros(n, np.int64)
    np.maximum.at(q_max, window[inside], level[inside])
    area = np.bincount(window[inside], weights=(level * (hi - lo))[inside], minlength=n)
    wall = (w_end - w_start).astype(np.float64)
    q_mean = np.divide(area, wall, out=np.zeros(n), where=wall > 0)
    return q_max, q_mean


#: Device work of earlier slices of a rank (chunked analysis): (pid, tid, ts, end) arrays.
StreamWork = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
#: The most device rows per stream carried from one slice to the next: the work just before a
#: slice's first kernel on a stream is its stream's last rows of the slices before.
CARRIED_STREAM_ROWS = 256


def device_work(ev: EventArrays, earlier: StreamWork | None = None) -> StreamWork:
    """The device rows (kernels, copies, memsets) of ``ev`` as (pid, tid, ts, end), after
    ``earlier``'s."""
    rows = np.flatnonzero(DEVICE[ev.kind] & (ev.end > ev.ts))
    mine = (ev.pid[rows], ev.tid[rows], ev.ts[rows], ev.end[rows])
    if earlier is None:
        return mine
    return tuple(np.concatenate([a, b]) for a, b in zip(earlier, mine, strict=True))  # type: ignore[return-value]


def table_device_work(events: pa.Table) -> StreamWork:
    """``device_work`` of a table's rows, read off its columns (no call trees needed)."""
    kind = coded(events.column(S.KIND), KIND_CODE)
    ts = ints(events.column(S.TS_NS), 0)
    end = ts + ints(events.column(S.DUR_NS), 0)
    rows = np.flatnonzero(DEVICE[kind] & (end > ts))
    pid, tid = ints(events.column(S.PID), 0), ints(events.column(S.TID), 0)
    return pid[rows], tid[rows], ts[rows], end[rows]


def stream_tail(work: StreamWork, keep: int = CARRIED_STREAM_ROWS) -> StreamWork:
    """The last ``keep`` rows (by start) of each stream in ``work``."""
    pid, tid, ts, end = work
    order = np.lexsort((ts, tid, pid))
    pid, tid, ts, end = pid[order], tid[order], ts[order], end[order]
    last = np.ones(len(ts), bool)  # the last row of each stream
    last[:-1] = (pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1])
    # rows from each stream's end: a running count reset at each stream's last row
    group_end = np.flatnonzero(last)
    stream_of = np.searchsorted(group_end, np.arange(len(ts)))
    from_end = group_end[stream_of] - np.arange(len(ts)) if len(ts) else np.zeros(0, np.int64)
    kept = from_end < keep
    return pid[kept], tid[kept], ts[kept], end[kept]


def stream_free(ev: EventArrays, rows: np.ndarray, earlier: StreamWork | None = None) -> np.ndarray:
    """Per device row: the instant its stream (device and stream) finished the work before it
    (at most the row's own start; 0 where nothing ran there before). A stream runs its work in
    order, so the row could not start before then whenever it was launched: the time from its
    launch call until then is queueing, the rest of its launch delay launch latency.
    ``earlier``: device work of the rank's slices before this one (chunked analysis)."""
    free = np.zeros(len(rows), np.int64)
    pid, tid, ts, end = device_work(ev, earlier)
    if len(rows) == 0 or len(ts) == 0:
        return free
    # one lane id per (device, stream), for the busy rows and the rows asked about alike (each
    # column coded on its own, then the pairs: sorting rows as pairs is several times slower)
    _, device = np.unique(np.concatenate([pid, ev.pid[rows]]), return_inverse=True)
    _, stream = np.unique(np.concatenate([tid, ev.tid[rows]]), return_inverse=True)
    lanes, lane_of = unique_inverse(device.ravel() * (int(stream.max()) + 1) + stream.ravel())
    row_lane, lane_of = lane_of[len(ts) :], lane_of[: len(ts)]
    for lane in range(len(lanes)):  # a rank has a few streams: one pass each
        mine, at = lane_of == lane, np.flatnonzero(row_lane == lane)
        if not mine.any() or len(at) == 0:
            continue
        us, ue = merge_intervals(ts[mine], end[mine])
        start = ev.ts[rows[at]]
        i = np.searchsorted(us, start, side="left") - 1  # the last busy stretch begun before
        free[at] = np.where(i >= 0, np.minimum(ue[np.maximum(i, 0)], start), 0)
    return free


def launch_stats(events: pa.Table, tl: RankTimeline | None = None) -> pa.Table:
    """The launches table (schema.LAUNCHES_SCHEMA) of one rank: per step, per (phase, op) of the
    kernels launched inside it (op "": unknown), per phase (op null), and one row for all of
    them (phase and op null)."""
    tl = tl or rank_timeline(events)
    rank = int(events.column(S.RANK)[0].as_py()) if events.num_rows else 0
    return combine_launches([kernel_launches(events, tl)], rank)


@dataclass
class KernelRows:
    """The kernels of a rank's step windows (``kernel_launches``), what ``combine_launches``
    sums up: each one's step (-1: none), phase (its place in ``S.EVENT_PHASES``) and operator
    (its place in ``ops``; -1: none), and its launch latency, queueing, duration and launch
    call's duration. A multi-GB rank keeps millions until it is done: each number takes 32 bits
    where the slice's all fit."""

    step: np.ndarray
    phase: np.ndarray
    op: np.ndarray
    ops: list[str]
    latency: np.ndarray
    queue: np.ndarray
    duration: np.ndarray
    overhead: np.ndarray

    def __len__(self) -> int:
        return len(self.step)


def kernel_launches(
    events: pa.Table, tl: RankTimeline, earlier: StreamWork | None = None
) -> KernelRows:
    """The kernels that started inside the timeline's step windows (``KernelRows``).
    ``earlier``: the device work of the rank's earlier slices (``stream_free``)."""
    ev = tl.ev
    kernels, launcher = _launched(ev)
    if tl.gpu and len(tl.w_start):  # kernels that ran inside one of the rank's step windows
        window = np.searchsorted(tl.w_start, ev.ts[kernels], side="right") - 1
        inside = (window >= 0) & (ev.ts[kernels] < tl.w_end[np.maximum(window, 0)])
        kernels, launcher = kernels[inside], launcher[inside]
        # the kernel's step as the events give it (its launch's), else the window it ran in
        step = np.where(ev.step[kernels] >= 0, ev.step[kernels], tl.numbers[window[inside]])
    else:
        kernels, launcher = kernels[:0], launcher[:0]
        step = np.zeros(0, np.int64)
    op, ops = dictionary_codes(events.column(S.OP).take(pa.array(kernels, pa.int64())))
    delay = ev.ts[kernels] - ev.ts[launcher]
    free = stream_free(ev, kernels, earlier)
    queue = np.clip(free - ev.ts[launcher], 0, np.maximum(delay, 0))
    return KernelRows(
        step=_narrowest(np.maximum(step, -1)),
        phase=ev.phase[kernels].astype(np.int8),
        op=op.astype(np.int32),
        ops=[str(name) for name in ops],
        latency=_narrowest(delay - queue),
        queue=_narrowest(queue),
        duration=_narrowest(ev.end[kernels] - ev.ts[kernels]),
        overhead=_narrowest(ev.end[launcher] - ev.ts[launcher]),
    )


def _narrowest(values: np.ndarray) -> np.ndarray:
    """``values`` in 32 bits where they all fit, else 64."""
    small = not len(values) or (values.min() >= -(1 << 31) and values.max() < 1 << 31)
    return values.astype(np.int32 if small else np.int64)


def combine_launches(parts: list[KernelRows], rank: int) -> pa.Table:
    """The launches table of one rank from the ``kernel_launches`` of its step windows: per
    step, one row for all its kernels (phase and op null), one per phase (op null), one per
    (phase, op) (op "": unknown), each level in order of step (none last), phase and op."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return S.empty(S.LAUNCHES_SCHEMA)
    ops = sorted({name for part in parts for name in part.ops} | {""})
    place = {name: i for i, name in enumerate(ops)}
    blank = place[""]  # (an unknown op: "", as a kernel whose op is "")
    op = np.concatenate(
        [np.append(np.array([place[n] for n in p.ops], np.int64), blank)[p.op] for p in parts]
    )
    phases = sorted(S.EVENT_PHASES)
    phase = np.array([phases.index(p) for p in S.EVENT_PHASES], np.int64)[
        np.concatenate([p.phase for p in parts])
    ]
    step = np.concatenate([p.step.astype(np.int64) for p in parts])
    steps, step_place = np.unique(np.where(step < 0, _NO_STEP, step), return_inverse=True)
    values = {
        name: np.concatenate([getattr(p, name).astype(np.int64) for p in parts])
        for name in ("latency", "queue", "duration", "overhead")
    }
    short = values["duration"] < values["overhead"]
    # each level's groups in order: a key a kernel whose order is (step, phase name, op name)
    by_step = step_place.ravel().astype(np.int64)
    by_phase = by_step * len(phases) + phase
    columns: dict[str, list[Any]] = {}
    for level, keys in enumerate((by_step, by_phase, by_phase * len(ops) + op)):
        present, group = unique_inverse(keys)
        sizes = np.bincount(group, minlength=len(present))
        rows = _launch_sums(group, sizes, values, short)
        step_at, rest = np.divmod(present, [1, len(phases), len(phases) * len(ops)][level])
        rows[S.STEP] = pa.array(steps[step_at], pa.int64(), mask=steps[step_at] == _NO_STEP)
        rows[S.PHASE] = _names(phases, rest // len(ops) if level == 2 else rest, level >= 1)
        rows[S.OP] = _names(ops, rest % len(ops), level == 2)
        for name, column in rows.items():
            columns.setdefault(name, []).append(column)
    table = pa.table(
        {name: pa.concat_arrays([pa.array(c) for c in levels]) for name, levels in columns.items()}
    )
    table = table.append_column(S.RANK, pa.array(np.full(table.num_rows, rank, np.int32)))
    return S.conform(table, S.LAUNCHES_SCHEMA)


#: A kernel of no step, as its step sorts (last).
_NO_STEP = np.iinfo(np.int64).max


def _names(names: list[str], at: np.ndarray, named: bool) -> pa.Array:
    """``names[at]`` as strings (null throughout where the level does not name them)."""
    if not named:
        return pa.nulls(len(at), pa.string())
    return pa.DictionaryArray.from_arrays(pa.array(at, pa.int32()), names).cast(pa.string())


def _launch_sums(
    group: np.ndarray, sizes: np.ndarray, values: dict[str, np.ndarray], short: np.ndarray
) -> dict[str, Any]:
    """One level's sums and quantiles over its groups' kernels (``group``: each kernel's)."""
    ordered = {name: sorted_in_groups(v, group, sizes) for name, v in values.items()}
    sums = {name: group_sums(v, sizes) for name, v in ordered.items()}
    return {
        S.KERNELS: sizes.astype(np.int64),
        S.LATENCY_P50_NS: group_quantile(ordered["latency"], sizes, 0.5),
        S.LATENCY_P95_NS: group_quantile(ordered["latency"], sizes, 0.95),
        S.QUEUE_P50_NS: group_quantile(ordered["queue"], sizes, 0.5),
        S.QUEUE_P95_NS: group_quantile(ordered["queue"], sizes, 0.95),
        S.DELAY_TOTAL_NS: sums["latency"] + sums["queue"],
        S.QUEUE_TOTAL_NS: sums["queue"],
        S.DURATION_P50_NS: group_quantile(ordered["duration"], sizes, 0.5),
        S.DURATION_P95_NS: group_quantile(ordered["duration"], sizes, 0.95),
        S.OVERHEAD_P50_NS: group_quantile(ordered["overhead"], sizes, 0.5),
        S.TOTAL_NS: sums["duration"],
        S.SHORT_KERNELS: np.bincount(group, weights=short, minlength=len(sizes)).astype(np.int64),
    }


def launch_grains(launches: pa.Table) -> dict[str, pa.Table]:
    """The launches table (all ranks) as one table per grain, as ``export`` writes them:
    ``launches`` per (rank, phase, op) (op "": unknown), ``launches_by_phase`` per (rank,
    phase) and ``launches_by_rank`` per rank. Each row sums or takes percentiles over its own
    kernels, so a table's kernel counts add up to the rank's, once."""
    phase, op = pc.is_valid(launches.column(S.PHASE)), pc.is_valid(launches.column(S.OP))
    return {
        "launches": launches.filter(pc.and_(phase, op)),
        "launches_by_phase": launches.filter(pc.and_(phase, pc.invert(op))).drop_columns([S.OP]),
        "launches_by_rank": launches.filter(pc.invert(phase)).drop_columns([S.PHASE, S.OP]),
    }


#: ``view`` of a collective call: where it ran.
VIEW_HOST, VIEW_DEVICE = "host", "device"


def collective_views(collectives: pa.Table) -> pa.Table:
    """The collectives table with ``view`` after ``device``: ``host`` for a call on a host
    thread (what the rank's code called: ``c10d::allreduce_``, gloo's ``gloo:all_reduce``, a
    KVStore push), ``device`` for the kernel on a stream that carried it out. One collective
    appears once per view, so sums over durations take one view; the match columns are those
    of the view matching used and null on the other."""
    on_gpu = pc.equal(collectives.column(S.DEVICE).cast(pa.string()), S.DEVICE_GPU)
    view = pc.if_else(on_gpu, VIEW_DEVICE, VIEW_HOST)
    at = collectives.column_names.index(S.DEVICE) + 1
    return collectives.add_column(at, pa.field("view", pa.string(), nullable=False), view)


# --- results ---------------------------------------------------------------------------------

#: The verdict is given when the device is idle at least this share of the step...
IDLE_VERDICT = 0.2
#: ...and the host-bound (or data) part of that is at least this share of the step.
WAIT_VERDICT = 0.1
#: Kernel rows per rank in the report (most launched first).
KERNEL_ROWS = 20


def _ms(ns: float) -> float:
    return round(float(ns) / 1e6, 3)


def _us(ns: float | None) -> float:
    return round(float(ns or 0.0) / 1e3, 3)


#: How the launches table's per-step rows combine over the counted steps: counts and totals
#: add up; a median is the steps' medians weighted by their kernels; a 95th percentile is the
#: highest step's (what a step can reach).
_SUMMED = (S.KERNELS, S.DELAY_TOTAL_NS, S.QUEUE_TOTAL_NS, S.TOTAL_NS, S.SHORT_KERNELS)
_MEDIANS = (S.LATENCY_P50_NS, S.QUEUE_P50_NS, S.DURATION_P50_NS, S.OVERHEAD_P50_NS)
_HIGHEST = (S.LATENCY_P95_NS, S.QUEUE_P95_NS, S.DURATION_P95_NS)


@dataclass(frozen=True)
class CountedLaunches:
    """The launches table over the counted steps (``counted_launches``): its rows combined per
    (rank, phase, op), and per rank how many counted steps it has."""

    rows: pl.DataFrame
    steps: dict[int, int]


def counted_launches(launches: pa.Table, keep: pl.DataFrame) -> CountedLaunches:
    """The launches table's rows of the steps in ``keep`` (rank, step: the report's counted
    steps) combined per (rank, phase, op) (``_SUMMED``, ``_MEDIANS``, ``_HIGHEST``), and per
    rank how many of those steps it has: launch statistics per counted step, set-up and warm-up
    left out (made once per report: ``rank_gpu`` and ``phase_launches`` read it)."""
    per_step = pl.from_arrow(launches)
    assert isinstance(per_step, pl.DataFrame)
    kept = per_step.join(
        keep.select(S.RANK, S.STEP).unique(), on=[S.RANK, S.STEP], how="semi", nulls_equal=True
    )
    steps = dict(keep.select(S.RANK, S.STEP).unique().group_by(S.RANK).len().iter_rows())
    weight = pl.col(S.KERNELS).cast(pl.Float64)
    combined = kept.group_by(S.RANK, S.PHASE, S.OP).agg(
        *(pl.col(c).sum() for c in _SUMMED),
        *((pl.col(c) * weight).sum() / weight.sum().clip(1) for c in _MEDIANS),
        *(pl.col(c).max() for c in _HIGHEST),
    )
    return CountedLaunches(combined, {int(r): int(n) for r, n in steps.items()})


def _launch_row(row: dict[str, Any], steps: int) -> KernelLaunches:
    kernels, delay = int(row[S.KERNELS]), int(row[S.DELAY_TOTAL_NS])
    return KernelLaunches(
        phase=row[S.PHASE],
        op=row[S.OP],
        kernels_per_step=round(kernels / max(steps, 1), 1),
        launch_latency_us_p50=_us(row[S.LATENCY_P50_NS]),
        launch_latency_us_p95=_us(row[S.LATENCY_P95_NS]),
        kernel_us_p50=_us(row[S.DURATION_P50_NS]),
        kernel_us_p95=_us(row[S.DURATION_P95_NS]),
        launch_overhead_us_p50=_us(row[S.OVERHEAD_P50_NS]),
        short_kernel_fraction=round(int(row[S.SHORT_KERNELS]) / max(kernels, 1), 4),
        launch_queue_us_p50=_us(row[S.QUEUE_P50_NS]),
        launch_queue_us_p95=_us(row[S.QUEUE_P95_NS]),
        queued_fraction=round(int(row[S.QUEUE_TOTAL_NS]) / delay, 4) if delay > 0 else 0.0,
    )


def rank_gpu(gpu: pa.Table, counted: CountedLaunches, keep: pl.DataFrame) -> dict[int, RankGpu]:
    """Per GPU rank, its device time explained: means over the steps in ``keep`` (rank, step:
    the report's counted steps) of the gpu table, and the launch statistics per step over the
    same steps (``counted``)."""
    every = pl.from_arrow(gpu)
    assert isinstance(every, pl.DataFrame)
    launched, windows = counted.rows, counted.steps
    kept = every.join(
        keep.select(S.RANK, S.STEP).unique(), on=[S.RANK, S.STEP], how="semi", nulls_equal=True
    )
    out: dict[int, RankGpu] = {}
    for (rank,), df in kept.group_by(S.RANK, maintain_order=True):
        mean = {c: float(df[c].cast(pl.Float64).mean() or 0.0) for c in df.columns[2:]}
        wall, steps = mean[S.WALL_NS], windows.get(rank, 1)
        bound = sum(mean[S.host_bound_ns(p)] for p in S.GPU_HOST_BOUND_PHASES)
        phases = []
        for p in (S.H2D, S.FORWARD, S.BACKWARD, S.UPDATE, S.COMM, S.OTHER):
            device, host = mean[S.device_ns(p)], mean.get(S.host_bound_ns(p), 0.0)
            phases.append(
                GpuPhase(
                    phase=p,
                    device_ms=_ms(device),
                    host_bound_ms=_ms(host),
                    total_ms=_ms(device + host),
                )
            )
        mine = launched.filter(pl.col(S.RANK) == rank)
        total = mine.filter(pl.col(S.PHASE).is_null())
        launch = _launch_row(total.row(0, named=True), steps) if total.height else None
        rows = mine.filter(pl.col(S.PHASE).is_not_null() & pl.col(S.OP).is_not_null()).sort(
            [S.KERNELS, S.TOTAL_NS, S.PHASE, S.OP], descending=[True, True, False, False]
        )
        out[int(rank)] = RankGpu(
            busy_fraction=round(mean[S.BUSY_NS] / wall, 4) if wall else 0.0,
            busy_ms=_ms(mean[S.BUSY_NS]),
            idle_ms=GpuIdle(
                host_bound=_ms(bound),
                data=_ms(mean[S.IDLE_DATA_NS]),
                other=_ms(mean[S.IDLE_OTHER_NS]),
            ),
            sync_ms=_ms(mean[S.SYNC_NS]),
            launches=launch.kernels_per_step if launch else 0.0,
            launch_latency_us_p50=launch.launch_latency_us_p50 if launch else None,
            launch_latency_us_p95=launch.launch_latency_us_p95 if launch else None,
            short_kernel_fraction=launch.short_kernel_fraction if launch else None,
            kernel_us_p50=launch.kernel_us_p50 if launch else None,
            kernel_us_p95=launch.kernel_us_p95 if launch else None,
            launch_queue_us_p50=launch.launch_queue_us_p50 if launch else None,
            launch_queue_us_p95=launch.launch_queue_us_p95 if launch else None,
            launch_queued_fraction=launch.queued_fraction if launch else None,
            queue_depth_max=int(df[S.QUEUE_MAX].max() or 0),  # type: ignore[arg-type]
            queue_depth_mean=round(mean[S.QUEUE_MEAN], 2),
            phases=phases,
            kernels=[_launch_row(r, steps) for r in rows.head(KERNEL_ROWS).iter_rows(named=True)],
        )
    return out


def phase_launches(counted: CountedLaunches) -> dict[tuple[int, str], KernelLaunches]:
    """(rank, phase) -> the statistics of all kernels the phase launched, per counted step."""
    windows = counted.steps
    rows = counted.rows.filter(pl.col(S.PHASE).is_not_null() & pl.col(S.OP).is_null())
    return {
        (int(r[S.RANK]), str(r[S.PHASE])): _launch_row(r, windows.get(r[S.RANK], 1))
        for r in rows.iter_rows(named=True)
    }


def gpu_verdict(
    ranks: dict[int, RankGpu],
    step_ms: dict[int, float],
    phase_launches: dict[tuple[int, str], KernelLaunches] | None = None,
) -> GpuVerdict | None:
    """The verdict: on the rank whose device idles the most, the device is idle at least
    IDLE_VERDICT of the step and waits for the host (host-bound) or the data loader at least
    WAIT_VERDICT of it, whichever is larger."""
    if not ranks:
        return None
    rank = max(ranks, key=lambda r: (1.0 - ranks[r].busy_fraction, -r))
    gpu, step = ranks[rank], step_ms.get(rank, 0.0)
    idle = 1.0 - gpu.busy_fraction
    if step <= 0 or idle < IDLE_VERDICT:
        return None
    bound, data = gpu.idle_ms.host_bound / step, gpu.idle_ms.data / step
    if max(bound, data) < WAIT_VERDICT:
        return None
    if data >= bound:
        return GpuVerdict(
            rank=rank, wait="data", idle_fraction=round(idle, 4), wait_fraction=round(data, 4)
        )
    phase = max(gpu.phases, key=lambda p: p.host_bound_ms)
    row = phase_launches.get((rank, phase.phase)) if phase_launches else None
    return GpuVerdict(
        rank=rank,
        wait="host-bound",
        idle_fraction=round(idle, 4),
        wait_fraction=round(bound, 4),
        phase=phase.phase,
        kernels_per_step=row.kernels_per_step if row else None,
        kernel_us_p50=row.kernel_us_p50 if row else None,
    )
