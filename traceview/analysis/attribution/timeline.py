"""One rank's critical timeline (``rank_timeline``): the intervals that compete for each instant,
each at its priority level (``RankTimeline``), and the holder of their cut per step window
(``LevelTimes``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traceview.analysis.attribution.levels import (
    _COMM_LEVEL,
    _EXPLICIT,
    _FILL,
    _FILL_OF,
    _GAP,
    _GPU_HOST_LEVEL,
    _REGION,
    HOST_BOUND_LEVEL,
)
from traceview.analysis.attribution.windows import RankPart, _whole_rank_facts, step_windows
from traceview.analysis.collectives import issue_links
from traceview.model import schema as S
from traceview.model.columns import (
    DEVICE,
    HOST_TREE,
    KIND_CODE,
    OPERATOR,
    PHASE_CODE,
    STRUCTURAL,
    EventArrays,
    nearest_marked,
    phase_table,
    unique_pairs,
)


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


_COMM_PHASE = S.EVENT_PHASES.index(S.COMM)


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
        # that operator's time: the thread is inside the operator. Not a communication region
        # (collect's ``traceview.pg:`` around a collective call, a backend's ``gloo:``): a
        # thread blocked in a collective it called is communicating, inside an autograd
        # Function's forward or backward (an expert all-to-all) as anywhere
        inner = np.flatnonzero(has)[structural & (phase != _COMM_PHASE)]
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
    return nearest_marked(ev.parent_row, named)[rows]


def _fill_of(levels: np.ndarray) -> np.ndarray:
    out = np.full(len(levels), _GAP, np.int64)
    for level, fill_level in _FILL_OF.items():
        out[levels == level] = fill_level
    return out


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


def rank_timeline(
    events: pa.Table, part: RankPart | None = None, ev: EventArrays | None = None
) -> RankTimeline:
    """The intervals that compete for each instant of one rank, and its step windows (``part``:
    the events are a slice of the rank, and these are the whole rank's facts; ``ev``: the
    events' arrays, where the caller has them)."""
    ev = ev if ev is not None else EventArrays.of(events)
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
