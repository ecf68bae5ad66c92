"""Pass 1 over a large trace: its decoded batches surveyed and spilled to an Arrow file, each
row numbered; a plain trace large enough is read in two parts at once, the later one by a worker
process.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traceview.ingest.large.plan import Survey
from traceview.ingest.large.sinks import WorkerProcess
from traceview.model import schema as S
from traceview.model.columns import ints
from traceview.model.errors import Notes
from traceview.normalize.classify import STRAY_NS, may_stray, stray
from traceview.normalize.pipeline import whole_rank_passes
from traceview.normalize.rules import RuleSet
from traceview.normalize.steps import InferredSteps
from traceview.parsers import ParsedTrace, Parser, SplittableParser, WholeRead
from traceview.parsers.chrome_stream import SplitMismatch


def spill_surveyed(
    batches: Iterator[pa.RecordBatch], survey: Survey, rules: RuleSet, spill: Path
) -> None:
    """Pass 1 over some of a trace's batches: survey them, write them to ``spill`` with their
    row numbers (from the survey's count) and kind codes."""
    writer: pa.ipc.RecordBatchStreamWriter | None = None
    with pa.OSFile(str(spill), "wb") as sink:
        for batch in batches:
            first = survey.rows
            kind = survey.add(batch, rules)
            batch = batch.append_column("_row", pa.array(np.arange(first, survey.rows)))
            batch = batch.append_column("_kind", pa.array(kind, pa.int8()))
            if writer is None:
                writer = pa.ipc.new_stream(sink, batch.schema)
            writer.write_batch(batch)
        if writer is not None:
            writer.close()


@dataclass
class FirstPass:
    parsed: ParsedTrace  # the parser's result, without events
    base_ns: int  # the time base to add
    survey: Survey | None  # (None once taken: its arrays are freed as the plan is made)
    spills: list[tuple[Path, int]]  # the spilled rows: files, each with its first row's number
    helper: WorkerProcess | None = None  # the helper that read the later part, now waiting
    inferred: InferredSteps | None = None  # steps inferred over the whole rank read whole


def first_pass(
    parser: Parser,
    path: Path,
    rules: RuleSet,
    work: Path,
    helper: bool,
    preload: tuple[str, ...] = (),
    rank: int = 0,
) -> FirstPass:
    """Pass 1 (module doc). With ``helper``, a plain trace large enough is read in two parts
    at once: the later part by a process of its own (``read_later_part``) on another core. A
    trace read whole (``WholeRead``) first goes through the passes that need the whole rank
    (``WholeRankPasses``; ``rank``: the rank's number, for their notes)."""
    boundary = _split_boundary(parser, path) if helper else None
    if boundary is not None:
        try:
            return _in_two_parts(
                cast(SplittableParser, parser), path, rules, work, boundary, preload
            )
        except SplitMismatch:  # no event starts there after all: read it in one piece
            pass
    stream = parser.stream(path)
    whole = WholeRankPasses(rules, rank)
    if isinstance(stream, WholeRead):
        stream.prepare = whole
    survey = Survey()
    spill = work / "raw.arrows"
    spill_surveyed(iter(stream), survey, rules, spill)
    return FirstPass(stream.result, stream.base_ns, survey, [(spill, 0)], inferred=whole.inferred)


@dataclass
class WholeRankPasses:
    """The passes of the whole-rank path that need the whole rank, run on a trace read whole
    (``WholeRead``) before pass 1, in ``normalize``'s order: the layout pass its format names
    (MXNet's engine timeline), then, where the format says how steps are found and the trace
    marks none, the events with corrupt times dropped and the steps inferred (TensorFlow's step
    groups). The rank is then read as one that needs neither: what the passes say of it goes to
    the parser's result (metadata, thread labels, skipped records, notes), and the inferred
    steps to ``inferred``."""

    rules: RuleSet
    rank: int
    inferred: InferredSteps | None = None

    def __call__(self, parsed: ParsedTrace, events: pa.Table) -> pa.Table:
        if parsed.layout is None and parsed.infer_steps is None:
            return events  # (its corrupt times: dropped after pass 1, ``without_strays``)
        notes = Notes()
        events, found, self.inferred = whole_rank_passes(
            events, self.rules, self.rank, parsed.layout, parsed.infer_steps,
            parsed.process_names, notes,
        )  # fmt: skip
        parsed.layout = parsed.infer_steps = None
        if found is not None:
            parsed.meta.update(found.meta)
            for key, label in found.threads.items():
                parsed.threads.setdefault(key, label)
            parsed.skipped.update(found.skipped)
            found.events = found.events.slice(0, 0)  # (``events`` holds them)
        parsed.notes.extend(notes)
        return events


#: Where the later part starts, as a share of the file: the helper starts later (a Python
#: process and its imports), so the first part is the larger. ``TRACEVIEW_SPLIT_AT``.
SPLIT_AT = 0.45


def _split_boundary(parser: Parser, path: Path) -> int | None:
    """Where the later part of a trace read in two parts starts (None: read in one piece:
    a gzip trace, a format that cannot be split). A trace with a helper process (large
    enough to pay for one: ``chunked.helper_pays``) is read in two parts wherever it can be."""
    if not hasattr(parser, "split_point"):  # not a SplittableParser
        return None
    size = path.stat().st_size
    near = int(size * float(os.environ.get("TRACEVIEW_SPLIT_AT", SPLIT_AT)))
    return cast(SplittableParser, parser).split_point(path, near)


def _in_two_parts(
    parser: SplittableParser,
    path: Path,
    rules: RuleSet,
    work: Path,
    boundary: int,
    preload: tuple[str, ...] = (),
) -> FirstPass:
    """Pass 1 in two parts at once: [0, boundary) here, the rest in a helper process; its
    rows follow ours. Where the helper fails (killed, out of memory), its part is read here.
    The helper then waits to run the rank's analysis (``InWorker``), its imports done."""
    later = work / "later"
    later.mkdir()
    with (work / "rules.pickle").open("wb") as fh:
        pickle.dump(rules, fh)
    command = ["read-part", parser.name, str(path), str(boundary), str(work / "rules.pickle")]
    try:
        helper = WorkerProcess([*command, str(later), ",".join(preload)], later / "stderr")
    except OSError as exc:  # no process can start: read the trace in one piece
        raise SplitMismatch(f"{path}: no helper process ({exc})") from None
    try:
        stream = parser.stream(path, (0, boundary))
        survey = Survey()
        spill = work / "raw.arrows"
        spill_surveyed(iter(stream), survey, rules, spill)
        try:
            done = helper.inbox.recv() == ("part",) and (later / PART_FILE).exists()
        except (EOFError, OSError):  # it died
            done = False
    except BaseException:
        helper.close(kill=True)
        raise
    if done:
        with (later / PART_FILE).open("rb") as fh:
            later_survey, part = pickle.load(fh)
    else:
        helper.close(kill=True)
        later_survey, part = read_later_part(parser, path, boundary, rules, later)
    first_later = survey.rows
    survey.then(later_survey)
    stream.then(part)
    spills = [(spill, 0), (later / "raw.arrows", first_later)]
    return FirstPass(stream.result, stream.base_ns, survey, spills, helper if done else None)


#: What ``read_later_part`` leaves beside its spilled rows: its survey and the parser's part.
PART_FILE = "part.pickle"


def read_later_part(
    parser: SplittableParser, path: Path, boundary: int, rules: RuleSet, out: Path
) -> tuple[Survey, Any]:
    """Pass 1 over the part of ``path`` from ``boundary`` to its end (``traceview.ingest.large.worker``
    runs it in a process of its own): its rows spilled to ``out``/raw.arrows (numbered from
    0), and its survey and the parser's part (also in ``out``/``PART_FILE``)."""
    stream = parser.stream(path, (boundary, None))
    survey = Survey()
    spill_surveyed(iter(stream), survey, rules, out / "raw.arrows")
    done = (survey, stream.part_read())
    tmp = out / (PART_FILE + ".tmp")
    with tmp.open("wb") as fh:
        pickle.dump(done, fh, protocol=pickle.HIGHEST_PROTOCOL)
    tmp.replace(out / PART_FILE)
    return done


@dataclass
class Kept:
    """A rank's rows less its strays (``without_strays``): surveyed afresh, in a spill of
    their own (the rows pass 1 spilled stay, for the whole-rank path, until the plan is made)."""

    survey: Survey
    spills: list[tuple[Path, int]]
    dropped: int


def without_strays(first: FirstPass, rules: RuleSet, work: Path) -> Kept | None:
    """The ``stray_times`` pass on a rank read in chunks, where pass 1 saw times far enough
    apart (rare: a corrupt record): the strays are found over the whole rank as the whole-rank
    path finds them (the median of every event's time, read back from the spills: 8 bytes an
    event), and the rest spilled again and surveyed afresh, numbered without them. None: no
    event is a stray (then nothing is read again)."""
    survey = first.survey
    assert survey is not None
    if not may_stray(survey.ts_min, survey.ts_max, survey.dur_max):
        return None
    # (as the whole-rank path takes them: times in ns with the base added, then as floats)
    times = [
        (ints(batch.column(S.TS_NS), 0) + first.base_ns).astype(np.float64)
        for path, _ in first.spills
        for batch in spill_batches(path, [S.TS_NS])
    ]
    ts = np.concatenate(times) if times else np.zeros(0)
    del times
    median = float(np.median(ts)) if len(ts) else 0.0
    if survey.dur_max <= STRAY_NS and not (np.abs(ts - median) > STRAY_NS).any():
        return None
    del ts
    dropped = 0

    def kept() -> Iterator[pa.RecordBatch]:
        nonlocal dropped
        for path, _ in first.spills:
            for batch in spill_batches(path):
                ts = ints(batch.column(S.TS_NS), 0) + first.base_ns
                out = stray(ts, ints(batch.column(S.DUR_NS), 0), median)
                dropped += int(out.sum())
                yield batch.drop_columns(["_row", "_kind"]).filter(pa.array(~out))

    again = Survey()
    spill = work / "kept.arrows"
    spill_surveyed(kept(), again, rules, spill)  # (some are dropped: the test above says so)
    return Kept(again, [(spill, 0)], dropped)


def whole_table(spills: list[tuple[Path, int]], base_ns: int) -> pa.Table:
    """The spilled batches as the one raw table ``parse`` gives (the trace is not read
    twice)."""
    batches = [b.drop_columns(["_row", "_kind"]) for p, _ in spills for b in spill_batches(p)]
    table = pa.Table.from_batches(batches) if batches else S.RAW_SCHEMA.empty_table()
    del batches
    if base_ns:
        ts = pc.add(table.column(S.TS_NS), pa.scalar(base_ns, pa.int64()))
        table = table.set_column(table.schema.get_field_index(S.TS_NS), S.TS_NS, ts)
    return S.conform(table, S.RAW_SCHEMA).unify_dictionaries()


def spill_batches(path: Path, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """A spill's batches (``columns``: only those, the rest freed batch by batch)."""
    if not path.exists() or path.stat().st_size == 0:  # nothing was decoded
        return
    with pa.OSFile(str(path), "rb") as source:
        reader = pa.ipc.open_stream(source)
        if columns is None:
            yield from reader
        else:
            for batch in reader:
                yield batch.select(columns)
