"""The run directory: the boundary between stages, so any stage can re-run from disk.

    RUN/
      manifest.json                    what was run and read, per-rank status, notes
      raw/rank-00000/...               traces as the framework wrote them (from ``collect``)
      events/rank=0/part-0.parquet     normalized events, hive-partitioned by rank
      steps.parquet  ops.parquet  collectives.parquet  comm.parquet  gpu.parquet  launches.parquet
                                       the per-rank analysis, a cache (traceview.analysis)

Every file is written to a temporary name and renamed into place, so a reader never sees half a
file, and a crash leaves the previous version (or nothing) rather than a torn one. A whole run
directory is built beside its target as ``.RUN.partial-HOST-PID`` and swapped in at the end
(``replace_dir``); a kill at any point leaves either the previous run or the new one at RUN.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import signal
import socket
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from traceview.model import schema as S
from traceview.model.columns import SpilledTable, TableOnDemand, Within
from traceview.model.errors import BadInput, Notes, UsageError, cannot_write
from traceview.model.escape import encodable, safe
from traceview.model.manifest import Manifest, from_json
from traceview.store.names import EVENTS, LIVE, MANIFEST, RAW, REQUESTS, WINDOWS


def _process_umask() -> int:
    """The process's umask, read without changing it where Linux says it (os.umask can only
    read it by setting it, which races with threads writing files)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: Files are created as any tool creates them: 0666 less the umask (mkstemp makes them 0600, and
#: nobody else on a shared cluster could read a run directory).
FILE_MODE = 0o666 & ~_process_umask()


@contextmanager
def atomic_path(path: Path, *, make_parent: bool = True) -> Iterator[Path]:
    """A temporary sibling of ``path`` to write; renamed onto ``path`` if the block succeeds.
    A system error while writing (full, read-only, over a file-size limit) is an OutputError
    naming ``path``. The rename replaces whatever is at ``path``, a symbolic link included: it
    never writes through one. ``make_parent=False``: a missing folder is an error, not made (a
    run directory swapped away by an ingest must not come back empty)."""
    try:
        if make_parent:
            path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.fchmod(fd, FILE_MODE)
        os.close(fd)
    except OSError as exc:
        raise cannot_write(path, exc) from None
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        raise cannot_write(path, exc) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_json(path: Path, value: Any) -> None:
    """``value`` (builtins or a msgspec Struct) as indented JSON, atomically; a file name's bytes
    that are not UTF-8 written escaped. (msgspec: json.dumps took 0.7 s for the manifest of
    20,000 ranks.)"""
    try:
        data = msgspec.json.encode(value, enc_hook=str)
    except UnicodeEncodeError:
        data = msgspec.json.encode(encodable(msgspec.to_builtins(value, enc_hook=str)))
    with atomic_path(path) as tmp:
        tmp.write_bytes(msgspec.json.format(data, indent=2) + b"\n")


def parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """How traceview writes Parquet: zstd, and dictionary pages for text columns only (ids,
    times and sizes are nearly all distinct: a dictionary there is tried and dropped per page,
    which made a rank's events file 1.6x larger, 1.3x slower to write and 3x slower to read).
    Statistics (min/max per row group, for readers that skip groups) for the other columns
    only: a group of events holds nearly every name, kind and phase, so text statistics skip
    nothing, and they took a quarter of the time to write a rank's events."""
    text = [
        f.name
        for f in schema
        if pa.types.is_string(f.type)
        or pa.types.is_large_string(f.type)
        or (pa.types.is_dictionary(f.type) and pa.types.is_string(f.type.value_type))
    ]
    others = [f.name for f in schema if f.name not in text]
    return {"compression": "zstd", "use_dictionary": text, "write_statistics": others}


#: Rows per row group of the Parquet files traceview writes.
ROW_GROUP = 1 << 16


def write_table(path: Path, table: pa.Table) -> None:
    """``table`` as Parquet at ``path`` as it is (``write_parquet`` writes beside and renames)."""
    pq.write_table(table, path, row_group_size=ROW_GROUP, **parquet_options(table.schema))


def write_parquet(path: Path, table: pa.Table) -> None:
    with atomic_path(path) as tmp:
        write_table(tmp, table)


def write_parquet_parts(
    path: Path, parts: list[pa.Table | SpilledTable], schema: pa.Schema
) -> None:
    """``parts`` one after the other as one Parquet file (``schema``, its metadata
    included), a row group at a time: a spilled part is read a batch at a time, never whole.
    The file is the one ``write_parquet`` writes of the parts concatenated."""
    with atomic_path(path) as tmp:
        write_table_parts(tmp, parts, schema)


def write_table_parts(path: Path, parts: list[pa.Table | SpilledTable], schema: pa.Schema) -> None:
    """``write_parquet_parts`` at ``path`` as it is (no temporary file)."""
    with pq.ParquetWriter(path, schema, **parquet_options(schema)) as out:
        held: list[pa.RecordBatch] = []
        rows, written = 0, False
        for part in parts:
            for batch in part.batches() if isinstance(part, SpilledTable) else part.to_batches():
                if not batch.schema.equals(schema):
                    batch = batch.cast(schema)
                held.append(batch)
                rows += batch.num_rows
                if rows >= ROW_GROUP:
                    table = pa.Table.from_batches(held, schema)
                    whole = rows - rows % ROW_GROUP
                    out.write_table(table.slice(0, whole), ROW_GROUP)
                    held, rows, written = table.slice(whole).to_batches(), rows - whole, True
        if rows or not written:  # (an empty table is written as write_table writes it)
            out.write_table(pa.Table.from_batches(held, schema), ROW_GROUP)


#: The folder of a run being built where its ranks spill what is written on later.
SPILL = ".spill"


def spill_dir(run: Path) -> Path:
    """Where an ingest spills what it writes on later (``SpilledTable``), in the run it
    builds; removed once the run's tables are written."""
    folder = run / SPILL
    folder.mkdir(exist_ok=True)
    return folder


#: A cached analysis table's schema metadata: which run, analysis and inputs it was computed
#: from (``cache_key``); one whose key is not the run's own is stale or another run's, and
#: recomputed, never read as valid.
CACHE_KEY = b"traceview.cache"


def cache_key(run_id: str | None, analysis_version: str | None, inputs: str) -> bytes:
    return json.dumps(
        {"run_id": run_id, "analysis_version": analysis_version, "inputs": inputs},
        sort_keys=True,
    ).encode()


def with_cache_key(table: pa.Table, key: bytes) -> pa.Table:
    return table.replace_schema_metadata({**(table.schema.metadata or {}), CACHE_KEY: key})


def without_cache_key(table: pa.Table) -> pa.Table:
    metadata = table.schema.metadata or {}
    if CACHE_KEY not in metadata:
        return table
    return table.replace_schema_metadata({k: v for k, v in metadata.items() if k != CACHE_KEY})


def is_run_dir(path: Path) -> bool:
    try:
        return path.is_dir() and (path / MANIFEST).is_file()
    except OSError as exc:  # a folder this user may not look into
        raise BadInput(f"{path}: cannot read ({exc.strerror or exc})") from None


def leads_out(run: Path, path: Path) -> str | None:
    """Where ``path``, a path inside ``run``, leads once its symbolic links are followed, when
    that is outside ``run`` (links followed too); None where it stays inside. Nothing in a run
    directory is followed out of it, for reading or writing: an ``events/`` linked to another
    run, a rank's file linked to a file elsewhere."""
    root = os.path.realpath(run)
    real = os.path.realpath(path)
    try:
        if os.path.commonpath([root, real]) == root:
            return None
    except ValueError:  # (different drives)
        pass
    return real


def check_inside(run: Path, path: Path) -> None:
    """BadInput where ``path`` leads out of ``run`` through a symbolic link."""
    real = leads_out(run, path)
    if real is not None:
        raise BadInput(
            f"{path}: a symbolic link out of the run directory (to {safe(real, 120)}); not followed"
        )


def events_path(run: Path, rank: int) -> Path:
    return run / EVENTS / f"rank={rank}" / "part-0.parquet"


#: A rank's events file of fewer rows than this is written uncompressed, each page with its
#: checksum (verified as it is read, ``parquet_file``): zstd's setup per column was 0.39 of the
#: 0.72 ms that writing a one-step rank's 27 columns took, and the checksum finds a damaged
#: page as zstd's frame does (every 64-byte overwrite of such a file, either way).
SMALL_EVENTS_ROWS = 1024


def write_events(run: Path, rank: int, events: pa.Table, *, in_place: bool = False) -> Path:
    """One rank's events; the rank lives in the path (hive partitioning), not in the file.
    ``in_place``: written where it belongs, not beside and renamed, by the only process that
    writes it into a run being built (a local pool's worker: the run's folder is renamed into
    place once every rank is in, and a file cut short there is never seen)."""
    path = events_path(run, rank)
    table = events.drop_columns([S.RANK])
    if not in_place:
        with atomic_path(path) as tmp:
            _write_events_file(table, tmp)
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_events_file(table, path)
    except OSError as exc:
        path.unlink(missing_ok=True)
        raise cannot_write(path, exc) from None
    return path


def _write_events_file(table: pa.Table, path: Path) -> None:
    options = parquet_options(table.schema)
    if table.num_rows >= SMALL_EVENTS_ROWS:
        pq.write_table(table, path, row_group_size=ROW_GROUP, **options)
        return
    # (a small file uncompressed, each page with its checksum, made whole in memory and written
    # by Python: pyarrow's own opening of a path took 0.1 of the 0.4 ms a one-step rank's took)
    options.update(compression="none", write_page_checksum=True)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=ROW_GROUP, **options)
    with open(path, "wb") as out:
        out.write(sink.getvalue())


