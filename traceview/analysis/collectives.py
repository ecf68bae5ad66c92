"""A rank's collective calls: the small table cross-rank passes match across ranks, so they run
on per-rank results without reading events.

A call is an event the rules mark as a collective that no enclosing event on the same device
is also one: the outermost view of each call on its thread or stream (``c10d::allreduce_`` on
the training thread, ``gloo:all_reduce`` on gloo's thread, a KVStore push/pull, a TensorFlow
collective op, an NCCL kernel on its stream, whose parent is the host call that launched it).
Views are kept apart (``name``) and numbered in time order per (name, collective): ``seq`` is the
rank's n-th call of that view, the key to match it with the other ranks' n-th. A call's bytes
and process group are its own or those a collective event inside it records (c10d::allreduce_
records neither, the record_param_comms inside it does); the group is null where the trace does
not name it (gloo's CPU collectives in Kineto traces, TensorFlow, MXNet). A kernel takes its collective
from the host call that launched it, and its bytes and group where it records none.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traceview.model import schema as S
from traceview.model.columns import (
    dictionary_codes,
    ints,
    nearest_marked,
    pair_groups,
    parent_rows,
    rank_codes,
    roots,
)


def _outermost(
    parent_row: np.ndarray, is_collective: np.ndarray, device: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The collective rows no ancestor of which is a collective on the same device; for every
    other collective row the outermost such one it is inside; and for each row the nearest
    collective ancestor on another device (-1: none), the host call that launched a kernel.
    Pointer jumping, so that a chain of nested calls costs the log of its depth in rounds (a
    trace that nests one call 50,000 times in itself, not 50,000 rounds): each row's nearest
    collective ancestor first, then along those of the same device the outermost. (A collective
    above a collective of another device, itself above one of the first device, as a host call
    inside a kernel would be, is not followed past the other device's.)"""
    rows = np.flatnonzero(is_collective)
    nearest = nearest_marked(parent_row, is_collective)[rows]
    at = np.maximum(nearest, 0)
    same = (nearest >= 0) & (device[at] == device[rows])
    # the chain of same-device collective ancestors, over the collective rows (by position)
    position = np.full(len(parent_row), -1, np.int64)
    position[rows] = np.arange(len(rows))
    up = np.where(same, position[at], -1)
    top = roots(up)
    inner = top != np.arange(len(rows))
    owner = rows[top[inner]]
    launcher = nearest[~inner]  # (no same-device collective above: the nearest is another's)
    return rows[~inner], np.stack([rows[inner], owner]), launcher


#: Views a worker thread runs for a call the program issued on its own thread: gloo runs
#: ``c10d::allreduce_``'s work as ``gloo:all_reduce`` on one of its group's threads (and a
#: blocking receive's wait as ``gloo:recv``), whenever a thread is free: what the program waited
#: for began when it issued the call, not when the worker got to it.
RUN_PREFIX = "gloo:"


def _fifo(issued: np.ndarray, runs: np.ndarray) -> np.ndarray:
    """For runs (start times, sorted) of calls issued at ``issued`` (sorted), each run's issue
    (index into ``issued``; -1: none), first in first out: every run takes the earliest issue not
    yet taken that came before it began, and none when every such issue is taken (its issue was
    before the trace began). Vectorized: the number of runs left without an issue before run j
    is the running maximum of ``j - (issues before run j)`` + 1 (at least 0)."""
    j = np.arange(len(runs))
    before = np.searchsorted(issued, runs, side="right")
    deficit = j - before
    unissued = np.maximum(np.concatenate(([0], np.maximum.accumulate(deficit + 1)[:-1])), 0)
    linked = unissued > deficit
    return np.where(linked, j - unissued, -1)


