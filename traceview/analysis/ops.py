"""The ops table: per rank, step, device, kind, phase and canonical operator, how often and how
long. A step of null holds what ran outside every step (set-up before the first, teardown after
the last); a report counts the rows of its counted steps (``summary``'s top operators).

``count``/``total``/percentiles count an operator once where it nests inside itself (aten::conv2d
around aten::convolution are both "convolution"); ``self`` adds the time of every event mapped to
the operator that no child event covers, so self times add up to the thread's busy time.
Grouping works on dictionary codes with numpy: no per-event Python, no copies of the names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from traceview.model import schema as S
from traceview.model.columns import distinct as sorted_distinct
from traceview.model.columns import (
    group_quantile,
    ints,
    parent_rows,
    rank_codes,
    sorted_in_groups,
    unique_inverse,
)

_COUNTED_KINDS = (S.KIND_OP, S.KIND_ANNOTATION, *S.DEVICE_ACTIVITY_KINDS)


_NAMED_KEYS = (S.DEVICE, S.KIND, S.PHASE, S.OP)
_KEYS = (S.STEP, *_NAMED_KEYS)
_RANK_KEYS = (S.RANK, *_KEYS)
_NAMED = (*_NAMED_KEYS, S.NAME)


@dataclass
class Coded:
    """A column as codes into its distinct values (-1: null)."""

    codes: np.ndarray
    values: list

    def named_codes(self) -> np.ndarray:
        """The codes some row holds (a part's dictionary may hold more values)."""
        seen = np.bincount(self.codes[self.codes >= 0], minlength=len(self.values))
        return np.flatnonzero(seen)

    def numbers(self) -> np.ndarray:
        """A rank or step column's values as int64 (a null: -1; no rank or step is negative)."""
        return np.fromiter(
            (-1 if v is None else v for v in self.values), np.int64, len(self.values)
        )

    def at(self, rows: np.ndarray) -> Coded:
        """The codes of ``rows``, into the same values."""
        return Coded(self.codes[rows], self.values)


@dataclass
class OpsPart:
    """What some of one rank's events add to its ops table (``ops_part``): parts of disjoint
    rows ``combine_ops`` into the table the rank's events give in one piece. (Events of several
    ranks, ``RowParts`` of a batch of ranks: each rank's groups apart, its rows as its own.)"""

    # per group (a distinct rank, step, device, kind, phase, op): each key's code into its
    # distinct values (-1: null)...
    keys: dict[str, Coded]
    # ...how many outermost events, their total, the self time, the bytes (and whether any is
    # known)
    count: np.ndarray
    total: np.ndarray
    self_ns: np.ndarray
    nbytes: np.ndarray
    known: np.ndarray
    # the outermost events' durations, sorted by group (its index above) and duration;
    # group g's are durations[offsets[g]:offsets[g + 1]]
    durations: np.ndarray
    offsets: np.ndarray
    # per (group, name) pair: how many of the group's events carry the name
    name_group: np.ndarray
    name: Coded
    name_count: np.ndarray
    # per column of _NAMED: rank -> value -> the lowest event id
    first_seen: dict[str, dict[int, dict[str, int]]]


def _codes(column: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """A column as codes into its distinct values (-1: null), whatever dictionaries (with
    repeated values) its chunks hold."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not pa.types.is_dictionary(array.type):
        array = array.dictionary_encode()
    values = array.dictionary
    indices = pc.fill_null(array.indices, len(values)).to_numpy(zero_copy_only=False)
    indices = np.array(indices, np.int64)  # (a copy: written below)
    if _plain_strings(values):  # (each value once: its code is its place)
        indices[indices == len(values)] = -1
        return indices, values.to_pylist()
    distinct: dict[str, int] = {}
    lut = np.array(
        [distinct.setdefault(str(v), len(distinct)) for v in values.to_pylist()] + [-1],
        np.int64,
    )
    return lut[indices], list(distinct)


def _plain_strings(values: pa.Array) -> bool:
    """Whether a dictionary holds strings, none null and none twice."""
    return (
        (pa.types.is_string(values.type) or pa.types.is_large_string(values.type))
        and values.null_count == 0
        and len(pc.unique(values)) == len(values)
    )


def _first_seen(
    codes: np.ndarray, values: list[str], ids: np.ndarray, rank: np.ndarray, ranks: list[int]
) -> dict[int, dict[str, int]]:
    """Per rank and value among ``codes`` (``rank``: each row's code into ``ranks``), the lowest
    event id that carries it."""
    width = max(len(values), 1)
    first = np.full(len(ranks) * width, np.iinfo(np.int64).max, np.int64)
    known = codes >= 0
    np.minimum.at(first, rank[known] * width + codes[known], ids[known])
    out: dict[int, dict[str, int]] = {}
    for i, r in enumerate(ranks):
        mine = first[i * width : (i + 1) * width]
        seen = np.flatnonzero(mine < np.iinfo(np.int64).max)
        out[r] = dict(zip([values[j] for j in seen.tolist()], mine[seen].tolist(), strict=True))
    return out


def ops_part(
    events: pa.Table, counted: np.ndarray | None = None, parent: np.ndarray | None = None
) -> OpsPart:
    """The ops-table part of the rows of ``events`` where ``counted`` (default: all); the other
    rows are context (an event's parent may be among them; ``parent``: each row's parent row,
    ``arrays.parent_rows``, where the caller has it). Grouping works on dictionary codes with
    numpy: no per-event Python, no copies of the names."""
    n = events.num_rows
    rows = np.arange(n) if counted is None else np.flatnonzero(counted)
    ids = ints(events.column(S.EVENT_ID), 0)
    rank, ranks = rank_codes(ints(events.column(S.RANK), 0))
    coded: dict[str, tuple[np.ndarray, list[Any]]] = {n: _codes(events.column(n)) for n in _NAMED}
    first_seen = {
        name: _first_seen(codes[rows], values, ids[rows], rank[rows], ranks)
        for name, (codes, values) in coded.items()
    }
    coded[S.RANK] = (rank, ranks)
    step = ints(events.column(S.STEP), -1)
    steps = np.unique(step[rows]).tolist()
    coded[S.STEP] = (np.searchsorted(np.asarray(steps, np.int64), step), steps)
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
    key_codes = [coded[k][0][rows] + 1 for k in _RANK_KEYS]  # 0: null
    sizes = tuple(len(coded[k][1]) + 1 for k in _RANK_KEYS)
    key = np.ravel_multi_index(key_codes, sizes) if len(rows) else np.zeros(0, np.int64)
    keys, group = unique_inverse(key)
    group = np.asarray(group, np.int64).ravel()
    g = len(keys)

    def total(values: np.ndarray) -> np.ndarray:
        summed = np.zeros(g, np.int64)
        np.add.at(summed, group, values)
        return summed

    distinct: dict[str, list[Any]] = {k: coded[k][1] for k in _RANK_KEYS}
    distinct[S.STEP] = [None if v < 0 else v for v in steps]  # (-1: no step)
    group_codes = {
        k: np.asarray(codes, np.int64) - 1  # (0 above: null)
        for k, codes in zip(_RANK_KEYS, np.unravel_index(keys, sizes), strict=True)
    }
    if steps and steps[0] < 0:  # (the step of -1: null)
        group_codes[S.STEP][group_codes[S.STEP] == 0] = -1
    outer_group, outer_dur = group[is_outer], dur[is_outer]
    order = np.lexsort((outer_dur, outer_group))
    name_codes, names = coded[S.NAME]
    pair, pair_counts = np.unique(
        group * (len(names) + 1) + (name_codes[rows] + 1), return_counts=True
    )
    pair_name = pair % (len(names) + 1) - 1
    return OpsPart(
        keys={k: Coded(group_codes[k], distinct[k]) for k in _RANK_KEYS},
        count=total(is_outer.astype(np.int64)),
        total=total(np.where(is_outer, dur, 0)),
        self_ns=total(self_ns),
        nbytes=total(np.where(has_bytes, nbytes, 0)),
        known=np.bincount(group, weights=has_bytes, minlength=g) > 0,
        durations=outer_dur[order],
        offsets=np.searchsorted(outer_group[order], np.arange(g + 1)),
        name_group=pair // (len(names) + 1),
        name=Coded(np.asarray(pair_name, np.int64), names),
        name_count=pair_counts.astype(np.int64),
        first_seen=first_seen,
    )


def _places(parts: list[OpsPart]) -> dict[str, Any]:
    """Per column of _NAMED, per rank, each value's place by the event in which it first
    appears on the rank, over every part (ties in self time, in how often a name is seen, go to
    the values seen first), a rank's places after those of the ranks before it; the ranks and
    steps in order (their distinct numbers sorted: a number's place is where it is found)."""
    places: dict[str, Any] = {}
    for column in _NAMED:
        first: dict[int, dict[str, int]] = {}
        for part in parts:
            for rank, seen in part.first_seen[column].items():
                mine = first.setdefault(rank, {})
                for value, event in seen.items():
                    if event < mine.get(value, event + 1):
                        mine[value] = event
        place, at = {}, 0
        for rank in sorted(first):
            mine = first[rank]
            place[rank] = {v: at + i for i, v in enumerate(sorted(mine, key=mine.__getitem__))}
            at += len(mine)
        places[column] = place
    for column in (S.RANK, S.STEP):  # in order (a null step first)
        present = [p.keys[column].numbers()[p.keys[column].named_codes()] for p in parts]
        numbers = np.unique(np.concatenate(present))
        places[column] = numbers[numbers >= 0]
    return places


def _placed(column: Coded, place: Any, rank: Coded | None = None) -> np.ndarray:
    """Each code's value's place (a null's: -1, before every value): a rank's or step's where
    its number is among the sorted ``place``; a named value's a lookup a distinct value (with
    ``rank``, each code's rank where the places are per rank: a distinct pair)."""
    codes = column.codes
    if rank is None:
        numbers = column.numbers()
        at = np.where(numbers >= 0, np.searchsorted(place, numbers), -1)
        return np.append(at, -1)[codes]  # (a code of -1, the last: a null's)
    width = len(column.values) + 1
    pairs, inverse = np.unique(rank.codes * width + (codes + 1), return_inverse=True)
    values = [None, *column.values]
    found = [
        -1 if values[c] is None else place[rank.values[r]][values[c]]
        for r, c in zip((pairs // width).tolist(), (pairs % width).tolist(), strict=True)
    ]
    return np.asarray(found, np.int64)[np.asarray(inverse).ravel()]


def _in_place_order(place: dict[int, dict[str, int]]) -> list[str]:
    """The values of per-rank places, in the order of their places."""
    return [v for rank in sorted(place) for v in sorted(place[rank], key=place[rank].__getitem__)]


def combine_ops(parts: list[OpsPart]) -> pa.Table:
    """The ops table (schema.OPS_SCHEMA) of one rank from the parts of its events."""
    parts = [p for p in parts if len(p.count)]
    if not parts:
        return S.empty(S.OPS_SCHEMA)
    places = _places(parts)
    # each part's groups as rows of their keys' places; the merged groups are the distinct rows,
    # in the order of the places (a null first)
    placed = np.concatenate(
        [
            np.stack(
                [
                    _placed(p.keys[k], places[k], p.keys[S.RANK] if k in _NAMED else None)
                    for k in _RANK_KEYS
                ],
                axis=1,
            )
            for p in parts
        ]
    )
    merged_keys, index = _unique_rows(placed)
    n = len(merged_keys)
    starts = np.cumsum([0] + [len(p.count) for p in parts])

    def summed(values: list[np.ndarray]) -> np.ndarray:
        out = np.zeros(n, np.int64)
        np.add.at(out, index, np.concatenate(values).astype(np.int64))
        return out

    count = summed([p.count for p in parts])
    total = summed([p.total for p in parts])
    self_ns = summed([p.self_ns for p in parts])
    nbytes = summed([p.nbytes for p in parts])
    known = summed([p.known for p in parts]) > 0
    p50, p95 = _percentiles(parts, index, starts, n)
    top = _top_names(parts, index, starts, places[S.NAME], n)
    key_names: dict[str, list[Any]] = {
        k: _in_place_order(places[k]) if k in _NAMED else places[k].tolist() for k in _RANK_KEYS
    }
    table = pa.table(
        {
            S.RANK: pa.array(np.asarray(key_names[S.RANK], np.int32)[merged_keys[:, 0]]),
            # (a place of -1: a null step, an empty name)
            S.STEP: _taken_ints(key_names[S.STEP], merged_keys[:, 1]),
            **{
                k: _taken_strings(key_names[k], merged_keys[:, j])
                for j, k in enumerate(_RANK_KEYS)
                if k not in (S.RANK, S.STEP)
            },
            S.NAME: _taken_strings(top[1], top[0]),
            S.COUNT: count,
            S.TOTAL_NS: total,
            S.SELF_NS: self_ns,
            S.MEAN_NS: total / np.maximum(count, 1),
            S.P50_NS: p50,
            S.P95_NS: p95,
            S.BYTES: pa.array(nbytes, pa.int64(), mask=~known),
        }
    )  # fmt: skip
    table = table.sort_by([(S.RANK, "ascending"), (S.SELF_NS, "descending")])  # (stable)
    return S.conform(table, S.OPS_SCHEMA)


def _taken_strings(values: list[str], codes: np.ndarray) -> pa.Array:
    """``values[code]`` for each code, "" for -1 (a null, a group without a name): one take."""
    table = pa.array([*(v or "" for v in values), ""], pa.string())
    return table.take(pa.array(np.where(codes < 0, len(values), codes)))


def _taken_ints(values: list[int], codes: np.ndarray) -> pa.Array:
    """``values[code]`` for each code, null for -1."""
    table = np.asarray([*values, 0], np.int64)
    return pa.array(table[np.where(codes < 0, len(values), codes)], mask=codes < 0)


def _unique_rows(placed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(placed, axis=0, return_inverse=True)`` of places (-1 and up), by one integer
    key a row where their ranges allow (a sort of rows as records is ten times slower)."""
    sizes = tuple(int(c.max()) + 2 if len(c) else 1 for c in placed.T)
    if not len(placed) or np.prod(np.asarray(sizes, np.float64)) >= 2.0**62:
        keys, index = np.unique(placed, axis=0, return_inverse=True)
        return keys, np.asarray(index, np.int64).ravel()
    key = np.ravel_multi_index(tuple((placed + 1).T), sizes)  # (row order: key order)
    unique, index = np.unique(key, return_inverse=True)
    keys = np.stack(np.unravel_index(unique, sizes), axis=1).astype(placed.dtype) - 1
    return keys, np.asarray(index, np.int64).ravel()


def _percentiles(
    parts: list[OpsPart], index: np.ndarray, starts: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each merged group's p50 and p95 of the durations of every part that has it (linear
    between the closest ranks), for all groups at once."""
    sizes = np.zeros(n, np.int64)
    groups = []  # (each part's durations' merged groups, in 32 bits: the end's peak)
    for i, part in enumerate(parts):
        merged, counts = index[starts[i] : starts[i + 1]], np.diff(part.offsets)
        np.add.at(sizes, merged, counts)
        groups.append(np.repeat(merged.astype(np.int32), counts))
    ordered = sorted_in_groups([part.durations for part in parts], groups, sizes)
    return group_quantile(ordered, sizes, 0.5), group_quantile(ordered, sizes, 0.95)


def _top_names(
    parts: list[OpsPart], index: np.ndarray, starts: np.ndarray, place: dict, n: int
) -> tuple[np.ndarray, list[str]]:
    """Each merged group's framework name seen most often (ties: the one seen first), for all
    groups at once: its code into the names in the order of their places (-1: a group without
    names), and those names."""
    by_place = _in_place_order(place)
    group = np.concatenate(
        [index[starts[i] : starts[i + 1]][part.name_group] for i, part in enumerate(parts)]
    ).astype(np.int64)
    name = np.concatenate(
        [_placed(part.name, place, part.keys[S.RANK].at(part.name_group)) for part in parts]
    )
    times = np.concatenate([part.name_count for part in parts]).astype(np.int64)
    out = np.full(n, -1, np.int64)
    if not len(group):
        return out, by_place
    pair, where = np.unique(group * (len(by_place) + 1) + (name + 1), return_inverse=True)
    summed = np.bincount(np.asarray(where).ravel(), weights=times).astype(np.int64)
    pair_group, pair_name = pair // (len(by_place) + 1), pair % (len(by_place) + 1) - 1
    order = np.lexsort((pair_name, -summed, pair_group))
    first = order[np.r_[True, pair_group[order][1:] != pair_group[order][:-1]]]
    out[pair_group[first]] = pair_name[first]
    return out, by_place


def in_steps(ops: pa.Table, steps: list[int]) -> pa.Table:
    """The rows of ``steps`` (a report's counted steps); every row where no operator carries a
    step (a rank without step markers: its one window is its step)."""
    if ops.num_rows == 0 or ops.column(S.STEP).null_count == ops.num_rows:
        return ops
    wanted = sorted_distinct(np.asarray(steps, np.int64))
    step = ops.column(S.STEP).to_numpy(zero_copy_only=False)  # (a null: NaN, in no step)
    at = np.searchsorted(wanted, step).clip(max=max(len(wanted) - 1, 0))
    keep = wanted[at] == step if len(wanted) else np.zeros(len(step), bool)
    return ops if keep.all() else ops.filter(pa.array(keep))


def over_steps(ops: pa.Table, steps: list[int] | None = None) -> pa.Table:
    """The ops table summed over its steps (``steps``: only those; default: every row, outside
    the steps included), a row per rank, device, kind, phase and operator with a null step.
    p50 is the count-weighted mean of the steps' medians, p95 the largest step's."""
    df = pl.from_arrow(ops if steps is None else in_steps(ops, steps))
    assert isinstance(df, pl.DataFrame)
    weight = pl.col(S.COUNT) / pl.col(S.COUNT).sum().clip(lower_bound=1)
    summed = df.group_by(S.RANK, *_NAMED_KEYS, maintain_order=True).agg(
        pl.col(S.NAME).first(),
        pl.col(S.COUNT, S.TOTAL_NS, S.SELF_NS).sum(),
        (pl.col(S.P50_NS) * weight).sum(),
        pl.col(S.P95_NS).max(),
        pl.col(S.BYTES).sum().alias("_bytes"),
        pl.col(S.BYTES).is_not_null().any().alias("_known"),
    )
    summed = summed.with_columns(
        pl.lit(None, pl.Int64).alias(S.STEP),
        (pl.col(S.TOTAL_NS) / pl.col(S.COUNT).clip(lower_bound=1)).alias(S.MEAN_NS),
        pl.when(pl.col("_known")).then(pl.col("_bytes")).alias(S.BYTES),
    ).sort(S.SELF_NS, descending=True, maintain_order=True)
    return S.conform(summed.drop("_bytes", "_known").to_arrow(), S.OPS_SCHEMA)