def read_manifest(run: Path) -> Manifest:
    check_inside(run, run / MANIFEST)
    try:
        data = (run / MANIFEST).read_bytes()
    except FileNotFoundError:
        raise BadInput(parked_hint(run) or f"{run}: not a run directory (no {MANIFEST})") from None
    except NotADirectoryError:
        raise BadInput(f"{run}: not a run directory (a file)") from None
    except OSError as exc:
        raise BadInput(f"{run}/{MANIFEST}: unreadable ({exc})") from None
    manifest: Manifest = from_json(data, Manifest, f"{run}/{MANIFEST}")
    return manifest


def write_manifest(run: Path, manifest: Manifest) -> None:
    write_json(run / MANIFEST, manifest)


def parquet_file(path: Path, dictionary: list[str] | None = None) -> pq.ParquetFile:
    """The Parquet file at ``path``, opened only where it is a regular file: a FIFO, socket or
    device in its place (a run directory is as untrusted as a trace) would block or never end.
    FileNotFoundError where nothing is there; BadInput for anything else. ``dictionary``: text
    columns read as dictionaries."""
    mode = path.stat().st_mode  # (links followed)
    if not stat.S_ISREG(mode):
        raise BadInput(f"{path}: {special_kind(mode)}, not a file traceview wrote; not opened")
    try:
        # (a page written with its checksum, a small rank's events: SMALL_EVENTS_ROWS)
        return pq.ParquetFile(path, read_dictionary=dictionary, page_checksum_verification=True)
    except KeyError as exc:  # a column to read as a dictionary that the file does not have
        raise BadInput(f"{path}: not a table traceview wrote (no column {safe(exc)})") from None


