"""The ops table: per rank, device, kind, phase and canonical operator, how often and how long.

``count``/``total``/percentiles count an operator once where it nests inside itself (aten::conv2d
around aten::convolution are both "convolution"); ``self`` adds the time of every event mapped to
the operator that no child event covers, so self times add up to the thread's busy time.
Grouping works on dictionary codes with numpy: no per-event Python, no copies of the names.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from traceview.model import schema as S
from traceview.model.columns import ints, parent_rows, unique_inverse

_COUNTED_KINDS = (S.KIND_OP, S.KIND_ANNOTATION, *S.DEVICE_ACTIVITY_KINDS)


_KEYS = (S.DEVICE, S.KIND, S.PHASE, S.OP)
_NAMED = (*_KEYS, S.NAME)


@dataclass
class OpsPart:
    """What some of one rank's events add to its ops table (``ops_part``): parts of disjoint
    rows ``combine_ops`` into the table the rank's events give in one piece."""

    rank: int
    groups: pl.DataFrame  # per (device, kind, phase, op): count, total, self, bytes, known
    # the outermost events' durations, sorted by group (its index in ``groups``) and duration;
    # group g's are durations[offsets[g]:offsets[g + 1]]
    durations: np.ndarray
    offsets: np.ndarray
    names: pl.DataFrame  # per group index and name: how many of the group's events carry it
    first_seen: dict[str, pl.DataFrame]  # per column of _NAMED: value, the lowest event id


