"""Open what the user points at — a run directory, a folder of traces, or trace files — as a run.

Commands that read results (report, compare, scaling, tui) all start here: traces are ingested
(with the per-rank analysis) into a temporary run directory that lives as long as the ``with``
block; a run directory is used as it is, its cached analysis tables recomputed from its events
when an older (or newer) traceview wrote them.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from traceview.analysis import ANALYSIS_VERSION, RANK_TABLES, rank_tables
from traceview.model import schema as S
from traceview.model.columns import SpilledTable, TableOnDemand, Within
from traceview.model.errors import BadInput, OutputError, UsageError, cannot_write
from traceview.model.escape import safe
from traceview.model.manifest import Manifest
from traceview.model.progress import Progress, quiet
from traceview.model.results import PathStretch, RunReport, StepCollective
from traceview.store import rundir as R

if TYPE_CHECKING:
    from traceview.analysis.crossrank import CrossRank
    from traceview.model.choice import StepChoice


@dataclass
class Run:
    path: Path  # the run directory (temporary when read from traces)
    label: str  # how to name it to the user
    manifest: Manifest
    tables: dict[str, pa.Table]  # the per-rank analysis tables of every rank (RANK_TABLES) ...
    segments: TableOnDemand  # ... but the segments, the largest, read only where needed
    temporary: bool
    # the steps --steps/--skip chose (None: leading warm-up steps left out): every report of
    # this run counts them, once decided (analysis/selection.py)
    choice: StepChoice | None = None
    # the key its tables were read with (a run directory's current cache): what a report
    # keeps in the run directory records it too (None: nothing is kept)
    cache_key: bytes | None = None

    @property
    def steps(self) -> pa.Table:
        return self.tables["steps"]

    @property
    def ops(self) -> pa.Table:
        return self.tables["ops"]

    @property
    def collectives(self) -> pa.Table:
        return self.tables["collectives"]

    @property
    def has_memory(self) -> bool:
        """Whether ingest read memory records (memory.parquet; some runs predate it), and they
        are inside the run directory (a link out of it is not followed: ``reanalyze`` says so)."""
        path = self.path / f"{R.MEMORY}.parquet"
        return path.is_file() and R.leads_out(self.path, path) is None

    def report(self, top: int = 10, whatif: list[str] | None = None) -> RunReport:

        path = None if self.temporary else str(self.path)
        try:
            return self._summarize(top, path, whatif)
        except UsageError as exc:  # a step choice this run has no steps for: say which run
            raise UsageError(f"{safe(self.label)}: {exc}") from None

    def _summarize(self, top: int, path: str | None, whatif: list[str] | None) -> RunReport:
        from traceview.analysis.summary import summarize

        return summarize(
            self.steps,
            self.ops,
            self.manifest,
            top,
            path=path,
            collectives=self.collectives,
            cross=self.cross,
            gpu=self.tables["gpu"],
            launches=self.tables["launches"],
            memory_steps=self.tables["memory_steps"] if self.has_memory else None,
            choice=self.choice,
            comm=self.tables["comm"],
            segments=self.segments,
            whatif=whatif,
            path_cache=(
                None if self.temporary or self.cache_key is None
                else PathFile(self.path, self.cache_key)
            ),
        )  # fmt: skip

    @cached_property
    def cross(self) -> CrossRank | None:
        """The cross-rank pass over this run's tables (None where ranks are missing), once."""
        from traceview.analysis.summary import cross_rank_of

        return cross_rank_of(self.manifest, self.collectives, self.tables["comm"])

    def export_tables(self) -> dict[str, pa.Table]:
        """The tables ``export`` writes beside the events: steps, ops, the collective calls
        with what matching them across ranks found (``view``: host or device) and their group's
        dimension and ranks (schema.EXPORT_COLLECTIVES_SCHEMA), and on GPU runs
        the gpu table and the launches tables, one grain each (``launch_grains``)."""
        from traceview.analysis.crossrank import matched_table
        from traceview.analysis.gpu import collective_views, launch_grains
        from traceview.analysis.groups import with_group_columns
        from traceview.analysis.summary import complete_flag, groups_of

        groups = self.cross.groups if self.cross is not None else groups_of(self.manifest)
        calls = with_group_columns(matched_table(self.collectives, self.cross), groups)
        tables = {
            "steps": complete_flag(self.steps, self.manifest, self.choice),
            "ops": self.ops,
            "collectives": collective_views(calls),
        }
        if self.tables["gpu"].num_rows:
            tables["gpu"] = self.tables["gpu"]
        if self.tables["launches"].num_rows:
            tables.update(launch_grains(self.tables["launches"]))
        path = self.critical_path()
        if path.num_rows:
            tables["critical_path"] = path
        memory = R.read_memory(self.path) if self.has_memory else None
        if memory is not None and memory.num_rows:  # runs without memory records: none
            tables["memory"] = memory
            tables["memory_steps"] = self.tables["memory_steps"]
        return tables

    def critical_path(self) -> pa.Table:
        """The critical path of every step across ranks, a row per piece
        (schema.CRITICAL_PATH_SCHEMA), on the clock the collectives were matched on."""
        import polars as pl

        from traceview.analysis.critical_path import path_table
        from traceview.analysis.crossrank import Matched

        segments, cross = self.segments, self.cross
        if cross is not None and cross.clocks is not None:
            segments = cross.clocks.shifted_segments(segments)
        steps = sorted(set(self.steps.column(S.STEP).to_pylist()), key=lambda s: (s is None, s))
        matched = cross.matched if cross is not None else Matched(pl.DataFrame())
        return path_table(segments, matched, steps)

    def critical_path_stretches(self) -> dict[int | None, list[PathStretch]]:
        """Every step's critical path as the stretches the report lists (what the TUI draws)."""
        from traceview.analysis.critical_path import path_stretches

        return path_stretches(self.critical_path())

    def clock_offsets(self) -> dict[int, int]:
        """ns to subtract from each rank's times to put it on the run's clock, where they were
        estimated from collectives (traces from several hosts); empty otherwise."""
        fit = self.cross.clocks if self.cross is not None else None
        return {r: round(o) for r, o in fit.offset_ns.items()} if fit is not None else {}

    def step_collectives(self) -> dict[int | None, list[StepCollective]]:
        """Per step, its collective calls matched across ranks, the most skewed first."""
        from traceview.analysis.crossrank import matched_table, step_collectives

        return step_collectives(matched_table(self.collectives, self.cross))

    def collective_spans(self) -> dict[tuple[int, int | None], list[tuple[int, int]]]:
        """Per (rank, step), the [start, end) of each collective call that is not
        point-to-point, on the rank's own clock (as its events are): what a pipeline view
        draws as communication rather than bubble."""
        import polars as pl

        from traceview.analysis.crossrank import POINT_TO_POINT

        calls = pl.from_arrow(self.collectives)
        assert isinstance(calls, pl.DataFrame)
        calls = calls.filter(~pl.col(S.COLLECTIVE).is_in(POINT_TO_POINT))
        spans: dict[tuple[int, int | None], list[tuple[int, int]]] = {}
        for rank, step, start, end in calls.select(
            S.RANK, S.STEP, S.START_NS, S.END_NS
        ).iter_rows():
            spans.setdefault((rank, step), []).append((start, end))
        return spans

    def events(self, ranks: list[int] | None = None) -> pa.Table:
        """The events of ``ranks`` (all when None); a rank refused when the run was opened
        (its events unreadable, another run's, or behind a link out of the run directory) is
        left out, as the analysis left it out."""
        return R.read_events(self.path, ranks, {}, self.manifest.run_id)

    def window_events(self, rank: int, start_ns: int, end_ns: int) -> pa.Table:
        """The events of ``rank`` that overlap [start_ns, end_ns): only their row groups."""
        return R.read_window(self.path, rank, start_ns, end_ns, self.manifest.run_id)

    def memory(self, ranks: list[int] | None = None) -> pa.Table | None:
        """The memory records of ``ranks`` (None: the run has no memory table)."""
        return R.read_memory(self.path, ranks) if self.has_memory else None


