"""Numpy views of Arrow columns and of an events table (kinds and phases as fixed small-integer
codes). The parsers share the column helpers (``dictionary_codes``, ``ints``): this module
imports nothing of traceview but the schema."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traceview.model import schema as S

KIND_CODE: dict[str, int] = {k: i for i, k in enumerate(S.EVENT_KINDS)}
PHASE_CODE: dict[str, int] = {p: i for i, p in enumerate(S.EVENT_PHASES)}


#: Rows whose integer ``column`` lies in [lo, hi] or is null: a reader given one reads only the
#: pieces that may hold such rows (each whole: the caller picks the rows).
Within: TypeAlias = tuple[str, int, int]


@dataclass(frozen=True)
class TableOnDemand:
    """A table read where it is needed, not before: its rows counted at once, its contents
    read afresh by each ``read`` (a report reads the segments, the largest table, only where
    its critical path is not kept, and frees them once used)."""

    num_rows: int
    read: Callable[[], pa.Table]
    close: Callable[[], None] = lambda: None  # (what it holds open, let go)
    # its rows in order, a piece (a row group) at a time: never whole (None: read whole)
    pieces: Callable[[Within | None], Iterator[pa.Table]] | None = None

    @classmethod
    def of(cls, table: pa.Table) -> TableOnDemand:
        """A table already in memory (held: nothing to read)."""
        return cls(table.num_rows, lambda: table)

    def in_pieces(self, within: Within | None = None) -> Iterator[pa.Table]:
        """Its rows, a piece at a time where it can be read so (else whole, one piece);
        ``within``: only pieces that may hold such rows are read (``Within``)."""
        return self.pieces(within) if self.pieces is not None else iter([self.read()])

    def mapped(self, change: Callable[[pa.Table], pa.Table]) -> TableOnDemand:
        """The same table with ``change`` made to what each read gives (row by row: a piece
        changed is the whole changed, in pieces; ``within`` is of the rows as read)."""
        pieces = self.pieces
        return TableOnDemand(
            self.num_rows,
            lambda: change(self.read()),
            self.close,
            None if pieces is None else lambda within: map(change, pieces(within)),
        )


@dataclass(frozen=True)
class SpilledTable:
    """A table written to an Arrow IPC stream file as it was made, a piece at a time (a rank's
    segments, the largest analysis table): never whole in memory where it is written on a batch
    at a time (``batches``). Small to pickle: a worker process hands back its name."""

    path: Path
    num_rows: int
    schema: pa.Schema

    def batches(self) -> Iterator[pa.RecordBatch]:
        """Its rows, a batch (a piece as written) at a time, read rather than mapped: each is
        freed once let go."""
        with pa.OSFile(str(self.path)) as source:
            yield from pa.ipc.open_stream(source)

    def read(self) -> pa.Table:
        return pa.Table.from_batches(list(self.batches()), self.schema)


class TableSpill:
    """Writes the pieces of a table to ``path`` as they come (``add``), holding none of them;
    ``close``: the ``SpilledTable`` (the file is made at the first piece, or at the end where
    none came, so that a spill that has not begun pickles as a path)."""

    def __init__(self, path: Path, schema: pa.Schema):
        self.path, self.schema = path, schema
        self.rows = 0
        self._sink: pa.NativeFile | None = None
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None

    def add(self, table: pa.Table) -> None:
        if self._writer is None:
            self._sink = pa.OSFile(str(self.path), "wb")
            self._writer = pa.ipc.new_stream(self._sink, self.schema)
        if not table.schema.equals(self.schema):
            table = table.cast(self.schema)
        self._writer.write_table(table)
        self.rows += table.num_rows

    def close(self) -> SpilledTable:
        if self._writer is None:
            self.add(self.schema.empty_table())
        assert self._writer is not None and self._sink is not None
        self._writer.close()
        self._sink.close()
        return SpilledTable(self.path, self.rows, self.schema)

    def __getstate__(self) -> dict[str, Any]:
        if self._writer is not None:
            raise TypeError("a spill being written cannot be pickled")
        return self.__dict__


def kind_table(kinds: tuple[str, ...] | list[str]) -> np.ndarray:
    """A boolean lookup over kind codes: ``table[kind]`` says which rows are of one of
    ``kinds`` (code -1, no kind: never). One gather, where ``np.isin`` sorts or loops over the
    codes (10-20x slower on millions of rows)."""
    return np.array([k in kinds for k in S.EVENT_KINDS] + [False])


def phase_table(phases: tuple[str, ...] | list[str]) -> np.ndarray:
    """``kind_table`` for phase codes."""
    return np.array([p in phases for p in S.EVENT_PHASES] + [False])


HOST_TREE = kind_table(S.HOST_TREE_KINDS)
DEVICE = kind_table(S.DEVICE_ACTIVITY_KINDS)
STRUCTURAL = kind_table(S.STRUCTURAL_KINDS)
TIMED = HOST_TREE | DEVICE
#: Operators, runtime calls and regions: the kinds ``outermost_operators`` weighs.
OPERATOR = kind_table((S.KIND_OP, S.KIND_RUNTIME, S.KIND_ANNOTATION))
#: The host's own calls (operators, runtime calls, regions, Python frames; not the profiler's
#: records): the first of them starts the rank's startup.
WORK = kind_table((S.KIND_OP, S.KIND_RUNTIME, S.KIND_ANNOTATION, S.KIND_PYTHON))


def first_start(events: pa.Table, kinds: np.ndarray, among: np.ndarray | None = None) -> int | None:
    """The earliest start of the rows of ``events`` whose kind is one of ``kinds`` (a
    ``kind_table``), among the rows ``among`` (default: all); None where there is none."""
    rows = kinds[coded(events.column(S.KIND), KIND_CODE)]
    if among is not None:
        rows &= among
    return int(ints(events.column(S.TS_NS), 0)[rows].min()) if rows.any() else None


def dictionary_codes(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[Any]]:
    """A dictionary (or string) column's codes (int64, -1 for null) and the values they stand
    for."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not pa.types.is_dictionary(array.type):
        array = array.dictionary_encode()
    values = array.dictionary.to_pylist()
    indices = array.indices if array.null_count == 0 else pc.fill_null(array.indices, -1)
    return np.asarray(indices.to_numpy(zero_copy_only=False), np.int64), values


