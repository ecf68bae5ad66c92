"""A written rank's events read back in chunks of whole steps, as ingest cut them, and fed to
the per-rank analysis (``analyse_written``): the one way a rank is analysed again without its
events whole in memory, for a reader's recompute (after an analysis change) and for an ingest
whose chunked analysis found a fact it took up front wrong.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from traceview.ingest.large.plan import (
    OPEN_END,
    SAMPLE_EVERY,
    Firsts,
    ThreadTime,
    chunk_rows,
    inside_steps,
    steps_and_chunks,
)
from traceview.ingest.large.route import ChunkFiles
from traceview.ingest.large.sinks import RankAnalysisInChunks, SideTables
from traceview.ingest.large.spill import spill_batches
from traceview.ingest.large.trim import release_memory
from traceview.model import schema as S
from traceview.model.columns import (
    DEVICE,
    HOST_TREE,
    KIND_CODE,
    OPERATOR,
    STRUCTURAL,
    SpilledTable,
    ints,
    unique_pairs,
)
from traceview.model.errors import BadInput
from traceview.normalize.phases import ANCHOR_PHASES
from traceview.store import rundir as R

_READ_ROWS = 1 << 16


def recompute_in_chunks() -> bool:
    """Whether a reader's recompute of a rank's analysis (after an analysis change) reads its
    events a chunk at a time, as ingest analyses them: always, unless ``TRACEVIEW_WHOLE_RANK=1``
    (the tests' reference: read whole)."""
    return os.environ.get("TRACEVIEW_WHOLE_RANK", "0") != "1"


def written_by_traceview(schema: pa.Schema) -> bool:
    """Whether an events file holds exactly the columns traceview writes, of the same types: the
    chunks read back take it as it is (a reader whole conforms it, or says what is wrong)."""
    wanted = {f.name: f.type for f in S.EVENTS_SCHEMA if f.name != S.RANK}
    return {f.name: f.type for f in schema} == wanted


def analyse_written(
    run: Path,
    rank: int,
    analysis: RankAnalysisInChunks,
    side: SideTables,
    spill: Path | None = None,
) -> dict[str, pa.Table | SpilledTable] | None:
    """The analysis of a written rank, its events read back a chunk of steps at a time as
    ingest cut them (``spill``: where the analysis may write its segments as it makes them);
    None for a file whose ids are not its rows or whose columns traceview did not write (read
    it whole, which says what is wrong with it), where the analysis found a fact of the whole
    rank wrong, or where ``recompute_in_chunks`` says no."""
    path = R.events_path(run, rank)
    if not recompute_in_chunks():
        return None
    try:
        schema = R.parquet_file(path).schema_arrow
    except (OSError, pa.ArrowException, BadInput):
        return None
    if not written_by_traceview(schema):
        return None
    with tempfile.TemporaryDirectory(prefix="traceview-chunks-") as work:
        try:
            found = events_in_chunks(path, rank, Path(work), chunk_rows())
        except (OSError, pa.ArrowException, ValueError) as exc:
            raise BadInput(f"{path}: unreadable ({exc})") from None
        if found is None:
            return None
        sink = analysis.chunked(side, spill)(
            found.training, found.gpu, found.backward_elsewhere, found.whole
        )
        for chunk in found.chunks:
            sink.add(*chunk)
            release_memory()
        return sink.finish()


@dataclass
class EventChunks:
    """A written rank's events as the chunks ``normalize_chunked`` hands its sink: per chunk,
    its rows with the host events still open at its start before them (context), which rows
    are its own (and counted: each event once), and the time span [lo, hi) of its steps; with
    the facts of the whole rank the analysis of a slice takes up front."""

    training: tuple[int, int]
    gpu: bool
    backward_elsewhere: bool
    chunks: Iterator[tuple[pa.Table, np.ndarray, np.ndarray, int, int]]
    whole: tuple[int, int] | None = None  # a rank without step markers: its one window


def events_in_chunks(path: Path, rank: int, work: Path, target_rows: int) -> EventChunks | None:
    """The events file ``path`` of ``rank`` in chunks of whole steps (``work``: a folder for
    the routed rows). Two passes over the file, a row group at a time: the step markers and
    what the rank holds, then each row to its chunk's file (by its start; a device activity by
    the call that launched it, else by its step's marker). A stretch of more than twice
    ``target_rows`` rows between two cuts, a long step, is cut inside too, at phase markers, as
    ingest cuts it (``inside_steps``). A rank without step markers is one window, cut about
    every ``target_rows`` rows (``_unmarked_file``); None where its ids are not its rows'."""
    from traceview.model.columns import KIND_CODE, PHASE_CODE, coded

    step_code, backward = KIND_CODE[S.KIND_STEP], PHASE_CODE[S.BACKWARD]
    annotation, runtime_code = KIND_CODE[S.KIND_ANNOTATION], KIND_CODE[S.KIND_RUNTIME]
    file = R.parquet_file(path)
    rows = file.metadata.num_rows
    markers: list[np.ndarray] = []
    gpu = False
    backward_threads: set[tuple[int, int]] = set()
    # where a long step's events lie, where its phase markers start, and each runtime call
    sampled, anchors, runtime_ids, runtime_ts = [], [], [], []
    seen = 0
    columns = [S.EVENT_ID, S.KIND, S.PHASE, S.PID, S.TID, S.TS_NS, S.DUR_NS, S.STEP]
    for batch in file.iter_batches(batch_size=_READ_ROWS, columns=columns):
        kind = coded(batch.column(S.KIND), KIND_CODE)
        pid, tid = ints(batch.column(S.PID), 0), ints(batch.column(S.TID), 0)
        ts = ints(batch.column(S.TS_NS), 0)
        end = ts + ints(batch.column(S.DUR_NS), 0)
        mark = kind == step_code
        if mark.any():
            step = ints(batch.column(S.STEP), -1)
            markers.append(np.stack([pid[mark], tid[mark], ts[mark], end[mark], step[mark]]))
        gpu |= bool(DEVICE[kind].any())
        phase = coded(batch.column(S.PHASE), PHASE_CODE)
        back = HOST_TREE[kind] & ~STRUCTURAL[kind] & (phase == backward)
        if back.any():
            pairs = unique_pairs(pid[back], tid[back])
            backward_threads.update(zip(pairs[0].tolist(), pairs[1].tolist(), strict=True))
        sampled.append(ts[(-seen) % SAMPLE_EVERY :: SAMPLE_EVERY].copy())
        seen += len(ts)
        anchors.append(ts[(kind == annotation) & (phase >= 0) & ANCHOR_PHASES[phase]])
        runtime = kind == runtime_code
        runtime_ids.append(ints(batch.column(S.EVENT_ID), -1)[runtime])
        runtime_ts.append(ts[runtime])
    whole: tuple[int, int] | None = None
    launchers = Firsts.NONE  # a device activity goes with its launcher
    step_numbers = step_chunks = np.zeros(0, np.int64)
    if markers:
        m_pid, m_tid, m_ts, m_end, m_step = np.concatenate(markers, axis=1)
        training, mine, bounds = steps_and_chunks(m_pid, m_tid, m_ts, m_end, rows, target_rows)
        starts = np.sort(np.concatenate(sampled))
        bounds = inside_steps(bounds, starts, rows, np.concatenate(anchors), target_rows)
        del starts, sampled, anchors
        launchers = Firsts(runtime_ids, runtime_ts, bounds)
        # the chunk of each step (by its marker), for the device activities it launched whose
        # launcher is not known
        numbers = m_step[mine]
        known = numbers >= 0
        step_numbers = numbers[known]
        step_chunks = np.searchsorted(bounds, m_ts[mine][known], side="right")
        order = np.argsort(step_numbers, kind="stable")
        step_numbers, step_chunks = step_numbers[order], step_chunks[order]
    else:
        del anchors
        found = _unmarked_file(file, rows, target_rows, sampled, runtime_ids, runtime_ts)
        if found is None:
            return None
        training, whole, bounds, launchers = found

    with ChunkFiles(work, "events") as files:
        for batch in file.iter_batches(batch_size=_READ_ROWS):
            ts = ints(batch.column(S.TS_NS), 0)
            chunk = np.searchsorted(bounds, ts, side="right")
            kind = coded(batch.column(S.KIND), KIND_CODE)
            device = np.flatnonzero(DEVICE[kind])
            if len(device) and len(step_numbers):
                step = ints(batch.column(S.STEP), -1)[device]
                at = np.minimum(np.searchsorted(step_numbers, step), len(step_numbers) - 1)
                hit = (step >= 0) & (step_numbers[at] == step)
                chunk[device] = np.where(hit, step_chunks[at], chunk[device])
            if len(device):
                launcher = launchers.get(ints(batch.column(S.PARENT), -1)[device])
                chunk[device] = np.where(launcher >= 0, launcher, chunk[device])
            for c in np.unique(chunk).tolist():
                files.write(c, batch.filter(pa.array(chunk == c)))

    def chunks() -> Iterator[tuple[pa.Table, np.ndarray, np.ndarray, int, int]]:
        open_rows: pa.Table | None = None
        last = len(bounds)
        for c in range(last + 1):
            lo = int(bounds[c - 1]) if c > 0 else -OPEN_END
            hi = int(bounds[c]) if c < last else OPEN_END
            spilled = work / f"events-{c}.arrows"
            own = pa.Table.from_batches(list(spill_batches(spilled)), file.schema_arrow)
            spilled.unlink(missing_ok=True)
            own = own.append_column(S.RANK, pa.array(np.full(own.num_rows, rank, np.int32)))
            carried = 0 if open_rows is None else open_rows.num_rows
            table = own if open_rows is None else pa.concat_tables([open_rows, own])
            table = table.unify_dictionaries()
            mine = np.arange(table.num_rows) >= carried
            yield table, mine, mine, lo, hi
            # host events still open at the next chunk's start: its context
            kind = coded(table.column(S.KIND), KIND_CODE)
            ts = ints(table.column(S.TS_NS), 0)
            still = HOST_TREE[kind] & (ts + ints(table.column(S.DUR_NS), 0) > hi)
            open_rows = table.filter(pa.array(still)) if still.any() else None

    return EventChunks(training, gpu, bool(backward_threads - {training}), chunks(), whole)


def _unmarked_file(
    file: pq.ParquetFile,
    rows: int,
    target_rows: int,
    sampled: list[np.ndarray],
    runtime_ids: list[np.ndarray],
    runtime_ts: list[np.ndarray],
) -> tuple[tuple[int, int], tuple[int, int], np.ndarray, Firsts] | None:
    """What ``events_in_chunks`` needs of a written rank without step markers, in two more
    passes over a few of its columns: its training thread (as ``rank_timeline`` finds it over
    the whole rank: the thread with the most time in outermost operators, which takes each
    parent's kind, looked up by id), its one window (the span of its timed events), the chunk
    bounds (about every ``target_rows`` rows, by a sample of the starts), and the chunk of
    each runtime call (a device activity's launcher) by id (``sampled``, ``runtime_ids`` and
    ``runtime_ts``: the caller's pass found them). None where the ids are not the rows' numbers
    (not a file traceview wrote)."""
    from traceview.model.columns import PHASE_CODE, coded

    kind_of = np.full(rows + 1, -1, np.int8)  # by id (the last: none)
    start, end = 1 << 62, -(1 << 62)
    timed = HOST_TREE | DEVICE
    for batch in file.iter_batches(
        batch_size=_READ_ROWS, columns=[S.EVENT_ID, S.KIND, S.TS_NS, S.DUR_NS]
    ):
        ids = ints(batch.column(S.EVENT_ID), -1)
        if len(ids) and (ids.min() < 0 or ids.max() >= rows):
            return None
        kind = coded(batch.column(S.KIND), KIND_CODE)
        kind_of[ids] = kind
        ts = ints(batch.column(S.TS_NS), 0)
        mine = timed[kind]
        if mine.any():
            start = min(start, int(ts[mine].min()))
            end = max(end, int((ts[mine] + ints(batch.column(S.DUR_NS), 0)[mine]).max()))
    if end < start:
        return None
    thread_time = ThreadTime()
    columns = [S.KIND, S.PID, S.TID, S.DUR_NS, S.PHASE, S.PARENT]
    for batch in file.iter_batches(batch_size=_READ_ROWS, columns=columns):
        kind = coded(batch.column(S.KIND), KIND_CODE)
        parent = ints(batch.column(S.PARENT), -1)
        parent_kind = kind_of[np.where((parent >= 0) & (parent < rows), parent, rows)]
        # (``outermost_operators``, with each parent's kind looked up by id)
        top = OPERATOR[kind] & ~OPERATOR[parent_kind]
        rows_here = np.flatnonzero(HOST_TREE[kind])
        phase = coded(batch.column(S.PHASE), PHASE_CODE)
        thread_time.add(
            ints(batch.column(S.PID), 0)[rows_here],
            ints(batch.column(S.TID), 0)[rows_here],
            top[rows_here],
            (phase == PHASE_CODE[S.BACKWARD])[rows_here],
            np.maximum(ints(batch.column(S.DUR_NS), 0), 0)[rows_here],
        )
    training = thread_time.training()
    if training is None:
        return None
    starts = np.sort(np.concatenate(sampled)) if sampled else np.zeros(0, np.int64)
    step = max(1, target_rows // SAMPLE_EVERY)
    bounds = np.unique(starts[step::step])
    launchers = Firsts(runtime_ids, runtime_ts, bounds)
    return training, (start, end), bounds, launchers
