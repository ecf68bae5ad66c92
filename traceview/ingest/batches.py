"""Many small ranks on a pool of workers: several ranks a task (``ingest_ranks``), so that what a
task costs besides its ranks' work (sending the task, the results back, each table pickled with
its schema) is paid per batch, not per rank: 20,000 one-step ranks are 20,000 tasks otherwise,
each returning ten small tables (~18 KB pickled, milliseconds each way).

A batch's ranks are ingested one after the other, each as ``ingest_rank`` does alone; a rank
whose trace cannot be read is returned as its error, in its place, and the others are kept (the
caller leaves it out with its warning, as for a rank ingested alone). The ranks' tables of one
name are concatenated into the batch's first part (``combine`` orders rows by rank, keeping each
rank's in order: the run's tables are the same). The per-event tables (ops, collectives,
actions) of the batch's ranks read whole are made for the batch at once (``_rows_at_once``).
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pyarrow as pa

from traceview.ingest.discover import TraceFile
from traceview.ingest.large.trim import weighted_bytes
from traceview.ingest.rank import RankAnalysis, RankPartial, ingest_rank
from traceview.ingest.windows import NotOneRun
from traceview.model.errors import BadInput

#: At most this many ranks a task, ...
BATCH_RANKS = 64
#: ... of at most this many bytes together (on disk; a gzip file counts 8 times its size): a
#: larger trace is a task of its own, as before (its own work dwarfs a task's cost).
BATCH_BYTES = 4 << 20
#: Tasks per worker at least, where the ranks allow: the pool's last tasks stay short.
TASKS_PER_WORKER = 8


def _weight(trace: TraceFile) -> int:
    return weighted_bytes(trace.path.name, trace.size)


def batches(traces: list[TraceFile], workers: int) -> list[list[TraceFile]]:
    """``traces``, in the order given (the pool's), cut into tasks of consecutive traces: up to
    ``BATCH_RANKS`` and ``BATCH_BYTES`` a task, and fewer ranks where that leaves fewer than
    ``TASKS_PER_WORKER`` tasks per worker."""
    most = max(1, min(BATCH_RANKS, len(traces) // max(1, workers * TASKS_PER_WORKER)))
    tasks: list[list[TraceFile]] = []
    task: list[TraceFile] = []
    size = 0
    for trace in traces:
        weight = _weight(trace)
        if task and (len(task) >= most or size + weight > BATCH_BYTES):
            tasks.append(task)
            task, size = [], 0
        task.append(trace)
        size += weight
    if task:
        tasks.append(task)
    return tasks


def ingest_ranks(
    traces: list[TraceFile],
    run: Path,
    run_id: str,
    rules_path: Path | None,
    analyze: RankAnalysis | None,
) -> list[RankPartial | BadInput]:
    """``ingest_rank`` of each of ``traces`` in turn: its part, or the error that left it out
    (a ``NotOneRun`` stops the whole ingest: raised); the parts' tables in memory merged."""
    results: list[RankPartial | BadInput] = []
    for trace in traces:
        try:
            results.append(
                ingest_rank(trace, run, run_id, rules_path, analyze, beside=False, rows_later=True)
            )
        except NotOneRun:
            raise
        except BadInput as exc:
            results.append(exc)
    parts = [r for r in results if isinstance(r, RankPartial)]
    _rows_at_once(parts, analyze)
    _merge_tables(parts)
    return results


def _rows_at_once(parts: list[RankPartial], analyze: RankAnalysis | None) -> None:
    """The per-event tables of the parts' ranks that left them to the batch (``events``), made
    at once and held by the first of them (``_merge_tables`` concatenates each name's tables:
    every rank's rows, each rank's as its own analysis gives them)."""
    waiting = [part for part in parts if part.events is not None]
    if not waiting or analyze is None:
        return
    tables = analyze.rows([part.events for part in waiting])  # type: ignore[attr-defined]
    for part in waiting:
        part.events = None
    waiting[0].tables.update(tables)


def _merge_tables(parts: list[RankPartial]) -> None:
    """Each table name's in-memory tables of ``parts`` as one, held by the first part that had
    one (a table a rank spilled to a file stays with its rank)."""
    names = {name for part in parts for name in part.tables}
    for name in names:
        holders = [part for part in parts if isinstance(part.tables.get(name), pa.Table)]
        if len(holders) < 2:
            continue
        tables = [cast(pa.Table, part.tables.pop(name)) for part in holders]
        holders[0].tables[name] = pa.concat_tables(tables).combine_chunks()


def given(result: RankPartial | BadInput) -> RankPartial:
    """A rank's result from ``ingest_ranks``: its part, or its error raised."""
    if isinstance(result, BadInput):
        raise result
    return result
