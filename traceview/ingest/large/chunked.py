"""Bounded-memory ingest of one large trace: normalize a rank in chunks of whole steps (a long
step in pieces).

A trace this large (``CHUNKED_MIN_BYTES``) is never whole in memory. Three passes:

1. **Spill.** The parser's record batches (``KinetoParser.stream``) are written as they are
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
   a long step, is cut inside too, at phase markers (``_inside_steps``). A kernel launched in
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
file as it is done (``_EventsWriter``): the file holds the rows the whole-rank path writes,
by chunk (time) rather than by id. A trace with no step markers is one window (the span of
its timed events) cut in pieces; its training thread, which takes the call trees, is guessed in
pass 1 and checked in pass 3 (``_normalize_routed``). One with events whose times are corrupt
(the ``stray_times`` pass needs the whole rank's median) takes the whole-rank path.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import os
import pickle
import queue
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from traceview.model import schema as S
from traceview.model.columns import (
    DEVICE,
    HOST_TREE,
    KIND_CODE,
    OPERATOR,
    STRUCTURAL,
    disjoint,
    distinct,
    ints,
    training_thread_of,
    unique_pairs,
    window_index,
)
from traceview.model.errors import Notes
from traceview.normalize.classify import KIND_CODES, STRAY_NS, classify, kinds_from_categories
from traceview.normalize.phases import ANCHOR_PHASES
from traceview.normalize.pipeline import ChunkContext, RankMeta, normalize_chunk
from traceview.normalize.rules import RuleSet
from traceview.normalize.steps import NO_STEP_MARKERS
from traceview.parsers import ParsedTrace
from traceview.parsers.chrome_stream import SplitMismatch
from traceview.store import rundir as R

#: Traces at least this large (bytes on disk; a gzip file counts 8 times its size) are read in
#: chunks; smaller ones whole. ``TRACEVIEW_CHUNKED_MIN_BYTES`` overrides it (tests: 0).
CHUNKED_MIN_BYTES = 256 << 20
#: Rows a chunk aims at: as many whole steps as hold about this many events (at least one).
#: ``TRACEVIEW_CHUNK_ROWS`` overrides it (tests: 1, a chunk per step).
CHUNK_ROWS = 200_000
#: A stretch between two cuts (a long step, or what precedes or follows the steps) holding
#: more than twice this many events is cut inside too, into pieces of about this many, at
#: phase markers (``_inside_steps``). ``TRACEVIEW_PIECE_ROWS`` overrides it.
PIECE_ROWS = CHUNK_ROWS
#: Pass 1 keeps the start of every this-many-th event: where a long step's events lie.
_SAMPLE_EVERY = 32
#: The parsers whose traces can be streamed.
STREAMING_PARSERS = ("kineto",)


class _MemoRules(RuleSet):
    """The rules with their answers per name remembered: every chunk (and the survey of
    every decoded batch) asks again about the same few thousand names."""

    def classify(self, kind: str, cat: str | None, name: str) -> Any:
        key = (kind, cat, name)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = super().classify(kind, cat, name)
        return found

    def default_op(self, name: str) -> str:
        found = self._ops.get(name)
        if found is None:
            found = self._ops[name] = super().default_op(name)
        return found

    @classmethod
    def of(cls, rules: RuleSet) -> _MemoRules:
        memo = cls(**{f.name: getattr(rules, f.name) for f in dataclasses.fields(rules) if f.init})
        memo._memo = {}
        memo._ops = {}
        return memo

    _memo: dict[tuple[str, str | None, str], Any]
    _ops: dict[str, str]


#: Memory freed by chunks and kept by glibc (the process's RSS above what it was after the last
#: hand-back) that is handed back to the system. Handing it back after every chunk kept the peak
#: 70-100 MB lower, but the next chunk faulted the same pages in again: 0.7 s of a 1 GB trace's
#: 7.3 s, 5 s of a 4 GB trace's 29 s.
TRIM_SLACK = 128 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_trimmed_at = 0  # RSS after the last hand-back


def _rss() -> int:
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):  # (no /proc: hand back every time)
        return 1 << 62


def release_memory(*, now: bool = False) -> None:
    """Hand the memory freed by chunks back to the system once it is ``TRIM_SLACK`` (glibc
    keeps it otherwise, and the next chunk's allocations land beside it: the peak would grow by
    a chunk's worth each chunk); ``now``: at once (after a pass whose arrays are gone)."""
    global _trimmed_at
    if _LIBC is not None and (now or _rss() - _trimmed_at > TRIM_SLACK):
        _LIBC.malloc_trim(0)
        _trimmed_at = _rss()


def _libc() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:  # not glibc (macOS, musl): nothing to hand back this way
        return None


_LIBC = _libc()


def chunked_min_bytes() -> int:
    return int(os.environ.get("TRACEVIEW_CHUNKED_MIN_BYTES", CHUNKED_MIN_BYTES))


def chunk_rows() -> int:
    return max(1, int(os.environ.get("TRACEVIEW_CHUNK_ROWS", CHUNK_ROWS)))


def piece_rows() -> int:
    return max(1, int(os.environ.get("TRACEVIEW_PIECE_ROWS", PIECE_ROWS)))


def wants_chunks(parser: str, path: Path, size: int) -> bool:
    """Whether a trace is read in chunks: a streaming format, and large."""
    if parser not in STREAMING_PARSERS:
        return False
    weight = 8 if path.name.endswith(".gz") else 1
    return size * weight >= chunked_min_bytes()


class ChunkSink(Protocol):
    """Takes each chunk as it is normalized (the per-rank analysis, ``analysis.parts``): its
    rows (``own``: the chunk's, the others context carried in), those it writes (``counted``),
    and the time span [lo, hi) whose step markers it holds; ``finish``: its result."""

    def add(
        self, events: pa.Table, own: np.ndarray, counted: np.ndarray, lo: int, hi: int
    ) -> None: ...

    def finish(self) -> dict[str, pa.Table] | None: ...


#: Makes the sink of a rank from what the first pass found: the parser's result (without
#: events), the training thread, whether the rank has device activities, whether a thread
#: other than the training thread runs backward operators, and (a rank without step markers)
#: its one window.
SinkFactory = Callable[
    [ParsedTrace, tuple[int, int], bool, bool, tuple[int, int] | None], ChunkSink | None
]


class _InBackground:
    """A sink fed on a thread of its own: the analysis of chunk k (numpy and Arrow, which let
    go of the GIL) runs while chunk k+1 is normalized, and its end (``close``) while the events
    file is finished. One chunk at most waits for it (the memory of a chunk's rows)."""

    def __init__(self, sink: ChunkSink):
        self.sink = sink
        self.waiting: queue.Queue[tuple[Any, ...] | None] = queue.Queue(maxsize=1)
        self.error: BaseException | None = None
        self.result: dict[str, pa.Table] | None = None
        self.closed = False
        self.thread = threading.Thread(target=self._work, name="traceview-analysis", daemon=True)
        self.thread.start()

    def _work(self) -> None:
        try:
            while (item := self.waiting.get()) is not None:
                if self.error is None:
                    self.sink.add(*item)
            if self.error is None:
                self.result = self.sink.finish()
        except BaseException as exc:  # handed to the caller by finish
            self.error = exc
            while self.waiting.get() is not None:  # let the producer go on to the end
                pass

    def add(self, events: pa.Table, own: np.ndarray, counted: np.ndarray, lo: int, hi: int) -> None:
        if self.error is None:
            self.waiting.put((events, own, counted, lo, hi))

    def abandon(self) -> None:
        """The chunks stop coming (an error): the thread ends without finishing the sink."""
        self.error = self.error or RuntimeError("abandoned")
        self.close()

    def close(self) -> None:
        """No more chunks: the sink finishes on its thread."""
        if self.thread.is_alive() and not self.closed:
            self.closed = True
            self.waiting.put(None)

    def finish(self) -> dict[str, pa.Table] | None:
        self.close()
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.result


def free_core() -> bool:
    """Whether a helper process may run beside the ingest (``_first_pass``, ``InProcess``): a
    second core, and ``TRACEVIEW_HELPER_PROCESSES`` not 0."""
    if os.environ.get("TRACEVIEW_HELPER_PROCESSES", "1") == "0":
        return False
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (cores or 1) >= 2


class HelperProcess:
    """A helper process (``traceview.ingest.large.worker``) with the two pipes of its analysis service:
    ``outbox`` to it, ``inbox`` from it. It ends with the ingest (Linux), or when ``close``
    closes its pipes."""

    def __init__(self, command: list[str], stderr: Path):
        from multiprocessing.connection import Connection

        to_helper, from_us = os.pipe()
        to_us, from_helper = os.pipe()
        try:
            with stderr.open("wb") as err:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "traceview.ingest.large.worker", *command,
                     str(to_helper), str(from_helper), str(os.getpid())],
                    pass_fds=(to_helper, from_helper),
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                )  # fmt: skip
        except OSError:
            for fd in (to_helper, from_us, to_us, from_helper):
                os.close(fd)
            raise
        os.close(to_helper)
        os.close(from_helper)
        self.outbox = Connection(from_us, readable=False)
        self.inbox = Connection(to_us, writable=False)

    def close(self, kill: bool = False) -> None:
        """Close the pipes (a helper waiting for work then ends) and wait for it to end."""
        for end in (self.outbox, self.inbox):
            end.close()
        if kill and self.proc.poll() is None:
            self.proc.kill()
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class InProcess:
    """A sink run by a helper process (``traceview.ingest.large.worker analyse``) on the core the ingest
    leaves free: the analysis of chunk k runs while chunk k+1 is normalized, in parallel (a
    thread shares the interpreter). A chunk's rows go over in an Arrow file in the work
    folder; at most ``AHEAD`` chunks wait for it (files on disk: 4 rather than 2 left the
    ingest waiting 0.4 s less on a 1 GB trace). Where the helper dies, ``finish`` returns None
    (the rank is then analysed from its events file); its errors are raised there. ``helper``:
    one already running and waiting for the sink (the one that read the later part of the
    trace, its imports done); otherwise one is started."""

    AHEAD = 4

    def __init__(self, sink: ChunkSink, work: Path, helper: HelperProcess | None = None):
        # its own folder: the work folder is gone when the ingest reads the result
        self.work = work.with_name(work.name + ".analysis")
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir()
        if helper is None:
            try:
                helper = HelperProcess(["analyse"], self.work / "analysis.stderr")
            except OSError:  # no process can start (the caller runs the sink on a thread)
                shutil.rmtree(self.work, ignore_errors=True)
                raise
        self.helper = helper
        self.sent = self.answered = 0
        self.lost = False  # the helper died
        self.closed = False
        self.error: BaseException | None = None
        self._send(sink)

    def _send(self, message: Any) -> None:
        if not self.lost:
            try:
                self.helper.outbox.send(message)
            except OSError:  # the helper died (a broken pipe)
                self.lost = True

    def _answer(self) -> tuple[Any, ...] | None:
        try:
            answer = self.helper.inbox.recv()
        except (EOFError, OSError):
            self.lost = True
            return None
        if answer[0] == "error" and self.error is None:
            self.error = answer[1]
        return answer

    def _answered_up_to(self, ahead: int) -> None:
        """Wait for the chunks' answers until at most ``ahead`` chunks are unanswered."""
        while not self.lost and self.sent - self.answered > ahead:
            self._answer()
            self.answered += 1

    def add(self, events: pa.Table, own: np.ndarray, counted: np.ndarray, lo: int, hi: int) -> None:
        self._answered_up_to(self.AHEAD - 1)
        if self.lost or self.error is not None:
            return
        path = self.work / f"analysis-{self.sent}.arrows"
        # the rows' roles go in the file too: a message larger than the pipe's buffer would
        # wait for the helper to be done with the chunk before
        events = events.append_column("_own", pa.array(own)).append_column(
            "_counted", pa.array(counted)
        )
        with pa.OSFile(str(path), "wb") as out, pa.ipc.new_file(out, events.schema) as writer:
            writer.write_table(events)
        self._send(("chunk", str(path), lo, hi))
        self.sent += 1

    def close(self) -> None:
        """No more chunks: the helper finishes the sink (while the events file is finished)."""
        if not self.closed:
            self.closed = True
            self._send(("finish", str(self.work)))

    def abandon(self) -> None:
        self.closed = True
        self._end(kill=True)

    def finish(self) -> dict[str, pa.Table] | None:
        self.close()
        self._answered_up_to(0)
        answer = None if self.lost else self._answer()
        try:
            if self.error is not None:
                raise self.error
            if answer is None or answer[1] is None:
                return None
            tables = {}
            for name, file in answer[1].items():
                with pa.OSFile(file, "rb") as source:
                    tables[name] = pa.ipc.open_file(source).read_all()
            return tables
        finally:
            self._end()

    def _end(self, kill: bool = False) -> None:
        self.helper.close(kill)
        shutil.rmtree(self.work, ignore_errors=True)


