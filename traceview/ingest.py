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

import inspect
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from multiprocessing import get_context
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from traceview import __version__
from traceview import rundir as R
from traceview import schema as S
from traceview.chunked import ChunkSink, normalize_chunked, wants_chunks
from traceview.errors import (
    BadInput,
    Notes,
    OutputError,
    TraceviewError,
    UsageError,
    cannot_write,
)
from traceview.helper import die_with_parent
from traceview.manifest import (
    MAX_WORLD_SIZE,
    Clock,
    Collected,
    Manifest,
    ManifestNotes,
    RankIngest,
    RankStatus,
    lenient,
)
from traceview.normalize import RankMeta, normalize
from traceview.parsers import (
    ParsedTrace,
    Parser,
    TraceIdentity,
    generic,
    rank_from_filename,
    registered,
)
from traceview.parsers.chrome_json import read_head
from traceview.rules import RuleSet, rules_for

#: Below this much trace data, and this many ranks, parsing in the parent beats starting worker
#: processes (~0.5 s each to import; a small rank takes ~20 ms: 1,024 of 4 KB each ingest in
#: 22 s serially, 15 s on 2 workers).
PARALLEL_MIN_BYTES = 48 << 20
PARALLEL_MIN_RANKS = 32


@dataclass
class TraceFile:
    path: Path
    parser: str
    framework: str
    rank: int = -1
    claimed_rank: int | None = None
    world_size: int | None = None
    host: str | None = None
    size: int = 0
    clock: Clock = field(default_factory=Clock)  # from the status beside it (collect's runs)


#: A per-rank analysis: one rank's events and memory records (schema.MEMORY_SCHEMA) in, named
#: result tables out (written as NAME.parquet). It must be a module-level function: worker
#: processes receive it by reference.
RankAnalysis = Callable[[pa.Table, pa.Table], dict[str, pa.Table]]


@dataclass
class RankPartial:
    """One rank's part of a run, wherever it was computed (this process, a worker pool, another
    machine): its manifest entry, its analysis tables and its notes. ``combine`` merges the
    ranks' parts into the run's."""

    info: RankIngest
    tables: dict[str, pa.Table]
    notes: Notes = field(default_factory=Notes)

    @property
    def rank(self) -> int:
        return self.info.rank


@dataclass
class Combined:
    ranks: list[RankIngest]  # by rank
    tables: dict[str, pa.Table]  # each table: every rank's rows, by rank
    notes: Notes


def combine(parts: Iterable[RankPartial]) -> Combined:
    """The ranks' parts of one run as the run's: ordered by rank, whatever order they came in
    (a pool returns them as they finish), tables concatenated per name, notes in rank order."""
    ordered = sorted(parts, key=lambda p: p.rank)
    ranks = [p.rank for p in ordered]
    if len(set(ranks)) < len(ranks):
        twice = sorted({r for r in ranks if ranks.count(r) > 1})
        raise BadInput(f"rank(s) {_ranges(twice)} came twice: parts of different runs?")
    names = sorted({name for p in ordered for name in p.tables})
    tables = {
        name: pa.concat_tables([p.tables[name] for p in ordered if name in p.tables])
        for name in names
    }
    notes = Notes()
    for part in ordered:
        notes.extend(part.notes)
    return Combined([p.info for p in ordered], tables, notes)


#: What `traceview collect` writes beside each rank's trace.
RANK_STATUS = "status.json"


def _candidates(folder: Path) -> list[Path]:
    files = [p for p in sorted(folder.rglob("*")) if p.is_file() and p.name != RANK_STATUS]
    return [
        p for p in files if not any(part.startswith(".") for part in p.relative_to(folder).parts)
    ]


def rank_status(trace: Path, notes: Notes | None = None) -> RankStatus:
    """The status `traceview collect` wrote beside a trace (empty when there is none). Fields
    that do not read are left at their defaults, with a warning in ``notes``: the trace and the
    rest of the status (its clock offset above all) are used all the same."""
    path = trace.parent / RANK_STATUS
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return RankStatus()
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        if notes is not None:
            notes.warn(f"{path}: unreadable, not used ({exc})")
        return RankStatus()
    status, dropped = lenient(data, RankStatus)
    if dropped and notes is not None:
        notes.warn(
            f"{path}: field(s) {', '.join(dropped)} of the wrong type or out of range, not used"
        )
    return status


