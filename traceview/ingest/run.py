"""Ingest: trace files in, a run directory out (normalized events and the manifest).

Files are found (a folder is searched recursively; a run directory's raw/ traces are used),
identified cheaply (rank, world size) so ranks are fixed before any heavy work, then each rank is
parsed, normalized and written in its own worker process. The caller may hand in a per-rank
analysis (``analyze``): it runs in the same worker on the rank's events while they are in memory,
and its tables are written beside the events; ingest itself knows nothing of the analysis. The run
directory is built beside the target and renamed into place at the end: readers never see a
half-written run.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from itertools import pairwise
from multiprocessing import get_context
from pathlib import Path
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traceview import __version__
from traceview.ingest.batches import batches, given, ingest_ranks
from traceview.ingest.discover import TraceFile, assign_ranks, discover, per_device
from traceview.ingest.lifetime import die_with_parent
from traceview.ingest.rank import RankAnalysis, RankPartial, ingest_rank
from traceview.ingest.windows import NotOneRun
from traceview.model import schema as S
from traceview.model.columns import SpilledTable
from traceview.model.errors import (
    BadInput,
    Notes,
    OutputError,
    TraceviewError,
    cannot_write,
)
from traceview.model.manifest import (
    Collected,
    Manifest,
    ManifestNotes,
    RankIngest,
)
from traceview.model.progress import Progress, quiet
from traceview.parsers import number_ranges
from traceview.store import outputs
from traceview.store import rundir as R

#: Below this much trace data, and this many ranks, parsing in the parent beats starting worker
#: processes (~0.5 s each to import; a small rank takes ~20 ms: 1,024 of 4 KB each ingest in
#: 22 s serially, 15 s on 2 workers).
PARALLEL_MIN_BYTES = 48 << 20
PARALLEL_MIN_RANKS = 32


#: A table of the run as ``combine`` gives it: in memory, or (where a rank spilled it as it was
#: made: ``SpilledTable``) its parts in rank order, which are written a batch at a time.
RunTable: TypeAlias = pa.Table | list[pa.Table | SpilledTable]


@dataclass
class Combined:
    ranks: list[RankIngest]  # by rank
    tables: dict[str, RunTable]  # each table: every rank's rows, by rank
    notes: Notes

    def table(self, name: str) -> pa.Table:
        """One of ``tables`` whole in memory (its spilled parts read)."""
        table = self.tables[name]
        if isinstance(table, pa.Table):
            return table
        return pa.concat_tables(
            [p.read() if isinstance(p, SpilledTable) else p for p in table]
        ).cast(table[0].schema)


#: Parts are folded into one table per name every this many ranks: 20,000 small ranks held as
#: 20,000 tables of each name cost ~100 KB each in schemas and buffers, folded a few bytes a row.
FOLD_PARTS = 256


def combine(parts: Iterable[RankPartial]) -> Combined:
    """The ranks' parts of one run as the run's: ordered by rank, whatever order they came in
    (a pool returns them as they finish), tables concatenated per name, notes in rank order.
    Parts are consumed as they come and folded as they accumulate, so memory follows the rows,
    not the number of ranks; a table a rank spilled stays in its file (``RunTable``)."""
    infos: list[RankIngest] = []
    notes_of: list[tuple[int, Notes]] = []
    folded: dict[str, list[pa.Table]] = {}
    pending: list[dict[str, pa.Table]] = []
    spilled: dict[str, list[tuple[int, SpilledTable]]] = {}

    def fold() -> None:
        for name in {name for tables in pending for name in tables}:
            batch = [tables[name] for tables in pending if name in tables]
            folded.setdefault(name, []).append(pa.concat_tables(batch).combine_chunks())
        pending.clear()

    for part in parts:
        infos.append(part.info)
        notes_of.append((part.rank, part.notes))
        in_memory = {}
        for name, table in part.tables.items():
            if isinstance(table, SpilledTable):
                spilled.setdefault(name, []).append((part.rank, table))
            else:
                in_memory[name] = table
        pending.append(in_memory)
        if len(pending) >= FOLD_PARTS:
            fold()
    fold()
    ranks = sorted(info.rank for info in infos)
    twice = sorted({a for a, b in pairwise(ranks) if a == b})
    if twice:
        raise BadInput(f"rank(s) {number_ranges(twice)} came twice: parts of different runs?")
    tables: dict[str, RunTable] = {
        name: _by_rank(pa.concat_tables(folded[name])) for name in sorted(folded)
    }
    for name, files in sorted(spilled.items()):
        held = tables.get(name)
        tables[name] = _in_rank_order(held, files)
    return Combined(sorted(infos, key=lambda info: info.rank), tables, _named(notes_of))


def _in_rank_order(
    held: pa.Table | None, spilled: list[tuple[int, SpilledTable]]
) -> list[pa.Table | SpilledTable]:
    """The parts of a table some ranks spilled (``spilled``) and others held (``held``, by
    rank), in rank order: each rank's held rows a slice of their own."""
    parts: list[tuple[int, pa.Table | SpilledTable]] = list(spilled)
    if held is not None and held.num_rows:
        ranks = held.column(S.RANK).to_numpy()
        cuts = [0, *(np.flatnonzero(ranks[1:] != ranks[:-1]) + 1).tolist(), len(ranks)]
        parts += [(int(ranks[a]), held.slice(a, b - a)) for a, b in pairwise(cuts)]
    parts.sort(key=lambda part: part[0])
    return [part for _, part in parts]