def _in_helper(
    sink: ChunkSink, work: Path, helper: HelperProcess | None = None
) -> InProcess | _HereAndThere:
    """``sink`` run by a helper process; where it splits (``ChunkedAnalysis.split``), its
    per-event part runs here, beside the normalization, and only the rest in the helper: the
    two cores then finish at about the same time."""
    split = getattr(sink, "split", None)
    if split is None:
        return InProcess(sink, work, helper)
    here, there = split()
    return _HereAndThere(here, InProcess(there, work, helper))


class _HereAndThere:
    """A sink in two parts: one fed in this process as each chunk comes, the other in a helper
    (``InProcess``); the result is both parts' tables (None where the helper's is)."""

    def __init__(self, here: ChunkSink, there: InProcess):
        self.here, self.there = here, there

    def add(self, events: pa.Table, own: np.ndarray, counted: np.ndarray, lo: int, hi: int) -> None:
        self.there.add(events, own, counted, lo, hi)  # (first: the helper starts on it)
        self.here.add(events, own, counted, lo, hi)

    def close(self) -> None:
        self.there.close()

    def abandon(self) -> None:
        self.there.abandon()

    def finish(self) -> dict[str, pa.Table] | None:
        self.there.close()  # (the helper finishes its part while this one is combined)
        release_memory(now=True)  # (before the combining, the end's peak)
        try:
            here = self.here.finish()
        except BaseException:
            self.there.abandon()
            raise
        tables = self.there.finish()
        return None if tables is None or here is None else {**tables, **here}


