"""One rank's several trace files (a profiler that wrote one per cycle or per step) read as one
trace: each file parsed, the files put in time order, and their events joined into one table,
each file's call ids kept apart. Files that cover the same time, or that different processes
wrote, are not one rank's windows: refused, naming both.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from traceview.model import schema as S
from traceview.model.errors import BadInput
from traceview.parsers import SURE_PID, ParsedTrace


class NotOneRun(BadInput):
    """A rank's files are not one process's windows: the whole ingest stops (leaving the rank
    out would report the rest as a run they are not)."""


#: Columns that link events within one file (a launch and its kernel, an operator and its
#: calls): renumbered per file so that two files' ids never meet.
_LINK_IDS = (S.CORRELATION, S.EXTERNAL_ID)


def parse_windows(
    files: list[Path], rank: int, parse: Callable[[Path], ParsedTrace]
) -> ParsedTrace:
    """The files of one rank as one parsed trace, in time order. Where two files overlap in
    time (copies of one trace, or two runs' traces) or were written by different processes,
    ``NotOneRun`` names them."""
    parts = sorted((parse(path) for path in files), key=_start)
    for earlier, later in pairwise(parts):
        why = _not_windows(earlier, later)
        if why:
            raise NotOneRun(
                f"two traces say they are rank {rank}: {earlier.path} and {later.path}, {why} "
                "(copies, or traces of different runs? ingest one run at a time)"
            )
    first = parts[0]
    first.events = _joined([p.events for p in parts])
    for part in parts[1:]:
        first.bytes_read += part.bytes_read
        first.lost_bytes += part.lost_bytes
        for kind, count in part.skipped.items():
            first.skipped[kind] = first.skipped.get(kind, 0) + count
        for key, label in part.threads.items():
            first.threads.setdefault(key, label)
        for pid, name in part.process_names.items():
            first.process_names.setdefault(pid, name)
        for key, value in part.meta.items():
            first.meta.setdefault(key, value)
        first.notes.extend(part.notes)
        for name, table in part.side.items():
            held = first.side.get(name)
            first.side[name] = table if held is None else pa.concat_tables([held, table])
    first.meta["trace_files"] = len(parts)
    return first


def _start(parsed: ParsedTrace) -> int:
    value = pc.min(parsed.events.column(S.TS_NS)).as_py() if parsed.events.num_rows else None
    return int(value) if value is not None else 0


def _end(parsed: ParsedTrace) -> int:
    if not parsed.events.num_rows:
        return 0
    ends = pc.add(parsed.events.column(S.TS_NS), parsed.events.column(S.DUR_NS))
    return int(pc.max(ends).as_py() or 0)


def _not_windows(earlier: ParsedTrace, later: ParsedTrace) -> str:
    """Why two files of one rank, in time order, are not successive windows of one process
    ("" where they are)."""
    overlap = _end(earlier) - _start(later)
    if earlier.events.num_rows and later.events.num_rows and overlap > 0:
        return f"and they cover the same time ({overlap / 1e6:.1f} ms of it)"
    pids = [_main_process(p.events) for p in (earlier, later)]
    if None not in pids and pids[0] != pids[1]:
        return f"and different processes wrote them (pid {pids[0]}, then pid {pids[1]})"
    return ""


def _main_process(events: pa.Table) -> int | None:
    """The process most of a trace's events are in, where that is surely an OS process id
    (None: the trace states none)."""
    if not events.num_rows or S.PID not in events.column_names:
        return None
    pids = events.column(S.PID).drop_null().to_numpy()
    pids = pids[pids >= SURE_PID]
    if not len(pids):
        return None
    value, _ = Counter(pids.tolist()).most_common(1)[0]
    return int(value)


def _joined(tables: list[pa.Table]) -> pa.Table:
    """Files' events as one table, each file's link ids moved past the previous files'."""
    moved = []
    base = 0
    for table in tables:
        top = 0
        for column in _LINK_IDS:
            if column not in table.column_names:
                continue
            ids = table.column(column)
            if base:
                ids = pc.add(ids, pa.scalar(base, pa.int64()))
                table = table.set_column(table.schema.get_field_index(column), column, ids)
            top = max(top, int(pc.max(ids).as_py() or 0) + 1)
        base = max(base, top)
        moved.append(table)
    return pa.concat_tables(moved).unify_dictionaries()