def special_kind(mode: int) -> str:
    """What a file that is not a regular one is, for a message."""
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "a special file"


def read_table(
    path: Path,
    schema: pa.Schema | None = None,
    check: Callable[[pq.ParquetFile], None] | None = None,
) -> pa.Table:
    """The table in ``path``; with ``schema``, one of that shape (cast where it can be), else
    bad input: a file in a run directory is as untrusted as a trace. ``check`` looks at the
    opened file first (its metadata) and raises BadInput to refuse it unread. The columns that
    ``schema`` holds as dictionaries are read as such."""
    try:
        # ParquetFile, not read_table: the latter imports pyarrow.dataset (~0.25 s) on first use
        with _opened(path, schema, check) as file:
            table = file.read()
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise BadInput(f"{path}: unreadable ({exc})") from None
    return _shaped(path, table, schema)


def table_on_demand(
    path: Path, schema: pa.Schema, check: Callable[[pq.ParquetFile], None] | None = None
) -> TableOnDemand:
    """The table in ``path`` as ``read_table`` reads it, opened and checked now (its footer:
    a missing, foreign or cut file is refused here) but read only where it is asked for,
    through the file opened now: a run directory replaced meanwhile is read as it was, never a
    mix of two. A file of another shape than ``schema`` is read now (and cast, or refused)."""
    try:
        file = _opened(path, schema, check)
        if not file.schema_arrow.remove_metadata().equals(schema):
            with file:
                return TableOnDemand.of(without_cache_key(_shaped(path, file.read(), schema)))
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise BadInput(f"{path}: unreadable ({exc})") from None

    def unreadable(exc: BaseException) -> BadInput:
        return BadInput(f"{path}: unreadable ({exc}); run `traceview ingest` again")

    def read() -> pa.Table:
        try:
            return without_cache_key(file.read())
        except (OSError, pa.ArrowException, ValueError) as exc:
            raise unreadable(exc) from None

    def pieces(within: Within | None) -> Iterator[pa.Table]:
        meta = file.metadata
        column = -1 if within is None else file.schema_arrow.get_field_index(within[0])
        offset = 0  # (the first row of the group)
        for group in range(meta.num_row_groups):
            rows = meta.row_group(group).num_rows
            if within is not None and column >= 0 and _outside(meta, group, column, within):
                offset += rows
                continue
            try:
                piece = file.read_row_group(group)
            except (OSError, pa.ArrowException, ValueError) as exc:
                raise UnreadableRows(str(unreadable(exc)), offset) from None
            yield without_cache_key(piece)
            offset += rows

    return TableOnDemand(file.metadata.num_rows, read, file.close, pieces)


