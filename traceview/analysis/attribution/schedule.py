"""The comm schedule: when a step's collectives became ready against its backward
(``comm_schedule``), and the layer-wise overlap model that replays it on another backward
(``layerwise_exposed``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from traceview.analysis.attribution.segments import attribution
from traceview.analysis.attribution.timeline import rank_timeline
from traceview.model import schema as S
from traceview.model.columns import (
    DEVICE,
    HOST_TREE,
    PHASE_CODE,
    kind_table,
)

_OPERATOR = kind_table((S.KIND_OP, S.KIND_ANNOTATION))


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
