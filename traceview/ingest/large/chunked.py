"""Bounded-memory ingest of one large trace: normalize a rank in chunks of whole steps (a long
step in pieces).

Every trace in a format that can be streamed (Kineto JSON, TF1 Timeline JSON) takes this
path but the smallest (``ingest.rank.read_whole``: under 1 MiB, read whole, as one chunk would
hold it). A trace is never whole in memory. So does
one whose parser reads it whole (``parsers.WholeRead``: MXNet's, Chainer's and Chrome JSON
read with rules pair begin and end records over the whole file; TensorFlow's XSpace is a
protobuf), its raw events alone held whole (MXNet's laid out on its engine's timeline and an
XSpace's steps inferred first: ``spill.WholeRankPasses``). Three passes:

1. **Spill.** The parser's record batches (``KinetoParser.stream``, ``TimelineParser.stream``,
   ``WholeRead``) are written as they are
   decoded to an Arrow IPC file in the run's staging folder, each row numbered (its event id,
   as the whole-rank path numbers it). Only small state is kept: the step markers, the phase
   markers (time and phase), and per runtime call its correlation and start (per operator with
   an external id, that id and start), from which the step windows, the training thread and
   each device activity's launching call are found as ``normalize`` finds them.
2. **Route.** The spill is read back a batch at a time and every event goes to the chunk that
   holds its start, except a device activity, which goes to the chunk of the call that
   launched it: the link is then always inside one chunk. Chunks are runs of whole steps, cut
   at a step's end (the events before the first step go with the first chunk, those after the
   last with the last); a stretch of more than twice ``PIECE_ROWS`` events between two cuts,
   a long step, is cut inside too, at phase markers (``inside_steps``). A kernel launched in
   one step and run in the next is linked as before.
3. **Normalize.** Chunk by chunk (``normalize.normalize_chunk``: the same passes), with the
   host events of earlier chunks still open at the chunk's start (and their ancestors) as
   context, so call trees that span steps nest as they do over the whole rank. An event still
   open at a chunk's end is written when it closes, its self time summed over every chunk that
   holds one of its children. The rows are appended to the rank's events file as Parquet row
   groups; event and parent ids are the whole rank's.

Peak memory is that of the largest chunk plus the small state, not the file's (a long step
with no phase marker inside is one chunk); the per-rank analysis takes a step cut in pieces a
slice at a time (``analysis.parts``). Each chunk's closed rows are appended to the events
file as it is done (``EventsWriter``): the file holds the rows the whole-rank path writes,
by chunk (time) rather than by id. A trace with no step markers is one window (the span of
its timed events) cut in pieces; its training thread, which takes the call trees, is guessed in
pass 1 and checked in pass 3 (``_normalize_routed``). One without markers whose training loop
repeats calls that step inference cuts steps at has them inferred from what pass 1 kept
(``normalize.step_inference.RepeatState``), its markers read as its last rows (``_inferred``).
One with events whose times are corrupt (the ``stray_times`` pass needs the whole rank's median)
has the median found over its spilled times and its other events spilled again
(``spill.without_strays``). One with no host events takes the whole-rank path.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from traceview.ingest.large.plan import (
    OPEN_END,
    Firsts,
    MemoRules,
    Plan,
    Survey,
    ThreadTime,
    chunk_rows,
    make_plan,
)
from traceview.ingest.large.route import Routing, chunk_files, read_chunk, route_both
from traceview.ingest.large.sinks import (
    Background,
    ChunkSink,
    InThread,
    SinkFactory,
    WorkerProcess,
    free_core,
    in_worker,
)
from traceview.ingest.large.spill import (
    FirstPass,
    first_pass,
    spill_surveyed,
    whole_table,
    without_strays,
)
from traceview.ingest.large.trim import release_memory, weighted_bytes
from traceview.ingest.large.writer import EventsWriter, with_self
from traceview.model import schema as S
from traceview.model.columns import (
    WORK,
    compact_dictionaries,
    first_start,
    ints,
)
from traceview.model.errors import Notes, cannot_write, no_room
from traceview.normalize.classify import has_scope, strays_dropped
from traceview.normalize.pipeline import ChunkContext, RankMeta, normalize_chunk
from traceview.normalize.rules import RuleSet
from traceview.normalize.steps import NO_STEP_MARKERS, InferredSteps, step_markers
from traceview.parsers import ParsedTrace, Parser, streams_of
from traceview.store import rundir as R

#: Traces at least this large (bytes on disk; a gzip file counts 8 times its size) may use a
#: helper process (reading the later part of the file, then analysing the chunks): it costs an
#: interpreter and its imports, about a second of CPU, which a smaller trace does not repay.
HELPER_MIN_BYTES = 256 << 20

#: The inferred step markers are spilled in batches of at most this many rows.
_MARKER_BATCH_ROWS = 4096


def wants_chunks(parser: Parser) -> bool:
    """Whether a trace may take this path (the smallest are read whole: ``ingest.rank.read_whole``):
    its parser
    streams (``Parser.streams``): read a batch at a time (Kineto, TF1 Timelines), or read whole
    and handed on a batch at a time (``parsers.WholeRead``: MXNet's, Chainer's and any Chrome
    JSON read with rules, whose begin and end records are paired over the whole file, and
    TensorFlow's XSpace, a protobuf; only their raw events are held whole). Every built-in
    parser does; a plugin's traces are read whole unless it says it streams.
    ``TRACEVIEW_WHOLE_RANK=1`` reads every trace whole, as a parser that cannot stream is: the
    tests' reference for the chunks."""
    return streams_of(parser) and os.environ.get("TRACEVIEW_WHOLE_RANK", "0") != "1"


def helper_pays(path: Path, size: int) -> bool:
    """Whether a trace is large enough for a helper process (``HELPER_MIN_BYTES``)."""
    least = int(os.environ.get("TRACEVIEW_HELPER_MIN_BYTES", HELPER_MIN_BYTES))
    return weighted_bytes(path.name, size) >= least


@dataclass
class ChunkedRank:
    """What ``normalize_chunked`` returns in place of ``Normalized``: the events are in the
    file already."""

    parsed: ParsedTrace  # the parser's result, without events
    events: int
    training_thread: tuple[int, int] | None
    steps: int
    notes: Notes = field(default_factory=Notes)
    sink: ChunkSink | None = None  # the sink the chunks went to
    first_call_ns: int | None = None  # its first host call's start (``WORK``), as written
    inferred: InferredSteps | None = None  # where the trace marks no steps: how they were found


def normalize_chunked(
    parser: Parser,
    path: Path,
    rules: RuleSet,
    meta: RankMeta,
    run: Path,
    offset_ns: int,
    sink: SinkFactory | None = None,
    helper: bool = False,
    preload: tuple[str, ...] = (),
) -> ChunkedRank | ParsedTrace:
    """Parse, normalize and write one rank's events in chunks of whole steps (module doc); the
    parser's result with every event where the trace needs the whole-rank path (no host
    events, corrupt times), read once.
    ``sink``: makes what each normalized chunk is handed to (the per-rank analysis);
    ``helper``: a core is free for a helper process (``first_pass``); ``preload``: the modules
    the sink needs, which a helper process imports while it waits for the sink."""
    rules = MemoRules.of(rules)
    helper = helper and free_core()
    work = run / f".chunks-rank-{meta.rank}"
    shutil.rmtree(work, ignore_errors=True)
    try:
        work.mkdir(parents=True)
        return _normalize_chunked(
            parser, path, rules, meta, run, offset_ns, work, sink, helper, preload
        )
    except OSError as exc:
        if no_room(exc):  # the rank's events on their way (spilled, routed), on a full disk
            raise cannot_write(R.events_path(run, meta.rank), exc) from None
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _normalize_chunked(
    parser: Parser,
    path: Path,
    rules: RuleSet,
    meta: RankMeta,
    run: Path,
    offset_ns: int,
    work: Path,
    make_sink: SinkFactory | None,
    helper: bool = False,
    preload: tuple[str, ...] = (),
) -> ChunkedRank | ParsedTrace:
    first = first_pass(parser, path, rules, work, helper, preload, meta.rank)
    try:
        return _normalize_read(first, rules, meta, run, offset_ns, work, make_sink, helper)
    finally:
        if first.helper is not None:  # not taken by the analysis: idle, it need not finish
            first.helper.close(kill=True)


def _normalize_read(
    first: FirstPass,
    rules: RuleSet,
    meta: RankMeta,
    run: Path,
    offset_ns: int,
    work: Path,
    make_sink: SinkFactory | None,
    helper: bool,
) -> ChunkedRank | ParsedTrace:
    """Passes 2 and 3 on what pass 1 read (``_normalize_routed``), or the whole-rank path."""
    notes = Notes()  # the passes' over the whole rank, before the chunks'
    parsed, base_ns, survey, spills = first.parsed, first.base_ns, first.survey, first.spills
    read = list(spills)  # the rows as pass 1 read them (the whole-rank path's, if it comes to it)
    kept = without_strays(first, rules, work)
    if kept is not None:
        survey, spills = kept.survey, kept.spills
        notes.warn(strays_dropped(meta.rank, kept.dropped))
    assert survey is not None
    first.survey = None
    if meta.host is None:  # the trace may name its host after its events: known by now
        meta.host = parsed.host
    # no step markers, but calls that repeat: the steps inferred from what pass 1 kept
    # (before the plan, which takes the survey's arrays)
    inferred = first.inferred  # (a rank read whole: inferred before pass 1)
    rows = survey.inference_table(parsed.infer_steps) if parsed.infer_steps else None
    if not survey.marker_ts and rows is not None:
        inferred = _inferred(parsed, survey, rows, rules, spills, work, notes)
    plan = make_plan(survey, chunk_rows(), notes)
    del survey
    if plan is None:  # no host events: the whole-rank path, on what was read (strays and all)
        parsed.events = whole_table(read, base_ns)
        return parsed
    if kept is not None:  # (the rows with their strays are not needed any more)
        for path, _ in read:
            path.unlink(missing_ok=True)
    shift = base_ns + offset_ns
    whole = None if plan.whole is None else (plan.whole[0] + shift, plan.whole[1] + shift)

    def start_sink(plan: Plan) -> Background | None:
        """The per-rank analysis of the chunks to come, on a helper process where one may
        run (the one that read the later part of the trace, the first time), else a thread."""
        if make_sink is None:
            return None
        sink = make_sink(parsed, plan.training, plan.gpu, plan.backward_elsewhere, whole)
        if sink is None:
            return None
        try:
            if first.helper is not None:  # the helper that read the later part, waiting
                background, first.helper = in_worker(sink, work, first.helper), None
                return background
            return in_worker(sink, work) if helper else InThread(sink)
        except OSError:  # no process can start: a thread, then
            return InThread(sink)

    done = _normalize_routed(
        spills, plan, work, shift, rules, meta, run, start_sink, parsed, first.helper
    )
    notes.extend(done.notes)
    done.notes, done.inferred = notes, inferred
    return done


def _inferred(
    parsed: ParsedTrace,
    survey: Survey,
    rows: pa.Table,
    rules: RuleSet,
    spills: list[tuple[Path, int]],
    work: Path,
    notes: Notes,
) -> InferredSteps | None:
    """The steps of a rank without markers, inferred as the whole-rank path infers them, from
    what pass 1 kept of the rows that could mark them (``rows``: ``Survey.inference_table``). The
    markers are read as the trace's last rows (a spill of their own, numbered after the
    trace's, as the whole-rank path appends them) and surveyed: the rank is then read as a
    marked one. None: nothing repeats (one window)."""
    found = step_markers(rows, parsed.infer_steps or "", parsed.process_names or {}, notes)
    if found is None:
        return None
    if found.markers.num_rows:
        # (in batches, each with the names its rows use: a chunk routed a slice of one batch
        # of every marker held all their names, 100,000 for as many Session.runs)
        markers = S.conform(found.markers, S.RAW_SCHEMA).to_batches(_MARKER_BATCH_ROWS)
        spill = work / "markers.arrows"  # (numbered from survey.rows)
        spill_surveyed(map(compact_dictionaries, markers), survey, rules, spill)
        spills.append((spill, 0))
    return found


class _WrongGuess(Exception):
    """The training thread of a rank without step markers was not the one its call trees
    name (``_normalize_routed`` starts the chunks again with that one)."""

    def __init__(self, training: tuple[int, int]):
        self.training = training


def _normalize_routed(
    spills: list[tuple[Path, int]],
    plan: Plan,
    work: Path,
    shift: int,
    rules: RuleSet,
    meta: RankMeta,
    run: Path,
    start_sink: Callable[[Plan], Background | None],
    parsed: ParsedTrace,
    helper: WorkerProcess | None = None,
) -> ChunkedRank:
    """Passes 2 and 3 (module doc): route the spilled rows (``helper``: the one that read the
    later part routes it), normalize and write chunk by chunk.
    A rank without step markers has its training thread guessed from pass 1; where the call
    trees name another one, its chunks are normalized again (rare: kept for that)."""
    route_both(spills, Routing(plan.bounds, plan.runtime, plan.ops), work, helper)
    plan.runtime = plan.ops = Firsts.NONE  # (the launch lookups: only routing needs them)
    release_memory(now=True)
    for spill, _ in spills:
        spill.unlink()

    while True:
        notes = Notes()
        if plan.whole is not None:
            notes.remark(NO_STEP_MARKERS)
        sink = start_sink(plan)
        try:
            with EventsWriter(R.events_path(run, meta.rank)) as out:
                devices, unlinked, training, first_call = _normalize_chunks(
                    plan, work, shift, rules, meta, sink, notes, out
                )
                if training != plan.training:
                    raise _WrongGuess(training)
        except _WrongGuess as wrong:
            if sink is not None:
                sink.abandon()
            plan.training = wrong.training
            plan.backward_elsewhere = bool(plan.backward_threads - {wrong.training})
            continue
        except BaseException:
            if sink is not None:
                sink.abandon()
            raise
        break
    if devices and unlinked:
        notes.remark(
            f"{unlinked} of {devices} device activities have no launching host "
            "call in the trace; their phase is 'other' unless a rule names it"
        )
    return ChunkedRank(
        parsed=parsed,
        events=out.written,
        training_thread=plan.training,
        steps=len(plan.starts),
        notes=_unique_notes(notes),
        sink=sink,
        first_call_ns=first_call,
    )


def _normalize_chunks(
    plan: Plan,
    work: Path,
    shift: int,
    rules: RuleSet,
    meta: RankMeta,
    sink: Background | None,
    notes: Notes,
    out: EventsWriter,
) -> tuple[int, int, tuple[int, int], int | None]:
    """Pass 3: each routed chunk normalized, its closed rows written to ``out`` and handed to
    ``sink``; the device activities seen, how many of them have no launching call (none
    counted where the rank names scopes, as ``normalize.devices.link_devices`` has it), the
    training thread (without step markers: the one the call trees name, as
    ``normalize.find_steps`` finds it; the chunks' files are then kept, should it not be the
    guessed one), and the start of the first host call (``WORK``)."""
    chunks = len(plan.bounds) + 1
    devices = unlinked = 0
    scoped = False  # the rank names scopes: no activity is said to lack a launch
    first_call: int | None = None
    thread_time = ThreadTime() if plan.whole is not None else None

    carry_raw: pa.Table | None = None
    carry_out: pa.Table | None = None
    carry_positional = np.zeros(0, np.int8)
    carry_children = np.zeros(0, np.int64)
    for c in range(chunks):
        own = read_chunk(work, c, shift)
        if own is None and carry_raw is None:
            continue
        parts = [t for t in (carry_raw, own) if t is not None]
        raw = pa.concat_tables(parts).unify_dictionaries().combine_chunks()
        del parts, own
        carried = 0 if carry_raw is None else carry_raw.num_rows
        anchor = plan.anchor_ts == plan.bounds[c] if c < chunks - 1 else None
        ctx = ChunkContext(
            training=plan.training,
            starts=plan.starts + shift,
            ends=plan.ends + shift,
            numbers=plan.numbers,
            backward_steps=plan.backward_steps,
            more_anchors=(
                (plan.anchor_ts[anchor] + shift, plan.anchor_phase[anchor])
                if anchor is not None
                else (np.zeros(0, np.int64), np.zeros(0, np.int64))
            ),
            carried=carried,
            carried_positional=carry_positional,
        )
        scoped = scoped or has_scope(raw)
        result = normalize_chunk(raw, rules, meta, ctx, notes)
        devices += result.devices
        unlinked += result.unlinked
        events = result.events
        n = events.num_rows
        dur = ints(events.column(S.DUR_NS), 0)
        ts = ints(events.column(S.TS_NS), 0)
        parent = result.parent
        is_own = np.arange(n) >= carried
        here = first_start(events, WORK, is_own)
        if here is not None:
            first_call = here if first_call is None else min(first_call, here)
        if thread_time is not None:
            host = np.flatnonzero(result.host_tree & is_own)
            thread_time.add(
                ints(events.column(S.PID), 0)[host],
                ints(events.column(S.TID), 0)[host],
                result.outermost[host],
                result.own_backward[host],
                dur[host],
            )
        child = is_own & (parent >= 0)
        children = np.bincount(parent[child], weights=dur[child], minlength=n).astype(np.int64)
        children[:carried] += carry_children
        # still open at the cut: carried on (with its ancestors), written when it closes
        if c < chunks - 1:
            still = result.host_tree & (ts + dur > plan.bounds[c] + shift)
            frontier = np.flatnonzero(still)
            while len(frontier):
                up = parent[frontier]
                up = np.unique(up[up >= 0])
                up = up[~still[up]]
                still[up] = True
                frontier = up
        else:
            still = np.zeros(n, bool)
        # rows carried in and now closed: their own chunk's row, self time summed
        closed = [events.filter(pa.array(is_own & ~still))]
        done = np.flatnonzero(~still[:carried])
        if len(done) and carry_out is not None:  # (first: their ids are the lower)
            closed.insert(0, with_self(carry_out.take(done), dur[done] - children[done]))
        out.write(closed)
        keep = np.flatnonzero(still)
        keep_carried = keep[keep < carried]
        keep_own = keep[keep >= carried]
        if len(keep):
            carry_raw = raw.take(keep)
            carried_rows = [events.take(keep_own)]
            if len(keep_carried) and carry_out is not None:
                carried_rows.insert(0, carry_out.take(keep_carried))
            carry_out = pa.concat_tables(carried_rows).unify_dictionaries()
            carry_positional = result.positional[keep]
            carry_children = children[keep]
        else:
            carry_raw = carry_out = None
            carry_positional = np.zeros(0, np.int8)
            carry_children = np.zeros(0, np.int64)
        if thread_time is None:
            for path in chunk_files(work, c):
                path.unlink(missing_ok=True)
        del raw, result, closed
        if sink is not None:  # the rows as written: carried ones with their self time summed
            column = events.column(S.SELF_NS)
            self_ns = ints(column, 0).copy()
            self_ns[done] = np.maximum(dur[done] - children[done], 0)
            unknown = np.array(column.is_null().to_numpy(zero_copy_only=False), bool)
            unknown[done] = False
            self_col = pa.array(self_ns, pa.int64(), mask=unknown)
            sink.add(
                events.set_column(events.schema.get_field_index(S.SELF_NS), S.SELF_NS, self_col),
                is_own,
                ~still,
                int(plan.bounds[c - 1]) + shift if c > 0 else -OPEN_END,
                int(plan.bounds[c]) + shift if c < chunks - 1 else OPEN_END,
            )
        del events
        release_memory()
    if sink is not None:
        sink.close()  # its last windows are analysed while the events file is finished
    training = thread_time.training() if thread_time is not None else None
    return devices, 0 if scoped else unlinked, training or plan.training, first_call


def _unique_notes(notes: Notes) -> Notes:
    out = Notes()
    for text in dict.fromkeys(notes.warnings):
        out.warn(text)
    for text in dict.fromkeys(notes.remarks):
        out.remark(text)
    return out
