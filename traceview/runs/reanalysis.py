"""Re-analysing a run whose cache is missing, stale or damaged: from its events, a chunk of steps
at a time where they are large."""

from __future__ import annotations

import tempfile
from contextlib import suppress
from pathlib import Path

import pyarrow as pa

from traceview.analysis import ANALYSIS_VERSION, RANK_TABLES, rank_tables
from traceview.ingest.large.readback import analyse_written
from traceview.model import schema as S
from traceview.model.columns import SpilledTable, TableOnDemand
from traceview.model.errors import BadInput, OutputError
from traceview.model.manifest import Manifest
from traceview.model.progress import Progress, quiet
from traceview.runs.cache import (
    _TABLE_SCHEMAS,
    RunReplaced,
    _cache,
    _cached_as,
    _key,
    _version,
)
from traceview.store import rundir as R


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
    refused = _side_links_out(run, manifest)
    ranks = _listed_ranks(run, manifest)
    for done, rank in enumerate(ranks):
        progress("analysing ranks", done, len(ranks))
        try:
            R.check_events(run, rank, manifest.run_id)
            side = _side_rows(run, rank, refused, manifest)
            spill = work / f"segments-{rank}.arrows"
            tables = analyse_written(run, rank, rank_tables, side, spill)
            per_rank.append(tables or rank_tables(R.read_events(run, [rank]), side))
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
    unlisted = len(ranks) < len(R.event_ranks(run))
    if damaged or refused or newer or unlisted:
        return tables, segments, False  # not cached: a cache holds every rank
    # read-only or damaged: uncached (RunReplaced goes on: the run is read again)
    with suppress(OutputError, OSError, ValueError, RecursionError):
        _cache(run, tables, segments, _key(manifest, seen), seen)
        return tables, segments, True
    return tables, segments, False

    # leaving the block renames the tables into place, then the manifest


def _listed_ranks(run: Path, manifest: Manifest) -> list[int]:
    """The ranks with events in the run directory that its manifest lists; events of a rank it
    does not list (a part copied in from another run, or left by one) are left out, with one
    warning naming them."""
    found = R.event_ranks(run)
    listed = {r.rank for r in manifest.ranks}
    if not listed:  # (a manifest that lists no rank: nothing to hold the parts to)
        return found
    extra = [r for r in found if r not in listed]
    if extra:
        which = ", ".join(map(str, extra[:10])) + (" ..." if len(extra) > 10 else "")
        manifest.notes.warnings.append(
            f"rank(s) {which} left out: events in {run / R.EVENTS} for rank(s) its manifest "
            "does not list (a part of another run, or copied in since the ingest)"
        )
    return [r for r in found if r in listed]


def _side_rows(run: Path, rank: int, refused: set[str], manifest: Manifest) -> dict[str, pa.Table]:
    """The rank's rows of each side input not ``refused``; a side input whose file cannot be
    read is left out of every rank (added to ``refused``) with one warning: the ranks' events
    are still analysed, without it (uncached)."""
    side = {}
    for name, spec in S.SIDE_INPUTS.items():
        if name in refused:
            continue
        try:
            rows = R.read_side(run, name, [rank])
        except BadInput as exc:  # (one file for every rank: unreadable for each)
            refused.add(name)
            manifest.notes.warnings.append(f"{spec.what} left out: {exc}")
            continue
        if rows is not None:
            side[name] = rows
    return side


def _side_links_out(run: Path, manifest: Manifest) -> set[str]:
    """The side inputs whose file is a link out of the run directory: not followed, with a
    warning (the rest of the run is still analysed, uncached)."""
    refused = set()
    for name, spec in S.SIDE_INPUTS.items():
        path = R.side_path(run, name)
        out = R.leads_out(run, path)
        if out is not None:
            refused.add(name)
            manifest.notes.warnings.append(
                f"{spec.what} left out: {path} is a symbolic link out of the run directory "
                f"(to {out}); not followed"
            )
    return refused
