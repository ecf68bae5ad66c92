"""The per-step breakdown: every instant of a step counted once, by the highest-priority phase.

Per rank, time is cut into step windows and every instant of a window goes to the highest-priority
phase active at that instant on the rank's critical timeline:

    forward | backward | update  >  h2d  >  io  >  comm  >  (region fill)  >  other
        >  (host-bound h2d > forward > backward > update)  >  idle

The critical timeline is, on CPU runs, the training thread: at each instant the innermost event
on it decides; on GPU runs, the device: kernels and copies (which carry the phase of the host
call that launched them), plus the training thread's data loading, and below every device
level and communication, the host's compute and copy time (the training thread inside an
operator or region of forward, backward, update or h2d, or another thread running such an
operator): the device waits for the host to launch that phase's work, which is that phase's
time, "host-bound", recorded in the steps table on its own (``host_bound_<phase>_ns``) as well
as inside the phase's column. Communication on any thread or stream of the rank also counts. Time on the training thread that no operator covers (Python
between operators, a wait without an event of its own) counts as the enclosing region's phase
("region fill": inside a forward/backward/optimizer region, or between two operators of the same
phase), but only when no communication is in flight then: a training thread that stops while a
collective runs is waiting for it, which is communication, not compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traceview.analysis.collectives import issue_links
from traceview.model import schema as S
from traceview.model.columns import (
    DEVICE,
    HOST_TREE,
    KIND_CODE,
    OPERATOR,
    PHASE_CODE,
    STRUCTURAL,
    TIMED,
    EventArrays,
    disjoint,
    distinct,
    kind_table,
    outermost_operators,
    phase_table,
    training_thread_of,
    unique_pairs,
)

# Priority levels, highest first: (name, the phase its time reports as). The explicit levels
# follow schema.ATTRIBUTION_PRIORITY; "fill" levels are a compute region's uncovered time
# (Python between the region's operators), which ranks below communication.
LEVELS = (
    (S.FORWARD, S.FORWARD),
    (S.BACKWARD, S.BACKWARD),
    (S.UPDATE, S.UPDATE),
    (S.H2D, S.H2D),
    (S.IO, S.IO),
    (S.COMM, S.COMM),
    ("forward fill", S.FORWARD),
    ("backward fill", S.BACKWARD),
    ("update fill", S.UPDATE),
    (S.OTHER, S.OTHER),
    # GPU timelines only: the device idles while the host is inside a compute or copy operator
    # or region (launching that phase's work). Below every device level (an unlinked kernel is
    # "other" and still device time) and communication on any host thread.
    *((f"host-bound {p}", p) for p in S.GPU_HOST_BOUND_PHASES),
)
LEVEL_PHASES = tuple(phase for _, phase in LEVELS)
LEVEL = {name: i for i, (name, _) in enumerate(LEVELS)}
_COMM_LEVEL = LEVEL[S.COMM]
_GAP = -1
_FILL = {p: LEVEL[f"{p} fill"] for p in S.COMPUTE_PHASES}
#: The host-bound level of each phase that has one (GPU timelines).
HOST_BOUND_LEVEL = {p: LEVEL[f"host-bound {p}"] for p in S.GPU_HOST_BOUND_PHASES}
# Level of an event's time by its phase code (schema.EVENT_PHASES order): as an operator's own
# time (explicit), and as a region marker's uncovered time (compute regions fill; other: none).
_EXPLICIT = np.array([LEVEL[p] for p in S.EVENT_PHASES])
_REGION = np.array([_FILL.get(p, LEVEL[p]) if p != S.OTHER else _GAP for p in S.EVENT_PHASES])
# A gap between two segments takes their level when they agree: compute as region fill, data
# loading, copies and communication as themselves; "other" never spreads.
_FILL_OF = {
    **{LEVEL[p]: _FILL[p] for p in S.COMPUTE_PHASES},
    **{_FILL[p]: _FILL[p] for p in S.COMPUTE_PHASES},
    **{LEVEL[p]: LEVEL[p] for p in (S.H2D, S.IO, S.COMM)},
}
# On GPU runs the training thread's data loading and communication keep their levels; its
# compute and copy time (operators and region fill) is host-bound; the rest does not count.
_GPU_HOST_LEVEL = np.full(len(LEVELS), _GAP, np.int64)
for _name, _phase in LEVELS:
    if _name in (S.IO, S.COMM):
        _GPU_HOST_LEVEL[LEVEL[_name]] = LEVEL[_name]
    elif _phase in HOST_BOUND_LEVEL and not _name.startswith("host-bound"):
        _GPU_HOST_LEVEL[LEVEL[_name]] = HOST_BOUND_LEVEL[_phase]
# The levels must keep the attribution rule's order, fill ranking just below communication.
assert [n for n, _ in LEVELS if "fill" not in n and "host-bound" not in n] == [
    p for p in S.ATTRIBUTION_PRIORITY if p != S.IDLE
], "LEVELS out of step with schema.ATTRIBUTION_PRIORITY"
assert min(HOST_BOUND_LEVEL.values()) > LEVEL[S.OTHER], "host-bound must rank below all else"

_OPERATOR = kind_table((S.KIND_OP, S.KIND_ANNOTATION))


def step_windows(
    ev: EventArrays,
    training: tuple[int, int] | None,
    gpu: bool,
    part: RankPart | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, ends, step numbers) of the rank's step windows, disjoint and sorted (``part``:
    only the windows of the markers that start in its span; the events are a slice of the rank).

    A window is the step marker on the training thread; on GPU runs it extends to the end of the
    last device activity launched in that step (the device runs behind the host), and the next
    window starts no earlier than that.
    """
    if part is not None and part.windows is not None:  # found from more than these events
        starts, ends, numbers = part.windows
        return starts.copy(), ends.copy(), numbers.copy()
    markers = np.zeros(len(ev.ts), bool)
    if training is not None:
        markers = (
            (ev.kind == KIND_CODE[S.KIND_STEP]) & (ev.pid == training[0]) & (ev.tid == training[1])
        )
    idx = np.flatnonzero(markers)
    idx = idx[np.argsort(ev.ts[idx], kind="stable")]
    idx = idx[disjoint(ev.ts[idx], ev.end[idx])]
    if part is not None:
        idx = idx[(ev.ts[idx] >= part.lo) & (ev.ts[idx] < part.hi)]
        if len(idx) == 0:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty
    if len(idx) == 0:
        timed = TIMED[ev.kind]
        if not timed.any():
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
        return (
            np.array([ev.ts[timed].min()]),
            np.array([ev.end[timed].max()]),
            np.array([-1]),
        )
    starts, ends, numbers = ev.ts[idx].copy(), ev.end[idx].copy(), ev.step[idx].copy()
    if gpu:
        device = DEVICE[ev.kind] & (ev.step >= 0)
        order = np.argsort(numbers)
        pos = np.searchsorted(numbers[order], ev.step[device])
        pos = np.minimum(pos, len(numbers) - 1)
        match = numbers[order][pos] == ev.step[device]
        device_end = np.full(len(numbers), np.iinfo(np.int64).min)
        np.maximum.at(device_end, order[pos[match]], ev.end[device][match])
        ends = np.maximum(ends, device_end)
        if part is not None and part.after is not None:  # the previous part's last window
            ends = np.maximum(ends, part.after)
            starts[0] = max(int(starts[0]), part.after)
        ends = np.maximum.accumulate(ends)
        starts[1:] = np.maximum(starts[1:], ends[:-1])
    return starts, ends, numbers