class UnreadableRows(BadInput):
    """A piece of a table could not be read: the rows from ``offset`` on were not given."""

    def __init__(self, message: str, offset: int):
        super().__init__(message)
        self.offset = offset


def _outside(meta: pq.FileMetaData, group: int, column: int, within: Within) -> bool:
    """Whether a row group's statistics say it holds no row ``within`` asks for."""
    stats = meta.row_group(group).column(column).statistics
    if stats is None or not stats.has_min_max or stats.null_count != 0:
        return False
    _, lo, hi = within
    return bool(stats.max < lo or stats.min > hi)


def _opened(
    path: Path, schema: pa.Schema | None, check: Callable[[pq.ParquetFile], None] | None
) -> pq.ParquetFile:
    dictionary = None
    if schema is not None:
        dictionary = [f.name for f in schema if pa.types.is_dictionary(f.type)] or None
    try:
        file = parquet_file(path, dictionary)
    except FileNotFoundError:
        raise BadInput(f"{path}: missing (re-run `traceview ingest`)") from None
    if check is not None:
        try:
            check(file)
        except BaseException:
            file.close()
            raise
    return file


def _shaped(path: Path, table: pa.Table, schema: pa.Schema | None) -> pa.Table:
    if schema is None or table.schema.equals(schema):
        return table
    try:
        return S.conform(table, schema)
    except (pa.ArrowException, ValueError, NotImplementedError) as exc:
        raise BadInput(f"{path}: not a table traceview wrote ({exc})") from None


def side_path(run: Path, name: str) -> Path:
    """Where every rank's rows of the side input ``name`` (schema.SIDE_INPUTS) are kept: ingest
    writes the file from the traces (not a cache: there is nothing to recompute it from)."""
    return run / f"{S.SIDE_INPUTS[name].name}.parquet"


def read_side(run: Path, name: str, ranks: list[int] | None = None) -> pa.Table | None:
    """The rows of side input ``name`` of ``ranks`` (all when None); None where the run has no
    such file (ingested before traceview read that input: its rows are unknown, not empty)."""
    path = side_path(run, name)
    if not path.is_file():
        return None
    check_inside(run, path)
    table = read_table(path, S.SIDE_INPUTS[name].stored)
    if ranks is not None:
        table = table.filter(pc.is_in(table.column(S.RANK), pa.array(ranks, pa.int32())))
    return table


def _rank_parts(run: Path) -> list[tuple[int, Path]]:
    """(rank, file) of every events file, by rank; folders not named rank=N are not ours."""
    parts = []
    events = run / EVENTS
    try:
        folders = [e.name for e in os.scandir(events) if e.name.startswith("rank=")]
    except OSError:  # (none, or not a folder: no events)
        return []
    for name in folders:  # (scandir, not glob: 20,000 ranks' folders took 0.45 s to glob)
        number = name.split("=", 1)[1]
        if not (number.isascii() and number.isdigit() and len(number) < 10):
            continue
        try:
            files = [e.name for e in os.scandir(events / name) if e.name.endswith(".parquet")]
        except OSError:  # (a file named rank=N, or one that cannot be read: no events)
            continue
        parts += [(int(number), events / name / file) for file in files]
    return sorted(parts)


def event_ranks(run: Path) -> list[int]:
    """The ranks that have events in ``run``."""
    return sorted({rank for rank, _ in _rank_parts(run)})