def _label(paths: list[Path]) -> str:
    # (not resolve(): a loop of links is for reading it to say, not for naming it)
    path = Path(os.path.abspath(paths[0]))
    try:
        name = path.name if path.is_dir() else path.parent.name
    except OSError:  # not ours to look into: reading it will say so
        name = path.name
    return name + (f" (+{len(paths) - 1})" if len(paths) > 1 else "")


def ingest_run(paths: list[Path], out: Path, **options: Any) -> Path:
    """``ingest.ingest`` with the per-rank analysis: the events and the analysis tables."""
    from traceview.ingest.run import ingest

    return ingest(paths, out, analyze=rank_tables, analysis_version=ANALYSIS_VERSION, **options)


class RunReplaced(Exception):
    """The run directory changed while it was read: an ingest replaced it (or a file in it)."""


def _version(value: str | None) -> int:
    return int(value) if value and value.isdigit() else 0


def _key(manifest: Manifest, seen: dict[str, R.Identity]) -> bytes:
    """The cache key of this run as ``seen``, with this analysis."""
    return R.cache_key(manifest.run_id, ANALYSIS_VERSION, R.inputs_key(seen))


def reanalyze(
    run: Path,
    manifest: Manifest,
    seen: dict[str, R.Identity] | None = None,
    progress: Progress = quiet,
) -> dict[str, pa.Table]:
    """The analysis tables of ``run`` computed afresh from its events, one rank at a time.

    A rank whose events cannot be read, belong to another run (their ``run_id`` is not the
    manifest's) or lie behind a link out of the run directory is left out with a warning; the
    memory table behind such a link too. The tables replace the cache when it is stale (or
    missing), where the run directory can be written, and only if the run on disk is still the
    one read (``seen``, its identities before anything was read; see ``_cache``). A cache
    written by a newer traceview is left for it. Only the manifest's ``analysis_version``
    changes (its other keys, known here or not, stay as written). RunReplaced: the run changed
    while it was read (read it again)."""
    with tempfile.TemporaryDirectory(prefix="traceview-reanalysis-") as work:
        tables, segments, _ = _reanalysis(run, manifest, seen, progress, Path(work))
        return {**tables, "segments": _whole(segments)}