#: A chunk's time span where it has no bound (before the first cut, after the last).
OPEN_END = 1 << 62


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


class _Firsts:
    """Per key, the chunk of the first row (in row order) with that key: a sorted lookup table
    built from the survey's per-batch arrays (which it empties as it goes: the rank's
    correlations are the largest state the survey keeps)."""

    def __init__(self, keys: list[np.ndarray], ts: list[np.ndarray], bounds: np.ndarray):
        k = np.concatenate(keys) if keys else np.zeros(0, np.int64)
        keys.clear()
        t = np.concatenate(ts) if ts else np.zeros(0, np.int64)
        ts.clear()
        v = np.searchsorted(bounds, t, side="right").astype(np.int32)
        del t
        order = np.argsort(k, kind="stable")
        k, v = k[order], v[order]
        del order
        first = np.concatenate(([True], k[1:] != k[:-1])) if len(k) else np.zeros(0, bool)
        self.keys, self.values = k[first], v[first]

    def get(self, query: np.ndarray) -> np.ndarray:
        """The chunk of each query's key; -1 where none (and for negative keys)."""
        if len(self.keys) == 0 or len(query) == 0:
            return np.full(len(query), -1, np.int64)
        pos = np.minimum(np.searchsorted(self.keys, query), len(self.keys) - 1)
        return np.where((query >= 0) & (self.keys[pos] == query), self.values[pos], -1)

    NONE: _Firsts  # an empty table

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.values.nbytes)


_Firsts.NONE = _Firsts([], [], np.zeros(0, np.int64))


class _ThreadTime:
    """Per host thread, the time of its host-tree events by (outermost operator, own phase
    backward): what ``arrays.training_thread_of`` weighs to find the training thread of a rank
    without step markers, summed a batch or a chunk at a time."""

    def __init__(self) -> None:
        self.parts: list[tuple[np.ndarray, np.ndarray]] = []  # (keys [4, groups], time)

    def add(
        self, pid: np.ndarray, tid: np.ndarray, top: np.ndarray, back: np.ndarray, dur: np.ndarray
    ) -> None:
        if len(pid):
            keys = np.stack([pid, tid, top.astype(np.int64), back.astype(np.int64)])
            self.parts.append(_summed_by(keys, dur))
        if len(self.parts) > 64:  # (a few rows per thread, however many batches)
            self.parts = [self._total()]

    def then(self, later: _ThreadTime) -> None:
        self.parts.extend(later.parts)

    def _total(self) -> tuple[np.ndarray, np.ndarray]:
        keys = np.concatenate([k for k, _ in self.parts], axis=1)
        return _summed_by(keys, np.concatenate([t for _, t in self.parts]))

    def training(self) -> tuple[int, int] | None:
        if not self.parts:
            return None
        (pid, tid, top, back), time = self._total()
        kind = np.full(len(pid), KIND_CODE[S.KIND_OP])
        return training_thread_of(pid, tid, kind, top.astype(bool), time, back.astype(bool))


