"""Timeline lanes: one rank's threads and streams in one step, cut into phase spans, and binned
into the cells of a screen (the TUI's timeline; any view that draws lanes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traceview.analysis.attribution import (
    _thread_segments,
    attribution,
    merge_intervals,
    rank_timeline,
)
from traceview.model import schema as S
from traceview.model.columns import DEVICE, HOST_TREE, KIND_CODE, STRUCTURAL, ints
from traceview.model.escape import safe


@dataclass
class Lane:
    """A row of a timeline view: one thread or stream of a rank, or the rank's critical path."""

    rank: int
    label: str
    starts: np.ndarray
    ends: np.ndarray
    phases: list[str]


#: Per step, per rank: the step's window (start, end) in ns, from the steps table.
StepWindows: TypeAlias = dict[int | None, dict[int, tuple[int, int]]]


def windows_by_step(steps: pa.Table) -> StepWindows:
    """The steps table's windows, by step and rank (what a view reads a step's events by)."""
    windows: StepWindows = {}
    columns = steps.select(["step", "rank", "start_ns", "end_ns"]).to_pydict()
    for step, rank, start, end in zip(
        columns["step"], columns["rank"], columns["start_ns"], columns["end_ns"], strict=True
    ):
        windows.setdefault(step, {})[rank] = (start, end)
    return windows


def window_read_span(windows: StepWindows, step: int, rank: int) -> tuple[int, int] | None:
    """What to read of ``rank``'s events to cut the lanes of ``step``: its window and the step
    before it (None: the rank has no such step). A step's attribution looks back: a
    synchronize at its start waits for the previous step's kernels, and without them it would
    read as waiting for nothing."""
    window = windows.get(step, {}).get(rank)
    if window is None:
        return None
    # the rank's window that starts last before this one (by time, not by step number)
    before = [
        w[rank][0]
        for s, w in windows.items()
        if s is not None and rank in w and w[rank][0] < window[0]
    ]
    return (max(before) if before else window[0], window[1])


#: What an unnamed thread is called by what it spends most of its time on.
_ROLES = {S.COMM: "communication", S.BACKWARD: "backward", S.IO: "data loading"}


def _unnamed(
    tid: int, phases: list[str], runtime: np.ndarray, start: np.ndarray, end: np.ndarray
) -> str:
    """A thread the trace gives no name: by what it does most (communication, backward, data
    loading; runtime calls, as a communication library's watchdog polling the device), its id
    shortened where it is a 64-bit one (``thread …411422 (communication)``)."""
    short = str(tid) if tid < 10**7 else f"…{str(tid)[-6:]}"
    dur = end - start
    spent: dict[str, float] = {}
    for phase, d in zip(phases, dur.tolist(), strict=True):
        spent[phase] = spent.get(phase, 0.0) + d
    busy = {p: v for p, v in spent.items() if p != S.IDLE}
    top = max(busy, key=busy.__getitem__, default=None)
    role = _ROLES.get(top) if top is not None else None
    if role is None and dur.sum() > 0 and dur[runtime].sum() * 2 > dur.sum():
        role = "runtime calls"
    return f"thread {short} ({role})" if role else f"thread {short}"