def _reanalyzed(
    run: Path, manifest: Manifest, seen: dict[str, R.Identity], progress: Progress
) -> tuple[dict[str, pa.Table], TableOnDemand]:
    """``reanalyze`` for a reader, the segments apart as ``Run`` holds them: never whole in
    memory (each rank's spilled as its analysis made them), read a row group at a time from
    the cache just written, else (a cache not written) from a file of their own, opened and
    then removed (read through the open file)."""
    schema = _TABLE_SCHEMAS["segments"]
    with tempfile.TemporaryDirectory(prefix="traceview-reanalysis-") as work:
        tables, parts, cached = _reanalysis(run, manifest, seen, progress, Path(work))
        if cached:
            key = _key(manifest, seen)
            with suppress(BadInput):  # (replaced since: the segments as computed, below)
                path = run / "segments.parquet"
                return tables, R.table_on_demand(path, schema, _cached_as(key, path))
        file = Path(work) / "segments.parquet"
        R.write_parquet_parts(file, parts, S.SEGMENTS_SCHEMA)
        return tables, R.table_on_demand(file, schema)


def _whole(parts: list[pa.Table | SpilledTable]) -> pa.Table:
    return pa.concat_tables([p.read() if isinstance(p, SpilledTable) else p for p in parts])


def _reanalysis(
    run: Path,
    manifest: Manifest,
    seen: dict[str, R.Identity] | None,
    progress: Progress,
    work: Path,
) -> tuple[dict[str, pa.Table], list[pa.Table | SpilledTable], bool]:
    """``reanalyze``'s work: the tables but the segments, the segments' parts (a rank analysed
    in chunks spills its own in ``work``), and whether they were cached."""
    if seen is None:
        seen = R.identities(run)
    per_rank, damaged = [], {}
    memory_out = R.leads_out(run, run / f"{R.MEMORY}.parquet")
    if memory_out is not None:
        manifest.notes.warnings.append(
            f"memory records left out: {run / R.MEMORY}.parquet is a symbolic link out of the "
            f"run directory (to {memory_out}); not followed"
        )
    ranks = R.event_ranks(run)
    for done, rank in enumerate(ranks):
        progress("analysing ranks", done, len(ranks))
        try:
            R.check_events(run, rank, manifest.run_id)
            memory = R.read_memory(run, [rank]) if memory_out is None else None
            tables = _in_chunks(run, rank, memory, work / f"segments-{rank}.arrows")
            per_rank.append(tables or rank_tables(R.read_events(run, [rank]), memory))
        except BadInput as exc:  # the other ranks are still reported (this time, uncached)
            damaged[rank] = exc
            manifest.notes.warnings.append(f"rank {rank} left out: {exc}")
    if R.identities(run) != seen:
        raise RunReplaced(str(run))
    if not per_rank:  # one line: the first rank's reason, and how many more
        first, why = next(iter(damaged.items()))
        more = f" (and {len(damaged) - 1} more rank(s))" if len(damaged) > 1 else ""
        raise BadInput(f"no rank left: rank {first} left out: {why}{more}")
    manifest.ranks = [r for r in manifest.ranks if r.rank not in damaged]
    tables = {
        name: pa.concat_tables([t[name] for t in per_rank])
        for name in RANK_TABLES
        if name != "segments"
    }
    segments = [t["segments"] for t in per_rank]
    newer = _version(manifest.analysis_version) > _version(ANALYSIS_VERSION)
    if damaged or memory_out is not None or newer:
        return tables, segments, False  # not cached: a cache holds every rank
    # read-only or damaged: uncached (RunReplaced goes on: the run is read again)
    with suppress(OutputError, OSError, ValueError, RecursionError):
        _cache(run, tables, segments, _key(manifest, seen), seen)
        return tables, segments, True
    return tables, segments, False


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
        # leaving the block renames the tables into place, then the manifest