def discover(paths: list[Path], notes: Notes, rules_given: bool = False) -> list[TraceFile]:
    """The traces among ``paths``; a named file that is not a trace is an error. With a rules
    file (``rules_given``), a Chrome trace that no parser claims is read by the generic one."""
    parsers = registered()
    if rules_given:
        parsers = [*parsers, _Fallback(generic())]
    found: list[TraceFile] = []
    skipped: list[str] = []
    damaged: list[str] = []
    for path in paths:
        try:
            there = path.exists()
        except OSError as exc:  # a folder this user may not look into, a name too long
            raise BadInput(f"{path}: cannot read ({exc.strerror or exc})") from None
        if not there:
            raise UsageError(R.parked_hint(path) or f"{path}: no such file or directory")
        if path.is_dir():
            folder = path / R.RAW if R.is_run_dir(path) and (path / R.RAW).is_dir() else path
            for candidate in _candidates(folder):
                try:
                    trace = _identify(candidate, parsers, notes)
                except BadInput as exc:  # one damaged file does not cost the folder's others
                    damaged.append(str(exc))
                    continue
                if trace is None:
                    skipped.append(str(candidate.relative_to(folder)))
                else:
                    found.append(trace)
            if not found:
                reason = f" ({damaged[0]}{' …' if len(damaged) > 1 else ''})" if damaged else ""
                what = "no readable traces" if damaged else "no traces"
                raise BadInput(f"{path}: {what} found in this folder{reason}")
        else:
            trace = _identify(path, parsers, notes)
            if trace is None:
                raise BadInput(
                    f"{path}: not a trace traceview can read (expected PyTorch/Kineto JSON, "
                    "TensorFlow .xplane.pb or Timeline JSON, MXNet profiler JSON or traceview "
                    "collect's Chainer JSON; any other Chrome trace with --rules)"
                )
            found.append(trace)
    for problem in damaged:
        notes.warn(f"{problem}: left out")
    if skipped:
        shown = ", ".join(skipped[:5]) + (
            f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
        )
        notes.remark(f"skipped {len(skipped)} file(s) that are not traces: {shown}")
    return found


class _Fallback:
    """The generic Chrome-trace parser, claiming whatever looks like a Chrome trace."""

    def __init__(self, parser: Parser):
        self.parser = parser
        self.name, self.framework = parser.name, parser.framework

    def sniff(self, path: Path, head: bytes) -> bool:
        from traceview.parsers.chrome import looks_like_chrome_trace

        return looks_like_chrome_trace(head)

    def identify(self, path: Path) -> TraceIdentity:
        return self.parser.identify(path)

    def parse(self, path: Path) -> ParsedTrace:
        return self.parser.parse(path)


def _identify(path: Path, parsers: list[Parser], notes: Notes) -> TraceFile | None:
    try:
        if path.stat().st_size == 0:
            raise BadInput(f"{path}: empty file")
        head = read_head(path)
    except OSError as exc:
        raise BadInput(f"{path}: cannot read ({exc.strerror or exc})") from None
    parser = next((p for p in parsers if p.sniff(path, head)), None)
    if parser is None:
        return None
    identity = parser.identify(path)
    status = rank_status(path, notes)
    rank = _believed(identity.rank, 0, MAX_WORLD_SIZE - 1, "rank", path, notes)
    world = _believed(identity.world_size, 1, MAX_WORLD_SIZE, "world size", path, notes)
    return TraceFile(
        path=path,
        parser=parser.name,
        framework=parser.framework,
        claimed_rank=rank if rank is not None else status.rank,
        world_size=world or status.world_size,
        host=identity.host or status.host,
        size=path.stat().st_size,
        clock=status.clock,
    )