def read_events(
    run: Path,
    ranks: list[int] | None = None,
    damaged: dict[int, BadInput] | None = None,
    run_id: str | None = None,
) -> pa.Table:
    """Events of ``ranks`` (all when None), with the rank column restored. With ``damaged``, a
    rank whose events cannot be read is left out and its error kept there (the others are
    read); without, it is raised. A rank's file that leads out of ``run`` through a link is
    refused, and with ``run_id`` (the manifest's) so is one whose events belong to another run."""
    tables = []
    for rank, path in _rank_parts(run):
        if ranks is not None and rank not in ranks:
            continue
        try:
            check_inside(run, path)
            tables.append(_rank_events(path, rank, run_id))
        except BadInput as exc:
            if damaged is None:
                raise
            damaged[rank] = exc
    if not tables:
        return S.EVENTS_SCHEMA.empty_table()
    return pa.concat_tables(tables, promote_options="permissive").unify_dictionaries()


def _rank_events(path: Path, rank: int, run_id: str | None) -> pa.Table:
    table = read_table(path, check=lambda file: same_run(file, path, run_id))
    table = table.append_column(S.RANK, pa.array([rank] * table.num_rows, pa.int32()))
    try:
        return S.conform(table, S.EVENTS_SCHEMA)
    except (pa.ArrowException, ValueError, NotImplementedError) as exc:
        raise BadInput(f"{path}: not events traceview wrote ({exc})") from None


def same_run(file: pq.ParquetFile, path: Path, run_id: str | None) -> None:
    """BadInput where the events in ``file`` belong to another run than ``run_id`` (None: not
    checked). Cheap: the run id is constant in a rank's file, so only the first row group's
    ``run_id`` column is read (one dictionary entry and its indices), never the other columns
    or groups."""
    if run_id is None or file.metadata.num_row_groups == 0:
        return
    if S.RUN_ID not in file.schema_arrow.names:
        return  # not events traceview wrote: reading it says so
    column = file.read_row_group(0, columns=[S.RUN_ID]).column(0)
    found = column[0].as_py() if len(column) else None
    if found is not None and found != run_id:
        raise BadInput(
            f"its events belong to run {safe(found, 40)}, not {safe(run_id, 40)} ({path})"
        )


def check_events(run: Path, rank: int, run_id: str | None) -> None:
    """BadInput where ``rank``'s events file leads out of ``run`` or belongs to another run;
    only its footer and first run id are read."""
    path = events_path(run, rank)
    check_inside(run, path)
    try:
        with parquet_file(path) as file:
            same_run(file, path, run_id)
    except FileNotFoundError:
        raise BadInput(f"{path}: missing (re-run `traceview ingest`)") from None
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise BadInput(f"{path}: unreadable ({exc})") from None


#: What a run directory's analysis is computed from, and its manifest: a file's identity
#: (st_ino, st_size, st_mtime_ns), ``"out"`` for a link out of the run directory, None where it
#: cannot be looked at.
Identity = tuple[int, int, int] | str | None


def _identity(run: Path, path: Path) -> Identity:
    if leads_out(run, path) is not None:
        return "out"
    try:
        found = path.stat()
    except OSError:
        return None
    return (found.st_ino, found.st_size, found.st_mtime_ns)


def _part_identity(run: Path, path: Path, events_inside: bool) -> Identity:
    """``_identity`` of a rank's events file: where the events folder stays inside the run and
    neither the rank's folder nor the file is a link, the file is inside, seen by one ``lstat``
    (a real path of each of 20,000 files took a second)."""
    if events_inside and not os.path.islink(path.parent):
        try:
            here = os.lstat(path)
        except OSError:
            return None
        if not stat.S_ISLNK(here.st_mode):
            return (here.st_ino, here.st_size, here.st_mtime_ns)
    return _identity(run, path)


def identities(run: Path) -> dict[str, Identity]:
    """The identity of the run on disk: its manifest, every rank's events file and its side
    inputs' files. Two looks that differ saw different runs (an ingest replaced it between them) or a
    file changed; a few stat calls per rank, nothing read."""
    found = {MANIFEST: _identity(run, run / MANIFEST)}
    events_inside = leads_out(run, run / EVENTS) is None
    for rank, path in _rank_parts(run):
        found[f"{EVENTS}/rank={rank}/{path.name}"] = _part_identity(run, path, events_inside)
    for name in S.SIDE_INPUTS:
        side = side_path(run, name)
        if side.is_symlink() or side.exists():
            found[side.name] = _identity(run, side)
    return found