def compact_dictionaries(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with each dictionary column's dictionary cut to the values its rows use, in
    their order there (a slice of a whole trace keeps the whole trace's dictionary: a Chainer
    trace's 85,000 step names in every batch of 65,536 rows, each read again by every pass that
    looks at a chunk's names)."""
    columns = list(batch.columns)
    for i, column in enumerate(columns):
        if not pa.types.is_dictionary(column.type):
            continue
        indices = column.indices
        valid = indices.is_valid().to_numpy(zero_copy_only=False)
        codes = indices.to_numpy(zero_copy_only=False)[valid].astype(np.int64, copy=False)
        used = np.unique(codes)
        if len(used) == len(column.dictionary):
            continue
        places = np.zeros(len(column.dictionary), np.int64)
        places[used] = np.arange(len(used))
        remapped = np.zeros(len(column), np.int64)
        remapped[valid] = places[codes]
        new_indices = pa.array(
            remapped.astype(indices.type.to_pandas_dtype()), indices.type, mask=~valid
        )
        columns[i] = pa.DictionaryArray.from_arrays(
            new_indices,
            column.dictionary.take(pa.array(used, pa.int64())),
            ordered=column.type.ordered,
        )
    return pa.RecordBatch.from_arrays(columns, schema=batch.schema)


def dictionary_array(codes: np.ndarray, values: list[Any]) -> pa.DictionaryArray:
    """``dictionary_codes`` the other way: codes (-1: null) into ``values`` as a dictionary array
    of strings."""
    indices = pa.array(codes.astype(np.int32, copy=False), pa.int32(), mask=codes < 0)
    strings = pa.array([None if v is None else str(v) for v in values], pa.string())
    return pa.DictionaryArray.from_arrays(indices, strings)


def disjoint(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Mask of the intervals (sorted by start) to keep: each that starts once every earlier one
    has ended (dropped ones included). Step markers: one that starts inside the previous one
    is dropped (docs/design.md, "The training thread and the steps")."""
    keep = np.ones(len(starts), bool)
    if len(starts) > 1:
        keep[1:] = starts[1:] >= np.maximum.accumulate(ends)[:-1]
    return keep


def window_index(
    starts: np.ndarray, ends: np.ndarray, at: np.ndarray, *, with_start: bool = True
) -> np.ndarray:
    """Index of the window that holds each instant of ``at``, -1 for none. The windows are
    sorted by start and their ends never decrease (disjoint windows, or running maxima of the
    ends: then the window found is the last to start before the instant, and some window up to
    it holds the instant). A window holds [start, end); ``with_start=False``: (start, end), an
    instant at its very start is not in it."""
    if len(starts) == 0:
        return np.full(len(at), -1, np.int64)
    idx = np.searchsorted(starts, at, side="right" if with_start else "left") - 1
    inside = (idx >= 0) & (at < ends[np.maximum(idx, 0)])
    return np.where(inside, idx, -1)


def coded(
    column: pa.ChunkedArray | pa.Array, codes: dict[str, int], missing: int = -1
) -> np.ndarray:
    """A dictionary (or string) column as codes from ``codes``; unknown or null: ``missing``."""
    own, values = dictionary_codes(column)
    lut = np.array([codes.get(v, missing) for v in values] + [missing], np.int64)
    return lut[own]


def ints(column: pa.ChunkedArray | pa.Array, fill: int = -1) -> np.ndarray:
    if column.null_count == 0:  # (most columns: no copy through fill_null, often none at all)
        return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)
    # (fill_null is coalesce after checks that cost a small column three times the fill)
    filled = pc.coalesce(column, pa.scalar(fill, column.type))
    return np.asarray(filled.to_numpy(zero_copy_only=False), dtype=np.int64)


def parent_rows(events: pa.Table) -> np.ndarray:
    """Row index of each event's parent (-1: none, or not among these rows); ids are row
    numbers as normalize writes them, but a filtered table keeps the original ids."""
    ids = np.maximum(ints(events.column(S.EVENT_ID), 0), 0)
    parent = ints(events.column(S.PARENT), -1)
    if np.array_equal(ids, np.arange(len(ids))):
        return np.where(parent < len(ids), parent, -1)
    if len(ids) == 0:
        return parent
    low, top = int(ids.min()), int(ids.max())
    if top - low > 16 * len(ids) + (1 << 20):  # a few rows far apart: no table as long as that
        order = np.argsort(ids, kind="stable")  # (rows mostly in id order: a quick sort)
        by_id = ids[order]
        at = np.minimum(np.searchsorted(by_id, parent), len(ids) - 1)
        return np.where((parent >= 0) & (by_id[at] == parent), order[at], -1)
    # a lookup table from id to row over the ids' range (a chunk's rows: a window of the ids)
    row_of_id = np.full(top - low + 2, -1, np.int32 if len(ids) < 1 << 31 else np.int64)
    row_of_id[ids - low] = np.arange(len(ids))
    at = parent - low
    known = (parent >= 0) & (at >= 0) & (at <= top - low)
    return np.where(known, row_of_id[np.where(known, at, -1)], -1).astype(np.int64, copy=False)


def nearest_marked(parent: np.ndarray, marked: np.ndarray) -> np.ndarray:
    """For each row, its nearest ancestor that is ``marked`` (-1: none), by pointer jumping."""
    up = parent.astype(np.int64, copy=True)
    while True:
        at = np.maximum(up, 0)
        moving = (up >= 0) & ~marked[at]
        if not moving.any():
            return up
        up = np.where(moving, up[at], up)


def roots(up: np.ndarray) -> np.ndarray:
    """For each node of a forest (``up``: its parent, -1 for a root), its root, by pointer
    jumping: a chain as deep as a trace nests one event in another 50,000 times costs the log
    of its depth in rounds, not its depth."""
    root = np.where(up >= 0, up, np.arange(len(up)))
    while True:
        nxt = root[root]
        if (nxt == root).all():
            return root
        root = nxt


def taken(values: list[Any], codes: np.ndarray) -> list[Any]:
    """``[values[c] for c in codes]``, as one numpy take (of objects: strings, None)."""
    table = np.empty(len(values), object)
    table[:] = values
    return table[codes].tolist()


def distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` for integers that are mostly distinct (times): numpy 2's unique
    hashes them, 20x slower here than a stable sort, which also merges sorted runs (a
    concatenation of sorted arrays) in one pass."""
    ordered = np.sort(values, kind="stable")
    if len(ordered) < 2:
        return ordered
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]


def rank_codes(rank: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Each row's code into the distinct ranks, and those ranks (one rank, a rank's own events:
    no sort of every row)."""
    if not len(rank) or rank.min() == rank.max():
        return np.zeros(len(rank), np.int64), [int(rank[0])] if len(rank) else []
    ranks, codes = np.unique(rank, return_inverse=True)
    return codes.ravel(), ranks.tolist()


def unique_inverse(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(key, return_inverse=True)`` for non-negative integer keys: where they span
    a modest range, by a table over it instead of a sort (15x faster on a chunk's rows)."""
    if len(key) == 0:
        return np.unique(key, return_inverse=True)
    low, top = int(key.min()), int(key.max())
    if low < 0 or top > 8 * len(key) + (1 << 20):
        unique, inverse = np.unique(key, return_inverse=True)
        return unique, inverse.ravel()
    present = np.zeros(top + 1, bool)
    present[key] = True
    rank = np.cumsum(present, dtype=np.int64) - 1
    return np.flatnonzero(present).astype(key.dtype, copy=False), rank[key]


def unique_pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The distinct (a, b) pairs as a 2×n array, sorted by a then b: ``np.unique(np.stack([a,
    b]), axis=1)`` without its slow row comparison."""
    return pair_groups(a, b)[0]


def pair_groups(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``unique_pairs`` and each row's place among them (``np.unique(..., axis=1,
    return_inverse=True)``: the count of each pair is ``np.bincount`` of the places)."""
    order = np.lexsort((b, a))
    pairs = np.stack([a[order], b[order]])
    new = np.ones(len(order), bool)
    new[1:] = (pairs[:, 1:] != pairs[:, :-1]).any(axis=0)
    inverse = np.empty(len(order), np.int64)
    inverse[order] = np.cumsum(new) - 1
    return pairs[:, new], inverse


def sorted_in_groups(
    values: np.ndarray | list[np.ndarray],
    groups: np.ndarray | list[np.ndarray],
    sizes: np.ndarray,
) -> np.ndarray:
    """``values`` by group, then by value (``values[np.lexsort((values, groups))]``; ``sizes``:
    each group's count; values and groups may come in pieces, as lists of arrays alike, and are
    never concatenated), by one sort in place of one integer key a value where the ranges allow
    it: a lexsort's orders and copies hold five times the values (a multi-GB rank's ingest
    peaked there, at its end)."""
    if isinstance(values, np.ndarray):
        values, groups = [values], [groups]  # type: ignore[list-item]
    pieces = [(v, g) for v, g in zip(values, groups, strict=True) if len(v)]
    if not pieces:
        return np.zeros(0, np.int64)
    low = min(int(v.min()) for v, _ in pieces)
    span = max(int(v.max()) for v, _ in pieces) - low + 1
    if len(sizes) * span >= 1 << 62:
        every, group = (np.concatenate(x).astype(np.int64) for x in zip(*pieces, strict=True))
        return every[np.lexsort((every, group))]
    key = np.empty(sum(len(v) for v, _ in pieces), np.int64)
    at = 0
    for v, g in pieces:
        part = key[at : at + len(v)]
        np.multiply(g, np.int64(span), out=part)  # (in 64 bits, whatever the groups')
        part += v
        at += len(v)
    key -= low
    key.sort()
    key -= np.repeat(np.arange(len(sizes), dtype=np.int64) * span, sizes) - low
    return key


def group_quantile(ordered: np.ndarray, sizes: np.ndarray, q: float) -> np.ndarray:
    """Per group, the ``q`` quantile of its values, linear between the closest ranks (numpy's
    and polars' "linear"); ``ordered``: ``sorted_in_groups``' values; 0.0 for an empty group."""
    first = np.cumsum(sizes) - sizes
    pos = (np.maximum(sizes, 1) - 1) * q
    lo, hi = np.floor(pos).astype(np.int64), np.ceil(pos).astype(np.int64)
    if not len(ordered):
        return np.zeros(len(sizes))
    at_lo = ordered[np.minimum(first + lo, len(ordered) - 1)]
    at_hi = ordered[np.minimum(first + hi, len(ordered) - 1)]
    return np.where(sizes > 0, at_lo + (at_hi - at_lo) * (pos - lo), 0.0)


def group_sums(ordered: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Per group, the sum of its values (``ordered``: by group), in integers (0: an empty
    group)."""
    ends = np.cumsum(sizes)
    total = np.concatenate([[0], np.cumsum(ordered, dtype=np.int64)])
    return total[ends] - total[ends - sizes]


def training_thread_of(
    pid: np.ndarray,
    tid: np.ndarray,
    kind: np.ndarray,
    top: np.ndarray,
    dur: np.ndarray,
    backward: np.ndarray,
) -> tuple[int, int] | None:
    """The thread that runs the training loop (arrays: host call-tree events).

    The thread with the step markers; without markers, the thread with the most time in
    outermost operators (``top``: not inside another operator or region), leaving out autograd's
    own threads (whose outermost operators are all backward) unless there is nothing else.
    """
    if len(pid) == 0:
        return None
    step = kind == KIND_CODE[S.KIND_STEP]
    if step.any():
        threads, inverse = pair_groups(pid[step], tid[step])
        best = int(np.argmax(np.bincount(inverse)))
        return int(threads[0, best]), int(threads[1, best])
    if not top.any():
        top = np.ones(len(pid), bool)
    threads, inverse = pair_groups(pid[top], tid[top])
    busy = np.bincount(inverse, weights=dur[top].astype(np.float64))
    in_backward = np.bincount(inverse, weights=(dur[top] * backward[top]).astype(np.float64))
    autograd = in_backward >= 0.9 * busy
    if not autograd.all():
        busy = np.where(autograd, -1.0, busy)
    best = int(np.argmax(busy))
    return int(threads[0, best]), int(threads[1, best])


def outermost_operators(kind: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Operators, runtime calls and regions not nested in another one (Python frames aside)."""
    operator = OPERATOR[kind]
    inside = np.where(parent >= 0, operator[np.maximum(parent, 0)], False)
    return operator & ~inside


@dataclass
class EventArrays:
    """The columns the analyses need, as numpy arrays aligned by row."""

    kind: np.ndarray
    phase: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    ts: np.ndarray
    end: np.ndarray
    self_ns: np.ndarray
    step: np.ndarray  # -1: no step
    parent_row: np.ndarray  # row index of the parent event, -1: none
    depth: np.ndarray

    @classmethod
    def of(cls, events: pa.Table) -> EventArrays:
        ts = ints(events.column(S.TS_NS), 0)
        return cls(
            kind=coded(events.column(S.KIND), KIND_CODE),
            phase=coded(events.column(S.PHASE), PHASE_CODE, PHASE_CODE[S.OTHER]),
            pid=ints(events.column(S.PID), 0),
            tid=ints(events.column(S.TID), 0),
            ts=ts,
            end=ts + ints(events.column(S.DUR_NS), 0),
            self_ns=ints(events.column(S.SELF_NS), 0),
            step=ints(events.column(S.STEP), -1),
            parent_row=parent_rows(events),
            depth=ints(events.column(S.DEPTH), -1),
        )


def encode_ranks(ranks: list[int]) -> str:
    """Ranks as arithmetic runs: ``0-7``, ``0-56/8``, ``1,3,9`` (compact in a manifest)."""
    out: list[str] = []
    i = 0
    while i < len(ranks):
        j = i + 1
        if j < len(ranks):
            step = ranks[j] - ranks[i]
            while j + 1 < len(ranks) and ranks[j + 1] - ranks[j] == step:
                j += 1
            if j - i >= 2 and step > 0:
                out.append(f"{ranks[i]}-{ranks[j]}" + (f"/{step}" if step != 1 else ""))
                i = j + 1
                continue
        out.append(str(ranks[i]))
        i += 1
    return ",".join(out)


#: the most ranks ``decode_ranks`` reads from one text (a wider span is no group of a job)
MAX_DECODED_RANKS = 1 << 22


def decode_ranks(text: str) -> list[int]:
    """``encode_ranks``'s text back to ranks; ValueError where it is not such a text, or names
    more than ``MAX_DECODED_RANKS`` (what a run directory holds is untrusted)."""
    out: list[int] = []
    for part in text.split(","):
        if not part:
            continue
        span, _, step = part.partition("/")
        first, _, last = span.partition("-")
        if last:
            ranks = range(int(first), int(last) + 1, int(step or 1))
            if len(out) + len(ranks) > MAX_DECODED_RANKS:
                raise ValueError(f"more than {MAX_DECODED_RANKS} ranks")
            out.extend(ranks)
        else:
            out.append(int(first))
    return out
