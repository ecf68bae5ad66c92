"""The ops table: per rank, device, kind, phase and canonical operator, how often and how long.

``count``/``total``/percentiles count an operator once where it nests inside itself (aten::conv2d
around aten::convolution are both "convolution"); ``self`` adds the time of every event mapped to
the operator that no child event covers, so self times add up to the thread's busy time.
Grouping works on dictionary codes with numpy: no per-event Python, no copies of the names.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traceview import schema as S
from traceview.arrays import ints

_COUNTED_KINDS = (S.KIND_OP, S.KIND_ANNOTATION, *S.DEVICE_ACTIVITY_KINDS)


def _codes(column: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not pa.types.is_dictionary(array.type):
        array = array.dictionary_encode()
    values = [str(v) for v in array.dictionary.to_pylist()]
    codes = np.asarray(
        pc.fill_null(array.indices, -1).to_numpy(zero_copy_only=False), dtype=np.int64
    )
    # codes in the order the values first appear (rows in event order): ties (in self time,
    # in how often a name is seen) go to the earlier, whatever the column's dictionary holds
    # (a rank normalized in chunks and read back is encoded otherwise than one normalized
    # whole, and its dictionary may hold values no row uses)
    seen = codes[codes >= 0]
    uniq, first = np.unique(seen, return_index=True)
    order = uniq[np.argsort(first, kind="stable")]
    rank = np.full(len(values) + 1, -1, np.int64)
    rank[order] = np.arange(len(order))
    return rank[codes], [values[i] for i in order.tolist()]


def _rank_ops(events: pa.Table, rank: int) -> pa.Table:
    device, devices = _codes(events.column(S.DEVICE))
    kind, kinds = _codes(events.column(S.KIND))
    phase, phases = _codes(events.column(S.PHASE))
    op, ops = _codes(events.column(S.OP))
    name, names = _codes(events.column(S.NAME))
    dur = ints(events.column(S.DUR_NS), 0)
    self_ns = np.asarray(
        pc.fill_null(events.column(S.SELF_NS), events.column(S.DUR_NS)).to_numpy(), np.int64
    )
    nbytes = ints(events.column(S.BYTES), -1)
    ids = ints(events.column(S.EVENT_ID), 0)
    parent = ints(events.column(S.PARENT), -1)

    counted = np.isin(kind, [kinds.index(k) for k in _COUNTED_KINDS if k in kinds]) & (op >= 0)
    row_of_id = np.full(int(ids.max(initial=0)) + 1, -1, np.int64)
    row_of_id[ids] = np.arange(len(ids))
    parent_row = np.where(parent >= 0, row_of_id[np.clip(parent, 0, len(row_of_id) - 1)], -1)
    parent_op = np.where(parent_row >= 0, op[np.maximum(parent_row, 0)], -1)
    outer = parent_op != op  # not nested in an event of the same operator

    rows = np.flatnonzero(counted)
    if len(rows) == 0:
        return S.OPS_SCHEMA.empty_table()
    sizes = (len(devices) + 1, len(kinds) + 1, len(phases) + 1, len(ops) + 1)
    key = np.ravel_multi_index(
        (device[rows] + 1, kind[rows] + 1, phase[rows] + 1, op[rows] + 1), sizes
    )
    groups, group = np.unique(key, return_inverse=True)
    n = len(groups)
    is_outer = outer[rows]
    count = np.bincount(group, weights=is_outer, minlength=n).astype(np.int64)
    total = np.bincount(group, weights=np.where(is_outer, dur[rows], 0), minlength=n).astype(
        np.int64
    )
    self_total = np.bincount(group, weights=self_ns[rows], minlength=n).astype(np.int64)
    has_bytes = is_outer & (nbytes[rows] >= 0)
    byte_total = np.bincount(
        group, weights=np.where(has_bytes, nbytes[rows], 0), minlength=n
    ).astype(np.int64)
    byte_known = np.bincount(group, weights=has_bytes, minlength=n) > 0

    # percentiles of the outermost durations, per group: sort by (group, duration)
    o_group, o_dur = group[is_outer], dur[rows][is_outer]
    order = np.lexsort((o_dur, o_group))
    o_group, o_dur = o_group[order], o_dur[order]
    starts = np.searchsorted(o_group, np.arange(n), side="left")
    sizes_g = np.bincount(o_group, minlength=n)
    p50 = np.zeros(n)
    p95 = np.zeros(n)
    has = sizes_g > 0
    for q, out in ((0.5, p50), (0.95, p95)):
        pos = (sizes_g[has] - 1) * q
        lo, hi = np.floor(pos).astype(np.int64), np.ceil(pos).astype(np.int64)
        base = starts[has]
        out[has] = o_dur[base + lo] + (o_dur[base + hi] - o_dur[base + lo]) * (pos - lo)

    # the framework name seen most often in each group
    pair = group * (len(names) + 1) + (name[rows] + 1)
    pairs, pair_counts = np.unique(pair, return_counts=True)
    pair_group = pairs // (len(names) + 1)
    best = np.lexsort((-pair_counts, pair_group))
    first = np.searchsorted(pair_group[best], np.arange(n), side="left")
    top_name = (pairs[best][first] % (len(names) + 1)) - 1

    d, k, ph, o = np.unravel_index(groups, sizes)
    label = lambda values, codes: [values[c - 1] if c > 0 else "" for c in codes.tolist()]  # noqa: E731
    table = pa.table(
        {
            S.RANK: pa.array(np.full(n, rank, np.int32)),
            S.DEVICE: label(devices, d),
            S.KIND: label(kinds, k),
            S.PHASE: label(phases, ph),
            S.OP: label(ops, o),
            S.NAME: [names[c] if c >= 0 else "" for c in top_name.tolist()],
            S.COUNT: count,
            S.TOTAL_NS: total,
            S.SELF_NS: self_total,
            S.MEAN_NS: total / np.maximum(count, 1),
            S.P50_NS: p50,
            S.P95_NS: p95,
            S.BYTES: pa.array(byte_total, pa.int64(), mask=~byte_known),
        }
    )
    table = table.sort_by([(S.SELF_NS, "descending")])
    return S.conform(table, S.OPS_SCHEMA)


def op_stats(events: pa.Table) -> pa.Table:
    """The ops table (schema.OPS_SCHEMA) of one or more ranks' events."""
    if events.num_rows == 0:
        return S.OPS_SCHEMA.empty_table()
    ranks = np.unique(ints(events.column(S.RANK), 0))
    if len(ranks) == 1:
        return _rank_ops(events, int(ranks[0]))
    parts = [
        _rank_ops(events.filter(pc.equal(events.column(S.RANK), int(r))), int(r)) for r in ranks
    ]
    return pa.concat_tables(parts)
