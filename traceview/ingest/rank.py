"""One rank's ingest, wherever it runs (this process, a pool worker, a Dask task): parse,
normalize and write its events, run the per-rank analysis it is handed on them, and return the
rank's part of the run (``RankPartial``). A large trace goes through ``ingest.large``.
"""

from __future__ import annotations

import inspect
import itertools
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from traceview.ingest.discover import TraceFile, rank_status
from traceview.ingest.large.chunked import helper_pays, normalize_chunked, wants_chunks
from traceview.ingest.large.readback import analyse_written
from traceview.ingest.large.sinks import (
    ChunkSink,
    RankAnalysis,
    RankAnalysisInChunks,
    SideTables,
)
from traceview.ingest.large.trim import weighted_bytes
from traceview.ingest.windows import parse_windows
from traceview.model import schema as S
from traceview.model.columns import WORK, SpilledTable, first_start
from traceview.model.errors import BadInput, Notes
from traceview.model.manifest import SERVICE_ROLES, RankIngest, role_named
from traceview.normalize.pipeline import RankMeta, normalize
from traceview.normalize.rules import RuleSet, rules_for
from traceview.normalize.steps import NO_STEP_MARKERS
from traceview.parsers import ParsedTrace, Parser, rules_file_of
from traceview.store import rundir as R

__all__ = [
    "RankAnalysis",
    "RankAnalysisInChunks",
    "RankPartial",
    "ingest_rank",
    "parse_with",
    "side_rows",
]

#: Traces below this many bytes (on disk; a gzip file counts 8 times its size) are read whole,
#: not in chunks: chunking bounds a large trace's memory, but costs a small one more than it
#: saves (its spill and chunk files, its threads: CPU a rank, loaded 2-core machine, 23 against
#: 18 ms for a one-step rank, 64 against 52 ms for a 1.2 MB one (113 KB gzipped); at 4.5 MB
#: the chunks cost less, 114 against 128 ms). Such a trace is one chunk (``CHUNK_ROWS``): both
#: paths write the same rows in the same order. ``TRACEVIEW_WHOLE_BELOW_BYTES`` sets it;
#: ``TRACEVIEW_WHOLE_RANK=0`` chunks every trace a parser streams (the tests of the chunks),
#: ``=1`` reads every trace whole (their reference).
WHOLE_BELOW_BYTES = 1 << 20


def read_whole(path: Path, size: int) -> bool:
    """Whether a trace a parser could stream is read whole all the same: it is small
    (``WHOLE_BELOW_BYTES``), unless ``TRACEVIEW_WHOLE_RANK=0`` says to chunk every one."""
    if os.environ.get("TRACEVIEW_WHOLE_RANK") == "0":
        return False
    below = int(os.environ.get("TRACEVIEW_WHOLE_BELOW_BYTES", WHOLE_BELOW_BYTES))
    return weighted_bytes(path.name, size) < below


#: The threads that write a rank's events while its analysis runs (``ingest_rank``): made once
#: per process (a thread made per rank cost a small rank ~1 ms; one rank after another use one,
#: ranks ingested at once on threads of a process one each), and made again in a process forked
#: from one that had them (its threads did not come along).
_writers: tuple[int, ThreadPoolExecutor] | None = None


def _write_beside(run: Path, rank: int, events: pa.Table) -> Future[Path]:
    global _writers
    if _writers is None or _writers[0] != os.getpid():
        pool = ThreadPoolExecutor(min(4, os.cpu_count() or 1), thread_name_prefix="traceview-write")
        _writers = (os.getpid(), pool)
    return _writers[1].submit(R.write_events, run, rank, events)


@dataclass
class RankPartial:
    """One rank's part of a run, wherever it was computed (this process, a worker pool, another
    machine): its manifest entry, its analysis tables and its notes. ``combine`` merges the
    ranks' parts into the run's."""

    info: RankIngest
    tables: dict[str, pa.Table | SpilledTable]  # (spilled: a large rank's segments, in a file)
    notes: Notes = field(default_factory=Notes)
    # a rank of a batch whose per-event tables are made for the batch at once (``batches``):
    # its events until then (never sent back)
    events: pa.Table | None = None

    @property
    def rank(self) -> int:
        return self.info.rank


#: The required parameters of each parser method seen (inspect.signature: 70 us a rank).
_REQUIRED: dict[Any, list[str]] = {}


