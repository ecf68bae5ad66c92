"""Which task of a TensorFlow parameter-server job (``ParameterServerStrategy`` with a
``ClusterCoordinator``) an XPlane profile is, from its events alone (the XPlane reader asks).

The chief (the coordinator) runs no operator of its own: it calls the step function remotely,
one call at a time on each of its threads that serve a worker (``TFE_Py_ExecuteCancelable``). A
worker runs each call it is handed whole (``EagerLocalExecute: __inference_<fn>``) as a request
of its eager service (``EagerService:Enqueue``), without step markers of its own: each such
execution is one of its steps, from its start to its end (the time between two is the worker
idling until the coordinator hands it the next). A parameter server runs only its partitions of
the workers' functions (``EagerLocalExecuteAsync: __inference_<fn>_partitioned_…``: the reads
of the variables it holds and their updates)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traceview.model import schema as S

REMOTE_REQUEST = "EagerService:Enqueue"
#: The thread a worker's waits for tensors from other tasks are laid on (``remote_waits``).
REMOTE_TID = 0x7E40_7E40
DISPATCH = "TFE_Py_ExecuteCancelable"
_WHOLE = re.compile(r"^EagerLocalExecute: (__inference_.+)$")
_PARTITION = re.compile(r"^EagerLocalExecuteAsync: (__inference_.+)_partitioned_\d+_\d+$")


@dataclass
class TaskRole:
    """What the profile showed: the role, and for a worker the rows of its steps' executions."""

    role: str
    steps: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # worker: rows
    start: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # ... their work's
    dur: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    function: str | None = None  # the function a worker runs as its step
    figures: dict[str, int] = field(default_factory=dict)


def task_role(events: pa.Table) -> TaskRole | None:
    """The profile's role in a parameter-server job (None: not one of its tasks, as far as the
    events show). ``events``: the profile's raw events (``name``, ``cat``, ``tid``)."""
    counts = pc.value_counts(events[S.NAME])
    names = counts.field("values").to_pylist()
    times = dict(zip(names, counts.field("counts").to_pylist(), strict=True))
    remote = times.get(REMOTE_REQUEST, 0) > 0
    whole = {n: c for n, c in times.items() if isinstance(n, str) and _WHOLE.match(n)}
    if remote and whole:
        main = max(whole, key=lambda n: (whole[n], n))
        rows = pc.indices_nonzero(pc.equal(events[S.NAME], main)).to_numpy().astype(np.int64)
        ts = events[S.TS_NS].to_numpy()
        rows = rows[np.argsort(ts[rows], kind="stable")]
        start, dur = _work_within(events, rows)
        fn = _WHOLE.match(main).group(1)  # type: ignore[union-attr]
        return TaskRole("worker", rows, start, dur, fn, {"executions": len(rows)})
    partitions = sum(c for n, c in times.items() if isinstance(n, str) and _PARTITION.match(n))
    if remote and partitions:
        return TaskRole("server", figures={"partitions": partitions})
    dispatched = times.get(DISPATCH, 0)
    if dispatched >= 2 and not _runs_operators(events):
        calls = events.filter(pc.equal(events[S.NAME], DISPATCH))
        threads = pc.count_distinct(calls[S.TID]).as_py()
        return TaskRole("chief", figures={"dispatched": dispatched, "threads": threads})
    return None


def _runs_operators(events: pa.Table) -> bool:
    """Whether the profile holds operators run in this process (TensorFlow's ``Name:Type``
    events of its executors)."""
    return bool(pc.any(pc.equal(events[S.CAT].cast(pa.string()), "tf_op")).as_py())


def _work_within(events: pa.Table, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per execution (``rows``, in time order, one at a time): from the first event of another
    thread inside it (its executors' operators, transfers, input pipeline) to the last one's end
    (clipped to the execution); the execution itself where no other thread shows. The eager
    runtime's own call (setting up and tearing down the function, on the calling thread) is
    outside: it is the worker waiting for work, as the time between two calls."""
    ts = events[S.TS_NS].to_numpy()
    end = ts + np.nan_to_num(events[S.DUR_NS].to_numpy(zero_copy_only=False)).astype(np.int64)
    tid = events[S.TID].to_numpy()
    caller = np.isin(tid, np.unique(tid[rows]))
    other = np.flatnonzero(~caller)
    order = other[np.argsort(ts[other], kind="stable")]
    o_ts, o_end = ts[order], end[order]
    s0, e0 = ts[rows], end[rows]
    lo = np.searchsorted(o_ts, s0, side="left")
    hi = np.searchsorted(o_ts, e0, side="right")
    start, stop = s0.copy(), e0.copy()
    some = hi > lo
    if some.any() and len(o_ts):
        start[some] = o_ts[lo[some]]
        # (the latest end among the events that start inside: a running maximum read at hi-1)
        running = np.maximum.accumulate(o_end)
        floor = np.where(lo > 0, running[np.maximum(lo - 1, 0)], np.iinfo(np.int64).min)
        last = running[hi[some] - 1]
        # (an event that started before this execution and runs on does not count)
        last = np.where(last > floor[some], last, o_ts[hi[some] - 1])
        stop[some] = np.minimum(np.maximum(last, start[some]), e0[some])
    return start.astype(np.int64), (stop - start).astype(np.int64)


def remote_waits(
    receives: tuple[list[str], list[bool], list[int], np.ndarray, np.ndarray] | None,
) -> pa.Table | None:
    """A worker's waits for tensors another task sends it (the variables a parameter server
    holds, the answers of its partitions): each ``_Recv`` from its start to its end
    (``ExecutorState::ProcessAsync::Start`` and ``::Done``, paired by the execution and the
    receiving op), merged where
    they overlap, as events of their own thread (category ``tf_remote``: communication).
    ``receives``: per record its pairing key, whether it ends the receive, pid, ts_ns and dur_ns."""
    if receives is None:
        return None
    flows, done, pids, ts, dur = receives
    start: dict[str, tuple[int, int]] = {}
    end: dict[str, int] = {}
    for flow, is_done, pid, t, d in zip(flows, done, pids, ts.tolist(), dur.tolist(), strict=True):
        if is_done:
            end[flow] = max(end.get(flow, t + d), t + d)
        elif flow not in start:
            start[flow] = (int(t), pid)
    paired = sorted((start[f][0], end[f], start[f][1]) for f in start if f in end)
    if not paired:
        return None
    merged: list[list[int]] = []
    for s0, e0, pid in paired:
        if merged and s0 <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e0)
            merged[-1][3] += 1
        else:
            merged.append([s0, e0, pid, 1])
    n = len(merged)
    from traceview.parsers import raw_events

    return raw_events(
        ["tf_remote"] * n,
        [f"_Recv ({m[3]} from other tasks)" for m in merged],
        [m[2] for m in merged],
        [REMOTE_TID] * n,
        pa.array([m[0] for m in merged], pa.int64()),
        pa.array([m[1] - m[0] for m in merged], pa.int64()),
    )