def issue_links(
    events: pa.Table, parent: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(run rows, issue rows): a worker-run call (``RUN_PREFIX``) with the call its program
    issued on another view of the same collective on the host (``c10d::allreduce_``) just before
    it, where the link is plain (what the timeline needs: the stretch the training thread waited
    for the worker; ``combine_collectives`` links every call over the whole rank), per
    collective: the latest issue before the run where no other run began in between."""
    empty = np.zeros(0, np.int64)
    if events.num_rows == 0:
        return empty, empty
    collective_codes, _ = dictionary_codes(events.column(S.COLLECTIVE))
    is_collective = collective_codes >= 0
    if not is_collective.any():
        return empty, empty
    names = events.column(S.NAME)
    is_run = np.zeros(events.num_rows, bool)
    is_run[is_collective] = np.asarray(
        pc.starts_with(names.take(pa.array(np.flatnonzero(is_collective))).cast(pa.string()),
                       RUN_PREFIX),
        bool,
    )  # fmt: skip
    if not is_run.any():
        return empty, empty
    device_codes, device_names = dictionary_codes(events.column(S.DEVICE))
    rows, _, launcher = _outermost(
        parent_rows(events) if parent is None else parent, is_collective, device_codes
    )
    cpu = device_names.index(S.DEVICE_CPU) if S.DEVICE_CPU in device_names else -2
    rows = rows[(device_codes[rows] == cpu) & (launcher < 0)]
    ts = ints(events.column(S.TS_NS), 0)
    runs_out, issues_out = [empty], [empty]
    for code in np.unique(collective_codes[rows]):
        mine = rows[collective_codes[rows] == code]
        runs = mine[is_run[mine]]
        issues = mine[~is_run[mine]]
        if len(runs) == 0 or len(issues) == 0:
            continue
        runs = runs[np.argsort(ts[runs], kind="stable")]
        issues = issues[np.argsort(ts[issues], kind="stable")]
        # the latest issue before the run, where no other run of the collective began between
        # them (local: the same links whichever slice of the rank the events are)
        latest = np.searchsorted(ts[issues], ts[runs], side="right") - 1
        previous_run = np.concatenate(([np.iinfo(np.int64).min], ts[runs][:-1]))
        linked = (latest >= 0) & (previous_run < ts[issues[np.maximum(latest, 0)]])
        runs_out.append(runs[linked])
        issues_out.append(issues[latest[linked]])
    return np.concatenate(runs_out), np.concatenate(issues_out)


def collective_calls(events: pa.Table) -> pa.Table:
    """The collective calls of one rank's events (schema.COLLECTIVES_SCHEMA), in time order."""
    return combine_collectives([collectives_part(events)])


def collectives_part(
    events: pa.Table, counted: np.ndarray | None = None, parent: np.ndarray | None = None
) -> pa.Table:
    """The collective calls among the rows of ``events`` where ``counted`` (default: all; the
    others are context: the calls a call is nested in or launched by), with their event ids
    (``_id``) and without ``seq``: ``combine_collectives`` numbers the parts' calls together.
    ``parent``: each row's parent row (``arrays.parent_rows``), where the caller has it."""
    if events.num_rows == 0:
        return S.empty(_PART_SCHEMA)
    # a region marker projected onto a stream (``nccl:all_reduce`` as a gpu_annotation) only
    # repeats the kernel it covers: the kernel is the call
    is_collective = np.asarray(pc.is_valid(events.column(S.COLLECTIVE)), bool) & ~np.asarray(
        pc.fill_null(
            pc.equal(events.column(S.KIND).cast(pa.string()), S.KIND_GPU_ANNOTATION), False
        ),
        bool,
    )
    if not is_collective.any():
        return S.empty(_PART_SCHEMA)
    device_codes, _ = dictionary_codes(events.column(S.DEVICE))
    parent = parent_rows(events) if parent is None else parent
    rows, (inner, owner), launcher = _outermost(parent, is_collective, device_codes)

    if counted is not None:
        mine = counted[rows]
        rows, launcher = rows[mine], launcher[mine]
    calls = events.take(pa.array(rows))
    ts = ints(calls.column(S.TS_NS), 0)
    end = ts + ints(calls.column(S.DUR_NS), 0)
    # bytes: the call's own, or the most a collective nested in it records; its process group:
    # its own, or the one a collective nested in it names (NCCL's record_param_comms)
    size = ints(events.column(S.BYTES), -1)
    best = size.copy()
    np.maximum.at(best, owner, size[inner])
    call_bytes = best[rows]
    launched = launcher >= 0
    # the launching call's outermost view holds what the calls nested in it recorded
    outer_of = np.arange(len(size))
    outer_of[inner] = owner
    launcher = np.where(launched, outer_of[np.maximum(launcher, 0)], -1)
    from_launcher = best[np.maximum(launcher, 0)]
    call_bytes = np.where((call_bytes < 0) & launched, from_launcher, call_bytes)
    # an all-to-all's split imbalance: its own, the most a call nested in it records, or its
    # launching call's
    split = np.nan_to_num(
        events.column(S.SPLIT_IMBALANCE).to_numpy(zero_copy_only=False).astype(np.float64),
        nan=-1.0,
    ) if S.SPLIT_IMBALANCE in events.column_names else np.full(len(size), -1.0)  # fmt: skip
    split_best = split.copy()
    np.maximum.at(split_best, owner, split[inner])
    call_split = split_best[rows]
    call_split = np.where(
        (call_split < 0) & launched, split_best[np.maximum(launcher, 0)], call_split
    )
    group_codes, group_names = dictionary_codes(events.column(S.GROUP))
    # a call nested in one naming several groups: the greatest name (by value, not by code)
    by_value = np.argsort(np.argsort(np.asarray(group_names, dtype=object), kind="stable"))
    by_value = np.append(by_value, -1)  # null: -1
    group_codes = by_value[group_codes]
    group_names = sorted(group_names)
    named = group_codes.copy()
    np.maximum.at(named, owner, group_codes[inner])
    call_group = np.where(group_codes[rows] >= 0, group_codes[rows], named[rows])
    call_group = np.where((call_group < 0) & launched, named[np.maximum(launcher, 0)], call_group)
    # or the one the region around the call names (``traceview collect``'s ``traceview.pg:``)
    around = _enclosing(parent, rows, group_codes >= 0)
    call_group = np.where((call_group < 0) & (around >= 0), group_codes[around], call_group)
    names = calls.column(S.NAME).cast(pa.string())
    # a kernel is the collective its host call says (NCCL runs an all-to-all as SendRecv)
    kinds = calls.column(S.COLLECTIVE).cast(pa.string())
    if launched.any():
        host_kinds = events.column(S.COLLECTIVE).take(pa.array(np.maximum(launcher, 0)))
        kinds = pc.if_else(pa.array(launched), host_kinds.cast(pa.string()), kinds)
    table = pa.table(
        {
            S.RANK: calls.column(S.RANK),
            S.STEP: calls.column(S.STEP),
            S.DEVICE: calls.column(S.DEVICE).cast(pa.string()),
            S.PID: calls.column(S.PID),
            S.TID: calls.column(S.TID),
            S.NAME: names,
            S.COLLECTIVE: kinds,
            S.GROUP: pa.array(
                [str(group_names[g]) if g >= 0 else None for g in call_group.tolist()], pa.string()
            ),
            S.BYTES: pa.array(call_bytes, pa.int64(), mask=call_bytes < 0),
            S.START_NS: pa.array(ts, pa.int64()),
            S.END_NS: pa.array(end, pa.int64()),
            S.PEER: _call_peers(events, rows, owner, inner, around, launcher),
            S.ISSUED_IN: _issued_in(events, parent, rows, launcher),
            S.SPLIT_IMBALANCE: pa.array(call_split, pa.float64(), mask=call_split < 0),
            **_fsdp_units(events, parent, rows, launcher),
            "_id": calls.column(S.EVENT_ID),
        }
    )
    return S.conform(table, _PART_SCHEMA)


def _enclosing(
    parent: np.ndarray,
    rows: np.ndarray,
    has: np.ndarray,
    depth: int = 16,
    stop: np.ndarray | None = None,
) -> np.ndarray:
    """For each of ``rows``, its nearest ancestor where ``has`` (-1: none within ``depth``, or
    none below an ancestor where ``stop``)."""
    found = np.full(len(rows), -1, np.int64)
    current = parent[rows]
    for _ in range(depth):
        live = (current >= 0) & (found < 0)
        if not live.any():
            break
        at = np.maximum(current, 0)
        found = np.where(live & has[at], current, found)
        blocked = stop[at] if stop is not None else np.zeros(len(at), bool)
        current = np.where(live & ~blocked, parent[at], -1)
    return found


#: The phases a call can be issued in (comm and other are no phase of the program's own).
_ISSUING = (S.FORWARD, S.BACKWARD, S.UPDATE, S.IO, S.H2D)


def _issued_in(
    events: pa.Table, parent: np.ndarray, rows: np.ndarray, launcher: np.ndarray
) -> pa.Array:
    """Each call's ``issued_in``: the phase of the nearest event around it (around the host call
    that launched it, for a kernel) whose phase is one of ``_ISSUING``; "other" without one (a
    call the loop makes between phases: an explicit all-reduce after ``backward()``)."""
    codes, names = dictionary_codes(events.column(S.PHASE))
    issuing = np.array([n in _ISSUING for n in names] + [False])
    has = issuing[codes]
    start = np.where(launcher >= 0, launcher, rows)
    own = has[start]
    # (not past the step marker: a profiler that steps inside the optimizer's step nests the
    # next step's marker in it)
    kinds, kind_names = dictionary_codes(events.column(S.KIND))
    step_marker = np.append(np.array([k == S.KIND_STEP for k in kind_names], bool), False)[kinds]
    around = _enclosing(parent, start, has, depth=64, stop=step_marker)
    at = np.where(own, start, around)
    labels = np.asarray([*names, S.OTHER], dtype=object)
    phase = np.where(at >= 0, labels[codes[np.maximum(at, 0)]], S.OTHER)
    return pa.array(phase.tolist(), pa.string())


#: FSDP2's regions (torch.distributed.fsdp.fully_shard), ``(i)`` naming the unit
_FSDP_GATHER, _FSDP_REDUCE, _FSDP_COPY_OUT, _FSDP_PRE, _FSDP_PREFETCH = 1, 2, 3, 4, 5
_FSDP_REGION = re.compile(
    r"FSDP::(all_gather|post_backward_reduce|all_gather_copy_out|pre_forward|pre_backward)"
    r"(?: \((.+?)\))?(?: \[pg=\d+\])?|FSDP::(forward|backward)_prefetch\b.*"
)
ROOT_UNIT = "(root)"  # FSDP names the root module's regions without a unit
_FSDP_KIND = {
    "all_gather": _FSDP_GATHER,
    "post_backward_reduce": _FSDP_REDUCE,
    "all_gather_copy_out": _FSDP_COPY_OUT,
    "pre_forward": _FSDP_PRE,
    "pre_backward": _FSDP_PRE,
}


def _fsdp_units(
    events: pa.Table, parent: np.ndarray, rows: np.ndarray, launcher: np.ndarray
) -> dict[str, pa.Array]:
    """Each call's FSDP ``unit``, whether an all-gather was ``prefetched`` and when what it
    gathered was ``needed`` (schema.UNIT, PREFETCHED, NEEDED_NS): from the regions FSDP2 records
    around its calls. The copy-out that needs a gather follows it on the issuing thread, in the
    same phase: inside the same part of a rank."""
    n = len(rows)
    none = {
        S.UNIT: pa.nulls(n, pa.string()),
        S.PREFETCHED: pa.nulls(n, pa.bool_()),
        S.NEEDED_NS: pa.nulls(n, pa.int64()),
    }
    codes, names = dictionary_codes(events.column(S.NAME))
    kind_of_name = np.zeros(len(names) + 1, np.int8)
    unit_of_name = np.full(len(names) + 1, -1, np.int64)
    units: dict[str, int] = {}
    for i, name in enumerate(names):
        found = _FSDP_REGION.fullmatch(name) if isinstance(name, str) else None
        if found is None:
            continue
        if found.group(3):
            kind_of_name[i] = _FSDP_PREFETCH
        else:
            kind_of_name[i] = _FSDP_KIND[found.group(1)]
            unit_of_name[i] = units.setdefault(found.group(2) or ROOT_UNIT, len(units))
    kind, unit = kind_of_name[codes], unit_of_name[codes]
    if not (kind == _FSDP_GATHER).any() and not (kind == _FSDP_REDUCE).any():
        return none
    start = np.where(launcher >= 0, launcher, rows)  # (a kernel: its launching call's)
    region = _enclosing(parent, start, (kind == _FSDP_GATHER) | (kind == _FSDP_REDUCE), depth=32)
    has = region >= 0
    at = np.maximum(region, 0)
    call_unit = np.where(has, unit[at], -1)
    gather = has & (kind[at] == _FSDP_GATHER)
    # prefetched: a prefetch region is the nearest around its gather, or another unit's pre-hook
    around = _enclosing(parent, at, (kind == _FSDP_PRE) | (kind == _FSDP_PREFETCH), depth=32)
    outer = np.maximum(around, 0)
    prefetched = (around >= 0) & ((kind[outer] == _FSDP_PREFETCH) | (unit[outer] != call_unit))
    needed_at = np.full(n, -1, np.int64)
    needed_at[gather] = _needed(events, parent, kind, unit, at[gather], launcher[gather])
    labels = np.asarray([*units, None], dtype=object)
    return {
        S.UNIT: pa.array(labels[call_unit].tolist(), pa.string()),
        S.PREFETCHED: pa.array(prefetched, pa.bool_(), mask=~gather),
        S.NEEDED_NS: pa.array(needed_at, pa.int64(), mask=needed_at < 0),
    }


def _needed(
    events: pa.Table,
    parent: np.ndarray,
    kind: np.ndarray,
    unit: np.ndarray,
    regions: np.ndarray,
    launcher: np.ndarray,
) -> np.ndarray:
    """For gather calls inside the gather ``regions`` (rows; ``launcher``: each call's launching
    row where it is a kernel), when their unit's next copy-out on the region's thread began, before the unit's next
    gather there (-1: none); for a kernel, the start of the first kernel that copy-out launched."""
    ts = ints(events.column(S.TS_NS), 0)
    thread = np.unique(
        np.stack([ints(events.column(c), 0) for c in (S.RANK, S.PID, S.TID)]),
        axis=1, return_inverse=True,
    )[1].ravel()  # fmt: skip
    copies = np.flatnonzero(kind == _FSDP_COPY_OUT)
    gathers = np.flatnonzero(kind == _FSDP_GATHER)
    out = np.full(len(regions), -1, np.int64)
    if len(copies) == 0:
        return out
    # the first kernel each copy-out launched (its device-side start)
    first_kernel = np.full(events.num_rows, -1, np.int64)
    device_codes, device_names = dictionary_codes(events.column(S.DEVICE))
    on_device = device_codes != (
        device_names.index(S.DEVICE_CPU) if S.DEVICE_CPU in device_names else -2
    )
    if (launcher >= 0).any() and on_device.any():
        kernels = np.flatnonzero(on_device)
        owner = _enclosing(parent, kernels, kind == _FSDP_COPY_OUT, depth=32)
        under = owner >= 0
        big = np.iinfo(np.int64).max
        earliest = np.full(events.num_rows, big, np.int64)
        np.minimum.at(earliest, owner[under], ts[kernels[under]])
        first_kernel = np.where(earliest < big, earliest, -1)
    key = thread * (int(unit.max()) + 1) + unit  # (thread, unit)
    for k in np.unique(key[regions]):
        here = copies[key[copies] == k]
        if len(here) == 0:
            continue
        here = here[np.argsort(ts[here], kind="stable")]
        mine = np.flatnonzero(key[regions] == k)
        later = np.sort(ts[gathers[key[gathers] == k]])
        begun = ts[regions[mine]]
        nxt = np.searchsorted(ts[here], begun, side="right")
        following = np.searchsorted(later, begun, side="right")
        next_gather = np.append(later, np.iinfo(np.int64).max)[following]
        ok = nxt < len(here)
        copy = here[np.minimum(nxt, len(here) - 1)]
        ok &= ts[copy] < next_gather
        device = launcher[mine] >= 0
        when = np.where(device, first_kernel[copy], ts[copy])
        out[mine] = np.where(ok & (when >= 0), when, -1)
    return out


def _call_peers(
    events: pa.Table,
    rows: np.ndarray,
    owner: np.ndarray,
    inner: np.ndarray,
    around: np.ndarray,
    launcher: np.ndarray,
) -> pa.Array:
    """Each call's peer: its own, the one a call nested in it records, or the region's around
    it (``traceview.pg:``)."""
    if S.PEER not in events.column_names:
        return pa.nulls(len(rows), pa.int32())
    peer = ints(events.column(S.PEER), -1)
    best = peer.copy()
    np.maximum.at(best, owner, peer[inner])
    out = best[rows]
    out = np.where((out < 0) & (around >= 0), peer[np.maximum(around, 0)], out)
    out = np.where((out < 0) & (launcher >= 0), best[np.maximum(launcher, 0)], out)  # a kernel
    return pa.array(out, pa.int32(), mask=out < 0)


_PART_SCHEMA = pa.schema(
    [f for f in S.COLLECTIVES_SCHEMA if f.name != S.SEQ] + [pa.field("_id", pa.int64())]
)


def _link_runs(calls: pa.Table, rank: np.ndarray) -> pa.Table:
    """The rank's calls with each worker-run call (``RUN_PREFIX``) linked to the host call of the
    same collective that queued it: its ``issued_ns``, and the process group either names where
    the other does not. Over the rank's whole table, so a call queued in one part and run in the
    next is linked too. (Several ranks' calls, ``rank`` each call's code: each rank's apart.)

    A worker thread serves one process group. Each run votes for its thread's group with the
    group of the latest host call of its collective issued before it began; the thread takes the
    group most of its votes name. A host call without a group takes the group of the first run of
    its collective that began after it. Then runs and host calls are linked first in first out
    per (collective, group) (``_fifo``)."""
    is_run = np.asarray(pc.fill_null(pc.starts_with(calls.column(S.NAME), RUN_PREFIX), False))
    if not is_run.any():
        return calls
    ts = ints(calls.column(S.START_NS), 0)
    # a worker thread: (rank, thread id), as one code
    tid = pair_groups(rank, ints(calls.column(S.TID), 0))[1]
    on_cpu = np.asarray(pc.fill_null(pc.equal(calls.column(S.DEVICE), S.DEVICE_CPU), False))
    kinds, kind_names = dictionary_codes(calls.column(S.COLLECTIVE))
    group_codes, group_names = dictionary_codes(calls.column(S.GROUP))
    group = group_codes.copy()
    peer = ints(calls.column(S.PEER), -1)
    issued_in = np.asarray(calls.column(S.ISSUED_IN).to_pylist(), dtype=object)
    split = np.nan_to_num(
        calls.column(S.SPLIT_IMBALANCE).to_numpy(zero_copy_only=False).astype(np.float64),
        nan=-1.0,
    )
    unit = np.asarray(calls.column(S.UNIT).to_pylist(), dtype=object)
    prefetched = np.asarray(calls.column(S.PREFETCHED).to_pylist(), dtype=object)
    needed = ints(calls.column(S.NEEDED_NS), -1).copy()
    is_issue = ~is_run & on_cpu
    # the queue a call goes through: its collective's, except that gloo runs a reduce-scatter
    # as an all-reduce (FSDP's) on a rank whose runs are all-reduces and no reduce-scatter:
    # those join the all-reduces' queue
    op_codes = kinds.copy()
    if "reduce_scatter" in kind_names and "allreduce" in kind_names:
        scatter, allreduce = kind_names.index("reduce_scatter"), kind_names.index("allreduce")
        ranks = int(rank.max()) + 1
        runs_scatter = np.bincount(rank[is_run & (kinds == scatter)], minlength=ranks) > 0
        runs_allreduce = np.bincount(rank[is_run & (kinds == allreduce)], minlength=ranks) > 0
        joins = runs_allreduce[rank] & ~runs_scatter[rank] & is_issue & (kinds == scatter)
        op_codes = np.where(joins, allreduce, op_codes)
    # and a rank's queues apart from another's
    op_codes = rank * (len(kind_names) + 1) + (op_codes + 1)
    # the threads' groups, from the votes of their runs
    votes_thread, votes_group = [], []
    for code in np.unique(op_codes[is_run]):
        runs = np.flatnonzero(is_run & (op_codes == code))
        issues = np.flatnonzero(is_issue & (op_codes == code))
        if len(issues) == 0:
            continue
        issues = issues[np.argsort(ts[issues], kind="stable")]
        before = np.searchsorted(ts[issues], ts[runs], side="right") - 1
        voted = group[issues[np.maximum(before, 0)]]
        ok = (before >= 0) & (voted >= 0)
        votes_thread.append(tid[runs[ok]])
        votes_group.append(voted[ok])
    if votes_thread:
        threads, groups = np.concatenate(votes_thread), np.concatenate(votes_group)
        if len(threads):
            pairs, inverse = pair_groups(threads, groups)
            counts = np.bincount(inverse)
            best = np.lexsort((-counts, pairs[0]))  # per thread, the most voted group first
            first = np.concatenate(([True], pairs[0, best][1:] != pairs[0, best][:-1]))
            keys, values = pairs[0, best][first], pairs[1, best][first]  # (keys sorted)
            at = np.minimum(np.searchsorted(keys, tid), len(keys) - 1)
            from_thread = np.where(keys[at] == tid, values[at], -1)
            group = np.where(is_run & (group < 0), from_thread, group)
    issued = np.full(calls.num_rows, -1, np.int64)
    for code in np.unique(op_codes[is_run]):
        runs = np.flatnonzero(is_run & (op_codes == code))
        issues = np.flatnonzero(is_issue & (op_codes == code))
        if len(issues) == 0:
            continue
        runs = runs[np.argsort(ts[runs], kind="stable")]
        issues = issues[np.argsort(ts[issues], kind="stable")]
        # a host call without a group: the group of the first run after it
        after = np.searchsorted(ts[runs], ts[issues], side="left")
        unnamed = (group[issues] < 0) & (after < len(runs))
        group[issues[unnamed]] = group[runs[np.minimum(after[unnamed], len(runs) - 1)]]
        for g in np.unique(group[runs]):
            mine = runs[group[runs] == g]
            queued = issues[group[issues] == g]
            if len(queued) == 0:
                continue
            taken = _fifo(ts[queued], ts[mine])
            linked, by = mine[taken >= 0], queued[taken[taken >= 0]]
            issued[linked] = ts[by]
            peer[linked] = np.where(peer[linked] < 0, peer[by], peer[linked])
            kinds[linked] = kinds[by]  # the run is the collective the program asked for
            issued_in[linked] = issued_in[by]
            split[linked] = np.where(split[linked] < 0, split[by], split[linked])
            unit[linked], prefetched[linked], needed[linked] = unit[by], prefetched[by], needed[by]
    names = np.asarray([*group_names, None], dtype=object)[group]
    out = calls.set_column(
        calls.schema.get_field_index(S.GROUP), S.GROUP, pa.array(names.tolist(), pa.string())
    )
    ops = np.asarray([*kind_names, None], dtype=object)[kinds]
    out = out.set_column(
        out.schema.get_field_index(S.COLLECTIVE), S.COLLECTIVE, pa.array(ops.tolist(), pa.string())
    )
    out = out.set_column(
        out.schema.get_field_index(S.ISSUED_IN),
        S.ISSUED_IN,
        pa.array(issued_in.tolist(), pa.string()),
    )
    out = out.set_column(
        out.schema.get_field_index(S.PEER), S.PEER, pa.array(peer, pa.int32(), mask=peer < 0)
    )
    out = out.set_column(
        out.schema.get_field_index(S.SPLIT_IMBALANCE),
        S.SPLIT_IMBALANCE,
        pa.array(split, pa.float64(), mask=split < 0),
    )
    for name, column in (
        (S.UNIT, pa.array(unit.tolist(), pa.string())),
        (S.PREFETCHED, pa.array(prefetched.tolist(), pa.bool_())),
        (S.NEEDED_NS, pa.array(needed, pa.int64(), mask=needed < 0)),
    ):
        out = out.set_column(out.schema.get_field_index(name), name, column)
    return out.append_column(S.ISSUED_NS, pa.array(issued, pa.int64(), mask=issued < 0))


def combine_collectives(parts: list[pa.Table]) -> pa.Table:
    """The rank's collective calls (schema.COLLECTIVES_SCHEMA) from ``collectives_part`` of
    disjoint rows, in time order, each numbered (``seq``) by its place among the rank's calls of
    the same view (name and collective) in time order. Parts of several ranks (``RowParts`` of
    a batch of ranks) give each rank's calls so, rank after rank."""
    calls = pa.concat_tables(parts) if parts else S.empty(_PART_SCHEMA)
    if calls.num_rows == 0:
        return S.empty(S.COLLECTIVES_SCHEMA)
    ids = ints(calls.column("_id"), 0)
    calls = calls.take(pa.array(np.argsort(ids, kind="stable")))  # in event order
    ts = ints(calls.column(S.START_NS), 0)
    rank = rank_codes(ints(calls.column(S.RANK), 0))[0]
    key = pc.binary_join_element_wise(calls.column(S.NAME), calls.column(S.COLLECTIVE), "\x00")
    _, group = np.unique(np.asarray(key.to_pylist(), dtype=object), return_inverse=True)
    group = pair_groups(rank, np.asarray(group, np.int64).ravel())[1]  # (per rank)
    order = np.lexsort((ts, group))
    seq = np.empty(calls.num_rows, np.int64)
    sorted_group = group[order]
    first = np.concatenate(([True], sorted_group[1:] != sorted_group[:-1]))
    start_of_group = np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
    seq[order] = np.arange(len(order)) - start_of_group
    table = calls.drop_columns(["_id"]).append_column(S.SEQ, pa.array(seq, pa.int64()))
    table = _link_runs(table, rank)
    if S.ISSUED_NS not in table.column_names:
        table = table.append_column(S.ISSUED_NS, pa.nulls(table.num_rows, pa.int64()))
    table = S.conform(table, S.COLLECTIVES_SCHEMA)
    return table.take(pa.array(np.lexsort((ts, rank))))  # (each rank's in time order)
