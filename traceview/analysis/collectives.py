"""A rank's collective calls: the small table cross-rank passes match across ranks, so they run
on per-rank results without reading events.

A call is an event the rules mark as a collective that no enclosing event is also one: the
outermost view of each call on its thread or stream (``c10d::allreduce_`` on the training
thread, ``gloo:all_reduce`` on gloo's thread, a KVStore push/pull, a TensorFlow collective op).
Views are kept apart (``name``) and numbered in time order per (name, collective): ``seq`` is the
rank's n-th call of that view, the key to match it with the other ranks' n-th. A call's bytes
and process group are its own or those a collective event inside it records (c10d::allreduce_
records neither, the record_param_comms inside it does); the group is null where the trace does
not name it (gloo's CPU collectives in Kineto traces, TensorFlow, MXNet).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traceview import schema as S
from traceview.arrays import dictionary_codes, ints


def _parent_rows(events: pa.Table) -> np.ndarray:
    """Row index of each event's parent (-1: none); ids are row numbers as normalize writes them."""
    ids = ints(events.column(S.EVENT_ID), 0)
    parent = ints(events.column(S.PARENT), -1)
    if np.array_equal(ids, np.arange(len(ids))):
        return parent
    row_of_id = np.full(int(ids.max(initial=-1)) + 1, -1, np.int64)
    row_of_id[ids] = np.arange(len(ids))
    return np.where(parent >= 0, row_of_id[np.clip(parent, 0, max(len(row_of_id) - 1, 0))], -1)


def _outermost(parent_row: np.ndarray, is_collective: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The collective rows no ancestor of which is a collective, and for every other collective
    row the outermost one it is inside. Walks up from the collective rows only (a few per step),
    one level per round."""
    rows = np.flatnonzero(is_collective)
    owner = np.full(len(rows), -1, np.int64)
    current = parent_row[rows]
    while (current >= 0).any():
        owner = np.where((current >= 0) & is_collective[np.maximum(current, 0)], current, owner)
        current = np.where(current >= 0, parent_row[np.maximum(current, 0)], -1)
    return rows[owner < 0], np.stack([rows[owner >= 0], owner[owner >= 0]])


def collective_calls(events: pa.Table) -> pa.Table:
    """The collective calls of one rank's events (schema.COLLECTIVES_SCHEMA), in time order."""
    if events.num_rows == 0:
        return S.COLLECTIVES_SCHEMA.empty_table()
    is_collective = np.asarray(pc.is_valid(events.column(S.COLLECTIVE)), bool)
    if not is_collective.any():
        return S.COLLECTIVES_SCHEMA.empty_table()
    rows, (inner, owner) = _outermost(_parent_rows(events), is_collective)
    calls = events.take(pa.array(rows))
    ts = ints(calls.column(S.TS_NS), 0)
    end = ts + ints(calls.column(S.DUR_NS), 0)
    # bytes: the call's own, or the most a collective nested in it records; its process group:
    # its own, or the one a collective nested in it names (NCCL's record_param_comms)
    size = ints(events.column(S.BYTES), -1)
    best = size.copy()
    np.maximum.at(best, owner, size[inner])
    call_bytes = best[rows]
    group_codes, group_names = dictionary_codes(events.column(S.GROUP))
    named = group_codes.copy()
    np.maximum.at(named, owner, group_codes[inner])
    call_group = np.where(group_codes[rows] >= 0, group_codes[rows], named[rows])
    names = calls.column(S.NAME).cast(pa.string())
    kinds = calls.column(S.COLLECTIVE).cast(pa.string())
    # seq: the call's place among the rank's calls of the same view, in time order
    key = pc.binary_join_element_wise(names, kinds, "\x00")
    _, group = np.unique(np.asarray(key.to_pylist(), dtype=object), return_inverse=True)
    group = np.asarray(group, np.int64).ravel()
    order = np.lexsort((ts, group))
    seq = np.empty(len(rows), np.int64)
    sorted_group = group[order]
    first = np.concatenate(([True], sorted_group[1:] != sorted_group[:-1]))
    start_of_group = np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
    seq[order] = np.arange(len(order)) - start_of_group
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
            S.SEQ: pa.array(seq, pa.int64()),
            S.BYTES: pa.array(call_bytes, pa.int64(), mask=call_bytes < 0),
            S.START_NS: pa.array(ts, pa.int64()),
            S.END_NS: pa.array(end, pa.int64()),
        }
    )
    table = S.conform(table, S.COLLECTIVES_SCHEMA)
    return table.take(pa.array(np.argsort(ints(table.column(S.START_NS)), kind="stable")))