def _named(notes_of: list[tuple[int, Notes]]) -> Notes:
    """The ranks' notes as the run's: each message once, in rank order, named with the ranks it
    came from unless every rank gave it ("ranks 0-3, 7: ...")."""
    said: dict[tuple[bool, str], list[int]] = {}
    for rank, part in sorted(notes_of, key=lambda pair: pair[0]):
        for warning, messages in ((True, part.warnings), (False, part.remarks)):
            for message in messages:
                said.setdefault((warning, message), []).append(rank)
    notes = Notes()
    for (warning, message), ranks in said.items():
        if len(ranks) < len(notes_of):
            message = f"rank{'s' if len(ranks) > 1 else ''} {number_ranges(ranks)}: {message}"
        (notes.warn if warning else notes.remark)(message)
    return notes


def _by_rank(table: pa.Table) -> pa.Table:
    """``table``'s rows ordered by rank, each rank's in the order they were (a stable sort)."""
    if table.num_rows == 0:
        return table
    ranks = table.column(S.RANK).to_numpy()
    if (ranks[1:] >= ranks[:-1]).all():
        return table  # already in rank order
    return table.take(pc.sort_indices(table, sort_keys=[(S.RANK, "ascending")]))


def _run_all(
    traces: list[TraceFile],
    staged: Path,
    run_id: str,
    rules_path: Path | None,
    jobs: int,
    analyze: RankAnalysis | None,
    notes: Notes,
    scheduler: str | Path | None = None,
    progress: Progress = quiet,
) -> Iterator[RankPartial]:
    """Every rank's part, as each is done; a rank whose trace cannot be read is left out with a
    warning (the others are kept), and only a run with no readable rank is an error."""
    done = 0
    failed: list[BadInput] = []

    def keep(trace: TraceFile, work: Callable[[], RankPartial]) -> list[RankPartial]:
        nonlocal done
        done += 1
        try:
            return [work()]
        except NotOneRun:
            raise
        except BadInput as exc:
            failed.append(exc)
            R.events_path(staged, trace.rank).unlink(missing_ok=True)
            notes.warn(f"rank {trace.rank} left out: {exc}")
            return []
        finally:
            progress("ingesting ranks", done, len(traces))

    progress("ingesting ranks", 0, len(traces))
    total = sum(t.size for t in traces)
    if scheduler is not None:
        from traceview.ingest.cluster import remove_attempt_leftovers, run_on_cluster

        for t, result in run_on_cluster(scheduler, traces, staged, run_id, rules_path, analyze):
            yield from keep(t, result)
        remove_attempt_leftovers(staged)
    elif (
        jobs <= 1
        or len(traces) == 1  # one trace: a worker would only add its start and its memory
        or (total < PARALLEL_MIN_BYTES and len(traces) < PARALLEL_MIN_RANKS)
    ):
        for t in traces:
            yield from keep(
                t, partial(ingest_rank, t, staged, run_id, rules_path, analyze, helper=True)
            )
    else:
        # Larger files first, so the pool's last task is a short one; small ranks several to
        # a task (``batches``), each rank still counted, and left out alone, as it is done.
        ordered = sorted(traces, key=lambda t: -t.size)
        workers = min(jobs, len(traces))
        with ProcessPoolExecutor(
            max_workers=workers,
            mp_context=get_context("spawn"),
            initializer=die_with_parent,
            initargs=(os.getpid(),),
        ) as pool:
            futures = deque(
                (batch, pool.submit(ingest_ranks, batch, staged, run_id, rules_path, analyze))
                for batch in batches(ordered, workers)
            )
            while futures:  # each result let go once combined
                batch, future = futures.popleft()
                results = future.result()
                for t, outcome in zip(batch, results, strict=True):
                    yield from keep(t, partial(given, outcome))
                del results
    if failed and len(failed) == done:
        more = f" (and {len(failed) - 1} more trace(s) like it)" if len(failed) > 1 else ""
        raise BadInput(f"{failed[0]}{more}")