def step_lanes(
    events: pa.Table,
    step: int | None,
    threads: dict[str, str] | None = None,
    window: tuple[int, int] | None = None,
) -> tuple[int, int, list[Lane]]:
    """The lanes of one rank for the window of ``step`` (None: the first window).

    Returns (window start, window end, lanes): first the rank's exclusive attribution
    ("critical path"), then every host thread and device stream that has operators, kernels or
    communication in the window, each as the phases of its own events (innermost on a thread).
    ``window``: the step's window as the steps table has it, for ``events`` read for that window
    alone (a step's bounds depend on events outside it, as where the previous update ended).
    """
    rank = int(events.column(S.RANK)[0].as_py()) if events.num_rows else 0
    tl = rank_timeline(events)
    if len(tl.w_start) == 0:
        return 0, 0, []
    if window is not None:
        start, end = window
    else:
        index = (
            0
            if step is None
            else int(np.flatnonzero(tl.numbers == step)[0])
            if (tl.numbers == step).any()
            else -1
        )
        if index < 0:
            raise KeyError(f"rank {rank} has no step {step}")
        start, end = int(tl.w_start[index]), int(tl.w_end[index])
    seg_s, seg_e, seg_p = attribution(tl, start, end)
    lanes = [Lane(rank, f"rank {rank} · every instant", seg_s, seg_e, seg_p)]
    ev = tl.ev
    in_window = (ev.end > start) & (ev.ts < end)
    host = HOST_TREE[ev.kind]
    names = threads or {}
    for pid, tid in sorted(
        {
            (int(p), int(t))
            for p, t in zip(ev.pid[host & in_window], ev.tid[host & in_window], strict=False)
        }
    ):
        rows = np.flatnonzero(host & (ev.pid == pid) & (ev.tid == tid))
        s, e, owner = _thread_segments(ev, rows)
        keep = (owner >= 0) & (e > start) & (s < end)
        if not keep.any():
            continue
        structural = STRUCTURAL[ev.kind[owner[keep]]]
        phases = [S.EVENT_PHASES[p] for p in ev.phase[owner[keep]]]
        phases = [
            S.IDLE if st and p == S.OTHER else p for st, p in zip(structural, phases, strict=False)
        ]
        role = (
            "training thread"
            if tl.training == (pid, tid)
            else names.get(f"{pid}/{tid}")
            or _unnamed(
                tid, phases, ev.kind[owner[keep]] == KIND_CODE[S.KIND_RUNTIME], s[keep], e[keep]
            )
        )
        lanes.append(
            Lane(
                rank,
                f"rank {rank} · {role}",
                np.maximum(s[keep], start),
                np.minimum(e[keep], end),
                phases,
            )
        )
    device = DEVICE[ev.kind] & in_window
    for pid, tid in sorted(
        {(int(p), int(t)) for p, t in zip(ev.pid[device], ev.tid[device], strict=False)}
    ):
        rows = np.flatnonzero(device & (ev.pid == pid) & (ev.tid == tid))
        rows = rows[np.argsort(ev.ts[rows], kind="stable")]
        phases = [S.EVENT_PHASES[p] for p in ev.phase[rows]]
        lanes.append(
            Lane(
                rank,
                f"rank {rank} · GPU {pid} stream {tid}",
                np.maximum(ev.ts[rows], start),
                np.minimum(ev.end[rows], end),
                phases,
            )
        )
    return start, end, lanes


@dataclass(frozen=True)
class RankLanes:
    """The lanes of one rank for one step (``step_lanes``), or why there are none."""

    rank: int
    step: int | None
    start_ns: int
    end_ns: int
    lanes: list[Lane]
    error: str | None = None
    memory: MemoryLane | None = None  # allocated memory over the step (records: memory.parquet)


def rank_lanes(
    events: pa.Table,
    rank: int,
    step: int | None,
    threads: dict[str, str],
    memory: pa.Table | None = None,
    window: tuple[int, int] | None = None,
) -> RankLanes:
    """Cut one rank's lanes for ``step`` from its events (10-100 ms: a worker's job), and its
    memory lane from its memory records where it has them. ``window``: as for ``step_lanes``."""
    if events.num_rows == 0:
        return RankLanes(rank, step, 0, 0, [], "no events")
    try:
        start, end, lanes = step_lanes(events, step, threads, window)
    except KeyError:
        return RankLanes(rank, step, 0, 0, [], f"no step {step}")
    for lane in lanes:
        lane.label = safe(lane.label)
    return RankLanes(rank, step, start, end, lanes, memory=memory_lane(memory, start, end))


_PHASE_CODE = {phase: i for i, phase in enumerate(S.BREAKDOWN_PHASES)}
#: Which phase wins a cell when two cover it equally: the attribution's priority.
_TIE_ORDER = S.ATTRIBUTION_PRIORITY


