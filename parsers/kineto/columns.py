"""Arrow columns from the decoded records' values: integers (ids, sizes), strings, launch
configurations, and the lanes of gloo's asynchronous spans beside their thread."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traceview.model import schema as S
from traceview.model.columns import ints
from traceview.parsers.kineto.records import _as_int, _fits_int64, _size, _thread_id


def _int_array(values: list[Any], convert: Callable[[Any], int | None] = _size) -> pa.Array:
    """Integers (ids, sizes) as int64; floats are truncated, numeric strings parsed, numbers
    wider than 64 bits made to fit by ``convert``."""
    if values.count(None) == len(values):
        return S.all_null(len(values), pa.int64())  # (pyarrow is very slow on all-null lists)
    try:
        return pa.array(values, pa.int64())  # the common case: ints and nulls
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        pass
    try:
        array = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return pa.array([convert(v) for v in values], pa.int64())
    if pa.types.is_floating(array.type) and (pc.max(pc.abs(array)).as_py() or 0) < 2**63:
        return pc.cast(array, pa.int64(), safe=False)
    return pa.array([convert(v) for v in values], pa.int64())


def _sizes(values: list[Any]) -> tuple[pa.Array, int]:
    """Sizes as int64, and how many were numbers too wide for 64 bits (left out: null)."""
    array = _int_array(values)
    wide = 0
    if array.null_count > values.count(None):  # some did not convert: were they too wide?
        wide = sum(1 for v in values if (n := _as_int(v)) is not None and not _fits_int64(n))
    return array, wide


_DICT = pa.dictionary(pa.int32(), pa.string())


def _strings(values: list[Any]) -> pa.Array:
    if values.count(None) == len(values):
        return pa.nulls(len(values), pa.string())  # (pyarrow is very slow on all-null lists)
    return pa.array(values, pa.string())


def _dictionary(values: list[Any]) -> pa.Array:
    return pa.array(values, _DICT)


#: The longest launch configuration kept (a grid or block is three small numbers).
_DIMS_BYTES = 48


def _dims(values: list[msgspec.Raw]) -> pa.Array:
    """Launch configurations (``grid``, ``block``) as the trace's JSON text; null where there is
    none or it is longer than a configuration can be."""
    if not any(values):
        return pa.nulls(len(values), _DICT)
    lengths = np.fromiter(map(len, values), np.int64, len(values))
    text: list[str | None] = [None] * len(values)
    for i in np.flatnonzero((lengths > 0) & (lengths <= _DIMS_BYTES)).tolist():
        text[i] = bytes(values[i]).decode("utf-8", "replace")
    return _dictionary(text)


#: gloo's point-to-point spans: record_function regions that gloo ends from its own thread when
#: the transfer completes, on the thread that posted them; they overlap whatever that thread runs
#: meanwhile instead of nesting in it.
_ASYNC_SPANS = frozenset(("gloo:send", "gloo:recv"))
#: Set on the thread id of those spans: a lane of their own beside the thread.
ASYNC_LANE = 1 << 62


def _async_lanes(tids: pa.Array, names: list[str | None], events: Sequence[Any]) -> pa.Array:
    """``tids`` with each async span (``_ASYNC_SPANS``) moved to a lane beside its thread: the
    first lane free when it begins (overlapping spans on lanes of their own, so none is taken
    for a call nested in another)."""
    if _ASYNC_SPANS.isdisjoint(names):
        return tids
    values = ints(tids, 0)
    moved = values.copy()
    rows = [i for i, n in enumerate(names) if n in _ASYNC_SPANS]
    rows.sort(key=lambda i: (values[i], events[i].ts or 0.0))
    free_at: dict[tuple[int, int], float] = {}  # (thread, lane) -> when its last span ends
    for i in rows:
        start = events[i].ts or 0.0
        end = start + (events[i].dur or 0.0)
        lane = 0
        while free_at.get((int(values[i]), lane), -math.inf) > start:
            lane += 1
        free_at[(int(values[i]), lane)] = end
        moved[i] = values[i] ^ (ASYNC_LANE | lane << 48)
    return pa.array(
        moved, pa.int64(), mask=np.asarray(pc.is_null(tids)) if tids.null_count else None
    )


def _ids(values: list[Any]) -> pa.Array:
    """pid/tid column: integers, and a few labels ("Spans") turned into stable negative ids."""
    try:
        return pa.array(values, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        mapping = {v: _thread_id(v) for v in set(values)}
        return pa.array(list(map(mapping.__getitem__, values)), pa.int64())
