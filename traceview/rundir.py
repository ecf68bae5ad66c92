"""The run directory: the boundary between stages, so any stage can re-run from disk.

    RUN/
      manifest.json                    what was run and read, per-rank status, notes
      raw/rank-00000/...               traces as the framework wrote them (from ``collect``)
      events/rank=0/part-0.parquet     normalized events, hive-partitioned by rank
      steps.parquet  ops.parquet  collectives.parquet  comm.parquet
                                       the per-rank analysis, a cache (traceview.analysis)

Every file is written to a temporary name and renamed into place, so a reader never sees half a
file, and a crash leaves the previous version (or nothing) rather than a torn one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from traceview import schema as S
from traceview.errors import BadInput
from traceview.manifest import Manifest, from_json

MANIFEST = "manifest.json"
EVENTS = "events"
RAW = "raw"
STEPS = "steps.parquet"
OPS = "ops.parquet"


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
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary sibling of ``path`` to write; renamed onto ``path`` if the block succeeds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, FILE_MODE)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_json(path: Path, value: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(value, indent=2, sort_keys=False, default=str) + "\n")


def write_parquet(path: Path, table: pa.Table) -> None:
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd", row_group_size=1 << 16)


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and (path / MANIFEST).is_file()


def events_path(run: Path, rank: int) -> Path:
    return run / EVENTS / f"rank={rank}" / "part-0.parquet"


def raw_dir(run: Path, rank: int) -> Path:
    return run / RAW / f"rank-{rank:05d}"


def write_events(run: Path, rank: int, events: pa.Table) -> Path:
    """One rank's events; the rank lives in the path (hive partitioning), not in the file."""
    path = events_path(run, rank)
    write_parquet(path, events.drop_columns([S.RANK]))
    return path


def read_manifest(run: Path) -> Manifest:
    try:
        data = (run / MANIFEST).read_bytes()
    except FileNotFoundError:
        raise BadInput(f"{run}: not a run directory (no {MANIFEST})") from None
    except OSError as exc:
        raise BadInput(f"{run}/{MANIFEST}: unreadable ({exc})") from None
    manifest: Manifest = from_json(data, Manifest, f"{run}/{MANIFEST}")
    return manifest


def write_manifest(run: Path, manifest: Manifest) -> None:
    write_json(run / MANIFEST, manifest.to_builtins())


def read_table(path: Path) -> pa.Table:
    try:
        # ParquetFile, not read_table: the latter imports pyarrow.dataset (~0.25 s) on first use
        with pq.ParquetFile(path) as file:
            return file.read()
    except FileNotFoundError:
        raise BadInput(f"{path}: missing (re-run `traceview ingest`)") from None
    except (OSError, pa.ArrowInvalid) as exc:
        raise BadInput(f"{path}: unreadable ({exc})") from None


def read_steps(run: Path) -> pa.Table:
    return read_table(run / STEPS)


def read_ops(run: Path) -> pa.Table:
    return read_table(run / OPS)


def event_ranks(run: Path) -> list[int]:
    """The ranks that have events in ``run``."""
    return sorted(
        int(path.parent.name.split("=", 1)[1]) for path in (run / EVENTS).glob("rank=*/*.parquet")
    )


def read_events(run: Path, ranks: list[int] | None = None) -> pa.Table:
    """Events of ``ranks`` (all when None), with the rank column restored."""
    tables = []
    root = run / EVENTS
    paths = sorted(root.glob("rank=*/*.parquet"), key=lambda p: int(p.parent.name.split("=", 1)[1]))
    for path in paths:
        rank = int(path.parent.name.split("=", 1)[1])
        if ranks is not None and rank not in ranks:
            continue
        table = read_table(path)
        table = table.append_column(S.RANK, pa.array([rank] * table.num_rows, pa.int32()))
        tables.append(S.conform(table, S.EVENTS_SCHEMA))
    if not tables:
        return S.EVENTS_SCHEMA.empty_table()
    return pa.concat_tables(tables, promote_options="permissive").unify_dictionaries()


def replace_dir(staged: Path, target: Path) -> None:
    """Move the finished directory ``staged`` onto ``target``, keeping ``target``'s raw traces."""
    if target.exists():
        if (target / RAW).exists() and not (staged / RAW).exists():
            os.replace(target / RAW, staged / RAW)
        trash = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, trash)
        os.replace(staged, target)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(staged, target)