def _believed(
    value: int | None, least: int, most: int, what: str, path: Path, notes: Notes
) -> int | None:
    """A rank or world size as a trace states it, unless it is absurd (memory follows the world
    size): then it is ignored with a warning, and the rank comes from the file name or order."""
    if value is None or least <= value <= most:
        return value
    shown = str(value) if len(str(value)) <= 24 else f"{str(value)[:21]}..."
    notes.warn(f"{path}: the {what} the trace states ({shown}) is outside {least}-{most}: ignored")
    return None


def _ranges(numbers: list[int]) -> str:
    """[1, 2, 3, 7] -> "1-3, 7"."""
    out: list[str] = []
    start = prev = None
    for n in sorted(numbers):
        if start is None:
            start = prev = n
        elif prev is not None and n == prev + 1:
            prev = n
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = n
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ", ".join(out)


def assign_ranks(traces: list[TraceFile], notes: Notes) -> int | None:
    """Fix each trace's rank: what the trace says, else its file name, else its order.

    Returns the world size (the largest any trace states) and warns about missing ranks.
    """
    by_rank: dict[int, TraceFile] = {}
    for trace in traces:
        if trace.claimed_rank is None:
            continue
        if trace.claimed_rank in by_rank:
            other = by_rank[trace.claimed_rank]
            raise BadInput(
                f"two traces say they are rank {trace.claimed_rank}: {other.path} and {trace.path} "
                "(traces of different runs? ingest one run at a time)"
            )
        by_rank[trace.claimed_rank] = trace
        trace.rank = trace.claimed_rank
    unclaimed = [t for t in traces if t.claimed_rank is None]
    # File names are used only when they number every remaining trace without collisions.
    named = {t.path: rank_from_filename(t.path) for t in unclaimed}
    ranks = [r for r in named.values() if r is not None]
    distinct = len(ranks) == len(unclaimed) and len(set(ranks)) == len(ranks)
    if unclaimed and distinct and not set(ranks) & set(by_rank):
        for trace in unclaimed:
            rank = named[trace.path]
            assert rank is not None
            trace.rank = rank
            by_rank[rank] = trace
        unclaimed = []
        notes.remark("ranks taken from the file names (the traces do not state them)")
    next_rank = 0
    for trace in unclaimed:
        while next_rank in by_rank:
            next_rank += 1
        trace.rank = next_rank
        by_rank[next_rank] = trace
    if unclaimed and len(traces) > 1:
        notes.remark("ranks numbered in file order (neither the traces nor their names state them)")
    worlds = [t.world_size for t in traces if t.world_size]
    world = max(worlds) if worlds else None
    present = sorted(by_rank)
    if world is not None and world > len(present):
        missing = sorted(set(range(world)) - set(present))
        notes.warn(
            f"world size {world} but {len(present)} trace(s) given: missing rank(s) {_ranges(missing)}; "
            f"reporting rank(s) {_ranges(present)} only"
        )
    return world