def _covered_until(s: np.ndarray, e: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Time covered by the disjoint sorted intervals (s, e) before each instant of ``t``."""
    before = np.concatenate([[0.0], np.cumsum(e - s)])
    k = np.searchsorted(s, t, side="right")  # intervals starting at or before t
    last = np.maximum(k - 1, 0)
    partial = np.where(k > 0, np.clip(t - s[last], 0, (e - s)[last]), 0.0)
    return before[last] * (k > 0) + partial


#: A cell is drawn solid when its phase covers at least this much of it, as a plain letter below.
SOLID = 0.5

Cell: TypeAlias = tuple[str, bool] | None  # (phase, solid); None: nothing in the cell


def bin_lane(lane: Lane, lo: int, hi: int, width: int) -> list[Cell]:
    """What to draw in each of ``width`` cells spanning [lo, hi) ns.

    A cell shows the phase covering most of it other than idle (ties by priority), solid when
    it covers at least half the cell; idle where only idle time is in the cell; None where
    nothing is. So a lane with short kernels and long gaps still shows where the kernels are,
    and which cells they fill.
    """
    cells: list[Cell] = [None] * max(width, 0)
    if width <= 0 or hi <= lo or len(lane.starts) == 0:
        return cells
    edges = np.linspace(0.0, float(hi - lo), width + 1)
    starts = (lane.starts - lo).astype(np.float64)
    ends = (lane.ends - lo).astype(np.float64)
    codes = np.array([_PHASE_CODE.get(p, _PHASE_CODE[S.OTHER]) for p in lane.phases])
    best = np.zeros(width)
    winner = np.full(width, -1)
    idle = np.zeros(width)
    for phase in _TIE_ORDER:
        mask = (codes == _PHASE_CODE[phase]) & (ends > 0) & (starts < edges[-1])
        if not mask.any():
            continue
        s, e = merge_intervals(starts[mask], ends[mask])
        covered = _covered_until(s, e, edges)
        amount = covered[1:] - covered[:-1]
        if phase == S.IDLE:
            idle = amount
            continue
        better = amount > best
        winner[better] = _PHASE_CODE[phase]
        best[better] = amount[better]
    cell = edges[1] - edges[0]
    for i in range(width):
        if winner[i] >= 0:
            cells[i] = (S.BREAKDOWN_PHASES[winner[i]], bool(best[i] >= SOLID * cell))
        elif idle[i] > 0:
            cells[i] = (S.IDLE, False)
    return cells


# --- a timeline lane ---------------------------------------------------------------------------


@dataclass
class MemoryLane:
    """Allocated memory of a rank's main device over one step window (the TUI's memory lane)."""

    device: str
    ts: np.ndarray  # the records in the window, in time order
    allocated: np.ndarray
    before: int | None  # allocated when the window starts (the last record before it)
    peak_bytes: int
    peak_ts: int


def memory_lane(memory: pa.Table | None, start: int, end: int) -> MemoryLane | None:
    """The memory lane of one rank's records for [start, end] ns: its accelerator with the
    highest peak in the window, else its CPU device with the highest (None: no records)."""
    if memory is None or memory.num_rows == 0:
        return None
    lanes = []
    devices = memory.column(S.DEVICE)
    for device in sorted(set(devices.to_pylist())):
        table = memory.filter(pc.equal(devices, device)).sort_by(S.TS_NS)
        ts = ints(table.column(S.TS_NS), 0)
        alloc = ints(table.column(S.ALLOCATED_BYTES), 0)
        i0, i1 = int(np.searchsorted(ts, start, "left")), int(np.searchsorted(ts, end, "right"))
        before = int(alloc[i0 - 1]) if i0 > 0 else None
        if i1 == i0 and before is None:
            continue
        window_ts, window_alloc = ts[i0:i1], alloc[i0:i1]
        if len(window_alloc) and (before is None or window_alloc.max() >= before):
            at = int(np.argmax(window_alloc))
            peak, peak_ts = int(window_alloc[at]), int(window_ts[at])
        else:
            peak, peak_ts = int(before or 0), start
        lanes.append(MemoryLane(device, window_ts, window_alloc, before, peak, peak_ts))
    if not lanes:
        return None
    allocators = [lane for lane in lanes if lane.device != S.DEVICE_RSS]
    accelerators = [lane for lane in allocators if not lane.device.startswith(S.DEVICE_CPU)]
    return max(accelerators or allocators or lanes, key=lambda lane: lane.peak_bytes)


def bin_memory(lane: MemoryLane, lo: int, hi: int, width: int) -> list[int | None]:
    """The most allocated in each of ``width`` cells spanning [lo, hi) ns: what was held when
    the cell starts and every record inside it; None before anything is known."""
    cells: list[int | None] = [None] * max(width, 0)
    if width <= 0 or hi <= lo:
        return cells
    edges = lo + (hi - lo) * np.arange(width + 1) / width
    # the level held at each cell's start: the last record before it (or the window's start)
    k = np.searchsorted(lane.ts, edges[:-1], "right")
    held = np.where(k > 0, lane.allocated[np.maximum(k - 1, 0)], -1)
    if lane.before is not None:
        held = np.where(k > 0, held, lane.before)
    best = held.astype(np.int64)
    inside = (lane.ts >= lo) & (lane.ts < hi)
    if inside.any():
        cell = np.minimum(((lane.ts[inside] - lo) * width) // (hi - lo), width - 1).astype(int)
        np.maximum.at(best, cell, lane.allocated[inside])
    return [int(v) if v >= 0 else None for v in best]