def _in_chunks(
    run: Path, rank: int, memory: pa.Table | None, spill: Path | None = None
) -> dict[str, pa.Table | SpilledTable] | None:
    """The analysis of a rank a chunk of steps at a time, as ingest runs it
    (``analysis.parts``), without its events whole in memory (``spill``: where its segments
    are written as they are made); None for a file whose ids are not its rows (read whole),
    or where ``readback.recompute_in_chunks`` says no."""
    from traceview.ingest.large.plan import chunk_rows
    from traceview.ingest.large.readback import events_in_chunks, recompute_in_chunks
    from traceview.ingest.large.trim import release_memory

    path = R.events_path(run, rank)
    if not recompute_in_chunks():
        return None
    try:
        schema = R.parquet_file(path).schema_arrow
    except (OSError, pa.ArrowException, BadInput):
        return None  # read whole, which says what is wrong with it
    if not _written_by_traceview(schema):
        return None  # (likewise)
    with tempfile.TemporaryDirectory(prefix="traceview-chunks-") as work:
        try:
            found = events_in_chunks(path, rank, Path(work), chunk_rows())
        except (OSError, pa.ArrowException, ValueError) as exc:
            raise BadInput(f"{path}: unreadable ({exc})") from None
        if found is None:
            return None
        analysis = rank_tables.chunked(memory, spill)(
            found.training, found.gpu, found.backward_elsewhere, found.whole
        )
        for chunk in found.chunks:
            analysis.add(*chunk)
            release_memory()
        return analysis.finish()


def _written_by_traceview(schema: pa.Schema) -> bool:
    """Whether an events file holds exactly the columns traceview writes, of the same types: the
    chunks read back take it as it is (a reader whole conforms it, or says what is wrong)."""
    wanted = {f.name: f.type for f in S.EVENTS_SCHEMA if f.name != S.RANK}
    return {f.name: f.type for f in schema} == wanted


#: How often a run directory that an ingest keeps replacing is read again before giving up.
READ_TRIES = 3


@contextmanager
def open_run(
    paths: list[Path],
    rules: Path | None = None,
    progress: Progress = quiet,
    choice: StepChoice | None = None,
) -> Iterator[Run]:
    """The run at ``paths``; traces are read into a temporary run directory. ``choice``: the
    steps its reports count (--steps/--skip; the analysis tables hold every step, so a cached
    analysis serves any choice)."""
    label = _label(paths)
    if len(paths) == 1 and R.is_run_dir(paths[0]) and R.event_ranks(paths[0]) and rules is None:
        opened = _open_dir(paths[0], label, progress)
        opened.choice = choice
        try:
            yield opened
        finally:
            opened.segments.close()
        return
    try:
        scratch = tempfile.TemporaryDirectory(prefix="traceview-")
    except OSError as exc:
        where = tempfile.gettempdir()
        raise cannot_write(where, exc) from None  # TMPDIR chooses another place
    with scratch as tmp:
        run = ingest_run(
            paths, Path(tmp) / "run", rules_path=rules, command=sys.argv, progress=progress
        )
        opened = Run(run, label, R.read_manifest(run), *_read_tables(run), True, choice)
        try:
            yield opened
        finally:
            opened.segments.close()


def _open_dir(run: Path, label: str, progress: Progress = quiet) -> Run:
    """A run directory: its cached analysis where the cache is this run's and current, else
    recomputed from the events. Read again (up to READ_TRIES times) where an ingest replaced it
    while it was read, so what is shown is one run, never a mix of two."""
    for _ in range(READ_TRIES):
        seen = R.identities(run)  # (first: any change after this is seen at the end)
        manifest = R.read_manifest(run)
        try:
            read = _read_tables(run, _key(manifest, seen)) if _current(manifest, seen) else None
        except BadInput:  # a damaged, stale or foreign cache: it is only a cache
            read = None
        try:
            if read is not None:
                tables, segments = read[0], _or_recomputed(read[1], run, manifest, seen)
            else:
                tables, segments = _reanalyzed(run, manifest, seen, progress)
            return Run(
                run, label, manifest, tables, segments, False, cache_key=_key(manifest, seen)
            )
        except RunReplaced:
            continue
    raise BadInput(
        f"{run}: replaced while it was read, {READ_TRIES} times (an ingest into it is running?); "
        "run again when it ends"
    )