def _summed_by(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct columns of ``keys``, and the sum of ``values`` over each."""
    order = np.lexsort(keys[::-1])
    keys, values = keys[:, order], values[order]
    heads = np.flatnonzero(np.concatenate(([True], (keys[:, 1:] != keys[:, :-1]).any(axis=0))))
    return keys[:, heads], np.add.reduceat(values, heads) if len(heads) else values[:0]


@dataclass
class _Survey:
    """Pass 1's small state: what the whole rank holds that its chunks need."""

    rows: int = 0
    ts_min: int = 1 << 62
    ts_max: int = -(1 << 62)
    dur_max: int = 0
    marker_pid: list[np.ndarray] = field(default_factory=list)
    marker_tid: list[np.ndarray] = field(default_factory=list)
    marker_ts: list[np.ndarray] = field(default_factory=list)
    marker_dur: list[np.ndarray] = field(default_factory=list)
    marker_number: list[np.ndarray] = field(default_factory=list)
    runtime_corr: list[np.ndarray] = field(default_factory=list)
    runtime_ts: list[np.ndarray] = field(default_factory=list)
    op_ext: list[np.ndarray] = field(default_factory=list)
    op_ts: list[np.ndarray] = field(default_factory=list)
    anchor_ts: list[np.ndarray] = field(default_factory=list)
    anchor_phase: list[np.ndarray] = field(default_factory=list)
    sampled_ts: list[np.ndarray] = field(default_factory=list)  # every _SAMPLE_EVERY-th row's
    devices: int = 0
    # per thread (pid, tid): host operators whose own phase is backward
    backward_threads: set[tuple[int, int]] = field(default_factory=set)
    # until a step marker is seen (a whole-run profile has none): per thread, the time in its
    # operators (the training thread is then the busiest: a first guess, ``_plan``) and where
    # the timed events start and end (the one window of such a rank)
    thread_time: _ThreadTime = field(default_factory=_ThreadTime)
    timed_start: int = 1 << 62
    timed_end: int = -(1 << 62)

    def then(self, later: _Survey) -> None:
        """Add the survey of the rows that follow (a later part of the trace)."""
        self.rows += later.rows
        self.ts_min, self.ts_max = min(self.ts_min, later.ts_min), max(self.ts_max, later.ts_max)
        self.dur_max = max(self.dur_max, later.dur_max)
        for f in dataclasses.fields(self):
            mine = getattr(self, f.name)
            if isinstance(mine, list):
                mine.extend(getattr(later, f.name))
        self.devices += later.devices
        self.backward_threads |= later.backward_threads
        self.thread_time.then(later.thread_time)
        self.timed_start = min(self.timed_start, later.timed_start)
        self.timed_end = max(self.timed_end, later.timed_end)

    def add(self, batch: pa.RecordBatch, rules: RuleSet) -> np.ndarray:
        """Survey one raw batch; its kind codes."""
        table = kinds_from_categories(pa.Table.from_batches([batch]), rules)
        classes = classify(table, rules)
        kind, own = classes.kind, classes.phase
        ts = ints(batch.column(S.TS_NS), 0)
        raw_dur = ints(batch.column(S.DUR_NS), 0)
        dur = np.maximum(raw_dur, 0)
        n = len(ts)
        self.sampled_ts.append(ts[(-self.rows) % _SAMPLE_EVERY :: _SAMPLE_EVERY].copy())
        self.rows += n
        if n:
            self.ts_min = min(self.ts_min, int(ts.min()))
            self.ts_max = max(self.ts_max, int(ts.max()))
            self.dur_max = max(self.dur_max, int(raw_dur.max()))
        host = HOST_TREE[kind]
        step = np.flatnonzero(kind == KIND_CODES[S.KIND_STEP])
        if len(step):
            self.marker_pid.append(ints(batch.column(S.PID), 0)[step])
            self.marker_tid.append(ints(batch.column(S.TID), 0)[step])
            self.marker_ts.append(ts[step])
            self.marker_dur.append(dur[step])
            self.marker_number.append(classes.step_number(step))
        corr = ints(batch.column(S.CORRELATION), -1)
        runtime = (kind == KIND_CODES[S.KIND_RUNTIME]) & (corr >= 0)
        self.runtime_corr.append(corr[runtime])
        self.runtime_ts.append(ts[runtime])
        ext = ints(batch.column(S.EXTERNAL_ID), -1)
        ops = host & (kind != KIND_CODES[S.KIND_RUNTIME]) & (ext >= 0)
        self.op_ext.append(ext[ops])
        self.op_ts.append(ts[ops])
        self.devices += int(DEVICE[kind].sum())
        backward = np.flatnonzero(host & ~STRUCTURAL[kind] & (own == _PHASE_BACKWARD))
        if len(backward):
            pid, tid = ints(batch.column(S.PID), 0), ints(batch.column(S.TID), 0)
            pairs = unique_pairs(pid[backward], tid[backward])
            self.backward_threads.update(zip(pairs[0].tolist(), pairs[1].tolist(), strict=True))
        anchor = host & (own >= 0)
        anchor[anchor] = ANCHOR_PHASES[own[anchor]]
        self.anchor_ts.append(ts[anchor])
        self.anchor_phase.append(own[anchor].astype(np.int8))
        if not self.marker_ts:
            self._unmarked(batch, kind, own, ts, dur)
        return kind.astype(np.int8)

    def _unmarked(
        self, batch: pa.RecordBatch, kind: np.ndarray, own: np.ndarray, ts: np.ndarray,
        dur: np.ndarray,
    ) -> None:  # fmt: skip
        """What a rank without step markers needs, from a batch (``thread_time``, its span)."""
        timed = np.flatnonzero(HOST_TREE[kind] | DEVICE[kind])
        if len(timed):
            self.timed_start = min(self.timed_start, int(ts[timed].min()))
            self.timed_end = max(self.timed_end, int((ts[timed] + dur[timed]).max()))
        host = np.flatnonzero(HOST_TREE[kind])
        self.thread_time.add(
            ints(batch.column(S.PID), 0)[host],
            ints(batch.column(S.TID), 0)[host],
            OPERATOR[kind[host]],  # (outermost or not: a guess, checked later)
            own[host] == _PHASE_BACKWARD,
            dur[host],
        )


def _spill(batches: Iterator[pa.RecordBatch], survey: _Survey, rules: RuleSet, spill: Path) -> None:
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
class _FirstPass:
    parsed: ParsedTrace  # the parser's result, without events
    base_ns: int  # the time base to add
    survey: _Survey | None  # (None once taken: its arrays are freed as the plan is made)
    spills: list[tuple[Path, int]]  # the spilled rows: files, each with its first row's number
    helper: HelperProcess | None = None  # the helper that read the later part, now waiting


def _first_pass(
    parser: Any, path: Path, rules: RuleSet, work: Path, helper: bool, preload: tuple[str, ...] = ()
) -> _FirstPass:
    """Pass 1 (module doc). With ``helper``, a plain trace large enough is read in two parts
    at once: the later part by a process of its own (``read_later_part``) on another core."""
    boundary = _split_boundary(parser, path) if helper else None
    if boundary is not None:
        try:
            return _in_two_parts(parser, path, rules, work, boundary, preload)
        except SplitMismatch:  # no event starts there after all: read it in one piece
            pass
    stream = parser.stream(path)
    survey = _Survey()
    spill = work / "raw.arrows"
    _spill(iter(stream), survey, rules, spill)
    return _FirstPass(stream.result, stream.base_ns, survey, [(spill, 0)])


#: Traces at least this large (plain, not gzip) are read in two parts at once where a helper
#: process may run. ``TRACEVIEW_SPLIT_MIN_BYTES`` overrides it (tests: 0).
SPLIT_MIN_BYTES = 64 << 20
#: Where the later part starts, as a share of the file: the helper starts later (a Python
#: process and its imports), so the first part is the larger. ``TRACEVIEW_SPLIT_AT``.
SPLIT_AT = 0.45


def _split_boundary(parser: Any, path: Path) -> int | None:
    """Where the later part of a trace read in two parts starts (None: read in one piece:
    a single core, a gzip trace, a small one, a format that cannot be split)."""
    if not hasattr(parser, "split_point"):
        return None
    size = path.stat().st_size
    if size < int(os.environ.get("TRACEVIEW_SPLIT_MIN_BYTES", SPLIT_MIN_BYTES)):
        return None
    near = int(size * float(os.environ.get("TRACEVIEW_SPLIT_AT", SPLIT_AT)))
    return parser.split_point(path, near)


def _in_two_parts(
    parser: Any,
    path: Path,
    rules: RuleSet,
    work: Path,
    boundary: int,
    preload: tuple[str, ...] = (),
) -> _FirstPass:
    """Pass 1 in two parts at once: [0, boundary) here, the rest in a helper process; its
    rows follow ours. Where the helper fails (killed, out of memory), its part is read here.
    The helper then waits to run the rank's analysis (``InProcess``), its imports done."""
    later = work / "later"
    later.mkdir()
    with (work / "rules.pickle").open("wb") as fh:
        pickle.dump(rules, fh)
    command = ["read-part", parser.name, str(path), str(boundary), str(work / "rules.pickle")]
    try:
        helper = HelperProcess([*command, str(later), ",".join(preload)], later / "stderr")
    except OSError as exc:  # no process can start: read the trace in one piece
        raise SplitMismatch(f"{path}: no helper process ({exc})") from None
    try:
        stream = parser.stream(path, (0, boundary))
        survey = _Survey()
        spill = work / "raw.arrows"
        _spill(iter(stream), survey, rules, spill)
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
    return _FirstPass(stream.result, stream.base_ns, survey, spills, helper if done else None)


#: What ``read_later_part`` leaves beside its spilled rows: its survey and the parser's part.
PART_FILE = "part.pickle"


def read_later_part(
    parser: Any, path: Path, boundary: int, rules: RuleSet, out: Path
) -> tuple[_Survey, Any]:
    """Pass 1 over the part of ``path`` from ``boundary`` to its end (``traceview.ingest.large.worker``
    runs it in a process of its own): its rows spilled to ``out``/raw.arrows (numbered from
    0), and its survey and the parser's part (also in ``out``/``PART_FILE``)."""
    stream = parser.stream(path, (boundary, None))
    survey = _Survey()
    _spill(iter(stream), survey, rules, out / "raw.arrows")
    done = (survey, stream.part_read())
    tmp = out / (PART_FILE + ".tmp")
    with tmp.open("wb") as fh:
        pickle.dump(done, fh, protocol=pickle.HIGHEST_PROTOCOL)
    tmp.replace(out / PART_FILE)
    return done


@dataclass
class _Plan:
    training: tuple[int, int]
    starts: np.ndarray  # per kept step window (base-0 clock)
    ends: np.ndarray
    numbers: np.ndarray
    bounds: np.ndarray  # chunk c holds [bounds[c-1], bounds[c]); first and last open-ended
    backward_steps: np.ndarray
    anchor_ts: np.ndarray
    anchor_phase: np.ndarray
    runtime: _Firsts
    ops: _Firsts
    gpu: bool
    backward_elsewhere: bool
    backward_threads: set[tuple[int, int]]
    # a rank without step markers: its one window, the span of its timed events (base-0);
    # ``training`` is then a guess (the thread with the most time in operators), checked once
    # every chunk's call trees are known (``_normalize_routed``)
    whole: tuple[int, int] | None = None


def _steps_and_chunks(
    pid: np.ndarray, tid: np.ndarray, ts: np.ndarray, end: np.ndarray, rows: int, target: int
) -> tuple[tuple[int, int], np.ndarray, np.ndarray]:
    """From a rank's step markers: the training thread (the one with the most), its kept
    markers by time (``normalize.find_steps``'s: none starting inside an earlier one), and the
    chunk bounds (cut at step ends, as many whole steps a chunk as hold about ``target`` of
    the rank's ``rows`` events; the events after the last step go with the last steps)."""
    threads, counts = np.unique(np.stack([pid, tid]), axis=1, return_counts=True)
    best = int(np.argmax(counts))
    training = int(threads[0, best]), int(threads[1, best])
    mine = np.flatnonzero((pid == training[0]) & (tid == training[1]))
    mine = mine[np.argsort(ts[mine], kind="stable")]
    mine = mine[disjoint(ts[mine], end[mine])]
    ends = end[mine]
    per_step = max(1, rows // max(len(mine), 1))
    steps_per_chunk = max(1, target // per_step)
    cuts = ends[steps_per_chunk - 1 :: steps_per_chunk]
    if len(cuts) and cuts[-1] == ends[-1]:
        cuts = cuts[:-1]
    return training, mine, np.unique(cuts)


def _plan(survey: _Survey, target_rows: int) -> _Plan | None:
    """The steps as ``normalize.find_steps`` finds them (with markers: the training thread is
    the one with the most), and the chunks. Without markers, the one window of the whole rank,
    cut in pieces, and a guess of the training thread; None where the rank has no host events
    (the whole-rank path)."""
    whole = None
    if survey.marker_ts:
        pid, tid = np.concatenate(survey.marker_pid), np.concatenate(survey.marker_tid)
        ts, dur = np.concatenate(survey.marker_ts), np.concatenate(survey.marker_dur)
        number = np.concatenate(survey.marker_number)
        training, mine, bounds = _steps_and_chunks(pid, tid, ts, ts + dur, survey.rows, target_rows)
        starts, ends = ts[mine], ts[mine] + dur[mine]
        numbers = number[mine]
        numbers = np.where(numbers >= 0, numbers, np.arange(len(mine)))
    else:
        guess = survey.thread_time.training()
        if guess is None or survey.timed_end < survey.timed_start:
            return None
        training, whole = guess, (survey.timed_start, survey.timed_end)
        starts = ends = numbers = bounds = np.zeros(0, np.int64)
    anchor_ts = np.concatenate(survey.anchor_ts)
    anchor_phase = np.concatenate(survey.anchor_phase).astype(np.int64)
    sampled = np.sort(np.concatenate(survey.sampled_ts)) if survey.sampled_ts else np.zeros(0)
    bounds = _inside_steps(bounds, sampled, survey.rows, anchor_ts, piece_rows())
    del sampled
    backward = anchor_ts[anchor_phase == _PHASE_BACKWARD]
    window = window_index(starts, ends, backward)
    outside = np.full(int((window < 0).any()), -1, np.int64)  # (-1: not in a step)
    backward_steps = np.unique(np.concatenate([numbers[window[window >= 0]], outside]))
    # only the markers at a chunk's cut can be a chunk's next marker from beyond it
    at_cut = np.isin(anchor_ts, bounds)
    return _Plan(
        training,
        starts,
        ends,
        numbers,
        bounds,
        backward_steps,
        anchor_ts[at_cut],
        anchor_phase[at_cut],
        _Firsts(survey.runtime_corr, survey.runtime_ts, bounds),
        _Firsts(survey.op_ext, survey.op_ts, bounds),
        survey.devices > 0,
        bool(survey.backward_threads - {training}),
        survey.backward_threads,
        whole,
    )


_PHASE_BACKWARD = S.EVENT_PHASES.index(S.BACKWARD)


def _inside_steps(
    bounds: np.ndarray, sampled: np.ndarray, rows: int, anchor_ts: np.ndarray, piece: int
) -> np.ndarray:
    """``bounds`` with more cuts inside every stretch between two of them that holds more than
    twice ``piece`` rows (by ``sampled``, the sorted starts of a regular sample of the rank's
    ``rows``), about every ``piece`` rows, each at a phase marker's start (``anchor_ts``).

    A cut there keeps each chunk's positional phases exact: an operator's next phase marker is
    then in its own chunk or is the one at the cut (``ChunkContext.more_anchors``), and a
    gradient seed's run of candidates up to its marker never crosses a cut. A stretch with no
    marker inside stays whole."""
    if len(sampled) == 0 or len(anchor_ts) == 0:
        return bounds
    per_sample = rows / len(sampled)
    edges = np.searchsorted(sampled, bounds, side="left")
    starts = np.concatenate(([0], edges))
    stops = np.concatenate((edges, [len(sampled)]))
    long = np.flatnonzero((stops - starts) * per_sample > 2 * piece)
    if len(long) == 0:
        return bounds
    markers = distinct(anchor_ts)
    cuts = [bounds]
    for stretch in long.tolist():
        first, stop = int(starts[stretch]), int(stops[stretch])
        pieces = round((stop - first) * per_sample / piece)
        wanted = sampled[first + (np.arange(1, pieces) * (stop - first)) // pieces]
        at = markers[np.minimum(np.searchsorted(markers, wanted), len(markers) - 1)]
        low = bounds[stretch - 1] if stretch > 0 else -OPEN_END
        high = bounds[stretch] if stretch < len(bounds) else OPEN_END
        cuts.append(at[(at > low) & (at < high)])
    return distinct(np.concatenate(cuts))


def _whole(spills: list[tuple[Path, int]], base_ns: int) -> pa.Table:
    """The spilled batches as the one raw table ``parse`` gives (the trace is not read
    twice)."""
    batches = [b.drop_columns(["_row", "_kind"]) for p, _ in spills for b in _spill_batches(p)]
    table = pa.Table.from_batches(batches) if batches else S.RAW_SCHEMA.empty_table()
    del batches
    if base_ns:
        ts = pc.add(table.column(S.TS_NS), pa.scalar(base_ns, pa.int64()))
        table = table.set_column(table.schema.get_field_index(S.TS_NS), S.TS_NS, ts)
    return S.conform(table, S.RAW_SCHEMA).unify_dictionaries()


def _spill_batches(path: Path) -> Iterator[pa.RecordBatch]:
    if not path.exists() or path.stat().st_size == 0:  # nothing was decoded
        return
    with pa.OSFile(str(path), "rb") as source:
        reader = pa.ipc.open_stream(source)
        yield from reader


def normalize_chunked(
    parser: object,
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
    ``helper``: a core is free for a helper process (``_first_pass``); ``preload``: the modules
    the sink needs, which a helper process imports while it waits for the sink."""
    rules = _MemoRules.of(rules)
    helper = helper and free_core()
    work = run / f".chunks-rank-{meta.rank}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        return _normalize_chunked(
            parser, path, rules, meta, run, offset_ns, work, sink, helper, preload
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _normalize_chunked(
    parser: object,
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
    first = _first_pass(parser, path, rules, work, helper, preload)
    try:
        return _normalize_read(first, rules, meta, run, offset_ns, work, make_sink, helper)
    finally:
        if first.helper is not None:  # not taken by the analysis: idle, it need not finish
            first.helper.close(kill=True)


def _normalize_read(
    first: _FirstPass,
    rules: RuleSet,
    meta: RankMeta,
    run: Path,
    offset_ns: int,
    work: Path,
    make_sink: SinkFactory | None,
    helper: bool,
) -> ChunkedRank | ParsedTrace:
    """Passes 2 and 3 on what pass 1 read (``_normalize_routed``), or the whole-rank path."""
    parsed, base_ns, survey, spills = first.parsed, first.base_ns, first.survey, first.spills
    assert survey is not None
    first.survey = None
    if meta.host is None:  # the trace may name its host after its events: known by now
        meta.host = parsed.host
    plan = None
    # the stray_times pass drops events by the whole rank's median: those take the whole path
    if survey.ts_max - survey.ts_min <= STRAY_NS and survey.dur_max <= STRAY_NS:
        plan = _plan(survey, chunk_rows())
    del survey
    if plan is None:  # the whole-rank path, on what was read
        parsed.events = _whole(spills, base_ns)
        return parsed
    shift = base_ns + offset_ns
    whole = None if plan.whole is None else (plan.whole[0] + shift, plan.whole[1] + shift)

    def start_sink(plan: _Plan) -> _Background | None:
        """The per-rank analysis of the chunks to come, on a helper process where one may
        run (the one that read the later part of the trace, the first time), else a thread."""
        if make_sink is None:
            return None
        sink = make_sink(parsed, plan.training, plan.gpu, plan.backward_elsewhere, whole)
        if sink is None:
            return None
        try:
            if first.helper is not None:  # the helper that read the later part, waiting
                background, first.helper = _in_helper(sink, work, first.helper), None
                return background
            return _in_helper(sink, work) if helper else _InBackground(sink)
        except OSError:  # no process can start: a thread, then
            return _InBackground(sink)

    return _normalize_routed(
        spills, plan, work, shift, rules, meta, run, start_sink, parsed, first.helper
    )


_Background = _InBackground | InProcess | _HereAndThere  # (a sink fed beside the ingest)


class _WrongGuess(Exception):
    """The training thread of a rank without step markers was not the one its call trees
    name (``_normalize_routed`` starts the chunks again with that one)."""

    def __init__(self, training: tuple[int, int]):
        self.training = training


def _normalize_routed(
    spills: list[tuple[Path, int]],
    plan: _Plan,
    work: Path,
    shift: int,
    rules: RuleSet,
    meta: RankMeta,
    run: Path,
    start_sink: Callable[[_Plan], _Background | None],
    parsed: ParsedTrace,
    helper: HelperProcess | None = None,
) -> ChunkedRank:
    """Passes 2 and 3 (module doc): route the spilled rows (``helper``: the one that read the
    later part routes it), normalize and write chunk by chunk.
    A rank without step markers has its training thread guessed from pass 1; where the call
    trees name another one, its chunks are normalized again (rare: kept for that)."""
    _route_both(spills, _Routing(plan.bounds, plan.runtime, plan.ops), work, helper)
    plan.runtime = plan.ops = _Firsts.NONE  # (the launch lookups: only routing needs them)
    release_memory(now=True)
    for spill, _ in spills:
        spill.unlink()

    while True:
        notes = Notes()
        if plan.whole is not None:
            notes.remark(NO_STEP_MARKERS)
        sink = start_sink(plan)
        try:
            with _EventsWriter(R.events_path(run, meta.rank)) as out:
                devices, unlinked, training = _normalize_chunks(
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
    )


def _normalize_chunks(
    plan: _Plan,
    work: Path,
    shift: int,
    rules: RuleSet,
    meta: RankMeta,
    sink: _Background | None,
    notes: Notes,
    out: _EventsWriter,
) -> tuple[int, int, tuple[int, int]]:
    """Pass 3: each routed chunk normalized, its closed rows written to ``out`` and handed to
    ``sink``; the device activities seen, how many of them have no launching call, and the
    training thread (without step markers: the one the call trees name, as
    ``normalize.find_steps`` finds it; the chunks' files are then kept, should it not be the
    guessed one)."""
    chunks = len(plan.bounds) + 1
    devices = unlinked = 0
    thread_time = _ThreadTime() if plan.whole is not None else None

    carry_raw: pa.Table | None = None
    carry_out: pa.Table | None = None
    carry_positional = np.zeros(0, np.int8)
    carry_children = np.zeros(0, np.int64)
    for c in range(chunks):
        own = _read_chunk(work, c, shift)
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
        result = normalize_chunk(raw, rules, meta, ctx, notes)
        devices += result.devices
        unlinked += result.unlinked
        events = result.events
        n = events.num_rows
        dur = ints(events.column(S.DUR_NS), 0)
        ts = ints(events.column(S.TS_NS), 0)
        parent = result.parent
        is_own = np.arange(n) >= carried
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
            closed.insert(0, _with_self(carry_out.take(done), dur[done] - children[done]))
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
            for path in _chunk_files(work, c):
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
    return devices, unlinked, training or plan.training


#: Rows per row group of the events file.
_ROW_GROUP_ROWS = 1 << 16


class _EventsWriter:
    """A rank's events file, written a chunk's closed rows at a time as the chunks are
    normalized: by chunk (by time), not by id (a row still open at a chunk's end is written
    with the chunk where it closes). Each write is encoded and compressed on a thread (no GIL)
    while the next chunk is normalized; the file is renamed into place on leaving the block."""

    def __init__(self, target: Path):
        self.target = target
        self.schema = S.EVENTS_SCHEMA.remove(S.EVENTS_SCHEMA.get_field_index(S.RANK))
        self.written = 0

    def __enter__(self) -> _EventsWriter:
        with ExitStack() as stack:  # (left in reverse: the last write, the footer, the rename)
            tmp = stack.enter_context(R.atomic_path(self.target))
            options = R.parquet_options(self.schema)
            self._file = stack.enter_context(pq.ParquetWriter(tmp, self.schema, **options))
            self._thread = stack.enter_context(
                ThreadPoolExecutor(1, thread_name_prefix="traceview-write")
            )
            self._pending: Future[None] | None = None
            self._stack = stack.pop_all()
        return self

    def write(self, tables: list[pa.Table]) -> None:
        tables = [t for t in tables if t.num_rows]
        if not tables:
            return
        table = pa.concat_tables(tables).unify_dictionaries().drop_columns([S.RANK])
        table = S.conform(table, self.schema)
        self.written += table.num_rows
        self._wait()  # at most one chunk's rows waiting to be written
        self._pending = self._thread.submit(
            self._file.write_table, table, row_group_size=_ROW_GROUP_ROWS
        )

    def _wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def __exit__(self, *exc: Any) -> bool:
        try:
            if exc[0] is None:
                self._wait()  # a failed write fails the block
        except BaseException:
            if not self._stack.__exit__(*sys.exc_info()):
                raise
            return False
        return bool(self._stack.__exit__(*exc))


def _with_self(rows: pa.Table, self_ns: np.ndarray) -> pa.Table:
    column = pa.array(np.maximum(self_ns, 0), pa.int64())
    return rows.set_column(rows.schema.get_field_index(S.SELF_NS), S.SELF_NS, column)


def _unique_notes(notes: Notes) -> Notes:
    out = Notes()
    for text in dict.fromkeys(notes.warnings):
        out.warn(text)
    for text in dict.fromkeys(notes.remarks):
        out.remark(text)
    return out


class _ChunkFiles:
    """An Arrow IPC stream per chunk (``work/PREFIX-C.arrows``), opened when rows first reach
    it; all closed on leaving."""

    def __init__(self, work: Path, prefix: str):
        self.work, self.prefix = work, prefix
        self.open: dict[int, tuple[pa.OSFile, pa.ipc.RecordBatchStreamWriter]] = {}

    def write(self, chunk: int, rows: pa.RecordBatch) -> None:
        if chunk not in self.open:
            sink = pa.OSFile(str(self.work / f"{self.prefix}-{chunk}.arrows"), "wb")
            self.open[chunk] = (sink, pa.ipc.new_stream(sink, rows.schema))
        self.open[chunk][1].write_batch(rows)

    def __enter__(self) -> _ChunkFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        for sink, writer in self.open.values():
            writer.close()
            sink.close()


@dataclass
class _Routing:
    """What routing a row takes: the chunk bounds, and each device activity's launcher's
    chunk by correlation (runtime calls) or external id (operators)."""

    bounds: np.ndarray
    runtime: _Firsts
    ops: _Firsts


#: The chunk files' prefixes: the rows this process routed, and the helper's (the later part).
_HERE, _LATER = "chunk", "chunk-later"


def _route(spills: list[tuple[Path, int]], routing: _Routing, work: Path, prefix: str) -> None:
    """Pass 2: each event to its chunk's file (``work``/PREFIX-C.arrows; a device activity to
    its launcher's chunk); ``spills``: the first pass's files, each with the number of its
    first row."""
    with _ChunkFiles(work, prefix) as files:
        for batch in (_renumbered(b, first) for p, first in spills for b in _spill_batches(p)):
            ts = ints(batch.column(S.TS_NS), 0)
            kind = np.asarray(batch.column("_kind").to_numpy(zero_copy_only=False), np.int64)
            chunk = np.searchsorted(routing.bounds, ts, side="right")
            device = np.flatnonzero(DEVICE[kind])
            if len(device):
                corr = ints(batch.column(S.CORRELATION), -1)[device]
                ext = ints(batch.column(S.EXTERNAL_ID), -1)[device]
                found = routing.runtime.get(corr)
                found = np.where(found >= 0, found, routing.ops.get(ext))
                chunk[device] = np.where(found >= 0, found, chunk[device])
            order = np.argsort(chunk, kind="stable")
            sorted_chunk = chunk[order]
            edges = np.flatnonzero(np.diff(sorted_chunk)) + 1
            for piece in np.split(np.arange(len(order)), edges):
                if len(piece):
                    files.write(int(sorted_chunk[piece[0]]), batch.take(pa.array(order[piece])))


def route_later_part(job: Path) -> None:
    """Pass 2 over the later part's spill (``traceview.ingest.large.worker`` runs it beside the ingest's
    own): ``job`` holds the spill, the number of its first row and the ``_Routing``."""
    with job.open("rb") as fh:
        spill, first, routing = pickle.load(fh)
    _route([(spill, first)], routing, job.parent, _LATER)


def _route_both(
    spills: list[tuple[Path, int]], routing: _Routing, work: Path, helper: HelperProcess | None
) -> None:
    """Pass 2: with a helper waiting (the one that read the later part) and two spills, each
    process routes one; else (or where the helper fails) this process routes them all."""
    if helper is None or len(spills) != 2:
        _route(spills, routing, work, _HERE)
        return
    job = work / "route.pickle"
    with job.open("wb") as fh:
        pickle.dump((*spills[1], routing), fh, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        helper.outbox.send(("route", str(job)))
        sent = True
    except OSError:
        sent = False
    _route(spills[:1], routing, work, _HERE)
    try:
        done = sent and helper.inbox.recv() == ("routed",)
    except (EOFError, OSError):
        done = False
    if not done:  # its files may be cut short: routed again here
        for partial in work.glob(f"{_LATER}-*.arrows"):
            partial.unlink()
        _route(spills[1:], routing, work, _LATER)


def _renumbered(batch: pa.RecordBatch, first: int) -> pa.RecordBatch:
    if not first:
        return batch
    rows = pc.add(batch.column("_row"), pa.scalar(first, pa.int64()))
    return batch.set_column(batch.schema.get_field_index("_row"), "_row", rows)


def _chunk_files(work: Path, chunk: int) -> list[Path]:
    """A chunk's routed rows: this process's, then the helper's (later rows: ids in order)."""
    return [work / f"{prefix}-{chunk}.arrows" for prefix in (_HERE, _LATER)]


def _read_chunk(work: Path, chunk: int, shift: int) -> pa.Table | None:
    batches = [b for path in _chunk_files(work, chunk) for b in _spill_batches(path)]
    if not batches:
        return None
    table = pa.Table.from_batches(batches)
    table = table.drop_columns(["_kind"])
    if shift:
        ts = pc.add(table.column(S.TS_NS), pa.scalar(shift, pa.int64()))
        table = table.set_column(table.schema.get_field_index(S.TS_NS), S.TS_NS, ts)
    return table


# --- a written rank's events, back in chunks ----------------------------------------------------

#: Ranks with at least this many events have their analysis recomputed (a reader's, after an
#: analysis change) a chunk at a time. ``TRACEVIEW_CHUNKED_MIN_ROWS`` overrides it (tests: 0).
CHUNKED_MIN_ROWS = 2_000_000
_READ_ROWS = 1 << 16


def chunked_min_rows() -> int:
    return int(os.environ.get("TRACEVIEW_CHUNKED_MIN_ROWS", CHUNKED_MIN_ROWS))


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
    ingest cuts it (``_inside_steps``). A rank without step markers is one window, cut about
    every ``target_rows`` rows (``_unmarked_file``); None where its ids are not its rows'."""
    from traceview.model.columns import KIND_CODE, PHASE_CODE, coded

    step_code, backward = KIND_CODE[S.KIND_STEP], PHASE_CODE[S.BACKWARD]
    annotation, runtime_code = KIND_CODE[S.KIND_ANNOTATION], KIND_CODE[S.KIND_RUNTIME]
    file = pq.ParquetFile(path)
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
        sampled.append(ts[(-seen) % _SAMPLE_EVERY :: _SAMPLE_EVERY].copy())
        seen += len(ts)
        anchors.append(ts[(kind == annotation) & (phase >= 0) & ANCHOR_PHASES[phase]])
        runtime = kind == runtime_code
        runtime_ids.append(ints(batch.column(S.EVENT_ID), -1)[runtime])
        runtime_ts.append(ts[runtime])
    whole: tuple[int, int] | None = None
    launchers = _Firsts.NONE  # a device activity goes with its launcher
    step_numbers = step_chunks = np.zeros(0, np.int64)
    if markers:
        m_pid, m_tid, m_ts, m_end, m_step = np.concatenate(markers, axis=1)
        training, mine, bounds = _steps_and_chunks(m_pid, m_tid, m_ts, m_end, rows, target_rows)
        starts = np.sort(np.concatenate(sampled))
        bounds = _inside_steps(bounds, starts, rows, np.concatenate(anchors), target_rows)
        del starts, sampled, anchors
        launchers = _Firsts(runtime_ids, runtime_ts, bounds)
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

    with _ChunkFiles(work, "events") as files:
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
            own = pa.Table.from_batches(list(_spill_batches(spilled)), file.schema_arrow)
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
) -> tuple[tuple[int, int], tuple[int, int], np.ndarray, _Firsts] | None:
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
    thread_time = _ThreadTime()
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
    step = max(1, target_rows // _SAMPLE_EVERY)
    bounds = np.unique(starts[step::step])
    launchers = _Firsts(runtime_ids, runtime_ts, bounds)
    return training, (start, end), bounds, launchers