def parse_with(parser: Parser, path: Path) -> ParsedTrace:
    """``parser.parse(path)``; a parser written for the old protocol ``parse(path, rules)``
    (before parsers stopped classifying) is bad input naming it, not an internal error."""
    required = [
        p
        for p in inspect.signature(parser.parse).parameters.values()
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(required) != 1:
        raise BadInput(
            f"the {parser.name!r} trace parser takes parse({', '.join(p.name for p in required)}); "
            "traceview's parsers take parse(path) and leave classification to the core and a "
            "rules file (docs/design.md): the plugin needs updating"
        )
    return parser.parse(path)


def ingest_rank(
    trace: TraceFile,
    run: Path,
    run_id: str,
    rules_path: Path | None,
    analyze: RankAnalysis | None,
    helper: bool = False,
) -> RankPartial:
    """Parse, normalize and write one rank's events into ``run``, and analyse them if asked:
    the unit of work a pool (or another machine) runs, one rank at a time. ``helper``: a core
    is free beside this one (the ranks are ingested one after the other), for a large trace's
    helper process (``chunked``)."""
    from traceview.parsers import parser_named

    R.fault_point("ingest:rank")  # the tests kill a cluster worker here, for real
    if pa.default_memory_pool().backend_name != "system":  # a fresh worker process
        pa.set_memory_pool(pa.system_memory_pool())
    started = time.perf_counter()
    parser = parser_named(trace.parser)
    rules = rules_for(parser.framework, rules_path)
    clock = trace.clock  # read once, when the trace was identified
    offset = clock.offset_ns
    if wants_chunks(trace.parser, trace.path, trace.size):
        part = _ingest_chunked(trace, parser, rules, run, run_id, analyze, started, helper)
        if isinstance(part, RankPartial):
            return part
        parsed = part  # the whole trace, for the whole-rank path: read once
    else:
        parsed = parse_with(parser, trace.path)
    notes = Notes()
    if offset:  # onto the launcher's clock, which all ranks share
        shifted = pc.add(parsed.events.column(S.TS_NS), pa.scalar(offset, pa.int64()))
        parsed.events = parsed.events.set_column(
            parsed.events.schema.get_field_index(S.TS_NS), S.TS_NS, shifted
        )
    host = trace.host or parsed.host
    meta = RankMeta(
        run_id=run_id,
        rank=trace.rank,
        framework=parser.framework,
        host=host,
        source=trace.path.name,
    )
    try:
        normalized = normalize(
            parsed.events,
            rules,
            meta,
            layout=parsed.layout,
            infer_steps=parsed.infer_steps,
            process_names=parsed.process_names,
        )
    except BadInput as exc:
        raise BadInput(f"{trace.path}: {exc}") from exc
    del parsed.events
    memory = rank_memory(_with_rss(parsed.memory, trace.path), trace.rank, offset)
    # Parquet encoding runs outside the GIL: write while the analysis runs.
    with ThreadPoolExecutor(max_workers=1) as writer:
        written = writer.submit(R.write_events, run, trace.rank, normalized.events)
        tables = analyze(normalized.events, memory) if analyze is not None else {}
        written.result()
    tables[R.MEMORY] = memory  # every rank's, empty or not: memory.parquet says it was read
    notes.extend(parsed.notes)
    notes.extend(normalized.notes)
    found, threads, skipped = dict(parsed.meta), dict(parsed.threads), dict(parsed.skipped)
    if normalized.layout is not None:
        found.update(normalized.layout.meta)
        for key, label in normalized.layout.threads.items():
            threads.setdefault(key, label)
        skipped.update(normalized.layout.skipped)
    if normalized.inferred is not None:
        threads.update(normalized.inferred.threads)
    info = RankIngest(
        rank=trace.rank,
        source=str(trace.path),
        format=parser.name,
        framework=parser.framework,
        host=host,
        status="truncated" if parsed.lost_bytes else "ok",
        events=normalized.events.num_rows,
        bytes_read=parsed.bytes_read,
        lost_bytes=parsed.lost_bytes,
        skipped_records=skipped,
        steps=normalized.steps,
        training_thread=list(normalized.training_thread) if normalized.training_thread else None,
        threads=threads,
        clock_offset_ns=offset,
        clock=clock,
        meta=found,
        seconds=round(time.perf_counter() - started, 3),
    )
    return RankPartial(info, tables, notes)


def _ingest_chunked(
    trace: TraceFile,
    parser: Parser,
    rules: RuleSet,
    run: Path,
    run_id: str,
    analyze: RankAnalysis | None,
    started: float,
    helper: bool = False,
) -> RankPartial | ParsedTrace:
    """``ingest_rank`` for a large trace, in chunks of whole steps (``traceview.chunked``),
    the analysis a chunk at a time (``analyze.chunked``, where it has one); where the trace
    needs the whole-rank path, the parser's result with every event (read once)."""
    clock = trace.clock
    offset = clock.offset_ns
    meta = RankMeta(
        run_id=run_id,
        rank=trace.rank,
        framework=parser.framework,
        host=trace.host,
        source=trace.path.name,
    )
    # the per-rank analysis takes each chunk as it is normalized, where it can (memory
    # records come with the parser's result, after the first pass)
    memory: list[pa.Table] = []
    chunked = getattr(analyze, "chunked", None)

    def sink(
        parsed: ParsedTrace,
        training: tuple[int, int],
        gpu: bool,
        elsewhere: bool,
        whole: tuple[int, int] | None,
    ) -> ChunkSink | None:
        memory[:] = [rank_memory(_with_rss(parsed.memory, trace.path), trace.rank, offset)]
        if chunked is None:
            return None
        return chunked(memory[0])(training, gpu, elsewhere, whole)

    try:
        done = normalize_chunked(parser, trace.path, rules, meta, run, offset, sink, helper)
    except BadInput as exc:
        raise BadInput(f"{trace.path}: {exc}") from exc
    if isinstance(done, ParsedTrace):
        return done
    parsed = done.parsed
    host = trace.host or parsed.host
    if not memory:
        memory.append(rank_memory(_with_rss(parsed.memory, trace.path), trace.rank, offset))
    tables: dict[str, pa.Table] | None = None
    if done.sink is not None:
        tables = done.sink.finish()
    if tables is None and analyze is not None:  # analysed whole: read back
        tables = analyze(R.read_events(run, [trace.rank]), memory[0])
    tables = tables or {}
    memory_table = memory[0]
    tables[R.MEMORY] = memory_table
    notes = Notes()
    notes.extend(parsed.notes)
    notes.extend(done.notes)
    info = RankIngest(
        rank=trace.rank,
        source=str(trace.path),
        format=parser.name,
        framework=parser.framework,
        host=host,
        status="truncated" if parsed.lost_bytes else "ok",
        events=done.events,
        bytes_read=parsed.bytes_read,
        lost_bytes=parsed.lost_bytes,
        skipped_records=dict(parsed.skipped),
        steps=done.steps,
        training_thread=list(done.training_thread) if done.training_thread else None,
        threads=dict(parsed.threads),
        clock_offset_ns=offset,
        clock=clock,
        meta=dict(parsed.meta),
        seconds=round(time.perf_counter() - started, 3),
    )
    return RankPartial(info, tables, notes)


def _with_rss(records: pa.Table | None, trace: Path) -> pa.Table | None:
    """The parser's memory records and the process's resident memory that collect sampled at
    step boundaries (status.json beside the trace; device ``rss``)."""
    status = rank_status(trace)
    # what a status claims is bounded before it is believed: a time in int64, a size to 1 PiB
    samples = [
        s
        for s in status.rss_samples
        if len(s) == 2 and 0 <= s[0] < 1 << 63 and 0 <= s[1] <= 1 << 50
    ]
    if not samples:
        return records
    rss = S.conform(
        pa.table(
            {
                S.DEVICE: pa.array([S.DEVICE_RSS] * len(samples), pa.string()),
                S.PID: pa.array([status.pid] * len(samples), pa.int64()),
                S.TS_NS: pa.array([s[0] for s in samples], pa.int64()),
                S.ALLOCATED_BYTES: pa.array([s[1] for s in samples], pa.int64()),
            }
        ),
        S.MEMORY_RAW_SCHEMA,
    )
    return rss if records is None else pa.concat_tables([records, rss])


def rank_memory(records: pa.Table | None, rank: int, offset_ns: int) -> pa.Table:
    """A parser's memory records (schema.MEMORY_RAW_SCHEMA) as the rank's rows of memory.parquet,
    on the run's clock (empty where the trace has none)."""
    if records is None or records.num_rows == 0:
        return S.MEMORY_SCHEMA.empty_table()
    if offset_ns:
        shifted = pc.add(records.column(S.TS_NS), pa.scalar(offset_ns, pa.int64()))
        records = records.set_column(records.schema.get_field_index(S.TS_NS), S.TS_NS, shifted)
    records = records.append_column(S.RANK, pa.array([rank] * records.num_rows, pa.int32()))
    return S.conform(records, S.MEMORY_SCHEMA)


def _run_all(
    traces: list[TraceFile],
    staged: Path,
    run_id: str,
    rules_path: Path | None,
    jobs: int,
    analyze: RankAnalysis | None,
    notes: Notes,
    scheduler: str | Path | None = None,
) -> list[RankPartial]:
    """Every rank's part; a rank whose trace cannot be read is left out with a warning (the
    others are kept), and only a run with no readable rank is an error."""
    parts: list[RankPartial] = []
    failed: list[BadInput] = []

    def keep(trace: TraceFile, work: Callable[[], RankPartial]) -> None:
        try:
            parts.append(work())
        except BadInput as exc:
            failed.append(exc)
            R.events_path(staged, trace.rank).unlink(missing_ok=True)
            notes.warn(f"rank {trace.rank} left out: {exc}")

    total = sum(t.size for t in traces)
    if scheduler is not None:
        from traceview.cluster import remove_attempt_leftovers, run_on_cluster

        for t, result in run_on_cluster(scheduler, traces, staged, run_id, rules_path, analyze):
            keep(t, result)
        remove_attempt_leftovers(staged)
    elif (
        jobs <= 1
        or len(traces) == 1  # one trace: a worker would only add its start and its memory
        or (total < PARALLEL_MIN_BYTES and len(traces) < PARALLEL_MIN_RANKS)
    ):
        for t in traces:
            keep(t, partial(ingest_rank, t, staged, run_id, rules_path, analyze, helper=True))
    else:
        # Larger files first, so the pool's last task is a short one.
        ordered = sorted(traces, key=lambda t: -t.size)
        with ProcessPoolExecutor(
            max_workers=min(jobs, len(traces)),
            mp_context=get_context("spawn"),
            initializer=die_with_parent,
            initargs=(os.getpid(),),
        ) as pool:
            futures = [
                (t, pool.submit(ingest_rank, t, staged, run_id, rules_path, analyze))
                for t in ordered
            ]
            for t, future in futures:
                keep(t, future.result)
    if failed and not parts:
        more = f" (and {len(failed) - 1} more trace(s) like it)" if len(failed) > 1 else ""
        raise BadInput(f"{failed[0]}{more}")
    return parts


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
) -> Path:
    """Read the traces under ``paths`` into the run directory ``out``; return ``out``.

    With ``analyze``, each rank's tables are written as ``NAME.parquet`` (all ranks in one file)
    and ``analysis_version`` is recorded in the manifest, so a later reader knows whether they are
    still current. With ``scheduler`` (a Dask scheduler's address or scheduler file), the ranks
    are ingested as tasks on that cluster instead of local processes.
    """
    notes = Notes()
    try:  # a name too long, a folder we may not look into: the output cannot go there
        R.recover(out.resolve(), notes)  # what an ingest killed while replacing it left
        if out.exists() and not out.is_dir():
            raise UsageError(f"{out}: exists and is a file, not a run directory")
        if out.exists() and not R.is_run_dir(out) and any(out.iterdir()):
            raise UsageError(f"{out}: exists and is not a traceview run directory")
    except OSError as exc:
        raise cannot_write(out, exc) from None
    traces = discover(paths, notes, rules_given=rules_path is not None)
    world = assign_ranks(traces, notes)
    collected = R.read_manifest(out).collect if R.is_run_dir(out) else None
    if collected is not None:
        _collect_notes(collected, notes)
        world = world or collected.world_size
    traces.sort(key=lambda t: t.rank)
    run_id = uuid.uuid4().hex[:12]
    out = out.resolve()
    staged = R.staging_dir(out)
    shutil.rmtree(staged, ignore_errors=True)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
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
            )
        )
        notes.extend(run.notes)
        for name, table in run.tables.items():
            R.write_parquet(staged / f"{name}.parquet", table)
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
            framework="+".join(frameworks),
            world_size=world,
            ranks_present=present,
            missing_ranks=sorted(set(range(world)) - set(present)) if world else [],
            ranks=run.ranks,
            notes=ManifestNotes(warnings=notes.warnings, remarks=notes.remarks),
            ingest_seconds=round(time.time() - started, 3),
            analysis_version=analysis_version if analyze is not None else None,
            collect=collected,
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
        notes.remark(
            f"parameter-server job: {counts} beside the workers, recorded but not profiled "
            "(what the servers do shows as the workers' push/pull time)"
        )
        for proc in others:
            if proc.state not in ("ok", "running"):
                detail = f" ({proc.detail})" if proc.detail else ""
                notes.warn(f"{proc.role} (pid {proc.pid}) ended: {proc.state}{detail}")