def _or_recomputed(
    segments: TableOnDemand, run: Path, manifest: Manifest, seen: dict[str, R.Identity]
) -> TableOnDemand:
    """The cached segments, opened with the other tables and read later; where they cannot be
    read then (a damaged cache whose footer was whole: it is only a cache), the run's analysis
    computed again from its events and the cache replaced, as at open, provided the run on
    disk is still the one opened (else BadInput: one run, never a mix of two)."""

    def recomputed() -> pa.Table:
        try:
            # (a copy: the run's manifest stays the one its other tables were read with)
            return reanalyze(run, copy.deepcopy(manifest), seen)["segments"]
        except RunReplaced:
            raise BadInput(
                f"{run}: replaced while it was read (an ingest into it is running?); "
                "run again when it ends"
            ) from None

    again: list[pa.Table] = []  # the segments computed again, once they were

    def read() -> pa.Table:
        if again:
            return again[0]
        try:
            return segments.read()
        except BadInput:
            again.append(recomputed())
            return again[0]

    def pieces(within: Within | None) -> Iterator[pa.Table]:
        """The cached pieces; from the first that cannot be read, the rest of the rows
        computed again (the same rows in the same order: the cache's key says so)."""
        if again:
            yield again[0]
            return
        try:
            yield from segments.in_pieces(within)
        except R.UnreadableRows as exc:
            again.append(recomputed())
            yield again[0].slice(exc.offset)

    return TableOnDemand(segments.num_rows, read, segments.close, pieces)


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


#: The shape of each cached table: one of another shape is damaged, and recomputed.
_TABLE_SCHEMAS = {
    "steps": S.STEPS_SCHEMA,
    "ops": S.OPS_SCHEMA,
    "collectives": S.COLLECTIVES_SCHEMA,
    "comm": S.COMM_SCHEMA,
    "gpu": S.GPU_SCHEMA,
    "launches": S.LAUNCHES_SCHEMA,
    "memory_steps": S.MEMORY_STEPS_SCHEMA,
    # (its labels as dictionaries: millions of segments name a few hundred phases, kinds and
    # operators, which as strings were most of a large run's memory)
    "segments": pa.schema(
        [
            f.with_type(pa.dictionary(pa.int32(), pa.string()))
            if f.name in (S.PHASE, S.KIND, S.OP)
            else f
            for f in S.SEGMENTS_SCHEMA
        ]
    ),
}
assert tuple(_TABLE_SCHEMAS) == RANK_TABLES


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


@contextmanager
def open_runs(
    groups: list[list[Path]],
    rules: Path | None = None,
    progress: Progress = quiet,
    labels: list[str] | None = None,
    choice: StepChoice | None = None,
) -> Iterator[list[Run]]:
    """Several runs at once (compare, scaling); labels made unique, or the ``labels`` given
    (one per run, all different)."""
    if labels:
        if len(labels) != len(groups):
            raise UsageError(f"{len(labels)} --label for {len(groups)} runs: give one per run")
        if len(set(labels)) < len(labels):
            twice = next(label for label in labels if labels.count(label) > 1)
            raise UsageError(f"--label {safe(twice)!r} given twice: each run needs its own")
    with ExitStack() as stack:
        runs = [stack.enter_context(open_run(paths, rules, progress, choice)) for paths in groups]
        # Same folder name in different frameworks' trees (pytorch/explicit, tensorflow/explicit):
        # prefix the framework; otherwise number the repeats.
        names = [run.label for run in runs]
        frameworks = [run.manifest.framework for run in runs]
        for run, framework in zip(runs, frameworks, strict=True):
            same = [f for name, f in zip(names, frameworks, strict=True) if name == run.label]
            if len(same) > 1 and framework and len(set(same)) > 1:
                run.label = f"{framework}/{run.label}"
        seen: dict[str, int] = {}
        for run in runs:
            count = seen.get(run.label, 0)
            seen[run.label] = count + 1
            if count:
                run.label = f"{run.label} #{count + 1}"
        for run, label in zip(runs, labels or [], strict=False):
            run.label = label
        yield runs