@dataclass
class RankPart:
    """What a slice of a rank's events (the steps of one chunk of a large trace, with the
    events around them) cannot tell of the whole rank: its training thread, whether it ran on a
    device, whether another thread runs its backward; and which step windows are this part's
    (the markers starting in [lo, hi)) and where the previous part's last window ended;
    ``windows``: the windows themselves, where the caller knows them (a slice of a long step)."""

    training: tuple[int, int] | None
    gpu: bool
    backward_elsewhere: bool
    lo: int
    hi: int
    after: int | None = None
    windows: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # (starts, ends, steps)


def _thread_segments(
    ev: EventArrays, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut one thread's time into segments owned by the innermost event: (starts, ends, row).

    Row is -1 where no event covers the time. Uses the call tree (parent rows), so it needs no
    per-event loop: an event's start hands the thread to it, its end back to its parent.
    Zero-length events own no time (their end would sort before their start and hand them the
    thread until the next event).
    """
    rows = rows[ev.end[rows] > ev.ts[rows]]
    if len(rows) == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    depth = np.maximum(ev.depth[rows], 0)
    times = np.concatenate([ev.ts[rows], ev.end[rows]])
    is_start = np.concatenate([np.ones(len(rows), np.int64), np.zeros(len(rows), np.int64)])
    # Ends before starts at the same instant; deeper ends first; shallower starts first.
    tie = np.concatenate([depth, -depth])
    owner = np.concatenate([rows, ev.parent_row[rows]])
    order = np.lexsort((tie, is_start, times))
    times, owner = times[order], owner[order]
    starts, ends = times[:-1], times[1:]
    owner = owner[:-1]
    keep = ends > starts
    return starts[keep], ends[keep], owner[keep]


def _training_levels(
    ev: EventArrays, owner: np.ndarray, unowned: np.ndarray | None = None
) -> np.ndarray:
    """Priority level of each training-thread segment from the event that owns it (``unowned``:
    per event row, events whose time is nobody's, as if no event covered it)."""
    level = np.full(len(owner), _GAP, np.int64)
    has = owner >= 0
    rows = owner[has]
    structural = STRUCTURAL[ev.kind[rows]]
    phase = ev.phase[rows]
    level[has] = np.where(structural, _REGION[phase], _EXPLICIT[phase])
    if structural.any():
        # a region inside an operator (a user's record_function in a custom backward) is still
        # that operator's time: the thread is inside the operator
        inner = np.flatnonzero(has)[structural]
        around = _enclosing_operator(ev, owner[inner])
        enclosed = around >= 0
        op_level = _EXPLICIT[ev.phase[around[enclosed]]]
        level[inner[enclosed]] = np.minimum(level[inner[enclosed]], op_level)
    if unowned is not None:
        level[has] = np.where(unowned[rows], _GAP, level[has])
    # A gap between two segments of the same phase belongs to that phase.
    gap = level == _GAP
    if gap.any() and (~gap).any():
        index = np.arange(len(level))
        prev_idx = np.maximum.accumulate(np.where(~gap, index, -1))
        next_idx = np.minimum.accumulate(np.where(~gap, index, len(level))[::-1])[::-1]
        prev_level = np.where(prev_idx >= 0, level[np.maximum(prev_idx, 0)], _GAP)
        next_level = np.where(
            next_idx < len(level), level[np.minimum(next_idx, len(level) - 1)], _GAP
        )
        prev_fill, next_fill = _fill_of(prev_level), _fill_of(next_level)
        fill = np.where(prev_fill == next_fill, prev_fill, _GAP)
        level = np.where(gap, fill, level)
    return level


def _enclosing_operator(ev: EventArrays, rows: np.ndarray) -> np.ndarray:
    """For each region row, the nearest operator (not a region) it lies in (-1: none)."""
    named = OPERATOR[ev.kind] & ~STRUCTURAL[ev.kind]
    cur = ev.parent_row[rows]
    found = np.full(len(rows), -1, np.int64)
    open_ = cur >= 0
    while open_.any():
        hit = open_ & named[np.maximum(cur, 0)]
        found[hit] = cur[hit]
        open_ &= ~hit
        cur = np.where(open_, ev.parent_row[np.maximum(cur, 0)], -1)
        open_ &= cur >= 0
    return found


def _fill_of(levels: np.ndarray) -> np.ndarray:
    out = np.full(len(levels), _GAP, np.int64)
    for level, fill_level in _FILL_OF.items():
        out[levels == level] = fill_level
    return out


def _clip(
    starts: np.ndarray, ends: np.ndarray, levels: np.ndarray, w_start: np.ndarray, w_end: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Intervals cut to the windows they overlap: (window, start, end, level)."""
    first = np.searchsorted(w_end, starts, side="right")
    last = np.searchsorted(w_start, ends, side="left") - 1
    count = np.maximum(last - first + 1, 0)
    if len(count) == 0 or count.max() <= 1:  # (nearly always: none spans two windows)
        inside = count == 1
        window = first[inside]
        s = np.maximum(starts[inside], w_start[window])
        e = np.minimum(ends[inside], w_end[window])
        keep = e > s
        return window[keep], s[keep], e[keep], levels[inside][keep]
    window = np.repeat(first, count) + (
        np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
    )
    s = np.maximum(np.repeat(starts, count), w_start[window])
    e = np.minimum(np.repeat(ends, count), w_end[window])
    keep = e > s
    return window[keep], s[keep], e[keep], np.repeat(levels, count)[keep]


def _union_by_window(
    window: np.ndarray, s: np.ndarray, e: np.ndarray, n_windows: int
) -> np.ndarray:
    """Length of the union of intervals per window; inputs sorted by (window, start)."""
    if len(s) == 0:
        return np.zeros(n_windows, np.int64)
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = (s[1:] > reach[:-1]) | (window[1:] != window[:-1])
    heads = np.flatnonzero(new)
    run_end = np.maximum.reduceat(e, heads)
    # reduceat over a run that follows another keeps the earlier reach out: runs are split where
    # a start passes the running maximum, so each run's own max end is its union end.
    lengths = run_end - s[heads]
    return np.bincount(window[heads], weights=lengths, minlength=n_windows).astype(np.int64)


@dataclass
class RankTimeline:
    """One rank's critical-timeline intervals, before they are cut into steps."""

    ev: EventArrays
    training: tuple[int, int] | None
    gpu: bool
    starts: np.ndarray
    ends: np.ndarray
    levels: np.ndarray  # priority level (LEVEL_PHASES) of each interval
    w_start: np.ndarray  # step windows
    w_end: np.ndarray
    numbers: np.ndarray  # step numbers (-1: no step markers)
    on_device: np.ndarray  # per interval: a kernel, copy or memset (else host time)
    rows: np.ndarray  # per interval: the event row that holds it (-1: a gap no event covers)
    cut: LevelTimes | None = None  # level_times' result, kept for the next caller


#: A device or stream synchronize: the host blocked until the device is done.
DEVICE_WAIT_PATTERN = (
    r"^(cuda|hip)(Device|Stream|Event)Synchronize$|^cu(Ctx|Stream|Event)Synchronize$"
)
_PHASED = phase_table((*S.COMPUTE_PHASES, S.H2D, S.IO, S.COMM))


def name_mask(events: pa.Table, pattern: str) -> np.ndarray:
    """Rows whose name matches ``pattern`` (evaluated once per distinct name)."""
    array = events.column(S.NAME).combine_chunks()
    if not pa.types.is_dictionary(array.type):
        array = array.dictionary_encode()
    hit = pc.match_substring_regex(array.dictionary, pattern).to_numpy(zero_copy_only=False)
    lut = np.append(np.asarray(hit, bool), False)
    indices = pc.fill_null(array.indices, len(lut) - 1).to_numpy(zero_copy_only=False)
    return lut[np.asarray(indices, np.int64)]


def _loose_waits(events: pa.Table, ev: EventArrays, rows_mask: np.ndarray) -> np.ndarray:
    """Per event: a device or stream synchronize inside a step marker but outside every
    operator and every region of a phase (the training loop's own ``torch.cuda.synchronize()``).
    Its phase is its position's, but the host is waiting for the device there, launching
    nothing: on GPU timelines its time is nobody's (issue 17: "a synchronize outside any phase"
    is other idle). One outside every step marker in the call tree (the profiler's own
    synchronize as it stops, which a trace can record overlapping the last step's operators
    without nesting in them) keeps its position's phase."""
    idx = np.flatnonzero(
        rows_mask & (ev.kind == KIND_CODE[S.KIND_RUNTIME]) & name_mask(events, DEVICE_WAIT_PATTERN)
    )
    inside = np.zeros(len(idx), bool)
    in_step = np.zeros(len(idx), bool)
    up = ev.parent_row[idx]
    for _ in range(64):  # up the call tree, one level per pass (deeper trees stop there)
        live = up >= 0
        if not live.any():
            break
        u = np.maximum(up, 0)
        region = (ev.kind[u] == KIND_CODE[S.KIND_ANNOTATION]) & _PHASED[ev.phase[u]]
        hit = live & ((ev.kind[u] == KIND_CODE[S.KIND_OP]) | region)
        inside |= hit
        in_step |= live & (ev.kind[u] == KIND_CODE[S.KIND_STEP])
        up = np.where(live & ~hit, ev.parent_row[u], -1)
    loose = np.zeros(len(ev.kind), bool)
    loose[idx[~inside & in_step]] = True
    return loose


# What counts from host threads other than the training thread on CPU timelines.
_ELSEWHERE = phase_table((*S.COMPUTE_PHASES, S.H2D))


def _compute_elsewhere(
    ev: EventArrays, rows_mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Forward, backward, update and host-to-device operators on host threads other than the
    training thread.

    Per thread, the innermost event decides each instant, as on the training thread; only
    operators (not regions) with a compute or h2d phase count, at their explicit level. On
    PyTorch CPU runs there are none (autograd runs on the training thread); TensorFlow runs a
    step's graph on its executor threads while the Python thread waits; MXNet copies to the GPU
    on engine threads of their own, which the step waits for when nothing else runs.
    """
    candidates = rows_mask & _ELSEWHERE[ev.phase] & ~STRUCTURAL[ev.kind]
    empty = np.zeros(0, np.int64)
    if not candidates.any():
        return empty, empty, empty, empty
    out_s, out_e, out_l, out_r = [empty], [empty], [empty], [empty]
    threads = unique_pairs(ev.pid[candidates], ev.tid[candidates])
    for pid, tid in threads.T:
        rows = np.flatnonzero(rows_mask & (ev.pid == pid) & (ev.tid == tid))
        seg_s, seg_e, owner = _thread_segments(ev, rows)
        has = owner >= 0
        owner_safe = np.maximum(owner, 0)
        keep = has & _ELSEWHERE[ev.phase[owner_safe]] & ~STRUCTURAL[ev.kind[owner_safe]]
        out_s.append(seg_s[keep])
        out_e.append(seg_e[keep])
        out_l.append(_EXPLICIT[ev.phase[owner[keep]]])
        out_r.append(owner[keep])
    return (
        np.concatenate(out_s),
        np.concatenate(out_e),
        np.concatenate(out_l).astype(np.int64),
        np.concatenate(out_r).astype(np.int64),
    )


def backward_elsewhere(ev: EventArrays, host: np.ndarray, training: tuple[int, int] | None) -> bool:
    """Whether a host thread other than the training thread runs backward operators
    (PyTorch's autograd thread)."""
    on_training = (
        host & (ev.pid == training[0]) & (ev.tid == training[1])
        if training is not None
        else np.zeros(len(ev.ts), bool)
    )
    backward = ev.phase == PHASE_CODE[S.BACKWARD]
    return bool((host & ~on_training & backward & ~STRUCTURAL[ev.kind]).any())


def _whole_rank_facts(
    ev: EventArrays, host: np.ndarray
) -> tuple[tuple[int, int] | None, bool, bool]:
    """A whole rank's training thread, whether it ran on a device, and whether another thread
    runs its backward there."""
    top = outermost_operators(ev.kind, ev.parent_row)
    backward = ev.phase == PHASE_CODE[S.BACKWARD]
    training = training_thread_of(
        ev.pid[host], ev.tid[host], ev.kind[host], top[host], (ev.end - ev.ts)[host],
        backward[host],
    )  # fmt: skip
    gpu = bool(DEVICE[ev.kind].any())
    return training, gpu, gpu and backward_elsewhere(ev, host, training)


def whole_rank_part(
    events: pa.Table,
) -> tuple[tuple[int, int] | None, bool, bool, tuple[int, int] | None]:
    """What ``rank_timeline`` finds over a whole rank and a slice cannot: its training thread,
    whether it ran on a device, whether another thread runs its backward (on a device), and its
    one window where the training thread has no step marker (None where it has)."""
    ev = EventArrays.of(events)
    training, gpu, elsewhere = _whole_rank_facts(ev, HOST_TREE[ev.kind])
    marked = training is not None and bool(
        (
            (ev.kind == KIND_CODE[S.KIND_STEP]) & (ev.pid == training[0]) & (ev.tid == training[1])
        ).any()
    )
    timed = TIMED[ev.kind]
    whole = None
    if not marked and timed.any():
        whole = (int(ev.ts[timed].min()), int(ev.end[timed].max()))
    return training, gpu, elsewhere, whole


def rank_timeline(events: pa.Table, part: RankPart | None = None) -> RankTimeline:
    """The intervals that compete for each instant of one rank, and its step windows (``part``:
    the events are a slice of the rank, and these are the whole rank's facts)."""
    ev = EventArrays.of(events)
    host = HOST_TREE[ev.kind]
    device = DEVICE[ev.kind]
    if part is None:
        training, gpu, elsewhere = _whole_rank_facts(ev, host)
    else:
        training, gpu, elsewhere = part.training, part.gpu, part.backward_elsewhere
    w_start, w_end, numbers = step_windows(ev, training, gpu, part)

    parts_s, parts_e, parts_l, parts_r = [], [], [], []
    on_training = np.zeros(len(ev.ts), bool)
    if training is not None:
        on_training = host & (ev.pid == training[0]) & (ev.tid == training[1])
        seg_s, seg_e, owner = _thread_segments(ev, np.flatnonzero(on_training))
        seg_l = _training_levels(ev, owner, _loose_waits(events, ev, on_training) if gpu else None)
        if gpu:  # data loading and communication as themselves, compute and copies host-bound
            if elsewhere:
                # backward runs on a thread of its own (PyTorch's autograd engine): the training
                # thread inside loss.backward() between its operators waits, it launches nothing
                seg_l = np.where(seg_l == _FILL[S.BACKWARD], _GAP, seg_l)
            seg_l = np.where(seg_l >= 0, _GPU_HOST_LEVEL[np.maximum(seg_l, 0)], _GAP)
        keep = seg_l != _GAP
        parts_s.append(seg_s[keep])
        parts_e.append(seg_e[keep])
        parts_l.append(seg_l[keep])
        parts_r.append(owner[keep])
    # compute that the framework runs on other threads (TensorFlow's executors; on GPU runs
    # PyTorch's autograd thread launching backward: host-bound there)
    s_, e_, l_, r_ = _compute_elsewhere(ev, host & ~on_training)
    parts_s.append(s_)
    parts_e.append(e_)
    parts_l.append(_GPU_HOST_LEVEL[l_] if gpu else l_)
    parts_r.append(r_)
    comm_elsewhere = host & ~on_training & (ev.phase == PHASE_CODE[S.COMM])
    parts_s.append(ev.ts[comm_elsewhere])
    parts_e.append(ev.end[comm_elsewhere])
    parts_l.append(np.full(int(comm_elsewhere.sum()), _COMM_LEVEL))
    parts_r.append(np.flatnonzero(comm_elsewhere))
    # a call queued for a worker thread is in flight from when the program issued it
    run_rows, issue_rows = issue_links(events, ev.parent_row)
    queued = ev.ts[run_rows] > ev.ts[issue_rows]
    parts_s.append(ev.ts[issue_rows[queued]])
    parts_e.append(ev.ts[run_rows[queued]])
    parts_l.append(np.full(int(queued.sum()), _COMM_LEVEL))
    parts_r.append(issue_rows[queued])
    n_host = sum(len(p) for p in parts_s)
    if gpu:
        parts_s.append(ev.ts[device])
        parts_e.append(ev.end[device])
        parts_l.append(_EXPLICIT[ev.phase[device]])
        parts_r.append(np.flatnonzero(device))
    starts = np.concatenate(parts_s)
    return RankTimeline(
        ev, training, gpu, starts, np.concatenate(parts_e),
        np.concatenate(parts_l).astype(np.int64), w_start, w_end, numbers,
        np.arange(len(starts)) >= n_host, np.concatenate(parts_r).astype(np.int64),
    )  # fmt: skip


@dataclass
class LevelTimes:
    """Per step window of a rank: the time each level (LEVELS) holds exclusively, the union of
    all levels and of the communication intervals (ns). What the steps table and the GPU table
    both read: one cut, so the two cannot disagree."""

    exclusive: np.ndarray  # [level, window]
    covered: np.ndarray  # [window]: the union of every level
    comm_total: np.ndarray  # [window]
    clipped: tuple[np.ndarray, ...]  # the intervals cut to the windows: window, start, end, level

    def host_bound(self, phase: str) -> np.ndarray:
        """The device's wait for the host inside ``phase`` per window (GPU timelines)."""
        return self.exclusive[HOST_BOUND_LEVEL[phase]]


def level_times(tl: RankTimeline) -> LevelTimes:
    """Every instant of each step window, counted once, for the highest level active then
    (computed once per timeline: the steps and gpu tables read the same cut)."""
    if tl.cut is None:
        tl.cut = _level_times(tl)
    return tl.cut


def covered_by_level(
    starts: np.ndarray,
    ends: np.ndarray,
    levels: np.ndarray,
    w_start: np.ndarray,
    w_end: np.ndarray,
    n_levels: int,
) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """Per window, the time covered by the intervals of level <= k, for k = 0..n_levels-1 (row
    k + 1; row 0 is zeros), so ``np.diff`` over the rows is each level's exclusive time; and the
    intervals clipped to their windows, sorted by window and start (window, start, end, level)."""
    n_windows = len(w_start)
    window, s, e, level = _clip(starts, ends, levels, w_start, w_end)
    order = np.lexsort((s, window))
    clipped = window[order], s[order], e[order], level[order]
    window, s, e, level = clipped
    covered = np.zeros((n_levels + 1, n_windows), np.int64)
    # level by level, the union so far (disjoint runs, few) merged with the level's intervals:
    # each interval is sorted in once, not once per level at or above its own
    by_level = np.argsort(level, kind="stable")
    bounds = np.searchsorted(level[by_level], np.arange(n_levels + 1))
    u_window = u_start = u_end = np.zeros(0, np.int64)
    for k in range(n_levels):
        mine = by_level[bounds[k] : bounds[k + 1]]
        if len(mine) == 0:
            covered[k + 1] = covered[k]
            continue
        u_window, u_start, u_end = _runs(
            np.concatenate([u_window, window[mine]]),
            np.concatenate([u_start, s[mine]]),
            np.concatenate([u_end, e[mine]]),
        )
        covered[k + 1] = np.bincount(u_window, weights=u_end - u_start, minlength=n_windows)
    return covered, clipped


def _runs(
    window: np.ndarray, s: np.ndarray, e: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The union of intervals per window, as disjoint runs sorted by (window, start)."""
    order = np.lexsort((s, window))
    window, s, e = window[order], s[order], e[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = (s[1:] > reach[:-1]) | (window[1:] != window[:-1])
    heads = np.flatnonzero(new)
    return window[heads], s[heads], np.maximum.reduceat(e, heads)


def _level_times(tl: RankTimeline) -> LevelTimes:
    n_windows = len(tl.w_start)
    covered_by, (window, s, e, level) = covered_by_level(
        tl.starts, tl.ends, tl.levels, tl.w_start, tl.w_end, len(LEVEL_PHASES)
    )
    comm = level == _COMM_LEVEL
    comm_total = _union_by_window(window[comm], s[comm], e[comm], n_windows)
    return LevelTimes(
        np.diff(covered_by, axis=0), covered_by[-1], comm_total, (window, s, e, level)
    )


def breakdown(events: pa.Table, tl: RankTimeline | None = None) -> pa.Table:
    """The steps table (schema.STEPS_SCHEMA) of one rank's events (``tl``: their timeline, where
    the caller has it already)."""
    rank = int(events.column(S.RANK)[0].as_py()) if events.num_rows else 0
    tl = tl or rank_timeline(events)
    w_start, w_end, numbers = tl.w_start, tl.w_end, tl.numbers
    n_windows = len(w_start)
    if n_windows == 0:
        return pa.Table.from_pylist([], schema=S.STEPS_SCHEMA)

    times = level_times(tl)
    exclusive, comm_total = times.exclusive, times.comm_total

    wall = w_end - w_start
    columns: dict[str, object] = {
        S.RANK: np.full(n_windows, rank, np.int32),
        S.STEP: pa.array(numbers, pa.int64(), mask=numbers < 0),
        S.TIMELINE: [S.DEVICE_GPU if tl.gpu else S.DEVICE_CPU] * n_windows,
        S.START_NS: w_start,
        S.END_NS: w_end,
        S.WALL_NS: wall,
    }
    for phase in S.BREAKDOWN_PHASES:
        if phase == S.IDLE:
            columns[S.phase_ns(phase)] = wall - times.covered
        else:
            levels = [i for i, p in enumerate(LEVEL_PHASES) if p == phase]
            columns[S.phase_ns(phase)] = exclusive[levels].sum(axis=0)
    exposed = exclusive[_COMM_LEVEL]
    columns[S.COMM_TOTAL_NS] = comm_total
    columns[S.COMM_EXPOSED_NS] = exposed
    with np.errstate(divide="ignore", invalid="ignore"):
        columns[S.COMM_HIDDEN_FRACTION] = np.where(comm_total > 0, 1.0 - exposed / comm_total, 0.0)
    for phase in S.GPU_HOST_BOUND_PHASES:  # part of the phase's column; null on CPU timelines
        columns[S.host_bound_ns(phase)] = pa.array(
            times.host_bound(phase), pa.int64(), mask=np.full(n_windows, not tl.gpu)
        )
    return pa.table(columns, schema=S.STEPS_SCHEMA)


def _inside(starts: np.ndarray, ends: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Whether each instant of ``at`` lies in one of the sorted, disjoint [start, end)."""
    pos = np.searchsorted(starts, at, side="right") - 1
    return (pos >= 0) & (at < ends[np.maximum(pos, 0)]) if len(starts) else np.zeros(len(at), bool)


def comm_intervals(events: pa.Table, tl: RankTimeline | None = None) -> pa.Table:
    """The rank's communication within its step windows (schema.COMM_SCHEMA): the union of its
    comm intervals, cut into pieces that are exposed (nothing of a higher level runs then: the
    breakdown's comm) or hidden. Per step, the exposed pieces add up to the steps table's comm
    and all pieces to its comm_total."""
    rank = int(events.column(S.RANK)[0].as_py()) if events.num_rows else 0
    tl = tl or rank_timeline(events)
    if len(tl.w_start) == 0:
        return S.COMM_SCHEMA.empty_table()
    _, s, e, level = level_times(tl).clipped
    comm = level == _COMM_LEVEL
    if not comm.any():
        return S.COMM_SCHEMA.empty_table()
    cs, ce = merge_intervals(s[comm], e[comm])
    above = level < _COMM_LEVEL
    hs, he = merge_intervals(s[above], e[above])
    bounds = distinct(np.concatenate([cs, ce, hs, he, tl.w_start, tl.w_end]))
    lo, hi = bounds[:-1], bounds[1:]
    mids = lo + (hi - lo) // 2
    keep = _inside(cs, ce, mids)
    lo, hi, exposed = lo[keep], hi[keep], ~_inside(hs, he, mids[keep])
    window = np.searchsorted(tl.w_start, lo, side="right") - 1
    # join neighbours of one window and one kind: a piece per stretch, not per boundary
    new = np.ones(len(lo), bool)
    new[1:] = (lo[1:] != hi[:-1]) | (exposed[1:] != exposed[:-1]) | (window[1:] != window[:-1])
    heads = np.flatnonzero(new)
    ends = np.maximum.reduceat(hi, heads) if len(heads) else hi
    numbers = tl.numbers[window[heads]]
    return pa.table(
        {
            S.RANK: pa.array(np.full(len(heads), rank, np.int32)),
            S.STEP: pa.array(numbers, pa.int64(), mask=numbers < 0),
            S.START_NS: pa.array(lo[heads], pa.int64()),
            S.END_NS: pa.array(ends, pa.int64()),
            S.EXPOSED: pa.array(exposed[heads], pa.bool_()),
        },
        schema=S.COMM_SCHEMA,
    )


def _holders(s: np.ndarray, e: np.ndarray, at: np.ndarray) -> np.ndarray:
    """For each instant of ``at``, an interval of (``s``, ``e``) that covers it (-1: none): the
    last one to start before it, or where that one is over, the one reaching furthest."""
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    pos = np.searchsorted(s, at, side="right") - 1
    safe_pos = np.maximum(pos, 0)
    reach = np.maximum.accumulate(e) if len(e) else e
    furthest = np.maximum.accumulate(np.where(e >= reach, np.arange(len(e)), 0)) if len(e) else e
    last = np.where(e[safe_pos] > at, safe_pos, furthest[safe_pos])
    return np.where((pos >= 0) & (e[last] > at), order[last], -1)


def _outermost_operator(ev: EventArrays, rows: np.ndarray) -> np.ndarray:
    """For each host event row, the outermost operator (not a region) it is nested in on its
    thread, itself included (what a segment is named by: ``linear``, not the ``addmm`` inside
    it); device rows and -1 stay as they are."""
    named = OPERATOR[ev.kind] & ~STRUCTURAL[ev.kind]
    cur = rows.copy()
    climbing = (cur >= 0) & HOST_TREE[ev.kind[np.maximum(cur, 0)]]
    while climbing.any():
        parent = ev.parent_row[np.maximum(cur, 0)]
        climbing &= (parent >= 0) & named[np.maximum(parent, 0)]
        cur = np.where(climbing, parent, cur)
    return cur


#: The kind (schema.SEGMENT_KINDS) of each level's time on a timeline, host and device side.
_HOST_KIND = np.array(
    [S.SEGMENT_KINDS.index(S.SEGMENT_COMM) if name == S.COMM
     else S.SEGMENT_KINDS.index(S.SEGMENT_HOST_BOUND) if name.startswith("host-bound")
     else S.SEGMENT_KINDS.index(S.SEGMENT_COMPUTE) for name, _ in LEVELS]
    + [S.SEGMENT_KINDS.index(S.SEGMENT_IDLE)]
)  # fmt: skip
_SEGMENT_PHASE = np.array([S.BREAKDOWN_PHASES.index(p) for p in (*LEVEL_PHASES, S.IDLE)])


def gap_operators(
    op: np.ndarray, phase: np.ndarray, kind: np.ndarray, window: np.ndarray
) -> np.ndarray:
    """Segment operator codes with the time between two stretches of one operator (Python
    between two calls of it: compute no operator holds) given to that operator, where the
    stretches before and after it are of that operator, phase and window (-1: no operator)."""
    gap = (op < 0) & (kind == _HOST_KIND[LEVEL[S.FORWARD]])
    if not gap.any():
        return op
    index = np.arange(len(op))
    before = np.maximum.accumulate(np.where(~gap, index, -1))
    after = np.minimum.accumulate(np.where(~gap, index, len(op))[::-1])[::-1]
    b, a = np.maximum(before, 0), np.minimum(after, len(op) - 1)
    same = (
        (before >= 0) & (after < len(op)) & (op[b] == op[a]) & (phase[b] == phase)
        & (phase[a] == phase) & (kind[b] == kind) & (kind[a] == kind)
        & (window[b] == window) & (window[a] == window)
    )  # fmt: skip
    return np.where(gap & same, op[b], op)


_HOST_BOUND, _LAUNCH = (S.SEGMENT_KINDS.index(k) for k in (S.SEGMENT_HOST_BOUND, S.SEGMENT_LAUNCH))


def _launching(events: pa.Table, ev: EventArrays, kind: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Host-bound instants (the device idle, the host inside an operator) at which the host is
    inside a runtime call that launches work (a kernel launch, an async copy: any runtime call
    but a synchronize) are ``launch``: the device waits for the launch itself."""
    bound = np.flatnonzero(kind == _HOST_BOUND)
    if len(bound) == 0:
        return kind
    runtime = (ev.kind == KIND_CODE[S.KIND_RUNTIME]) & ~name_mask(events, DEVICE_WAIT_PATTERN)
    rows = np.flatnonzero(runtime & (ev.end > ev.ts))
    if len(rows) == 0:
        return kind
    inside = _holders(ev.ts[rows], ev.end[rows], at[bound]) >= 0
    kind = kind.copy()
    kind[bound[inside]] = _LAUNCH
    return kind


def timeline_segments(events: pa.Table, tl: RankTimeline | None = None) -> pa.Table:
    """Each step window of the rank as its exclusive segments in time order
    (schema.SEGMENTS_SCHEMA): the breakdown's cut kept as time, a segment per stretch of one
    phase, kind and operator (the canonical op of the event holding the time, on the device
    the kernel's). Per window the segments tile it and their phases add up to the steps row."""
    rank = int(events.column(S.RANK)[0].as_py()) if events.num_rows else 0
    tl = tl or rank_timeline(events)
    if len(tl.w_start) == 0:
        return S.SEGMENTS_SCHEMA.empty_table()
    keep = tl.ends > tl.starts
    s, e, level = tl.starts[keep], tl.ends[keep], tl.levels[keep]
    rows, on_device = tl.rows[keep], tl.on_device[keep]
    bounds = distinct(np.concatenate([s, e, tl.w_start, tl.w_end]).astype(np.int64))
    lo, hi = bounds[:-1], bounds[1:]
    mids = lo + (hi - lo) // 2
    window = np.searchsorted(tl.w_start, mids, side="right") - 1
    inside = (window >= 0) & (mids < tl.w_end[np.maximum(window, 0)])
    lo, hi, mids, window = lo[inside], hi[inside], mids[inside], window[inside]
    idle = len(LEVEL_PHASES)
    winner = np.full(len(mids), idle, np.int64)
    holder = np.full(len(mids), -1, np.int64)  # the interval holding each piece
    by_level = np.argsort(level, kind="stable")
    cuts = np.searchsorted(level[by_level], np.arange(idle + 1))
    for k in range(idle):  # the lowest level covering an instant holds it
        mine = by_level[cuts[k] : cuts[k + 1]]
        if len(mine) == 0:
            continue
        free = np.flatnonzero(winner == idle)
        got = _holders(s[mine], e[mine], mids[free])
        won = got >= 0
        winner[free[won]] = k
        holder[free[won]] = mine[got[won]]
    kind = _HOST_KIND[winner]
    held = holder >= 0
    if len(rows) == 0:  # (windows with nothing in them: idle throughout)
        holder = np.full(len(mids), 0, np.int64)
        rows, on_device = np.full(1, -1, np.int64), np.zeros(1, bool)
    if tl.gpu:
        kernel = held & on_device[np.maximum(holder, 0)]
        kind = np.where(kernel, S.SEGMENT_KINDS.index(S.SEGMENT_KERNEL), kind)
        kind = _launching(events, tl.ev, kind, mids)
    row = np.where(held, rows[np.maximum(holder, 0)], -1)
    comm = winner == _COMM_LEVEL  # (named by the call itself, not the operator issuing it)
    row = np.where(comm, row, _outermost_operator(tl.ev, row))
    ops = pc.dictionary_encode(events.column(S.OP)).combine_chunks()
    op_codes = np.asarray(ops.indices.fill_null(-1).to_numpy(zero_copy_only=False), np.int64)
    named = (row >= 0) & (comm | ~STRUCTURAL[tl.ev.kind[np.maximum(row, 0)]])
    op = np.where(named, op_codes[np.maximum(row, 0)], -1)
    phase = _SEGMENT_PHASE[winner]
    op = gap_operators(op, phase, kind, window)
    new = np.ones(len(lo), bool)
    new[1:] = (
        (window[1:] != window[:-1]) | (phase[1:] != phase[:-1]) | (kind[1:] != kind[:-1])
        | (op[1:] != op[:-1]) | (lo[1:] != hi[:-1])
    )  # fmt: skip
    heads = np.flatnonzero(new)
    ends = np.append(hi[heads[1:] - 1], hi[-1]) if len(heads) else hi
    numbers = tl.numbers[window[heads]]
    op_heads = op[heads]
    return pa.table(
        {
            S.RANK: pa.array(np.full(len(heads), rank, np.int32)),
            S.STEP: pa.array(numbers, pa.int64(), mask=numbers < 0),
            S.START_NS: pa.array(lo[heads], pa.int64()),
            S.END_NS: pa.array(ends, pa.int64()),
            S.PHASE: pa.array(np.array(S.BREAKDOWN_PHASES, object)[phase[heads]], pa.string()),
            S.KIND: pa.array(np.array(S.SEGMENT_KINDS, object)[kind[heads]], pa.string()),
            S.OP: ops.dictionary.take(pa.array(np.maximum(op_heads, 0), mask=op_heads < 0))
            if len(ops.dictionary)
            else pa.nulls(len(heads), pa.string()),
        },
        schema=S.SEGMENTS_SCHEMA,
    )


def merge_intervals(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals as sorted, disjoint (start, end) arrays."""
    if len(s) == 0:
        return s, e
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > reach[:-1]
    heads = np.flatnonzero(new)
    return s[heads], np.maximum.reduceat(e, heads)


def attribution(tl: RankTimeline, start: int, end: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The exclusive phase of every instant of [start, end): (segment starts, ends, phases).

    The same rule as the breakdown, kept as time segments (idle where nothing runs): what a
    timeline view draws. Adjacent segments of one phase are merged.
    """
    clip_s, clip_e = np.maximum(tl.starts, start), np.minimum(tl.ends, end)
    keep = clip_e > clip_s
    s, e, level = clip_s[keep], clip_e[keep], tl.levels[keep]
    bounds = distinct(np.concatenate([[start, end], s, e]).astype(np.int64))
    mids = (bounds[:-1] + bounds[1:]) // 2
    winner = np.full(len(mids), len(LEVEL_PHASES), np.int64)  # idle
    for lvl in range(len(LEVEL_PHASES) - 1, -1, -1):
        us, ue = merge_intervals(s[level <= lvl], e[level <= lvl])
        if len(us) == 0:
            continue
        pos = np.searchsorted(us, mids, side="right") - 1
        inside = (pos >= 0) & (mids < ue[np.maximum(pos, 0)])
        winner[inside] = lvl
    names = [*LEVEL_PHASES, S.IDLE]
    phase = np.array([S.BREAKDOWN_PHASES.index(names[w]) for w in range(len(names))])[winner]
    change = np.ones(len(phase), bool)
    change[1:] = phase[1:] != phase[:-1]
    heads = np.flatnonzero(change)
    seg_s = bounds[:-1][heads]
    seg_e = np.append(bounds[:-1][heads[1:]], bounds[-1]) if len(heads) else bounds[1:]
    return seg_s, seg_e, [S.BREAKDOWN_PHASES[p] for p in phase[heads]]


@dataclass
class CommSchedule:
    """When a step's collectives became ready, as a share of that step's backward compute.

    ``ready[i]``: the fraction of the step's backward time (exclusive attribution) done when the
    training thread issued collective i (1.0: after backward); ``weight[i]``: its share of the
    step's communication time. What the layer-wise overlap model replays on another backward.
    """

    step: int
    ready: np.ndarray
    weight: np.ndarray


def _backward_done(seg_s: np.ndarray, seg_e: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Backward time covered by the (sorted, disjoint) segments before each instant of ``at``."""
    lengths = seg_e - seg_s
    done_before = np.concatenate([[0], np.cumsum(lengths)])
    idx = np.searchsorted(seg_s, at, side="right") - 1
    safe = np.maximum(idx, 0)
    partial = np.clip(at - seg_s[safe], 0, lengths[safe]) if len(seg_s) else np.zeros(len(at))
    return np.where(idx >= 0, done_before[safe] + partial, 0)


def comm_schedule(events: pa.Table) -> list[CommSchedule]:
    """Per step of one rank: when each collective was issued relative to backward progress.

    Issue times are the training thread's outermost communication calls (c10d::allreduce_,
    a framework's all-reduce op); their weights are the durations of the transfers they started
    (on communication threads or device streams) where the counts match, else equal shares.
    A collective issued during backward can overlap the backward still to come; one issued after
    it cannot. Steps without communication are left out.
    """
    tl = rank_timeline(events)
    ev = tl.ev
    comm = ev.phase == PHASE_CODE[S.COMM]
    host = HOST_TREE[ev.kind]
    on_training = (
        host & (ev.pid == tl.training[0]) & (ev.tid == tl.training[1])
        if tl.training is not None
        else np.zeros(len(ev.ts), bool)
    )
    parent_comm = np.where(ev.parent_row >= 0, comm[np.maximum(ev.parent_row, 0)], False)
    issues = on_training & comm & ~parent_comm & _OPERATOR[ev.kind]
    transfers = comm & ~on_training & (host | DEVICE[ev.kind])
    schedules = []
    for start, end, number in zip(tl.w_start, tl.w_end, tl.numbers, strict=True):
        issued = np.sort(ev.ts[issues & (ev.ts >= start) & (ev.ts < end)])
        moved = np.flatnonzero(transfers & (ev.ts >= start) & (ev.ts < end))
        moved = moved[np.argsort(ev.ts[moved], kind="stable")]
        if len(issued) == 0:
            issued = ev.ts[moved]
        if len(issued) == 0:
            continue
        seg_s, seg_e, phases = attribution(tl, int(start), int(end))
        backward = np.array([p == S.BACKWARD for p in phases], bool)
        bw_s, bw_e = seg_s[backward], seg_e[backward]
        total = int((bw_e - bw_s).sum())
        ready = _backward_done(bw_s, bw_e, issued) / total if total > 0 else np.ones(len(issued))
        durations = (ev.end - ev.ts)[moved].astype(np.float64)
        if len(moved) == len(issued) and durations.sum() > 0:
            weight = durations / durations.sum()
        else:
            weight = np.full(len(issued), 1.0 / len(issued))
        schedules.append(CommSchedule(int(number), np.clip(ready, 0.0, 1.0), weight))
    return schedules


def layerwise_exposed(schedule: CommSchedule, backward_ns: float, comm_ns: float) -> float:
    """Communication left after a backward of ``backward_ns``, with ``comm_ns`` of collectives.

    Wait-free backpropagation: each collective starts when its gradients are ready (at its
    share of the backward) and the previous one has finished; what runs past the end of the
    backward is exposed.
    """
    finish = 0.0
    for ready, weight in zip(schedule.ready * backward_ns, schedule.weight * comm_ns, strict=True):
        finish = max(finish, float(ready)) + float(weight)
    return max(0.0, finish - backward_ns)