def inputs_key(seen: dict[str, Identity]) -> str:
    """The analysis's inputs among ``seen`` (events and side inputs, not the manifest) as a short
    key a cached table records: sizes and modification times, not inode numbers, so that a
    copy that keeps times (``cp -p``, ``rsync -a``) keeps its cache."""
    import hashlib

    parts = sorted(
        (name, list(value[1:]) if isinstance(value, tuple) else value)
        for name, value in seen.items()
        if name != MANIFEST
    )
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:24]


def read_window(
    run: Path, rank: int, start_ns: int, end_ns: int, run_id: str | None = None
) -> pa.Table:
    """The events of ``rank`` that overlap [start_ns, end_ns), reading only the row groups that
    hold one: a group whose statistics put every start at or after the window's end is skipped
    unread, and of the others only the start and duration columns are read to find out. One
    step of a multi-GB trace costs its own row groups and two columns, never the whole table."""
    path = events_path(run, rank)
    check_inside(run, path)
    try:
        with parquet_file(path) as file:
            same_run(file, path, run_id)
            leaves = [file.schema.column(i).path for i in range(len(file.schema))]
            ts_col = leaves.index(S.TS_NS)  # its statistics, among the file's leaf columns
            chosen = []
            for group in range(file.metadata.num_row_groups):
                stats = file.metadata.row_group(group).column(ts_col).statistics
                if stats is not None and stats.has_min_max and stats.min >= end_ns:
                    continue
                times = file.read_row_group(group, columns=[S.TS_NS, S.DUR_NS])
                ts = times.column(0).to_numpy(zero_copy_only=False)
                dur = times.column(1).to_numpy(zero_copy_only=False)
                if ((ts < end_ns) & (ts + dur > start_ns)).any():
                    chosen.append(group)
            table = file.read_row_groups(chosen) if chosen else file.schema_arrow.empty_table()
    except FileNotFoundError:
        raise BadInput(f"{path}: missing (re-run `traceview ingest`)") from None
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise BadInput(f"{path}: unreadable ({exc})") from None
    if table.num_rows:
        ts = table.column(S.TS_NS)
        table = table.filter(
            pc.and_(pc.less(ts, end_ns), pc.greater(pc.add(ts, table.column(S.DUR_NS)), start_ns))
        )
    table = table.append_column(S.RANK, pa.array([rank] * table.num_rows, pa.int32()))
    try:
        return S.conform(table, S.EVENTS_SCHEMA)
    except (pa.ArrowException, ValueError, NotImplementedError) as exc:
        raise BadInput(f"{path}: not events traceview wrote ({exc})") from None