def _codes(column: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """A column as codes into its distinct values (-1: null), whatever dictionaries (with
    repeated values) its chunks hold."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not pa.types.is_dictionary(array.type):
        array = array.dictionary_encode()
    distinct: dict[str, int] = {}
    lut = np.array(
        [distinct.setdefault(str(v), len(distinct)) for v in array.dictionary.to_pylist()] + [-1],
        np.int64,
    )
    indices = pc.fill_null(array.indices, len(lut) - 1).to_numpy(zero_copy_only=False)
    return lut[np.asarray(indices, np.int64)], list(distinct)


def _first_seen(codes: np.ndarray, values: list[str], ids: np.ndarray) -> pl.DataFrame:
    """Per value among ``codes``, the lowest event id that carries it."""
    first = np.full(len(values), np.iinfo(np.int64).max, np.int64)
    known = codes >= 0
    np.minimum.at(first, codes[known], ids[known])
    seen = np.flatnonzero(first < np.iinfo(np.int64).max)
    return pl.DataFrame(
        {"value": [values[i] for i in seen.tolist()], "id": first[seen]},
        schema={"value": pl.String, "id": pl.Int64},
    )


def ops_part(
    events: pa.Table, counted: np.ndarray | None = None, parent: np.ndarray | None = None
) -> OpsPart:
    """The ops-table part of the rows of ``events`` where ``counted`` (default: all); the other
    rows are context (an event's parent may be among them; ``parent``: each row's parent row,
    ``arrays.parent_rows``, where the caller has it). Grouping works on dictionary codes with
    numpy: no per-event Python, no copies of the names."""
    n = events.num_rows
    rank = int(events.column(S.RANK)[0].as_py()) if n else 0
    rows = np.arange(n) if counted is None else np.flatnonzero(counted)
    ids = ints(events.column(S.EVENT_ID), 0)
    coded = {name: _codes(events.column(name)) for name in _NAMED}
    first_seen = {
        name: _first_seen(codes[rows], values, ids[rows]) for name, (codes, values) in coded.items()
    }
    op, _ = coded[S.OP]
    kind, kinds = coded[S.KIND]
    if parent is None:
        parent = parent_rows(events)
    parent_op = np.where(parent >= 0, op[np.maximum(parent, 0)], -1)
    outer = parent_op != op  # not nested in an event of the same operator
    countable = np.array([k in _COUNTED_KINDS for k in kinds] + [False])
    rows = rows[countable[kind[rows]] & (op[rows] >= 0)]
    dur = ints(events.column(S.DUR_NS), 0)[rows]
    self_ns = pc.fill_null(events.column(S.SELF_NS), events.column(S.DUR_NS))
    self_ns = np.asarray(self_ns.to_numpy(), np.int64)[rows]
    nbytes = ints(events.column(S.BYTES), -1)[rows]
    is_outer = outer[rows]
    has_bytes = is_outer & (nbytes >= 0)
    key_codes = [coded[k][0][rows] + 1 for k in _KEYS]  # 0: null
    sizes = tuple(len(coded[k][1]) + 1 for k in _KEYS)
    key = np.ravel_multi_index(key_codes, sizes) if len(rows) else np.zeros(0, np.int64)
    keys, group = unique_inverse(key)
    group = np.asarray(group, np.int64).ravel()
    g = len(keys)

    def total(values: np.ndarray) -> np.ndarray:
        return np.bincount(group, weights=values, minlength=g).astype(np.int64)

    columns: dict[str, object] = {"group": np.arange(g, dtype=np.int64)}
    for k, codes in zip(_KEYS, np.unravel_index(keys, sizes), strict=True):
        values = coded[k][1]
        columns[k] = pl.Series([values[c - 1] if c > 0 else None for c in codes.tolist()])
    columns[S.COUNT] = total(is_outer)
    columns[S.TOTAL_NS] = total(np.where(is_outer, dur, 0))
    columns[S.SELF_NS] = total(self_ns)
    columns[S.BYTES] = total(np.where(has_bytes, nbytes, 0))
    columns["known"] = np.bincount(group, weights=has_bytes, minlength=g) > 0
    outer_group, outer_dur = group[is_outer], dur[is_outer]
    order = np.lexsort((outer_dur, outer_group))
    name_codes, names = coded[S.NAME]
    pair, pair_counts = np.unique(
        group * (len(names) + 1) + (name_codes[rows] + 1), return_counts=True
    )
    pair_name = pair % (len(names) + 1) - 1
    return OpsPart(
        rank=rank,
        groups=pl.DataFrame(columns, schema_overrides={k: pl.String for k in _KEYS}),
        durations=outer_dur[order],
        offsets=np.searchsorted(outer_group[order], np.arange(g + 1)),
        names=pl.DataFrame(
            {
                "group": pair // (len(names) + 1),
                S.NAME: pl.Series([names[c] if c >= 0 else None for c in pair_name.tolist()]),
                "n": pair_counts.astype(np.int64),
            },
            schema_overrides={S.NAME: pl.String},
        ),
        first_seen=first_seen,
    )


def _order(seen: pl.DataFrame) -> dict[str, int]:
    """Each value's place by the event in which it first appears."""
    return {v: i for i, v in enumerate(seen.sort("id")["value"].to_list())}


def combine_ops(parts: list[OpsPart]) -> pa.Table:
    """The ops table (schema.OPS_SCHEMA) of one rank from the parts of its events."""
    parts = [p for p in parts if p.groups.height]
    if not parts:
        return S.OPS_SCHEMA.empty_table()
    rank = parts[0].rank
    keyed = [p.groups.with_columns(pl.lit(i).alias("part")) for i, p in enumerate(parts)]
    every = pl.concat(keyed)
    merged = every.group_by(list(_KEYS)).agg(
        pl.col(S.COUNT).sum(),
        pl.col(S.TOTAL_NS).sum(),
        pl.col(S.SELF_NS).sum(),
        pl.col(S.BYTES).sum(),
        pl.col("known").any(),
    )
    # ties (in self time, in how often a name is seen) go to the values seen first
    seen = {
        name: _order(
            pl.concat([p.first_seen[name] for p in parts]).group_by("value").agg(pl.col("id").min())
        )
        for name in _NAMED
    }
    place = [
        pl.col(k).replace_strict(seen[k], default=-1, return_dtype=pl.Int64).alias(f"_{k}")
        for k in _KEYS
    ]
    merged = merged.with_columns(place).sort([f"_{k}" for k in _KEYS], nulls_last=False)
    merged = merged.with_row_index("index")
    # each part's group index → the merged one
    lookup = every.join(merged.select(*_KEYS, "index"), on=list(_KEYS), nulls_equal=True).select(
        "part", "group", "index"
    )
    n = merged.height
    # each group's durations, from every part that has the group (each part's sorted)
    pieces: list[list[np.ndarray]] = [[] for _ in range(n)]
    for i, part in enumerate(parts):
        mine = lookup.filter(pl.col("part") == i).sort("group")
        for local, index in zip(mine["group"].to_list(), mine["index"].to_list(), strict=True):
            lo, hi = part.offsets[local], part.offsets[local + 1]
            if hi > lo:
                pieces[index].append(part.durations[lo:hi])
    p50, p95 = np.zeros(n), np.zeros(n)
    for index, found in enumerate(pieces):
        if not found:
            continue
        dur = found[0] if len(found) == 1 else np.sort(np.concatenate(found))
        for q, out in ((0.5, p50), (0.95, p95)):
            pos = (len(dur) - 1) * q
            lo, hi = int(np.floor(pos)), int(np.ceil(pos))
            out[index] = dur[lo] + (dur[hi] - dur[lo]) * (pos - lo)
    del pieces
    # the framework name seen most often in each group (ties: the one seen first)
    names = (
        pl.concat([p.names.with_columns(pl.lit(i).alias("part")) for i, p in enumerate(parts)])
        .join(lookup, on=["part", "group"])
        .group_by("index", S.NAME)
        .agg(pl.col("n").sum())
        .with_columns(
            pl.col(S.NAME)
            .replace_strict(seen[S.NAME], default=-1, return_dtype=pl.Int64)
            .alias("_name")
        )
        .sort("index", "n", "_name", descending=[False, True, False])
        .unique("index", keep="first")
        .sort("index")
    )
    top = dict(zip(names["index"].to_list(), names[S.NAME].to_list(), strict=True))
    count = merged[S.COUNT].to_numpy().astype(np.int64)
    total = merged[S.TOTAL_NS].to_numpy().astype(np.int64)
    table = pa.table(
        {
            S.RANK: pa.array(np.full(n, rank, np.int32)),
            **{k: [v if v is not None else "" for v in merged[k].to_list()] for k in _KEYS},
            S.NAME: [top.get(i) or "" for i in range(n)],
            S.COUNT: count,
            S.TOTAL_NS: total,
            S.SELF_NS: merged[S.SELF_NS].to_numpy().astype(np.int64),
            S.MEAN_NS: total / np.maximum(count, 1),
            S.P50_NS: p50,
            S.P95_NS: p95,
            S.BYTES: pa.array(
                merged[S.BYTES].to_numpy().astype(np.int64), pa.int64(),
                mask=~merged["known"].to_numpy().astype(bool),
            ),
        }
    )  # fmt: skip
    table = table.sort_by([(S.SELF_NS, "descending")])
    return S.conform(table, S.OPS_SCHEMA)


def op_stats(events: pa.Table) -> pa.Table:
    """The ops table (schema.OPS_SCHEMA) of one or more ranks' events."""
    if events.num_rows == 0:
        return S.OPS_SCHEMA.empty_table()
    ranks = np.unique(ints(events.column(S.RANK), 0))
    if len(ranks) == 1:
        return combine_ops([ops_part(events)])
    parts = [
        combine_ops([ops_part(events.filter(pc.equal(events.column(S.RANK), int(r))))])
        for r in ranks
    ]
    return pa.concat_tables(parts)