def ingest(
    paths: list[Path],
    out: Path,
    *,
    rules_path: Path | None = None,
    jobs: int | None = None,
    command: list[str] | None = None,
    analyze: RankAnalysis | None = None,
    analysis_version: str | None = None,
    scheduler: str | Path | None = None,
    progress: Progress = quiet,
) -> Path:
    """Read the traces under ``paths`` into the run directory ``out``; return ``out``.

    With ``analyze``, each rank's tables are written as ``NAME.parquet`` (all ranks in one file)
    and ``analysis_version`` is recorded in the manifest, so a later reader knows whether they are
    still current. With ``scheduler`` (a Dask scheduler's address or scheduler file), the ranks
    are ingested as tasks on that cluster instead of local processes.
    """
    notes = Notes()
    outputs.run_directory(out)  # (the command checked it already; a library caller may not have)
    try:
        R.recover(out.resolve(), notes)  # what an ingest killed while replacing it left
    except OSError as exc:
        raise cannot_write(out, exc) from None
    dumps: list[Path] = []  # (Flight Recorder dumps beside the traces: the report reads them)
    traces = discover(paths, notes, rules_path is not None, progress, dumps_found=dumps)
    world = per_device(traces, assign_ranks(traces, notes), notes)
    before = R.read_manifest(out) if R.is_run_dir(out) else None
    collected = before.collect if before is not None else None
    if collected is not None:
        _collect_notes(collected, notes)
        world = world or collected.world_size
    traces.sort(key=lambda t: t.rank)
    run_id = uuid.uuid4().hex[:12]
    out = out.resolve()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise cannot_write(out, exc) from None
    # one ingest at a time into one place: a second one stops here, saying so (ingest_lock)
    with R.ingest_lock(out):
        staged = R.staging_dir(out)
        shutil.rmtree(staged, ignore_errors=True)
        try:
            staged.mkdir()
        except OSError as exc:
            raise cannot_write(out, exc) from None
        started = time.time()
        try:
            run = combine(
                _run_all(
                    traces,
                    staged,
                    run_id,
                    rules_path,
                    jobs or os.cpu_count() or 1,
                    analyze,
                    notes,
                    scheduler,
                    progress,
                )
            )
            notes.extend(run.notes)
            # the inputs first (events, then side inputs): the analysis tables record what they
            # were computed from, so that a reader knows them for this run's (runs.open_run)
            inputs = {n: run.table(n) for n in run.tables if n in S.SIDE_INPUTS}
            for name, table in inputs.items():
                R.write_parquet(staged / f"{name}.parquet", table)
            key = R.cache_key(run_id, analysis_version, R.inputs_key(R.identities(staged)))
            for name, table in run.tables.items():
                if name in inputs:
                    continue
                if isinstance(table, pa.Table):
                    R.write_parquet(staged / f"{name}.parquet", R.with_cache_key(table, key))
                else:
                    schema = R.with_cache_key(table[0].schema.empty_table(), key).schema
                    R.write_parquet_parts(staged / f"{name}.parquet", table, schema)
            shutil.rmtree(staged / R.SPILL, ignore_errors=True)  # (written: not the run's)
            frameworks = sorted({r.framework or "?" for r in run.ranks})
            if len(frameworks) > 1:
                notes.warn(
                    f"one run holds traces of {' and '.join(frameworks)}: traces of different jobs? "
                    "(to compare runs, give each its own: traceview compare A B)"
                )
            present = [r.rank for r in run.ranks]
            manifest = Manifest(
                traceview_version=__version__,
                schema_version=S.SCHEMA_VERSION,
                run_id=run_id,
                created=time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
                command=command or [],
                inputs=[str(p) for p in paths],
                flight_dumps=[str(p) for p in dumps],
                framework="+".join(frameworks),
                world_size=world,
                ranks_present=present,
                missing_ranks=sorted(set(range(world)) - set(present)) if world else [],
                ranks=run.ranks,
                notes=ManifestNotes(warnings=notes.warnings, remarks=notes.remarks),
                ingest_seconds=round(time.time() - started, 3),
                analysis_version=analysis_version if analyze is not None else None,
                collect=collected,
                window=before.window if before is not None else None,
            )
            R.write_manifest(staged, manifest)
            R.fault_point("ingest:staged")
            try:
                R.replace_dir(staged, out)
            except OSError as exc:
                raise cannot_write(out, exc) from None
        except OutputError as exc:  # name where it was going, not the staging folder
            shutil.rmtree(staged, ignore_errors=True)
            raise OutputError(str(exc).replace(str(staged), str(out))) from None
        except TraceviewError:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
    return out


