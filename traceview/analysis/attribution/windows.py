"""A rank's step windows (``step_windows``), and what only the whole rank tells: its training
thread, whether it ran on a device, whether another thread runs its backward (``whole_rank_part``;
``RankPart`` hands them to a slice of the rank)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from traceview.model import schema as S
from traceview.model.columns import (
    DEVICE,
    HOST_TREE,
    KIND_CODE,
    PHASE_CODE,
    STRUCTURAL,
    TIMED,
    EventArrays,
    disjoint,
    outermost_operators,
    training_thread_of,
)


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
    numbered = ev.step[idx] >= 0
    if numbered.any():  # (a marker in no step: set aside where its number began again)
        idx = idx[numbered]
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
    events: pa.Table, ev: EventArrays | None = None
) -> tuple[tuple[int, int] | None, bool, bool, tuple[int, int] | None]:
    """What ``rank_timeline`` finds over a whole rank and a slice cannot: its training thread,
    whether it ran on a device, whether another thread runs its backward (on a device), and its
    one window where the training thread has no step marker (None where it has). ``ev``: the
    events' arrays, where the caller has them."""
    ev = ev if ev is not None else EventArrays.of(events)
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