def parse_with(parser: Parser, path: Path) -> ParsedTrace:
    """``parser.parse(path)``; a parser written for the old protocol ``parse(path, rules)``
    (before parsers stopped classifying) is bad input naming it, not an internal error."""
    method = getattr(parser.parse, "__func__", None)  # (a method's parameters: its function's)
    required = _REQUIRED.get(method) if method is not None else None
    if required is None:
        required = [
            p.name
            for p in inspect.signature(parser.parse).parameters.values()
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if method is not None:
            _REQUIRED[method] = required
    if len(required) != 1:
        raise BadInput(
            f"the {parser.name!r} trace parser takes parse({', '.join(required)}); "
            "traceview's parsers take parse(path) and leave classification to the core and a "
            "rules file (docs/design.md): the plugin needs updating"
        )
    return parser.parse(path)


class _OnDevice:
    """A parser bound to one device of the traces it reads (``TraceFile.device``: a process
    that drove several), and to the framework the trace named."""

    def __init__(self, parser: Parser, trace: TraceFile):
        self.parser, self.device = parser, trace.device
        self.name, self.framework = parser.name, trace.framework or parser.framework
        self.streams, self.rules_file = parser.streams, rules_file_of(parser)

    def sniff(self, path: Path, head: bytes) -> bool:
        return self.parser.sniff(path, head)

    def identify(self, path: Path) -> Any:
        return self.parser.identify(path)

    def parse(self, path: Path) -> ParsedTrace:
        if self.device is None:
            return self.parser.parse(path)
        return self.parser.parse(path, self.device)  # type: ignore[call-arg]

    def stream(self, path: Path) -> Any:
        if self.device is None:
            return self.parser.stream(path)
        return self.parser.stream(path, self.device)  # type: ignore[call-arg]


def on_device(parser: Parser, trace: TraceFile) -> Parser:
    """``parser`` as ``trace`` is read: on its device, in its framework (the parser itself
    where neither differs)."""
    if trace.device is None and trace.framework in (None, parser.framework):
        return parser
    return _OnDevice(parser, trace)


def ingest_rank(
    trace: TraceFile,
    run: Path,
    run_id: str,
    rules_path: Path | None,
    analyze: RankAnalysis | None,
    helper: bool = False,
    beside: bool = True,
    rows_later: bool = False,
) -> RankPartial:
    """Parse, normalize and write one rank's events into ``run``, and analyse them if asked:
    the unit of work a pool (or another machine) runs, one rank at a time. ``helper``: a core
    is free beside this one (the ranks are ingested one after the other), for a large trace's
    helper process (``chunked``). ``beside``: the events are written on a thread while the
    analysis runs; False: after it, on this one (a pool with a worker per core has no core for
    the thread: on 2 cores, 2,000 one-step ranks took 14 % more CPU with it), and in place
    (``rundir.write_events``: this process is a local pool's, the only writer). ``rows_later``:
    a rank read whole leaves its per-event tables to its batch (``RankPartial.events``), where
    the analysis makes those of many ranks at once (``RankTables.rows``)."""
    from traceview.parsers import parser_named

    R.fault_point("ingest:rank")  # the tests kill a cluster worker here, for real
    if pa.default_memory_pool().backend_name != "system":  # a fresh worker process
        pa.set_memory_pool(pa.system_memory_pool())
    started = time.perf_counter()
    parser = on_device(parser_named(trace.parser), trace)
    rules = rules_for(parser.framework, rules_path, rules_file_of(parser))
    clock = trace.clock  # read once, when the trace was identified
    offset = clock.offset_ns
    if trace.more:  # a file per profiler cycle or step: read whole, as one trace
        parsed = parse_windows(trace.files, trace.rank, lambda path: parse_with(parser, path))
    elif wants_chunks(parser) and not read_whole(trace.path, trace.size):
        helper = helper and helper_pays(trace.path, trace.size)
        part = _ingest_chunked(trace, parser, rules, run, run_id, analyze, started, helper)
        if isinstance(part, RankPartial):
            return _with_role(part, trace, run)
        parsed = part  # the whole trace, for the whole-rank path: read once
    else:
        parsed = parse_with(parser, trace.path)
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
    side = side_rows(parsed, trace, offset)
    # Parquet encoding runs outside the GIL: write while the analysis runs, where a core is free.
    written = _write_beside(run, trace.rank, normalized.events) if beside else None
    rows_later = rows_later and hasattr(analyze, "rows")
    try:
        tables: dict[str, pa.Table | SpilledTable] = {}
        if rows_later:
            tables = dict(analyze(normalized.events, side, rows=False))  # type: ignore[call-arg,misc]
        elif analyze is not None:
            tables = dict(analyze(normalized.events, side))
    except BaseException:
        if written is not None:
            wait([written])  # (the analysis's error is the one raised)
        raise
    if written is not None:
        written.result()
    else:
        R.write_events(run, trace.rank, normalized.events, in_place=True)
    found, threads, skipped = dict(parsed.meta), dict(parsed.threads), dict(parsed.skipped)
    if normalized.layout is not None:
        found.update(normalized.layout.meta)
        for key, label in normalized.layout.threads.items():
            threads.setdefault(key, label)
        skipped.update(normalized.layout.skipped)
    if normalized.inferred is not None:
        threads.update(normalized.inferred.threads)
    found["steps_from"] = normalized.steps_from
    if normalized.inferred is not None and normalized.inferred.warmup and normalized.steps:
        found["warmup_steps"] = normalized.inferred.warmup
    found.update(_startup(first_start(normalized.events, WORK), tables.get("steps")))
    part = _with_role(
        _partial(
            trace,
            parser,
            parsed,
            side,
            tables,
            [parsed.notes, normalized.notes],
            events=normalized.events.num_rows,
            steps=normalized.steps,
            training_thread=normalized.training_thread,
            threads=threads,
            skipped=skipped,
            meta=found,
            started=started,
            host=host,
        ),
        trace,
        run,
    )
    if rows_later and part.info.role in SERVICE_ROLES:  # (a server keeps every table, empty)
        part.tables.update(analyze.rows([]))  # type: ignore[union-attr]
    elif rows_later:
        part.events = normalized.events
    return part


def _with_role(part: RankPartial, trace: TraceFile, run: Path) -> RankPartial:
    """The rank's role in a parameter-server job (collect's, else what its trace showed); a
    process without steps of its own (a server) keeps its events but no step analysis, and
    what it did instead (``analysis.roles.server_figures``)."""
    info = part.info
    found = info.meta.pop("role", None)
    how = info.meta.pop("role_from", None)
    shown = info.meta.pop("server", None)
    if said := role_named(trace.role):
        info.role, info.role_from = said, "collect"
    elif seen := role_named(found):
        info.role, info.role_from = seen, str(how or "trace")
    if info.role not in SERVICE_ROLES:
        return part
    from traceview.analysis.roles import server_figures

    sums = int(shown.get("sums", 0)) if isinstance(shown, dict) else 0
    info.meta["server"] = server_figures(R.read_events(run, [info.rank]), sums)
    info.meta.pop("steps_from", None)
    info.steps = 0
    part.notes.remarks = [r for r in part.notes.remarks if not r.endswith(NO_STEP_MARKERS)]
    part.tables = {  # (each table kept, empty: a run of servers alone still has them all)
        name: table.slice(0, 0) if isinstance(table, pa.Table) else table.schema.empty_table()
        for name, table in part.tables.items()
    }
    return part


def _partial(
    trace: TraceFile,
    parser: Parser,
    parsed: ParsedTrace,
    side: SideTables,
    tables: dict[str, pa.Table | SpilledTable],
    notes: list[Notes],
    *,
    events: int,
    steps: int,
    training_thread: tuple[int, int] | None,
    threads: dict[str, str],
    skipped: dict[str, int],
    meta: dict[str, Any],
    started: float,
    host: str | None,
) -> RankPartial:
    """The rank's part: its manifest entry (what was read, found and how long it took), its
    analysis tables and its side inputs (every input's file, empty or not: it says the input
    was read), and its notes, whichever path read it."""
    for name, rows in side.items():
        tables[name] = rows
    info = RankIngest(
        rank=trace.rank,
        source=str(trace.path),
        format=parser.name,
        framework=parser.framework,
        host=host,
        status="truncated" if parsed.lost_bytes else "ok",
        events=events,
        bytes_read=parsed.bytes_read,
        lost_bytes=parsed.lost_bytes,
        skipped_records=skipped,
        steps=steps,
        training_thread=list(training_thread) if training_thread else None,
        threads=threads,
        trace_files=[str(path) for path in trace.files] if trace.more else [],
        clock_offset_ns=trace.clock.offset_ns,
        clock=trace.clock,
        meta=meta,
        seconds=round(time.perf_counter() - started, 3),
    )
    merged = Notes()
    for part in notes:
        merged.extend(part)
    return RankPartial(info, tables, merged)


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
    """``ingest_rank`` for a large trace, in chunks of whole steps (``traceview.ingest.large.chunked``),
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
    # the per-rank analysis takes each chunk as it is normalized, where it can (side inputs
    # come with the parser's result, after the first pass)
    side: dict[str, pa.Table] = {}
    chunked = analyze.chunked if isinstance(analyze, RankAnalysisInChunks) else None
    sinks = itertools.count()

    def sink(
        parsed: ParsedTrace,
        training: tuple[int, int],
        gpu: bool,
        elsewhere: bool,
        whole: tuple[int, int] | None,
    ) -> ChunkSink | None:
        side.clear()
        side.update(side_rows(parsed, trace, offset))
        if chunked is None:
            return None
        # (a file of its own: a sink started again, its guess of the training thread wrong,
        # never writes where the abandoned one may still be writing)
        spill = R.spill_dir(run) / f"segments-{trace.rank}-{next(sinks)}.arrows"
        return chunked(side, spill)(training, gpu, elsewhere, whole)

    try:
        preload = analyze.modules if isinstance(analyze, RankAnalysisInChunks) else ()
        done = normalize_chunked(
            parser, trace.path, rules, meta, run, offset, sink, helper, preload
        )
    except BadInput as exc:  # (the parser's own errors name the file already)
        if str(exc).startswith(f"{trace.path}:"):
            raise
        raise BadInput(f"{trace.path}: {exc}") from exc
    if isinstance(done, ParsedTrace):
        return done
    parsed = done.parsed
    if not side:
        side.update(side_rows(parsed, trace, offset))
    tables = done.sink.finish() if done.sink is not None else None
    if tables is None and analyze is not None:
        # a fact taken up front did not hold (or the analysis takes whole ranks): the rank as
        # written, read back in chunks where the analysis takes them, else whole
        if isinstance(analyze, RankAnalysisInChunks):
            spill = R.spill_dir(run) / f"segments-{trace.rank}-{next(sinks)}.arrows"
            tables = analyse_written(run, trace.rank, analyze, side, spill)
        if tables is None:
            tables = dict(analyze(R.read_events(run, [trace.rank]), side))
    tables = tables or {}
    found, threads = dict(parsed.meta), dict(parsed.threads)
    inferred = done.inferred
    if inferred is not None:
        threads.update(inferred.threads)
    found["steps_from"] = (
        (inferred.how if inferred is not None and inferred.how else "markers")
        if done.steps
        else "one_window"
    )
    if inferred is not None and inferred.warmup and done.steps:
        found["warmup_steps"] = inferred.warmup
    return _partial(
        trace,
        parser,
        parsed,
        side,
        tables,
        [parsed.notes, done.notes],
        events=done.events,
        steps=done.steps,
        training_thread=done.training_thread,
        threads=threads,
        skipped=dict(parsed.skipped),
        meta={**found, **_startup(done.first_call_ns, tables.get("steps"))},
        started=started,
        host=trace.host or parsed.host,
    )


def _collected(trace: Path) -> dict[str, pa.Table]:
    """The side inputs collect recorded beside the trace (status.json), by name: the process's
    resident memory it sampled at step boundaries (memory records of device ``rss``)."""
    status = rank_status(trace)
    # what a status claims is bounded before it is believed: a time in int64, a size to 1 PiB
    samples = [
        s
        for s in status.rss_samples
        if len(s) == 2 and 0 <= s[0] < 1 << 63 and 0 <= s[1] <= 1 << 50
    ]
    if not samples:
        return {}
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
    return {"memory": rss}


def side_rows(parsed: ParsedTrace, trace: TraceFile, offset_ns: int) -> dict[str, pa.Table]:
    """The rank's side inputs (schema.SIDE_INPUTS), every one, as its rows of the run's
    ``<name>.parquet``: the parser's and what collect recorded beside the trace (``_collected``),
    on the run's clock, with the rank (empty where the trace has none)."""
    collected = _collected(trace.path)
    side = {}
    for name, spec in S.SIDE_INPUTS.items():
        parts = [t for t in (parsed.side.get(name), collected.get(name)) if t is not None]
        rows = pa.concat_tables([S.conform(t, spec.raw) for t in parts]) if parts else None
        if rows is None or rows.num_rows == 0:
            side[name] = S.empty(spec.stored)
            continue
        if offset_ns:
            for column in spec.times:
                at = rows.schema.get_field_index(column)
                shifted = pc.add(rows.column(at), pa.scalar(offset_ns, pa.int64()))
                rows = rows.set_column(at, column, shifted)
        ranks = pa.array([trace.rank] * rows.num_rows, pa.int32())
        side[name] = S.conform(rows.append_column(S.RANK, ranks), spec.stored)
    return side


def _startup(first_call: int | None, steps: pa.Table | None) -> dict[str, int]:
    """``startup_ns``: the rank's time from its first host call (an operator, runtime call,
    annotation or Python frame; not the profiler's own records) to its first step (one-time
    startup: CUDA context creation, first allocations, lazy initialization; outside every step);
    none where the rank has no numbered step."""
    if steps is None or steps.num_rows == 0 or steps.column(S.STEP).null_count:
        return {}
    first_step = pc.min(steps.column(S.START_NS)).as_py()
    if first_step is None or first_call is None:
        return {}
    return {"startup_ns": max(int(first_step) - first_call, 0)}