def _collect_notes(collected: Collected, notes: Notes) -> None:
    """What `traceview collect` recorded about ranks that ended badly and other processes."""
    for rank in collected.ranks:
        if rank.state not in ("ok", "running"):
            detail = f" ({rank.detail})" if rank.detail else ""
            notes.warn(f"rank {rank.rank} ended: {rank.state}{detail}")
        if rank.stop_reason:
            at = f" at step {rank.stop_step}" if rank.stop_step is not None else ""
            notes.warn(f"rank {rank.rank}: profile stopped{at}: {rank.stop_reason}")
        if not rank.trace:
            notes.warn(f"rank {rank.rank} wrote no trace")
    others = collected.processes
    if others:
        roles = sorted({str(p.role) for p in others})
        counts = ", ".join(f"{sum(str(p.role) == r for p in others)} {r}" for r in roles)
        traced = sum(p.trace for p in others)
        notes.remark(
            f"parameter-server job: {counts} beside the workers; "
            + (
                f"{traced} profiled (by worker 0's KVStore or the chief), the rest recorded"
                if traced
                else "recorded but not profiled (what the servers do shows as the workers' "
                "push/pull time)"
            )
        )
        for proc in others:
            if proc.state not in ("ok", "running"):
                detail = f" ({proc.detail})" if proc.detail else ""
                notes.warn(f"{proc.role} (pid {proc.pid}) ended: {proc.state}{detail}")
