"""A rank's events file written a chunk's closed rows at a time."""

from __future__ import annotations

import sys
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from traceview.model import schema as S
from traceview.store import rundir as R

#: Rows per row group of the events file.
_ROW_GROUP_ROWS = 1 << 16


class EventsWriter:
    """A rank's events file, written a chunk's closed rows at a time as the chunks are
    normalized: by chunk (by time), not by id (a row still open at a chunk's end is written
    with the chunk where it closes). Each write is encoded and compressed on a thread (no GIL)
    while the next chunk is normalized; the file is renamed into place on leaving the block."""

    def __init__(self, target: Path):
        self.target = target
        self.schema = S.EVENTS_SCHEMA.remove(S.EVENTS_SCHEMA.get_field_index(S.RANK))
        self.written = 0

    def __enter__(self) -> EventsWriter:
        with ExitStack() as stack:  # (left in reverse: the last write, the footer, the rename)
            tmp = stack.enter_context(R.atomic_path(self.target))
            options = R.parquet_options(self.schema)
            self._file = stack.enter_context(pq.ParquetWriter(tmp, self.schema, **options))
            self._thread = stack.enter_context(
                ThreadPoolExecutor(1, thread_name_prefix="traceview-write")
            )
            self._pending: Future[None] | None = None
            self._stack = stack.pop_all()
        return self

    def write(self, tables: list[pa.Table]) -> None:
        tables = [t for t in tables if t.num_rows]
        if not tables:
            return
        table = pa.concat_tables(tables).unify_dictionaries().drop_columns([S.RANK])
        table = S.conform(table, self.schema)
        self.written += table.num_rows
        self._wait()  # at most one chunk's rows waiting to be written
        self._pending = self._thread.submit(
            self._file.write_table, table, row_group_size=_ROW_GROUP_ROWS
        )

    def _wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def __exit__(self, *exc: Any) -> bool:
        try:
            if exc[0] is None:
                self._wait()  # a failed write fails the block
        except BaseException:
            if not self._stack.__exit__(*sys.exc_info()):
                raise
            return False
        return bool(self._stack.__exit__(*exc))


def with_self(rows: pa.Table, self_ns: np.ndarray) -> pa.Table:
    column = pa.array(np.maximum(self_ns, 0), pa.int64())
    return rows.set_column(rows.schema.get_field_index(S.SELF_NS), S.SELF_NS, column)
