"""The cached analysis in a run directory: whether it may be read (this analysis, these inputs),
reading it, and the critical path kept between reports."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from traceview.analysis import ANALYSIS_VERSION, RANK_TABLES
from traceview.model import schema as S
from traceview.model.columns import SpilledTable, TableOnDemand
from traceview.model.errors import BadInput, OutputError
from traceview.model.manifest import Manifest
from traceview.store import rundir as R


class RunReplaced(Exception):
    """The run directory changed while it was read: an ingest replaced it (or a file in it)."""


def _version(value: str | None) -> int:
    return int(value) if value and value.isdigit() else 0


def _key(manifest: Manifest, seen: dict[str, R.Identity]) -> bytes:
    """The cache key of this run as ``seen``, with this analysis."""
    return R.cache_key(manifest.run_id, ANALYSIS_VERSION, R.inputs_key(seen))


def _cache(
    run: Path,
    tables: dict[str, pa.Table],
    segments: list[pa.Table | SpilledTable],
    key: bytes,
    seen: dict[str, R.Identity],
) -> None:
    """Put ``tables`` in place as ``run``'s cache (each recording ``key``: its run, analysis
    and inputs), and the analysis version in its manifest, if the run on disk is still ``seen``
    once they are written beside it. Each is a temporary file made in the run directory and
    renamed onto its name there: a rename replaces a symbolic link at that name rather than
    write through it, and a run directory swapped away by an ingest after the temporary files
    were made takes them with it (the rename then finds nothing to move), so a new run never
    receives this one's tables. RunReplaced where the run changed: nothing is renamed."""
    with ExitStack() as stack:
        raw = json.loads((run / R.MANIFEST).read_text())
        manifest_tmp = stack.enter_context(R.atomic_path(run / R.MANIFEST, make_parent=False))
        manifest_tmp.write_text(
            json.dumps({**raw, "analysis_version": ANALYSIS_VERSION}, indent=2, default=str) + "\n"
        )
        for name, table in tables.items():
            tmp = stack.enter_context(R.atomic_path(run / f"{name}.parquet", make_parent=False))
            R.write_table(tmp, R.with_cache_key(table, key))
        tmp = stack.enter_context(R.atomic_path(run / "segments.parquet", make_parent=False))
        schema = R.with_cache_key(S.SEGMENTS_SCHEMA.empty_table(), key).schema
        R.write_table_parts(tmp, segments, schema)
        if R.identities(run) != seen:
            raise RunReplaced(str(run))  # (the temporary files go; nothing is renamed)


#: The critical path a report took (analysis/critical_path/report.py's Explained), per choice of
#: steps and changes, for the next report of the run: at 1,024 ranks it is most of the time
#: `report` takes.
PATH_CACHE = "critical_path.cache.json"


_PATH_CACHE_ENTRIES = 8


class PathFile:
    """The run directory's PATH_CACHE (analysis/critical_path/report.py's PathCache): its entries
    count only where they record the key the run's tables were read with. A damaged, foreign
    or unwritable file is only a cache: read as empty, left as it is."""

    def __init__(self, run: Path, key: bytes):
        self.run, self.file, self.key = run, run / PATH_CACHE, key.hex()

    def _entries(self) -> dict[str, Any]:
        import msgspec

        from traceview.analysis.critical_path import Explained

        if R.leads_out(self.run, self.file) is not None:
            return {}
        try:
            doc = msgspec.json.decode(self.file.read_bytes(), type=tuple[str, dict[str, Explained]])
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            return {}
        return doc[1] if doc[0] == self.key else {}

    def get(self, key: str) -> Any:
        return self._entries().get(key)

    def put(self, key: str, explained: Any) -> None:
        import msgspec

        entries = self._entries()
        entries.pop(key, None)
        entries[key] = explained
        kept = dict(list(entries.items())[-_PATH_CACHE_ENTRIES:])
        with suppress(OutputError), R.atomic_path(self.file, make_parent=False) as tmp:
            tmp.write_bytes(msgspec.json.encode((self.key, kept)))


def _current(manifest: Manifest, seen: dict[str, R.Identity]) -> bool:
    """Whether the cache may be read: this analysis wrote it, and no input is refused (a link
    out of the run directory, a file that cannot be looked at: recomputing says which)."""
    inputs = [v for k, v in seen.items() if k != R.MANIFEST]
    return manifest.analysis_version == ANALYSIS_VERSION and all(
        isinstance(v, tuple) for v in inputs
    )


#: The shape of each cached table (RANK_TABLES'): one of another shape is damaged, and
#: recomputed. The segments' labels are kept as dictionaries: millions of segments name a few
#: hundred phases, kinds and operators, which as strings were most of a large run's memory.
_TABLE_SCHEMAS = {
    **RANK_TABLES,
    "segments": pa.schema(
        [
            f.with_type(pa.dictionary(pa.int32(), pa.string()))
            if f.name in (S.PHASE, S.KIND, S.OP)
            else f
            for f in RANK_TABLES["segments"]
        ]
    ),
}


def _read_tables(run: Path, key: bytes | None = None) -> tuple[dict[str, pa.Table], TableOnDemand]:
    """The cached analysis tables, the segments apart (opened, read where needed); with
    ``key``, each must record it (``R.CACHE_KEY``: this run, this analysis, these inputs), else
    BadInput: a table of another run, or computed from other events, is not read as this run's.
    A table behind a link out of the run directory is refused alike (and replaced, not written
    through, when the cache is written again)."""

    tables = {}
    segments = None
    for name in RANK_TABLES:
        path = run / f"{name}.parquet"
        R.check_inside(run, path)
        check = _cached_as(key, path) if key else None
        if name == "segments":
            segments = R.table_on_demand(path, _TABLE_SCHEMAS[name], check)
            continue
        table = R.read_table(path, _TABLE_SCHEMAS[name], check)
        tables[name] = R.without_cache_key(table)
    assert segments is not None
    return tables, segments


def _cached_as(key: bytes, path: Path) -> Callable[[pq.ParquetFile], None]:
    """A check that a cached table records ``key`` (else BadInput)."""

    def mine(file: pq.ParquetFile) -> None:
        if (file.schema_arrow.metadata or {}).get(R.CACHE_KEY) != key:
            raise BadInput(f"{path}: a stale cache, or another run's")

    return mine