def fault_point(name: str) -> None:
    """Die here by SIGKILL when TRACEVIEW_FAULT names this point: the tests kill an ingest at
    each step of replacing a run, for real, to show the previous run survives every one."""
    if os.environ.get("TRACEVIEW_FAULT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


def _host() -> str:
    return socket.gethostname().replace("/", "_") or "host"


def staging_dir(target: Path, kind: str = "partial") -> Path:
    """Where a new ``target`` is built (``partial``) or an old one parked (``old``): a hidden
    sibling naming the host and process, so a later ingest can tell a dead owner's leftover."""
    return target.with_name(f".{target.name}.{kind}-{_host()}-{os.getpid()}")


@contextmanager
def ingest_lock(target: Path) -> Iterator[None]:
    """Held while one ingest builds and swaps in ``target``: a second ingest into the same
    place stops at once (UsageError naming the first) instead of racing it, so the run left
    there is one run, whole. The lock is ``flock`` on ``.TARGET.lock`` beside ``target`` (not
    inside: the swap replaces the folder), released when the process ends however it ends; a
    file system without locks is written unlocked, as before."""
    import fcntl

    path = target.with_name(f".{target.name}.lock")
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        except OSError as exc:
            raise cannot_write(target, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.read(fd, 200).decode("utf-8", "replace").strip()
            os.close(fd)
            held = f" (pid {safe(owner, 60)})" if owner else ""
            raise UsageError(
                f"{target}: another traceview ingest is writing it{held}; not replaced "
                "(run again when it ends, or choose another -o)"
            ) from None
        except OSError:  # no locks here (some network file systems): unlocked, as before
            os.close(fd)
            yield
            return
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break  # (not a file its last holder removed after we opened it)
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} on {_host()}\n".encode())
        yield
    finally:
        with suppress(OSError):  # (still held: one that opened it sees it gone, and retries)
            os.unlink(path)
        os.close(fd)


def _owner(target: Path, leftover: Path) -> tuple[str, str, str]:
    """(kind, host, pid) of a leftover of ``target``, read after the known prefix: host names
    (node1.cluster.local) and run names (run.v2) may hold dots and dashes."""
    rest = leftover.name[len(f".{target.name}.") :]
    kind, _, owner = rest.partition("-")
    host, _, pid = owner.rpartition("-")
    return kind, host, pid


def leftovers(target: Path) -> list[Path]:
    """Hidden siblings of ``target`` left by ingests that were killed while building or
    replacing it."""
    prefix = f".{target.name}."
    try:
        return sorted(
            p
            for p in target.parent.iterdir()
            if p.name.startswith(prefix)
            and p.name[len(prefix) :].startswith(("partial-", "old-"))
            and p.is_dir()
        )
    except OSError:
        return []


def parked_hint(run: Path) -> str | None:
    """Why ``run`` is missing when an ingest was killed while replacing it."""
    parked = [p for p in leftovers(run) if _owner(run, p)[0] == "old"]
    if run.exists() or not parked:
        return None
    return (
        f"{run}: not there; the previous run is at {parked[0].name} (an ingest was killed while "
        "replacing it): run the same ingest again, which puts it back first"
    )


def _owner_alive(host: str, pid: str) -> bool | None:
    """Whether the ingest that made a leftover still runs: None when it ran on another host
    (or the name does not say), where this process cannot tell."""
    if host != _host() or not pid.isdigit():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def recover(target: Path, notes: Notes) -> None:
    """Repair what a killed ingest left beside ``target``: a previous run parked as ``.old-``
    while no run is at ``target`` goes back; other leftovers of dead ingests are removed; those
    of live (or remote) ones are named in a warning."""
    for leftover in leftovers(target):
        kind, host, pid = _owner(target, leftover)
        alive = _owner_alive(host, pid)
        if kind == "old" and not target.exists() and is_run_dir(leftover) and alive is not True:
            os.replace(leftover, target)
            notes.warn(
                f"{target}: restored the previous run from {leftover.name} (an ingest was killed "
                "while replacing it)"
            )
        elif alive is False:
            shutil.rmtree(leftover, ignore_errors=True)
            notes.remark(f"removed {leftover.name}, left by an ingest that was killed")
        else:
            notes.warn(
                f"{leftover}: left by an ingest that may still run (on this host or another); "
                "not touched"
            )


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one step (Linux renameat2 with RENAME_EXCHANGE); False where
    the system or the file system cannot, so the caller falls back to two renames."""
    if not sys.platform.startswith("linux") or os.environ.get("TRACEVIEW_NO_EXCHANGE"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # glibc before 2.28, another libc
        return False
    renameat2.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a))


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)  # raw traces reach gigabytes: a second name, not a copy
    except OSError:
        shutil.copy2(src, dst)


#: what an ingest into a run directory keeps of the one it replaces
KEPT = (RAW, WINDOWS, REQUESTS, LIVE)


def replace_dir(staged: Path, target: Path) -> None:
    """Put the finished directory ``staged`` at ``target``, keeping ``target``'s raw traces
    and profile windows (``KEPT``).

    The previous run stays whole at ``target`` until one atomic exchange puts the new one there
    (its raw traces are hard links to the previous run's, made first). Where the exchange is not
    available, the previous run is parked as ``.old-`` for the instant between two renames, and
    ``recover`` puts it back if the process dies there."""
    if not target.exists():
        os.replace(staged, target)
        return
    if not target.is_dir():
        raise BadInput(f"{target}: exists and is a file, not a run directory")
    for name in KEPT:  # (what the job and collect wrote, and the profile windows)
        if (staged / name).exists() or not (target / name).exists():
            continue
        if (target / name).is_dir():
            shutil.copytree(
                target / name, staged / name, symlinks=True, copy_function=_link_or_copy
            )
        else:
            _link_or_copy(str(target / name), str(staged / name))
    fault_point("replace:linked")
    if _exchange(staged, target):
        fault_point("replace:exchanged")
        shutil.rmtree(staged, ignore_errors=True)  # now the previous run
        return
    parked = staging_dir(target, "old")
    os.replace(target, parked)
    fault_point("replace:parked")
    os.replace(staged, target)
    shutil.rmtree(parked, ignore_errors=True)
